"""A plain Fleet script for ``python -m pyfleet.launch --mode hybrid``: nothing in it says
hybrid (the launcher's ``PYFLEET_MODE`` does), and it runs both roles::

    python -m pyfleet.launch --mode hybrid --servers 1 --workers 2 \\
        tests/support/hybrid_script.py OUT --steps S

Every worker trains ``S`` steps of batch 8 on its slice of each step's examples and writes
``OUT/worker<i>.json``: its index and count, the config's mode, its dense checksum, the
servers' stats, and its losses. ``--die-at K``: worker 1 kills itself (SIGKILL) at step K.
"""

import argparse
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyfleet import fluid
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.distributed.fleet import fleet
from pyfleet.optimizer import Adam
from support.collective_job import build, examples, feed_of

BATCH = 8


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--die-at", type=int, default=None, help="worker 1 SIGKILLs itself there")
    a = p.parse_args(argv)
    fleet.init()
    main_p, startup, avg, _ = build()
    cfg = DistributeTranspilerConfig()
    with fluid.program_guard(main_p, startup):
        fleet.distributed_optimizer(Adam(0.05), cfg).minimize(avg)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()
        return 0
    fleet.init_worker()
    exe = fluid.Executor()
    exe.run(fleet.startup_program)
    wi, wn = fleet.worker_index(), fleet.worker_num()
    losses = []
    for step in range(a.steps):   # one repeated batch: the loss must fall
        if step == a.die_at and wi == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        exs = examples(0, wn * BATCH)[wi * BATCH:(wi + 1) * BATCH]
        loss, = exe.run(fleet.main_program, feed=feed_of(exs), fetch_list=[avg])
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    fleet.barrier_worker()
    info = {"index": wi, "num": wn, "mode": cfg.mode, "sparse_mode": cfg.sparse_mode,
            "checksum": fleet._backend.dense_checksum(), "stats": fleet.stats(),
            "losses": losses, "rank": int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1")),
            "yield_when_idle": os.environ.get("OMPI_MCA_mpi_yield_when_idle")}  # noqa: SIM112
    with open(os.path.join(a.out, f"worker{wi}.json"), "w") as f:
        json.dump(info, f)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())

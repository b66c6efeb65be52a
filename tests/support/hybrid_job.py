"""The workers of a hybrid job (sparse on the servers, dense all-reduced), run under ``mpirun``
with ``PYFLEET_ROLE=worker``, ``PYFLEET_SERVER_ENDPOINTS`` and ``PYFLEET_WORKER_NUM`` set
(the worker index is the MPI rank)::

    python -m support.hybrid_job OUT --steps S --batch B [--sparse sync|async|geo]
        [--repeat] [--save DIR] [--load DIR]

Each rank trains on its slice ``[r*B, (r+1)*B)`` of step s's global batch (the same data as
:mod:`support.collective_job`; ``--repeat``: step 0's batch every step) and writes
``OUT/rank<r>.npz`` (per-step losses, dense values, and on rank 0 the servers' ``emb`` rows)
and ``OUT/rank<r>.json`` (dense checksums, the servers' stats).
"""

import argparse
import json
import os
import sys

import numpy as np

from pyfleet import fluid
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.distributed.fleet import fleet
from pyfleet.optimizer import Adam
from support.collective_job import SLOTS, build, examples, feed_of


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sparse", default="sync", choices=["sync", "async", "geo"])
    p.add_argument("--repeat", action="store_true")
    p.add_argument("--save", default=None)
    p.add_argument("--load", default=None)
    a = p.parse_args(argv)

    fleet.init()
    rank, size = fleet.worker_index(), fleet.worker_num()
    main_p, startup, avg, prob = build()
    cfg = DistributeTranspilerConfig()
    cfg.mode = "hybrid"
    cfg.sparse_mode = a.sparse
    with fluid.program_guard(main_p, startup):
        fleet.distributed_optimizer(Adam(0.05), cfg).minimize(avg)
    fleet.init_worker()
    exe = fluid.Executor()
    exe.run(fleet.startup_program)
    if a.load:
        fleet.load_persistables(exe, a.load)
    losses = []
    for step in range(a.steps):
        exs = examples(0 if a.repeat else step, size * a.batch)[rank * a.batch:
                                                                (rank + 1) * a.batch]
        loss, = exe.run(fleet.main_program, feed=feed_of(exs), fetch_list=[avg])
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    fleet.barrier_worker()   # every worker's pushes applied on the servers
    backend = fleet._backend
    arrays = {"losses": np.array(losses, dtype=np.float64)}
    for n, t in backend.dense.items():
        arrays["dense." + n] = t.pull()
    if rank == 0:
        pages = list(fleet._client.export_sparse("emb"))
        keys = np.concatenate([k for k, _ in pages])
        order = np.argsort(keys)
        arrays["emb.keys"] = keys[order]
        arrays["emb.weights"] = np.concatenate([w for _, w in pages])[order]
        if a.save:
            fleet.save_persistables(exe, a.save)
            fleet.save_inference_model(exe, a.save + ".inference",
                                       ["dense"] + [f"s{i}" for i in range(SLOTS)], [prob])
            test = fleet.main_program.clone(for_test=True)
            arrays["predict"], = exe.run(test, feed=feed_of(examples(999, 4)),
                                         fetch_list=[prob])
    info = {"rank": rank, "size": size, "checksum": backend.dense_checksum(),
            "stats": fleet.stats()}
    fleet.barrier_worker()   # rank 0's save is done before any worker stops
    fleet.stop_worker()
    np.savez(os.path.join(a.out, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)


if __name__ == "__main__":
    sys.exit(main())

"""A small CTR job for the collective-mode tests, run under ``mpirun`` (or alone).

    python -m support.collective_job collective OUT --steps S --batch B [--die-at K]
        [--mismatch] [--save DIR] [--load DIR]
    python -m support.collective_job single OUT --steps S --batch B --ranks N

``collective``: each rank trains on its slice ``[r*B, (r+1)*B)`` of step s's global
batch of ``N*B`` examples; ``single``: one process, no MPI, trains on the whole
global batch. Both write ``OUT/<rank|single>.npz`` (per-step losses, final dense
values, sparse rows by key) and ``.json`` (checksums).
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

from pyfleet import fluid
from pyfleet.fluid.backend import LocalBackend
from pyfleet.optimizer import Adam

L = fluid.layers
SLOTS = 2


def build(hidden=4, dim=3):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = 7
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        dense = L.data("dense", [2])
        slots = [L.data(f"s{i}", [1], dtype="int64", lod_level=1) for i in range(SLOTS)]
        label = L.data("label", [1], dtype="int64")
        embs = [L.sequence_pool(L.embedding(s, [10 ** 6, dim], is_sparse=True,
                                            param_attr=fluid.ParamAttr(name="emb")), "sum")
                for s in slots]
        h = L.fc(L.concat(embs + [dense], axis=1), hidden, act="relu")
        prob = L.fc(h, 2, act="softmax")
        avg = L.mean(L.cross_entropy(prob, label))
    return main, startup, avg, prob


def examples(step, n):
    """Step ``step``'s global batch: ``n`` examples (dense, label, per-slot ids)."""
    rng = np.random.default_rng(1000 + step)
    out = []
    for _ in range(n):
        ids = [rng.integers(0, 400, rng.integers(1, 4)).astype(np.int64) for _ in range(SLOTS)]
        out.append((rng.normal(size=2).astype(np.float32), int(rng.integers(0, 2)), ids))
    return out


def feed_of(exs):
    feed = {"dense": np.stack([e[0] for e in exs]),
            "label": np.array([[e[1]] for e in exs], dtype=np.int64)}
    for i in range(SLOTS):
        parts = [e[2][i] for e in exs]
        feed[f"s{i}"] = (np.concatenate(parts),
                         np.concatenate([[0], np.cumsum([len(p) for p in parts])]))
    return feed


def dump(out, name, losses, backend, extra=None, arrays=None):
    arrays = {"losses": np.array(losses, dtype=np.float64), **(arrays or {})}
    for n, t in backend.dense.items():
        arrays["dense." + n] = t.pull()
    t = backend.sparse["emb"]
    keys = np.sort(t.keys())
    arrays["emb.keys"] = keys
    arrays["emb.weights"] = t.export(keys)["weights"]
    np.savez(os.path.join(out, name + ".npz"), **arrays)
    info = dict(extra or {})
    if hasattr(backend, "checksum"):
        info["checksum"] = backend.checksum()
    with open(os.path.join(out, name + ".json.tmp"), "w") as f:
        json.dump(info, f)
    os.replace(os.path.join(out, name + ".json.tmp"), os.path.join(out, name + ".json"))


def collective(a):
    from pyfleet.fluid.incubate.fleet.base import role_maker
    from pyfleet.fluid.incubate.fleet.collective import DistributedStrategy, fleet

    fleet.init(role_maker.PaddleCloudRoleMaker(is_collective=True))
    rank, size = fleet.worker_index(), fleet.worker_num()
    main, startup, avg, prob = build(hidden=4 + (rank if a.mismatch else 0))
    strategy = DistributedStrategy()
    with fluid.program_guard(main, startup):
        fleet.distributed_optimizer(Adam(0.05), strategy).minimize(avg)
    exe = fluid.Executor()
    exe.run(fleet.startup_program)
    if a.load:
        fleet.load_persistables(exe, a.load)
    losses = []
    for step in range(a.steps):
        if a.die_at is not None and step == a.die_at and rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if a.stall_at is not None and step == a.stall_at and rank == size - 1:
            time.sleep(600)  # the stalled rank under test (the job's stall bound ends it)
        if a.sigstop_at is not None and step == a.sigstop_at and rank == size - 1:
            os.kill(os.getpid(), signal.SIGSTOP)   # stopped: no thread of it runs
        exs = examples(step, size * a.batch)[rank * a.batch:(rank + 1) * a.batch]
        loss, = exe.run(fleet.main_program, feed=feed_of(exs), fetch_list=[avg])
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    if a.save:
        fleet.save_persistables(exe, a.save)
        fleet.save_inference_model(exe, a.save + ".inference",
                                   ["dense"] + [f"s{i}" for i in range(SLOTS)], [prob])
    test = fleet.main_program.clone(for_test=True)
    predict, = exe.run(test, feed=feed_of(examples(999, 4)), fetch_list=[prob])
    dump(a.out, f"rank{rank}", losses, fleet.backend,
         {"rank": rank, "size": size, "endpoints": fleet.worker_endpoints(),
          "first": fleet.is_first_worker()}, {"predict": np.asarray(predict)})


def single(a):
    main, startup, avg, _ = build()
    with fluid.program_guard(main, startup):
        Adam(0.05).minimize(avg)
    backend = LocalBackend()
    main.set_backend(backend)
    exe = fluid.Executor()
    exe.run(startup)
    losses = []
    for step in range(a.steps):
        loss, = exe.run(main, feed=feed_of(examples(step, a.ranks * a.batch)),
                        fetch_list=[avg])
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    dump(a.out, "single", losses, backend)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["collective", "single"])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--die-at", type=int, default=None)
    p.add_argument("--stall-at", type=int, default=None)
    p.add_argument("--sigstop-at", type=int, default=None)
    p.add_argument("--mismatch", action="store_true")
    p.add_argument("--save", default=None)
    p.add_argument("--load", default=None)
    a = p.parse_args(argv)
    (collective if a.what == "collective" else single)(a)


if __name__ == "__main__":
    sys.exit(main())

"""Push cost of each optimizer rule, and of a table's regularizer, relative to
SGD in the same run (process CPU time, one thread).

    python benchmarks/micro/bench_rules.py [--rows 200000] [--dim 16] [--pushes 20]

Every rule pushes the same batches of --rows distinct keys (rows already
created) into a fresh fp32 table; the figure is the best of 3 CPU times of
--pushes pushes, divided by SGD's.
"""

import argparse
import time

import numpy as np

import pyfleet
from pyfleet.optimizer import SGD, Adagrad, Adam, Momentum, RMSProp

L2 = {"type": "L2Decay", "regularization_coeff": 1e-4}


def cpu_time(table, keys, grads, pushes):
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(pushes):
            table.push(keys, grads)
        best = min(best, time.process_time() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--pushes", type=int, default=20)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**63, a.rows, dtype=np.uint64))
    grads = rng.normal(0, 1e-3, (len(keys), a.dim)).astype(np.float32)
    cases = [("SGD", SGD(0.01), None), ("SGD + L2Decay", SGD(0.01), L2),
             ("Adagrad", Adagrad(0.01), None), ("Adam", Adam(0.001), None),
             ("Momentum", Momentum(0.01, 0.9), None),
             ("Momentum nesterov", Momentum(0.01, 0.9, use_nesterov=True), None),
             ("Momentum + L2Decay", Momentum(0.01, 0.9), L2),
             ("RMSProp", RMSProp(0.001, momentum=0.9), None),
             ("RMSProp centered", RMSProp(0.001, momentum=0.9, centered=True), None)]
    base = None
    print(f"{len(keys)} keys a push, dim {a.dim}, {a.pushes} pushes, best of 3 (CPU s)")
    for name, opt, reg in cases:
        t = pyfleet.SparseTable(a.dim, opt, regularizer=reg)
        t.pull(keys)
        s = cpu_time(t, keys, grads, a.pushes)
        base = base or s
        print(f"{name:22s} {s:7.3f} s  {s / base:5.2f}x SGD")


if __name__ == "__main__":
    main()

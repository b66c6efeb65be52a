"""The collective step's dense all-reduce beside a raw mpi4py ``Allreduce`` of the same buffer.

    mpirun -np 2 --oversubscribe python benchmarks/micro/bench_allreduce.py [--floats N] [--steps S]

Default buffer: the dense parameters of ``pyfleet train``'s reference DNN (39 inputs:
13 dense + 26 slots x 16-dim embeddings, layers 256-128-64, 2 outputs) plus one flag per
parameter, as :class:`pyfleet.distributed.collective_backend.CollectiveBackend` fuses them.
``fused`` is the backend's whole dense step (copy of every gradient into the fused buffer,
``MPIGroup.allreduce_mean``, the averaged gradient pushed into each ``DenseTable``);
``allreduce`` only ``MPIGroup.allreduce_mean``; ``raw`` mpi4py's ``Allreduce`` alone.
Rank 0 prints median milliseconds per step.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

from pyfleet.distributed.collective_backend import CollectiveBackend
from pyfleet.distributed.mpi_group import MPIGroup
from pyfleet.optimizer import Adam


def dnn_shapes(dense=13, slots=26, dim=16, layers=(256, 128, 64), out=2):
    sizes, fan_in = [], dense + slots * dim
    for width in (*layers, out):
        sizes += [(fan_in, width), (width,)]
        fan_in = width
    return sizes


def median_ms(fn, steps, comm):
    times = []
    for _ in range(steps):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    group = MPIGroup()
    backend = CollectiveBackend(group)
    shapes = dnn_shapes()
    grads = {}
    for i, s in enumerate(shapes):
        name = f"p{i:02d}"
        backend.create_dense(name, np.zeros(s, np.float32), Adam(1e-3))
        grads[name] = np.full(s, 1e-3, np.float32)
    names, shp, offsets, total, _ = backend._fused_layout()
    buf = np.ones(total, np.float32)
    raw = np.ones(total, np.float32)

    def fused():
        backend._dense_grads = dict(grads)
        backend._dense_step(names, shp, offsets, total)

    results = {
        "raw": median_ms(lambda: comm.Allreduce(MPI.IN_PLACE, raw, op=MPI.SUM), a.steps, comm),
        "allreduce": median_ms(lambda: group.allreduce_mean(buf), a.steps, comm),
        "fused": median_ms(fused, a.steps, comm),
    }
    if comm.Get_rank() == 0:
        print(f"ranks {comm.Get_size()}, buffer {total} floats ({4 * total / 1e6:.2f} MB), "
              f"median of {a.steps} steps")
        for k, v in results.items():
            print(f"{k:10s} {v:8.3f} ms  ({v / results['raw']:.2f}x raw)")


if __name__ == "__main__":
    main()

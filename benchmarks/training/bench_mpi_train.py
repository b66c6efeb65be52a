"""One rank of ``bench_train.py``'s ``collective`` and ``hybrid`` rows, run under ``mpirun``.

    mpirun -np 2 python benchmarks/training/bench_mpi_train.py collective JOB_JSON
    mpirun -np 2 python benchmarks/training/bench_mpi_train.py hybrid JOB_JSON   # + PYFLEET_ROLE=worker,
                                         # PYFLEET_SERVER_ENDPOINTS, PYFLEET_WORKER_NUM

The reference network and data of ``pyfleet train`` (``pyfleet.trainer.job``): every
rank trains on its share of ``job["train"]`` (the dataset's worker split) with batch
``job["batch_size"]``; all ranks stop at the step where the first runs out of data
(a collective step needs every rank; ``pyfleet.trainer.mpi.equal_steps``), prefetching the
next batch's sparse rows as the trainer does. Rank 0 then predicts the whole test set and
prints one JSON line: ``train_examples`` (all ranks), ``train_seconds`` (the slowest),
``train_examples_per_sec``, ``train_cpu_seconds`` (all ranks' training loops, with
the time MPI spends polling inside collectives), ``main_thread_ran_seconds`` and
``main_thread_queued_seconds`` (all ranks' training threads during the loop: on a core,
and runnable but waiting for a core, from Linux's schedstat), ``test_auc``.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from pyfleet import fluid
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.metrics import exact_auc
from pyfleet.trainer.job import JOB_DEFAULTS, build_program, feed_of, job_dataset, optimizer_of
from pyfleet.trainer.mpi import equal_steps, group_of
from pyfleet.trainer.role import prefetched_feeds


def _sched():
    """(seconds on a core, seconds runnable but waiting for one) of this thread so far:
    Linux's /proc/thread-self/schedstat; zeros elsewhere."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            ran, queued = f.read().split()[:2]
    except OSError:
        return 0.0, 0.0
    return int(ran) / 1e9, int(queued) / 1e9


def main(argv):
    kind, job = argv[0], {**JOB_DEFAULTS, **json.loads(argv[1])}
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    main_p, startup, model = build_program(job, job["n_dense"], job["n_slots"])
    if kind == "collective":
        from pyfleet.fluid.incubate.fleet.collective import DistributedStrategy, fleet
        fleet.init()
        strategy = DistributedStrategy()
    else:
        from pyfleet.distributed.fleet import fleet
        fleet.init()
        strategy = DistributeTranspilerConfig()
        strategy.mode = "hybrid"
        strategy.sparse_mode = job["mode"]
    with fluid.program_guard(main_p, startup):
        fleet.distributed_optimizer(optimizer_of(job), strategy).minimize(model.avg_cost)
    if kind == "hybrid":
        fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    data = job_dataset(job, job["train"], rank, size, shuffle=True)
    examples, t0, c0, q0 = 0, time.perf_counter(), time.process_time(), _sched()
    # As pyfleet train's workers: every rank stops at the first rank's last batch, and
    # the next batch's sparse rows are prefetched (hybrid: their pull travels) while
    # this step computes.
    for batch, feed in prefetched_feeds(equal_steps(data, group_of(fleet, {"mode": kind})), exe,
                                    fleet.main_program, model):
        exe.run(fleet.main_program, feed=feed, fetch_list=[model.avg_cost])
        examples += int(batch.labels.shape[0])
    if kind == "hybrid":
        fleet.barrier_worker()
    seconds = time.perf_counter() - t0
    cpu = comm.allreduce(time.process_time() - c0, op=MPI.SUM)
    q1 = _sched()
    ran, queued = (comm.allreduce(b - a, op=MPI.SUM) for a, b in zip(q0, q1))
    total = comm.allreduce(examples, op=MPI.SUM)
    slowest = comm.allreduce(seconds, op=MPI.MAX)
    summary = {"workers": size, "train_examples": total, "train_seconds": slowest,
               "train_examples_per_sec": total / max(slowest, 1e-9),
               "train_cpu_seconds": cpu, "main_thread_ran_seconds": ran,
               "main_thread_queued_seconds": queued}
    if rank == 0:
        test = fleet.main_program.clone(for_test=True)
        test.set_backend(fleet.main_program.backend)
        preds, labels = [], []
        for batch in job_dataset(job, job["test"], 0, 1):
            (pred,) = exe.run(test, feed=feed_of(batch, model), fetch_list=[model.predict])
            preds.append(pred.reshape(-1))
            labels.append(batch.labels)
        summary["test_auc"] = float(exact_auc(np.concatenate(preds), np.concatenate(labels)))
        print(json.dumps(summary), flush=True)
    comm.Barrier()
    if kind == "hybrid":
        fleet.stop_worker()


if __name__ == "__main__":
    main(sys.argv[1:])

"""The trainer's workers as one MPI job: ``pyfleet train --mode hybrid`` (sparse tables on
the servers, dense parameters replicated and all-reduced among the workers) and ``--mode
collective`` (no server: every rank holds the whole model, docs/collective.md).

:func:`pyfleet.trainer.role.run_role` runs the same pass loop in every mode; what differs
is here: which Fleet runs the job (:func:`fleet_of`), its strategy
(:func:`distributed_optimizer`), loading a resumed checkpoint into the replicas
(:func:`load_replicas`), and :func:`equal_steps`, since a collective step needs every
rank: each pass ends on every rank at the step where the first rank runs out of batches
(the others' last batches of that pass are skipped and counted in the log).
"""

import logging
import os

import numpy as np

from pyfleet.trainer.job import entry_of, optimizer_of, strategy_of

log = logging.getLogger("pyfleet.trainer")

MPI_MODES = ("hybrid", "collective")


def fleet_of(job):
    """The Fleet of the job's mode: the collective one, or the parameter-server one
    (which runs hybrid jobs too)."""
    if job["mode"] == "collective":
        from pyfleet.distributed.collective import fleet
    else:
        from pyfleet.distributed.fleet import fleet
    return fleet


def distributed_optimizer(fleet, job):
    """``fleet.distributed_optimizer`` with the job's optimizer and strategy."""
    if job["mode"] == "collective":
        from pyfleet.distributed.collective import DistributedStrategy
        return fleet.distributed_optimizer(optimizer_of(job), DistributedStrategy())
    return fleet.distributed_optimizer(optimizer_of(job), strategy_of(job),
                                       sparse_entry=entry_of(job),
                                       sparse_storage=job.get("storage") or "fp32",
                                       sparse_memory_budget=job.get("memory_budget"),
                                       sparse_spill_dir=job.get("spill_dir"))


def load_replicas(fleet, exe, job, where):
    """After the startup program: a resumed or restarted hybrid or collective job loads
    its checkpoint into this worker's replicas (hybrid: the dense parameters, the servers
    load the sparse rows; collective: every table): ``PYFLEET_RESTORE_DIR`` (a restart,
    at the checkpoint's recorded position) when it holds one, else ``where``."""
    restore = os.environ.get("PYFLEET_RESTORE_DIR")
    if restore and os.path.exists(os.path.join(restore, "MANIFEST.json")):
        where = restore
    if job["mode"] in MPI_MODES and where:
        log.info("worker %d: loading %s into the replicas", fleet.worker_index(), where)
        fleet.load_persistables(exe, where)


def group_of(fleet, job):
    """The workers' :class:`~pyfleet.distributed.mpi_group.MPIGroup`, or None
    outside hybrid and collective jobs."""
    if job["mode"] == "collective":
        return fleet._group
    if job["mode"] == "hybrid":
        return fleet._backend.group
    return None


def equal_steps(batches, group):
    """``batches`` while every rank of ``group`` still has one; without a group,
    ``batches`` unchanged.

    One 8-byte all-reduce per step counts the ranks that have a batch. It is started
    (``Iallreduce``) before the previous batch is handed out and waited for when the
    next one is asked for, so it travels with that step's own collectives instead of
    being one more point where the ranks wait for each other."""
    if group is None:
        yield from batches
        return
    it = iter(batches)
    flags = [np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)]  # MPI's until waited
    steps, pending = 0, None
    try:
        batch = next(it, None)
        flags[0][0] = batch is not None
        pending = group.iallreduce_sum(flags[0])
        while True:
            group.wait(pending, "the check that every rank has a next batch")
            pending = None
            if int(flags[steps % 2][0]) < group.size:
                if batch is not None:
                    left = 1 + sum(1 for _ in it)
                    log.warning("rank %d: another rank's data ended the pass after %d steps; "
                                "this rank's last %d batch(es) of the pass were skipped",
                                group.rank, steps, left)
                return
            nxt = next(it, None)
            flag = flags[(steps + 1) % 2]
            flag[0] = nxt is not None
            pending = group.iallreduce_sum(flag)
            steps += 1
            yield batch
            batch = nxt
    finally:
        if pending is not None:
            # Closed early (every rank alike): the started count still needs every rank.
            group.wait(pending, "the check that every rank has a next batch")
        close = getattr(it, "close", None)
        if close is not None:
            close()

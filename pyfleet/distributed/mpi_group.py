"""The workers of a collective or hybrid job as one MPI group (mpi4py's COMM_WORLD).

:class:`MPIGroup` wraps the few collectives a training step needs, each on
numpy buffers (mpi4py's upper-case, buffer methods: nothing is pickled):

- :meth:`MPIGroup.allreduce_mean` — one fused ``Allreduce`` of a float32 buffer, averaged;
- :meth:`MPIGroup.allgatherv` — every rank's 1-D array, concatenated in rank order;
- :meth:`MPIGroup.iallreduce_sum`, :meth:`MPIGroup.iallgatherv` — the same started
  without waiting (``Iallreduce``, ``Iallgatherv``), finished by :meth:`MPIGroup.wait`;
- :meth:`MPIGroup.agree` — every rank checks that all ranks hold the same program
  (a JSON signature exchanged as bytes), naming the first rank and parameter that differ.

A rank that dies ends the job: ``mpirun`` aborts every rank when one exits
abnormally, naming the dead rank. For the cases where no launcher does that
(a rank stalled, or a launcher that keeps the others alive), a watchdog thread
aborts the whole MPI job (``MPI_Abort``) when one collective waits longer than
``timeout`` seconds (the stall bound: ``pyfleet train --collective-timeout``,
``$PYFLEET_COLLECTIVE_TIMEOUT``, default 60), after printing which rank waited
in which collective of which step and which rank stalled: the ranks of one
machine publish, in a shared-memory board (``MPI_Win_allocate_shared``), how
many collectives each has entered, so a waiting rank names the ranks of its
machine that never reached its collective (a rank on another machine is named
as such). After ``save_persistables``, which rank 0 alone writes, the other
ranks' next collective may wait ``SAVE_FACTOR`` times the bound.
"""

import json
import os
import sys
import threading
import time

import numpy as np

from pyfleet._extras import install_hint
from pyfleet.distributed.role_maker import COLLECTIVE_LAUNCH, MPI_ENV_VARS
from pyfleet.errors import ConfigError

__all__ = ["DEFAULT_TIMEOUT", "MPIGroup", "import_mpi"]

DEFAULT_TIMEOUT = 60.0
SAVE_FACTOR = 10  # the next collective after a save waits for rank 0's writing


def import_mpi():
    """mpi4py's ``MPI`` module, or an ImportError saying how to install it."""
    # Open MPI's UCX one-sided component prints an error when it declines a shared-memory
    # window (the stall board's); the shared-memory one serves it. Read at MPI_Init.
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
    try:  # the optional mpi extra
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"collective and hybrid modes need mpi4py and an MPI library: "
                          f"{install_hint('mpi')}") from exc
    return MPI


def _timeout_from_env():
    raw = os.environ.get("PYFLEET_COLLECTIVE_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"PYFLEET_COLLECTIVE_TIMEOUT={raw!r}: set it to a number of "
                          f"seconds > 0")
    return value


class MPIGroup:
    """The ranks of ``comm`` (default COMM_WORLD) as one training group.

    Not thread-safe: one training thread calls it (the watchdog thread only
    reads the state it publishes)."""

    def __init__(self, comm=None, timeout=None):
        if comm is None and not any(os.environ.get(v) for v in MPI_ENV_VARS):
            raise ConfigError(f"this process was not started by an MPI launcher: "
                              f"{COLLECTIVE_LAUNCH}")
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout = _timeout_from_env() if timeout is None else float(timeout)
        self.step = 0
        self._waiting = None  # (deadline, what) while inside a collective
        self._watchdog = None
        self._entered = 0     # watched collectives entered so far
        self._slack = None    # the next collective's bound, when longer (after a save)
        self._board = _Board(self.MPI, self.comm) if self.size > 1 else None

    def allow_save(self):
        """Rank 0 writes a checkpoint now: this rank's next collective may wait
        ``SAVE_FACTOR`` times the stall bound for it."""
        self._slack = self.timeout * SAVE_FACTOR

    # ------------------------------------------------------------ watchdog
    def _enter(self, what):
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="pyfleet-mpi-watchdog",
                                              daemon=True)
            self._watchdog.start()
        self._entered += 1
        if self._board is not None:
            self._board.enter(self._entered)
        bound, self._slack = self._slack or self.timeout, None
        self._waiting = (time.monotonic() + bound, what, bound)

    def _leave(self):
        self._waiting = None

    def _watch(self):
        tick = min(1.0, self.timeout / 10)
        while True:
            time.sleep(tick)
            waiting = self._waiting
            if waiting is not None and time.monotonic() > waiting[0]:
                late = self._board.behind(self._entered) if self._board is not None else None
                if late:
                    who = "; ".join(f"rank {r} stalled: it never reached this collective (its "
                                    f"last one began {ago:.1f} s ago)" for r, ago in late)
                elif self._board is not None and self._board.local_only:
                    who = "another rank died or stalled"
                else:
                    who = "a rank on another machine died or stalled"
                msg = (f"pyfleet: rank {self.rank} of {self.size} waited more than "
                       f"{waiting[2]:g} s in {waiting[1]} of step {self.step}: {who} "
                       f"(--collective-timeout, PYFLEET_COLLECTIVE_TIMEOUT); aborting the "
                       f"MPI job")
                print(msg, file=sys.stderr, flush=True)
                self.comm.Abort(1)
                return

    # --------------------------------------------------------- collectives
    def allreduce_mean(self, buf):
        """Replace float32 ``buf`` (contiguous, 1-D) by its mean over the ranks, in place."""
        self._enter("the dense all-reduce")
        try:
            self.comm.Allreduce(self.MPI.IN_PLACE, [buf, self.MPI.FLOAT], op=self.MPI.SUM)
        finally:
            self._leave()
        if self.size > 1:
            buf *= np.float32(1.0 / self.size)
        return buf

    def bcast(self, buf, what="a broadcast"):
        """Rank 0's ``buf`` (a contiguous numpy array) on every rank, in place."""
        self._enter(what)
        try:
            self.comm.Bcast(buf, root=0)
        finally:
            self._leave()
        return buf

    def allreduce_sum(self, buf, what="an all-reduce"):
        """Sum of ``buf`` (a contiguous float32/float64/int64 array) over the ranks, in place."""
        self._enter(what)
        try:
            self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        finally:
            self._leave()
        return buf

    def iallreduce_sum(self, buf):
        """Start the sum of ``buf`` over the ranks, in place (as :meth:`allreduce_sum`);
        returns the request to pass to :meth:`wait`. Until then ``buf`` is MPI's."""
        return self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)

    def wait(self, requests, what):
        """Wait for ``requests`` (one or a list, from the ``i...`` methods), watched
        as any collective."""
        self._enter(what)
        try:
            if isinstance(requests, list):
                self.MPI.Request.Waitall(requests)
            else:
                requests.Wait()
        finally:
            self._leave()

    def allgather_counts(self, counts, what="the sparse exchange"):
        """``int64[size, len(counts)]``: every rank's ``counts`` row, in rank order."""
        counts = np.ascontiguousarray(counts, dtype=np.int64)
        out = np.empty((self.size, counts.shape[0]), dtype=np.int64)
        self._enter(what)
        try:
            self.comm.Allgather(counts, out)
        finally:
            self._leave()
        return out

    def allgatherv(self, arr, counts, what="the sparse exchange"):
        """Every rank's 1-D ``arr`` concatenated in rank order; ``counts[r]`` is
        rank r's length (from :meth:`allgather_counts`)."""
        arr = np.ascontiguousarray(arr)
        out, counts, displs = self._gathered(arr, counts)
        self._enter(what)
        try:
            self.comm.Allgatherv(arr, [out, (counts, displs)])
        finally:
            self._leave()
        return out

    @staticmethod
    def _gathered(arr, counts):
        counts = np.asarray(counts, dtype=np.int64)
        out = np.empty(int(counts.sum()), dtype=arr.dtype)
        displs = np.zeros_like(counts)
        np.cumsum(counts[:-1], out=displs[1:])
        return out, counts, displs

    def iallgatherv(self, arr, counts):
        """Start :meth:`allgatherv`: ``(out, request)``; ``out`` is filled once
        :meth:`wait` returned (``arr`` must stay untouched until then)."""
        arr = np.ascontiguousarray(arr)
        out, counts, displs = self._gathered(arr, counts)
        return out, self.comm.Iallgatherv(arr, [out, (counts, displs)])

    def allgather_bytes(self, data, what):
        """Every rank's ``data`` (bytes), a list in rank order."""
        raw = np.frombuffer(data, dtype=np.uint8)
        counts = self.allgather_counts([raw.shape[0]], what)[:, 0]
        flat = self.allgatherv(raw, counts, what)
        ends = np.cumsum(counts)
        return [flat[e - n:e].tobytes() for n, e in zip(counts, ends)]

    def agree(self, signature, what):
        """Raise ConfigError on every rank unless every rank passed an equal
        ``signature`` (a JSON object ``{item: description}``): the message names the
        first rank that differs from rank 0, and the items that differ."""
        mine = json.dumps(signature, sort_keys=True).encode()
        sigs = self.allgather_bytes(mine, f"the check that every rank has the same {what}")
        first = json.loads(sigs[0])
        for r, raw in enumerate(sigs[1:], start=1):
            if raw == sigs[0]:
                continue
            other = json.loads(raw)
            diff = [k for k in sorted(set(first) | set(other)) if first.get(k) != other.get(k)]
            shown = "; ".join(f"{what} {k!r} is {first.get(k) or 'missing'} on rank 0 and "
                              f"{other.get(k) or 'missing'} on rank {r}" for k in diff[:4])
            more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
            raise ConfigError(f"ranks build different programs: {shown}{more}; every rank "
                              f"must build the same program")

    def barrier(self, what="a barrier"):
        self._enter(what)
        try:
            self.comm.Barrier()
        finally:
            self._leave()


class _Board:
    """How many watched collectives each rank of this machine has entered, and
    when it entered its last one: one shared-memory window of the machine's
    ranks (``MPI_Win_allocate_shared``), written with plain stores (no MPI
    call: a stalled rank's slot is readable without it). Collective to make
    (every rank of ``comm`` at once); a library without shared windows leaves
    it empty (:meth:`behind` returns None)."""

    def __init__(self, MPI, comm):
        self.slots = None
        try:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            self.ranks = node.allgather(comm.Get_rank())
            self.local_only = node.Get_size() == comm.Get_size()
            self.me = node.Get_rank()
            n = node.Get_size()
            self._win = MPI.Win.Allocate_shared(16 * n if self.me == 0 else 0, 8, comm=node)
            buf, _ = self._win.Shared_query(0)
            self.slots = np.ndarray((n, 2), dtype=np.int64, buffer=buf)
            if self.me == 0:
                self.slots[:] = 0
            node.Barrier()
        except Exception:  # noqa: BLE001 -- a diagnostic: without it, the rank is not named
            self.slots = None
            self.local_only = False

    def enter(self, count):
        if self.slots is not None:
            self.slots[self.me, 1] = time.monotonic_ns()
            self.slots[self.me, 0] = count

    def behind(self, count):
        """``[(rank, seconds since its last collective began)]`` of this machine's
        ranks that have not entered collective number ``count``."""
        if self.slots is None:
            return None
        now = time.monotonic_ns()
        return [(self.ranks[i], (now - int(t)) / 1e9)
                for i, (c, t) in enumerate(self.slots.tolist()) if c < count]

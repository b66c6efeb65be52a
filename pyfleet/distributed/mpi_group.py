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
machine that never reached its collective. Ranks on other machines are asked
(:class:`_Peers`): shortly before the bound, a waiting rank's watchdog sends each
of them a question over a communicator of the watchdogs' own, which their
watchdog threads answer (how many collectives that rank entered, and when it
began its last); a rank that answers behind is named as stalled, one that does
not answer (stopped by SIGSTOP, or its machine unreachable) is named as
silent. After ``save_persistables``, which rank 0 alone writes, the other
ranks' next collective may wait ``SAVE_FACTOR`` times the bound.
"""

import atexit
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
        self._peers = _Peers(self.MPI, self.comm) if self.size > 1 else None
        self._last_ns = time.monotonic_ns()   # when this rank entered its last collective
        self._stop = threading.Event()

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
            # before mpi4py's own exit hook finalizes MPI: the watchdog calls MPI too
            atexit.register(self._stop_watchdog)
        self._last_ns = time.monotonic_ns()
        self._entered += 1
        if self._board is not None:
            self._board.enter(self._entered)
        bound, self._slack = self._slack or self.timeout, None
        self._waiting = (time.monotonic() + bound, what, bound)

    def _leave(self):
        self._waiting = None

    def _stop_watchdog(self):
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(5.0)

    def _watch(self):
        tick = min(1.0, self.timeout / 10)
        asked = None   # the wait the other machines' ranks were asked about
        while not self._stop.wait(tick):
            if self._peers is not None:
                self._peers.serve(self._entered, self._last_ns)
            waiting = self._waiting
            if waiting is None:
                continue
            now = time.monotonic()
            if self._peers is not None and asked is not waiting and \
                    now > waiting[0] - 3 * tick:   # answers come within a tick of theirs
                self._peers.ask()
                asked = waiting
            if now <= waiting[0]:
                continue
            count = self._entered
            late = (self._board.behind(count) if self._board is not None else None) or []
            who = [f"rank {r} stalled: it never reached this collective (its last one "
                   f"began {ago:.1f} s ago)" for r, ago in late]
            if self._peers is not None and asked is waiting:
                local = set(self._board.ranks) if self._board is not None and \
                    self._board.slots is not None else {self.rank}
                for r, ago in self._peers.behind(count, local):
                    who.append(f"rank {r} did not answer (stopped, or its machine "
                               f"unreachable)" if ago is None else
                               f"rank {r} stalled: it never reached this collective (its "
                               f"last one began {ago:.1f} s ago)")
            if not who:
                who = ["another rank died or stalled" if self._board is not None and
                       self._board.local_only else "a rank on another machine died or stalled"]
            msg = (f"pyfleet: rank {self.rank} of {self.size} waited more than "
                   f"{waiting[2]:g} s in {waiting[1]} of step {self.step}: {'; '.join(who)} "
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


_ASK, _ANSWER = 7101, 7102   # tags of the watchdogs' questions and answers


class _Peers:
    """The watchdogs of every rank, talking over a communicator of their own (a
    duplicate of the group's, made collectively): :meth:`ask` sends each other
    rank a question, its watchdog thread answers it in :meth:`serve` (with how
    many watched collectives its rank entered, and how long ago it began the
    last), and :meth:`behind` says who is behind or silent. A rank whose process
    is stopped answers nothing. Needs ``MPI_THREAD_MULTIPLE`` (mpi4py asks for
    it): without it, nothing is asked and no rank elsewhere is named. Used by
    the watchdog thread only."""

    def __init__(self, MPI, comm):
        self.comm = None
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            return
        self.MPI = MPI
        self.comm = comm.Dup()
        self.me, self.size = comm.Get_rank(), comm.Get_size()
        self._sent = []        # (request, buffer) of sends not yet complete
        self._question = 0
        self._answers = {}     # rank -> (collectives entered, seconds since the last began)

    def _send(self, values, dest, tag):
        buf = np.array(values, dtype=np.int64)
        self._sent.append((self.comm.Isend([buf, self.MPI.INT64_T], dest=dest, tag=tag), buf))

    def _received(self, tag):
        status = self.MPI.Status()
        while self.comm.Iprobe(source=self.MPI.ANY_SOURCE, tag=tag, status=status):
            buf = np.empty(3, dtype=np.int64)
            self.comm.Recv([buf, self.MPI.INT64_T], source=status.Get_source(), tag=tag)
            yield status.Get_source(), buf

    def serve(self, entered, last_ns):
        """Answer the questions waiting; take in the answers to this rank's own."""
        if self.comm is None:
            return
        for source, q in self._received(_ASK):
            self._send([q[0], entered, time.monotonic_ns() - last_ns], source, _ANSWER)
        for source, a in self._received(_ANSWER):
            if a[0] == self._question:   # not an answer to an earlier question
                self._answers[source] = (int(a[1]), int(a[2]) / 1e9)
        self._sent = [(r, b) for r, b in self._sent if not r.Test()]

    def ask(self):
        """Ask every other rank how far it is (answers arrive in :meth:`serve`)."""
        if self.comm is None:
            return
        self._question += 1
        self._answers = {}
        for r in range(self.size):
            if r != self.me:
                self._send([self._question, 0, 0], r, _ASK)

    def behind(self, count, known):
        """``[(rank, seconds since its last collective began, or None when it did not
        answer)]`` of the ranks not in ``known`` (this machine's, which the board
        names) that have not entered collective number ``count``."""
        if self.comm is None:
            return []
        out = []
        for r in range(self.size):
            if r == self.me or r in known:
                continue
            answer = self._answers.get(r)
            if answer is None:
                out.append((r, None))
            elif answer[0] < count:
                out.append((r, answer[1]))
        return out

"""Which client speaks for each worker index: :class:`Owners`.

A worker's requests change what a server does for every worker: a spoofed
``STOP_WORKER`` ends the servers under the real workers, a spoofed push
changes the model (in sync mode it joins the worker's step). So a worker
index belongs to the first client that acts as that worker (a push, a
barrier or a stop carrying the index), and only that client's pushes,
``BARRIER`` and ``STOP_WORKER`` for that index are accepted; only its
requests count as that worker's signs of life.
Connecting (``HEARTBEAT``) and pulling claim nothing: a tool's client that
only reads (whose default index is 0) does not take a worker's place.

A client is named by the random 40-bit prefix of its request ids
(:mod:`pyfleet.service.channel`: one per process, then a 24-bit counter): a
peer cannot see another process's request ids, since replies go only to the
socket that asked. A counter carry moves a process's prefix up by one, which
is followed. This is not authentication (a peer that claims an index first,
before the real worker, keeps it): against hostile peers, CURVE keys are
(docs/operations.md, "Secure a cluster"); it stops a peer from speaking for
a worker that is running.

A restarted worker (a new process, a new prefix) takes its index over once
the previous owner has stopped (``STOP_WORKER``) or been silent for
``heartbeat_timeout``. A ``HEARTBEAT`` from another client is answered (it
is also how a client connects and learns the server's settings) but does not
count as the worker's; a push, ``BARRIER`` or ``STOP_WORKER`` from another
client is refused, naming the rule (a tool that pushes while a job runs needs
a worker index no running worker owns).

Thread-safe (one lock; the socket thread and the handler threads call it).
"""

import logging
import threading

from pyfleet.service.protocol import Refused

__all__ = ["Owners", "not_a_worker"]

log = logging.getLogger("pyfleet.server")

_PREFIX_SHIFT = 24  # request id = prefix << 24 | counter (pyfleet.service.channel)


class Owners:
    """The owner (request-id prefix) of each of ``worker_num`` worker indices."""

    def __init__(self, worker_num, heartbeat_timeout):
        self.heartbeat_timeout = float(heartbeat_timeout)
        self._owner = [None] * int(worker_num)
        self._heard = [0.0] * int(worker_num)
        self._lock = threading.Lock()

    def heard(self, worker, rid, now):
        """A request of ``worker``'s index arrived: the owner's clock moves on
        if it is the owner's. Whether it may count as the worker's sign of
        life (the owner's, or the index is not claimed yet)."""
        p = rid >> _PREFIX_SHIFT
        o = self._owner[worker]
        if o is None:
            return True
        if p == o or p == o + 1:
            with self._lock:
                if self._owner[worker] == o:
                    self._owner[worker] = max(o, p)
                    self._heard[worker] = now
            return True
        return False

    def claim(self, worker, rid, now, stopped, what, refuse=True, take=True):
        """Whether the client of request ``rid`` speaks for ``worker`` (claiming
        it when free, when its owner stopped or went silent; ``take=False``:
        True for a free index, claiming nothing). Otherwise refused
        (:class:`Refused` naming ``what``), or False with ``refuse=False``."""
        p = rid >> _PREFIX_SHIFT
        with self._lock:
            o = self._owner[worker]
            if o is not None and (p == o or p == o + 1):
                self._owner[worker], self._heard[worker] = max(o, p), now
                return True
            if o is None and not take:
                return True
            silent = now - self._heard[worker]
            if o is None or stopped or silent > self.heartbeat_timeout:
                if o is not None:
                    log.warning("worker %d is now spoken for by another client (the one "
                                "before %s)", worker, "stopped" if stopped else
                                f"was silent for {silent:.1f} s")
                self._owner[worker], self._heard[worker] = p, now
                return True
        if not refuse:
            return False
        raise Refused(f"{what} for worker {worker} refused: another client speaks for worker "
                      f"{worker} (it was heard {silent:.1f} s ago); a worker index belongs to "
                      f"the first client that used it, until that one stops or is silent for "
                      f"heartbeat_timeout={self.heartbeat_timeout:g} s")

    def pause(self, gap):
        """The server stalled for ``gap`` seconds: not its owners' silence."""
        with self._lock:
            self._heard = [t + gap for t in self._heard]


def not_a_worker(status, worker_num):
    """Why a push whose header names worker index ``status - 1`` (0: none) is
    refused: a job's model changes only through its workers' pushes; one
    naming no worker, or an index beyond ``worker_num``, would skip the owner
    rule (and in sync mode join a step no worker of the job pushed)."""
    who = ("it names no worker (worker index field 0: anonymous)" if status == 0 else
           f"worker index {status - 1} is not a worker of this job")
    return (f"push refused: {who}; this server takes pushes only from its job's workers "
            f"0..{worker_num - 1} (worker_num={worker_num})")

"""A server's answers to a worker's lifecycle requests: :class:`WorkerOps`.

``STOP_WORKER`` (``{"worker": w}``; ``"may_return": true`` for Fluid's lifecycle,
where the same worker may start again, see :mod:`pyfleet.distributed.worker_return`)
and ``JOIN`` (``{"worker": w}``: a worker that stopped with ``may_return`` is live
again), and the end of the job they decide (:meth:`Barriers.finished
<pyfleet.service.barrier.Barriers.finished>`). A mix-in of
:class:`pyfleet.service.server.Server`, whose lock, barriers, owner rule and
barrier releases it uses.
"""

import logging
import time

from pyfleet.service import protocol as P
from pyfleet.service.table_ops import control_payload

__all__ = ["WorkerOps"]

log = logging.getLogger("pyfleet.server")


class WorkerOps:
    """``STOP_WORKER`` and ``JOIN`` of a :class:`~pyfleet.service.server.Server`."""

    def _stop_worker(self, h, op, frames, ident):
        """``{"worker": w}``: w is done. ``"may_return": true``: done, but its process
        goes on and may start it again (:meth:`_join`) until it stops without it."""
        payload = control_payload(frames, op)
        w = self._worker_of(payload)
        with self._lock:
            self._claim(w, h, "STOP_WORKER")
            rel, finished = self.barriers.stop(w, time.monotonic(),
                                               may_return=bool(payload.get("may_return")))
            out = [[ident] + P.reply(h, payload={"stopped": sorted(self.barriers.stopped)})]
            out += self._release(rel)
            if finished:
                log.info("every worker stopped; server %d exits", self.server_index)
                self._done.set()
        return out

    def _join(self, h, op, frames, ident):
        """``{"worker": w}``: w (re)starts: a worker that stopped with ``may_return``
        is live again (Fluid's trainer calling ``init_worker`` after ``stop_worker``)."""
        w = self._worker_of(control_payload(frames, op))
        with self._lock:
            self._claim(w, h, "JOIN")
            if self.barriers.rejoin(w, time.monotonic()):
                log.info("worker %d started again after it stopped", w)
            return [[ident] + P.reply(h, payload={"stopped": sorted(self.barriers.stopped)})]

    def _end_if_finished(self, now):
        """Housekeeping (caller holds the lock): every worker stopped, and those that
        could start again fell silent: the server ends."""
        if self.failure is None and not self._done.is_set() and self.barriers.finished(now):
            log.info("every worker stopped (those that could start again fell silent for "
                     "%g s); server %d exits", self.heartbeat_timeout, self.server_index)
            self._done.set()

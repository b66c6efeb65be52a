"""Liveness and barriers of one server, without sockets: :class:`Barriers`.

The server tells a :class:`Barriers` what happens (a worker was heard from,
arrived at a barrier, pushed a sync-mode gradient, stopped) and what time it
is (``now``, seconds of ``time.monotonic()``); the object answers with
decisions: which waiting requests a completed barrier releases, whether a
barrier failed (a missing worker went silent, or it waited too long), and
whether the server should give up (every worker stopped or went silent, one at
least silent). Requests are opaque *tokens* here (the server's reply
envelopes), so every rule is testable with plain values and a fake clock.

Rules:

- A worker is *live* until it called ``stop_worker``. A barrier completes
  once every live worker waits at one.
- A *step* barrier (sync mode: the end of a training step) completes with the
  workers at it; workers waiting at a *pass* barrier (``fleet.barrier_worker``:
  done with their share) take no part in it, as stopped ones, and are released
  once every live worker is at the pass barrier. So workers with fewer
  batches wait for the others instead of releasing, or deadlocking, their
  steps.
- In sync mode the gradients pushed during a step are buffered here and handed
  back with the step barrier's release, to be averaged over the workers at it;
  a failed barrier drops them.
- A barrier fails when a missing live worker has been silent for
  ``heartbeat_timeout`` (dead), or when it waited ``barrier_timeout`` in all.
- The server gives up once every worker has stopped or gone silent for
  ``heartbeat_timeout``, at least one silent; a worker never heard from counts
  as gone once ``barrier_timeout`` has passed since serving began (it died
  before its first request).
- A worker may stop *and stay* (``may_return``: Fluid's lifecycle, where a
  trainer could stop and start training again while its pservers served): it
  is not live (barriers go on without it) but its process still counts, until
  it stops without ``may_return`` (at its exit) or falls silent for
  ``heartbeat_timeout``. It may :meth:`rejoin` meanwhile, live again. The job is
  :meth:`finished` once every worker has stopped and none stays.

The server's own stalls (a SIGSTOP, a starved process) are not the
workers' silence: the server reports them with :meth:`pause`, which moves
every clock here forward by the stall.

Not thread-safe: the server calls every method under its lock, except
:meth:`seen`, a single dict store.
"""

import time
from typing import NamedTuple

from pyfleet.service.protocol import Refused

__all__ = ["BARRIER_KINDS", "Barriers", "Failure", "Release", "Ticks"]

BARRIER_KINDS = ("step", "pass")


class Release(NamedTuple):
    """A completed barrier: answer every ``tokens`` request with barrier
    number ``count``; with ``sync`` (``{table id: [(worker, keys, grads)]}``,
    sync mode only) apply those gradients first, divided by ``workers``."""

    tokens: list
    count: int
    sync: dict
    workers: int


class Failure(NamedTuple):
    """A failed barrier: answer every ``tokens`` request with an error saying ``why``."""

    tokens: list
    why: str


class Barriers:
    """Barrier, liveness and stop state of one server for ``worker_num`` workers.

    ``sync``: buffer gradients (:meth:`buffer`) and release them with each
    step barrier (a sync-mode server)."""

    def __init__(self, worker_num, heartbeat_timeout, barrier_timeout, sync=False,
                 max_step_bytes=128 << 20):
        self.worker_num = int(worker_num)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.barrier_timeout = float(barrier_timeout)
        self.sync = bool(sync)
        self.waiting = {}        # worker -> (token, kind)
        self.started = None      # when the current barrier's first worker arrived
        self.count = 0           # barriers completed
        self.last_seen = {}      # worker -> last time heard from
        self.stopped = set()
        self.staying = set()     # stopped workers whose process may start them again
        self.serving_since = None
        self.sync_buf = {}       # table id -> [(worker, keys, grads)]
        self.max_step_bytes = int(max_step_bytes)
        self.step_bytes = {}     # worker -> sparse bytes buffered in this step

    def start(self, now):
        """The server begins serving (the clock of workers that never connect)."""
        self.serving_since = now

    def pause(self, gap, now):
        """The server itself was stalled for ``gap`` seconds up to ``now``
        (stopped, starved of CPU, or busy): nobody could be heard meanwhile,
        so that time is not the workers' silence. Every clock of this object
        moves forward by ``gap`` (never past ``now``)."""
        if gap <= 0:
            return
        self.last_seen = {w: min(t + gap, now) for w, t in self.last_seen.items()}
        if self.started is not None:
            self.started = min(self.started + gap, now)
        if self.serving_since is not None:
            self.serving_since = min(self.serving_since + gap, now)

    def seen(self, worker, now):
        """``worker`` sent something (a request carrying its index, a heartbeat)."""
        self.last_seen[worker] = now

    def buffer(self, worker, table_id, keys, grads):
        """Keep a sync-mode push until the step's barrier. A dense push
        (``keys`` None) adds to the worker's buffer of that block; sparse
        pushes are kept as they came, up to ``max_step_bytes`` a worker a step
        (beyond: :class:`Refused`, nothing kept)."""
        items = self.sync_buf.setdefault(table_id, [])
        if keys is None:
            for i, (w, _, held) in enumerate(items):
                if w == worker:  # a new sum: ``held`` may be a view of a message
                    items[i] = (w, None, held + grads)
                    return
            items.append((worker, None, grads))
            return
        size = keys.nbytes + grads.nbytes
        held = self.step_bytes.get(worker, 0)
        if held + size > self.max_step_bytes:
            raise Refused(f"sync push of worker {worker} refused: {held + size} bytes of sparse "
                          f"gradient in one step would exceed this server's max_step_bytes="
                          f"{self.max_step_bytes} (--max-step-bytes)")
        self.step_bytes[worker] = held + size
        items.append((worker, keys, grads))

    def live(self):
        return set(range(self.worker_num)) - self.stopped

    def arrive(self, worker, token, kind, now):
        """``worker`` waits at a barrier of ``kind`` (``"step"``/``"pass"``);
        its request is ``token``. Returns a :class:`Release` when this
        completes the barrier, else None. A worker already waiting is refused."""
        if kind not in BARRIER_KINDS:
            raise Refused(f"barrier kind must be 'step' or 'pass', got {kind!r}")
        self.last_seen[worker] = now
        if worker in self.waiting:
            raise Refused(f"worker {worker} is already waiting at this barrier")
        if not self.waiting:
            self.started = now
        self.waiting[worker] = (token, kind)
        return self._complete(now)

    def stop(self, worker, now, may_return=False):
        """``worker`` is done. Returns ``(release, finished)``: the barrier its
        leaving completes, if any, and whether the job is :meth:`finished`.
        ``may_return``: its process goes on and may :meth:`rejoin` (it stays
        until it stops without ``may_return``, or falls silent)."""
        self.stopped.add(worker)
        self.last_seen[worker] = now
        if may_return:
            self.staying.add(worker)
        else:
            self.staying.discard(worker)
        return self._complete(now), self.finished(now)

    def rejoin(self, worker, now):
        """A worker that stopped starts again (``fleet.init_worker()`` after
        ``stop_worker()``): live again, barriers wait for it. Whether it was
        stopped (False: it was live already, nothing changes)."""
        self.last_seen[worker] = now
        if worker not in self.stopped:
            return False
        self.stopped.discard(worker)
        self.staying.discard(worker)
        return True

    def finished(self, now):
        """Every worker has stopped, and none that stayed (``may_return``) is
        still heard from: one silent for ``heartbeat_timeout`` is taken to have
        ended (its process was killed after it stopped)."""
        if len(self.stopped) != self.worker_num:
            return False
        return all(now - self.last_seen.get(w, now) > self.heartbeat_timeout
                   for w in self.staying)

    def _complete(self, now):
        if not self.waiting or not self.live() <= self.waiting.keys():
            return None
        step = {w: v for w, v in self.waiting.items() if v[1] == "step"}
        release = step or self.waiting
        sync = {}
        if self.sync and step:
            sync, self.sync_buf, self.step_bytes = self.sync_buf, {}, {}
        self.count += 1
        tokens = [token for token, _ in release.values()]
        if step:
            self.waiting = {w: v for w, v in self.waiting.items() if v[1] != "step"}
            self.started = now if self.waiting else None
        else:
            self.waiting = {}
            self.started = None
        return Release(tokens, self.count, sync, len(step))

    def check(self, now):
        """A :class:`Failure` when the barrier in progress must fail (a missing
        worker silent for ``heartbeat_timeout``, or waiting longer than
        ``barrier_timeout``), else None. A failed barrier's buffered
        gradients are dropped."""
        if not self.waiting:
            return None
        missing = sorted(self.live() - self.waiting.keys())
        dead = [w for w in missing if w in self.last_seen
                and now - self.last_seen[w] > self.heartbeat_timeout]
        if dead:
            why = "; ".join(f"worker {w} sent nothing for "
                            f"{now - self.last_seen[w]:.1f} s (dead?)" for w in dead)
        elif now - self.started > self.barrier_timeout:
            why = (f"worker(s) {missing} did not reach the barrier within "
                   f"{self.barrier_timeout:g} s" if missing else
                   f"the barrier was not released within {self.barrier_timeout:g} s")
        else:
            return None
        tokens = [token for token, _ in self.waiting.values()]
        self.waiting = {}
        self.started = None
        self.sync_buf, self.step_bytes = {}, {}  # that step's gradients die with it
        return Failure(tokens, why)

    def abandoned(self, now):
        """Why the server should give up (a sentence), or None: every worker
        has stopped or gone silent, one at least silent (a killed worker never
        sends ``stop_worker``, and nothing is left to serve)."""
        live = self.live()
        gone = sorted(w for w in live if w in self.last_seen
                      and now - self.last_seen[w] > self.heartbeat_timeout)
        never = sorted(w for w in live if w not in self.last_seen)
        late = self.serving_since is not None and \
            now - self.serving_since > self.barrier_timeout
        if not ((gone or never) and len(self.stopped) + len(gone) + len(never) == self.worker_num
                and (self.stopped or gone) and (not never or late)):
            return None
        why = []
        if gone:
            why.append(f"worker(s) {gone} sent nothing for more than "
                       f"{self.heartbeat_timeout:g} s (dead?)")
        if never:
            why.append(f"worker(s) {never} never connected within "
                       f"{self.barrier_timeout:g} s")
        if self.stopped:
            why.append(f"worker(s) {sorted(self.stopped)} stopped")
        return "; ".join(why) + ": no worker is left to serve"


class Ticks:
    """The server's housekeeping clock (its ROUTER thread's): the time since it last
    ran (a long gap is the server's own stall, reported with :meth:`Barriers.pause`,
    not the workers' silence) and whether housekeeping is due (every 0.1 s)."""

    def __init__(self):
        self.start()

    def start(self):
        self.last, self.house = time.monotonic(), 0.0

    def gap(self, now):
        gap, self.last = now - self.last, now
        return gap

    def due(self, now):
        if now - self.house < 0.1:
            return False
        self.house = now
        return True

"""Checkpoints inside a pass (``--checkpoint-steps K`` / ``--checkpoint-every 5m``) and the
data position a restarted job resumes from.

A checkpoint inside a pass is a *round*: worker 0 decides it is due (every K of its steps,
or every T seconds), writes a request, and every worker, at the end of a step, sends what
it holds to the servers (:meth:`fleet.flush`) and writes its position (the batches and
examples of the pass it has trained, its running counts), then waits; a worker that has
finished the pass has written its end-of-pass position instead. Worker 0 then saves every
server's tables with those positions in the manifest's ``meta`` (``fleet.save_persistables``:
the manifest commits the save) and lets everyone go on. So the saved rows hold exactly the
steps the positions name, in async mode too.

In sync mode every worker still in the pass has taken the same number of steps, so worker 0
asks for the round at its *next* step (the others cannot finish that step without it, so
they see the request in time) and every worker stops after that same step: the step barrier
of the restarted job starts from the checkpoint's step.

The rendezvous files live in ``RUN_DIR/progress/rounds`` (one local machine's directory:
``pyfleet train`` starts every role here). Names carry the attempt (``PYFLEET_RESTART_COUNT``)
so a restarted job never reads a dead attempt's files.

The manifest's ``meta`` of a round: ``{"pass": <last whole pass>, "position": {"pass": p,
"round": r, "workers": {"0": {...}, "1": {...}}}}``; each worker's entry holds ``batches``
(of pass p, trained and saved), ``pass_examples``, ``examples`` (since the job's first pass),
``steps``, ``loss_sum``, ``train_seconds``, ``history``, (worker 0) ``evaluations``, and
its running AUC counters (:func:`counters`): ``train_stats`` (the statistics ``pyfleet
train`` reports as the train AUC and logloss) and ``auc_states`` (the auc layer's states in
its scope), bucket counts stored sparse (most are zero). A restart and ``--resume`` both
restore them with the counts, so the progress, the running AUC, the summary and the
metrics go on from the checkpoint's position as if the run had not stopped.
"""

import json
import logging
import os
import time

import numpy as np

from pyfleet._atomic import write_json
from pyfleet.fluid import global_scope
from pyfleet.metrics import MetricStats
from pyfleet.service import checkpoint as _checkpoint

log = logging.getLogger("pyfleet.trainer")

POLL = 0.005
FULL_EVERY = 4  # rounds saved as deltas between full saves (a pass end is always full)


def _write(path, obj):
    write_json(path, obj, durable=False)


def _read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _sparse(a):
    """``a`` as JSON: its nonzero entries (``at``, ``v``) while fewer than half are
    nonzero (bucket counts mostly are), else every entry (``v``)."""
    a = np.asarray(a)
    flat = a.reshape(-1)
    at = np.flatnonzero(flat)
    d = {"shape": list(a.shape), "dtype": str(a.dtype)}
    if 2 * at.size < flat.size:
        return {**d, "at": at.tolist(), "v": flat[at].tolist()}
    return {**d, "v": flat.tolist()}


def _dense(d):
    out = np.zeros(int(np.prod(d["shape"], dtype=np.int64)), dtype=d["dtype"])
    if "at" in d:
        out[np.asarray(d["at"], dtype=np.int64)] = d["v"]
    else:
        out[:] = d["v"]
    return out.reshape(d["shape"])


def counters(stats, names):
    """This worker's running AUC counters, for its position: ``stats`` (a
    :class:`MetricStats`) and the scope's values of the auc states ``names``."""
    d = json.loads(stats.to_json())
    d["pos"], d["neg"] = _sparse(stats.pos), _sparse(stats.neg)
    scope = global_scope().vars
    return {"train_stats": d, "auc_states": {n: _sparse(scope[n]) for n in names if n in scope}}


def restore_counters(position):
    """Put the auc states of ``position`` (see :func:`counters`) back into the
    scope; returns its train statistics (None when it holds none)."""
    scope = global_scope().vars
    for name, d in (position.get("auc_states") or {}).items():
        value = _dense(d)
        if name in scope and np.shape(scope[name]) != value.shape:
            raise ValueError(f"the checkpoint's auc state {name!r} has shape {value.shape}, "
                             f"this model's {np.shape(scope[name])}: another model")
        scope[name] = value
    d = position.get("train_stats")
    if d is None:
        return None
    return MetricStats.from_json(json.dumps({**d, "pos": _dense(d["pos"]).tolist(),
                                             "neg": _dense(d["neg"]).tolist()}))


def restore_position(job, wi, wn):
    """``(first_pass, state)`` of this job's start: the pass to start with, and this
    worker's position in it (None: from its start; ``state["restart"]``: restored by a
    restart of this job, whose counts go on, not by ``--resume``). The checkpoint is
    ``PYFLEET_RESTORE_DIR`` (a restarted job) when it holds one, else the ``--resume``
    run's; a position saved by another number of workers is not this job's shares, so
    the pass starts over (and says so)."""
    first = int(job["first_pass"])
    restore = os.environ.get("PYFLEET_RESTORE_DIR")
    where = None
    if restore and os.path.exists(os.path.join(restore, _checkpoint.MANIFEST_NAME)):
        where = restore
    elif job.get("resume"):
        where = os.path.join(job["resume"], "checkpoint")
    if where is None:
        return first, None
    meta = (_checkpoint.read_manifest(where) or {}).get("meta") or {}
    done = meta.get("pass")
    if where == restore:
        first = done + 1 if isinstance(done, int) and not isinstance(done, bool) else first
    pos = meta.get("position")
    if not isinstance(pos, dict) or pos.get("pass") != first:
        return first, None
    workers = pos.get("workers") or {}
    if len(workers) != wn:
        log.warning("worker %d: the checkpoint's position in pass %d is of %d workers, not "
                    "%d: the pass starts over", wi, first, len(workers), wn)
        return first, None
    mine = workers.get(str(wi))
    if mine is not None:  # a restart goes on with the job's counts; a --resume is a new run
        mine = {**mine, "restart": where == restore}
    return first, mine


class Rounds:
    """One worker's side of the checkpoints inside a pass (see the module)."""

    def __init__(self, run_dir, wi, wn, steps, seconds, sync, timeout):
        self.wi, self.wn, self.sync, self.timeout = wi, wn, sync, float(timeout)
        self.steps, self.seconds = steps, seconds
        self.enabled = bool(steps or seconds)
        self.dir = os.path.join(run_dir, "progress", "rounds")
        os.makedirs(self.dir, exist_ok=True)
        self.attempt = os.environ.get("PYFLEET_RESTART_COUNT", "0")
        self.epoch, self.round, self.at_step = None, 1, None
        self.last = time.monotonic()
        self.saved = 0
        self.pauses = []  # seconds each round stopped this worker

    def _path(self, what, r=None, w=None):
        name = f"a{self.attempt}.p{self.epoch}"
        if r is not None:
            name += f".r{r}"
        name += f".{what}"
        if w is not None:
            name += f".w{w}"
        return os.path.join(self.dir, name)

    def start_pass(self, epoch):
        self.epoch, self.round, self.at_step = epoch, 1, None
        self.last = time.monotonic()

    def after_step(self, batches, state, save):
        """Called after every step (``batches`` of this pass trained so far). ``state()``
        is this worker's position; ``save(meta, mode)`` (worker 0) saves the checkpoint."""
        if not self.enabled:
            return
        if self.wi == 0:
            if self.at_step is None and self._due(batches):
                self.at_step = batches + 1 if self.sync else batches
                _write(self._path("request", self.round), {"at_step": self.at_step
                                                            if self.sync else None})
            if self.at_step is not None and batches >= self.at_step:
                self._lead(state, save)
            return
        req = _read(self._path("request", self.round))
        if req is not None and (req["at_step"] is None or batches >= req["at_step"]):
            self._follow(state)

    def _due(self, batches):
        if self.steps and batches % self.steps == 0:
            return True
        return bool(self.seconds) and time.monotonic() - self.last >= self.seconds

    def _wait(self, ready, what):
        deadline = time.monotonic() + self.timeout
        while True:
            got = ready()
            if got is not None:
                return got
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.wi}: checkpoint round {self.round} of pass "
                                   f"{self.epoch}: {what} for more than {self.timeout:g} s")
            time.sleep(POLL)

    def _follow(self, state):
        t0 = time.monotonic()
        _flush()
        _write(self._path("ack", self.round, self.wi), state())
        done, ended = self._path("done", self.round), self._path("ended", w=0)
        self._wait(lambda: True if os.path.exists(done) or os.path.exists(ended) else None,
                   "waited for worker 0's save")
        self.pauses.append(time.monotonic() - t0)
        self.round += 1

    def _lead(self, state, save):
        t0 = time.monotonic()
        _flush()
        positions = {"0": state()}
        _write(self._path("ack", self.round, 0), positions["0"])  # a record, read by no one
        for w in range(1, self.wn):
            ack, ended = self._path("ack", self.round, w), self._path("ended", w=w)
            positions[str(w)] = self._wait(lambda a=ack, e=ended: _read(a) or _read(e),
                                           f"waited for worker {w}'s position")
        meta = {"pass": self.epoch - 1,
                "position": {"pass": self.epoch, "round": self.round, "workers": positions}}
        mode = "full" if self.saved % (FULL_EVERY + 1) == 0 else "delta"
        save(meta, mode)
        self.saved += 1
        _write(self._path("done", self.round), {})
        pause = time.monotonic() - t0
        self.pauses.append(pause)
        log.info("worker 0: checkpoint round %d of pass %d (%s) in %.2f s", self.round,
                 self.epoch, mode, pause)
        self.round += 1
        self.at_step = None
        self.last = time.monotonic()

    def end_pass(self, state):
        """This worker's share of the pass is trained: its end position answers any round
        asked from now on (worker 0's also cancels a round it asked but cannot reach), and
        gives the pass-end checkpoint every worker's counts. Before the pass barrier."""
        _flush()
        _write(self._path("ended", w=self.wi), state())

    def next_pass_position(self, own):
        """Worker 0, at the pass-end save (after the pass barrier: every worker wrote its
        end position): the position at the start of the next pass, so that a restart from
        this checkpoint keeps every worker's counts. None when one is missing."""
        workers = {"0": own}
        for w in range(1, self.wn):
            got = _read(self._path("ended", w=w))
            if got is None:
                return None
            workers[str(w)] = got
        for w in workers.values():
            w.update(batches=0, pass_examples=0)
        return {"pass": self.epoch + 1, "round": 0, "workers": workers}

    def summary(self):
        p = self.pauses
        return {"rounds": len(p), "pause_seconds_total": sum(p),
                "pause_seconds_max": max(p) if p else 0.0}


def _flush():
    """This worker's pushes all applied (a collective rank sends none)."""
    from pyfleet.distributed.fleet import fleet  # lazy: the module is importable alone
    if fleet._client is not None:
        fleet.flush()

"""A worker's progress files, read by ``pyfleet train``'s monitor: its running loss, AUC
and throughput (``RUN_DIR/progress/worker<i>.json``) and worker 0's phase events
(``RUN_DIR/progress/events.jsonl``)."""

import json
import time

import numpy as np

from pyfleet._atomic import append_line, write_json
from pyfleet.metrics import MetricStats


class _Progress:
    """Running loss/AUC and throughput of this worker.

    Every ``interval`` seconds (and at the end of every pass) the worker's
    cumulative counts are written to ``status_path``
    (``RUN_DIR/progress/worker<i>.json``, replaced whole): ``pyfleet train``
    sums every worker's into one line for the job and into ``metrics.jsonl``.
    The counts are additive (loss sums, AUC bucket counts), so the job's
    figures are exact, not averages of the workers'.

    Predictions are buffered and counted into the statistics a chunk at a
    time (at most ``_CHUNK`` examples, and at every report): a few large
    updates cost a fraction of one per batch."""

    _CHUNK = 1 << 15

    def __init__(self, interval, status_path, worker_index):
        self.stats = MetricStats()
        self.interval = float(interval)
        self.status_path = status_path
        self.worker = worker_index
        self.start = self.last = time.perf_counter()
        self.examples = 0
        self.steps = 0
        self.loss_sum = 0.0
        self.pass_start = 0  # examples before this pass
        # counts restored from a checkpoint's position, before this process trained
        self.base_examples, self.base_loss_sum = 0, 0.0
        self.pass_ends = {}  # pass -> examples when it ended (the test's step)
        self._preds, self._labels, self._buffered = [], [], 0

    def update(self, epoch, pred, labels, loss):
        n = labels.shape[0]
        self.examples += n
        self.steps += 1
        self.loss_sum += float(loss) * n
        self._preds.append(pred)
        self._labels.append(labels)
        self._buffered += n
        if self._buffered >= self._CHUNK:
            self.drain()
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.report(epoch, now=now)

    def drain(self):
        """Count the buffered predictions into ``stats``."""
        if not self._preds:
            return
        chunk = MetricStats().update(np.concatenate(self._preds), np.concatenate(self._labels))
        self._preds, self._labels, self._buffered = [], [], 0
        self.stats.merge(chunk)

    def report(self, epoch, now=None, done=False):
        self.drain()
        now = now or time.perf_counter()
        self.last = now
        if done:
            self.pass_ends[str(epoch)] = self.examples
        if not self.status_path:
            return
        status = {"pass_ends": self.pass_ends, "time": time.time(), "worker": self.worker, "pass": epoch,
                  "pass_done": done, "pass_examples": self.examples - self.pass_start,
                  "step": self.steps,
                  "examples": self.examples, "loss_sum": self.loss_sum,
                  "base_examples": self.base_examples, "base_loss_sum": self.base_loss_sum,
                  "seconds": now - self.start, "stats": self.stats.to_json()}
        _replace_json(self.status_path, status)

    def close(self):
        self.drain()


def _replace_json(path, obj):
    """Replace ``path`` by ``obj`` as JSON (a reader sees the old or the new
    file whole; no fsync: these files only report progress)."""
    write_json(path, obj, durable=False)


class _Events:
    """Worker 0's announcements of the job's phases, one JSON object a line in
    ``RUN_DIR/progress/events.jsonl``: ``pyfleet train`` prints them as they
    come and records the test results in ``metrics.jsonl``."""

    def __init__(self, path):
        self.path = path

    def __call__(self, event, **fields):
        if self.path is None:
            return
        append_line(self.path, json.dumps({"event": event, "time": time.time(), **fields}))

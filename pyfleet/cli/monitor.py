"""The job's one progress line, its phases and ``metrics.jsonl``, seen from ``pyfleet train``.

Workers do not print their progress: each replaces ``RUN_DIR/progress/worker<i>.json``
with its cumulative counts (loss sum, AUC bucket counts, examples, lines of the pass)
every ``--log-interval`` seconds, and worker 0 appends the job's phases to
``RUN_DIR/progress/events.jsonl`` (see :mod:`pyfleet.trainer`). :class:`Monitor`, a
thread of the ``pyfleet train`` process, sums the workers' counts into one line for the
job (the loss of the window since the previous line, the running AUC of every worker's
predictions together, examples/s, % of the pass and the ETA of the training), prints
the phases as they come, and writes both to ``RUN_DIR/metrics.jsonl``.
"""

import json
import os
import threading
import time

from pyfleet._atomic import append_line
from pyfleet.data.files import open_data
from pyfleet.metrics import MetricStats

__all__ = ["Monitor", "count_lines"]

# Inputs up to this size are counted exactly for the % of a pass; larger ones are
# estimated from the length of their first lines (exact from the second pass on).
COUNT_LIMIT = 256 << 20


def count_lines(files, header_lines=0):
    """The data lines of ``files`` (plain or gzip), exact when small, else estimated;
    None when unknown (a large gzip file)."""
    total = 0
    big = sum(os.path.getsize(f) for f in files) > COUNT_LIMIT
    for path in files:
        try:
            f, raw = open_data(path)
        except OSError:
            return None
        try:
            if not big:
                n, last = 0, b"\n"
                while True:
                    block = f.read(1 << 20)
                    if not block:
                        break
                    n += block.count(b"\n")
                    last = block[-1:]
                n += last != b"\n"
            elif raw is not None:
                return None
            else:
                head = f.read(1 << 16)
                lines = head.count(b"\n")
                if not lines:
                    continue
                n = os.path.getsize(path) * lines // len(head[:head.rfind(b"\n") + 1])
        except (OSError, EOFError):  # unreadable or truncated: the reader names it
            return None
        finally:
            f.close()
            if raw is not None:
                raw.close()
        total += max(n - header_lines, 0) if n else 0
    return total


def _finite(x):
    return x if x == x and abs(x) != float("inf") else None


def _fmt(x):
    return "-" if x is None else f"{x:.4f}"


def _clock(seconds):
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class Monitor(threading.Thread):
    """Polls the workers' progress files every ``interval`` seconds until :meth:`finish`.

    ``say`` prints a line (nothing under ``--quiet``: pass a no-op); ``total_lines``
    is the training data's line count (None: no % and no ETA until a pass ends)."""

    def __init__(self, run_dir, workers, first_pass, last_pass, total, interval, say):
        super().__init__(name="pyfleet-monitor", daemon=True)
        self.dir = os.path.join(run_dir, "progress")
        self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
        self.workers, self.first, self.last = workers, first_pass, last_pass
        self.total = total
        self.interval = max(float(interval), 0.05)
        self.say = say
        self.stopping = threading.Event()
        self.events_offset = 0
        self.prev = None  # (time, examples, loss_sum) of the previous line
        self.current_pass = None
        self.saved_pass = None
        self.lock = threading.Lock()
        self.listeners = []  # callables given every record metrics.jsonl gets (--tensorboard)

    def run(self):
        while not self.stopping.wait(self.interval):
            self.poll()

    def finish(self):
        """Stop polling, then report what the workers wrote since the last poll."""
        self.stopping.set()
        self.join(timeout=10)
        self.poll()

    def poll(self):
        with self.lock:
            try:
                self._events()
                self._progress()
            except (OSError, ValueError) as e:  # a half-written file: the next poll reads it
                self.say(f"(progress unavailable: {e})")

    def _record(self, record):
        if self.metrics_path is not None:
            try:
                append_line(self.metrics_path, json.dumps(record))
            except OSError as e:  # a full disk: said once, in one line
                self.say(f"{e}; the metrics are no longer recorded there")
                self.metrics_path = None
        for listener in self.listeners:
            listener(record)

    def _events(self):
        path = os.path.join(self.dir, "events.jsonl")
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            f.seek(self.events_offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.events_offset += end
        for line in data[:end].splitlines():
            e = json.loads(line)
            self._event(e)

    def _event(self, e):
        kind, n = e["event"], e.get("pass")
        if kind == "pass":
            self._progress(upto=n - 1)  # the previous pass's last counts first
            self.current_pass = n
            self.say(f"pass {n}/{e.get('last', self.last)}: training")
        elif kind == "test":
            self._progress(upto=n)
            self.say(f"pass {n}: evaluating on the test data")
        elif kind == "tested":
            auc, loss = e.get("test_auc"), e.get("test_logloss")
            cal, ne = e.get("test_calibration"), e.get("test_ne")
            self.say(f"pass {n}: test AUC {_fmt(auc)} logloss {_fmt(loss)} calibration "
                     f"{_fmt(cal)} NE {_fmt(ne)} ({e.get('test_examples', 0):,} examples)")
            self._record({"time": e["time"], "pass": n, "test_auc": auc, "test_logloss": loss,
                          "test_calibration": cal, "test_ne": ne,
                          "test_examples": e.get("test_examples"),
                          "examples": self._examples_at_end(n)})
        elif kind == "saving":
            self.say(f"pass {n}: saving the checkpoint to {e['path']}")
        elif kind == "saved":
            self.saved_pass = n
            extra = []
            if e.get("kept"):
                extra.append("kept: pass " + ", ".join(str(k) for k in e["kept"]))
            if e.get("best") is not None:
                extra.append(f"best so far: pass {e['best']}")
            self.say(f"pass {n}: checkpoint saved" + (f" ({'; '.join(extra)})" if extra
                                                       else ""))
        elif kind == "export":
            self.say(f"exporting the inference model to {e['path']}")

    def _examples_at_end(self, n):
        """The job's examples when pass ``n`` ended (every worker's count then), the
        step its test belongs to; the last progress line's when a worker does not say."""
        ends = [s.get("pass_ends", {}).get(str(n)) for s in self._statuses()]
        if len(ends) == self.workers and all(isinstance(x, int) for x in ends):
            return sum(ends)
        return self.prev[1] if self.prev else None

    def _statuses(self):
        out = []
        for i in range(self.workers):
            try:
                with open(os.path.join(self.dir, f"worker{i}.json")) as f:
                    out.append(json.load(f))
            except FileNotFoundError:
                continue
        return out

    def _progress(self, upto=None):
        """Print and record the job's line; ``upto``: not when a worker is past that
        pass already (the events of a finished job are read after its last counts)."""
        st = self._statuses()
        if not st or (upto is not None and max(s["pass"] for s in st) > upto):
            return
        examples = sum(s["examples"] for s in st)
        loss_sum = sum(s["loss_sum"] for s in st)
        now = time.time()
        # The first line's window starts at what the workers restored from a checkpoint
        # (their counts go on from its position), not at 0 examples.
        t0, e0, l0 = self.prev or (now - max(s["seconds"] for s in st),
                                   sum(s.get("base_examples", 0) for s in st),
                                   sum(s.get("base_loss_sum", 0.0) for s in st))
        if examples <= e0:  # nothing trained since (a resumed worker whose share was done)
            return
        self.prev = (now, examples, loss_sum)
        loss = (loss_sum - l0) / (examples - e0)
        rate = (examples - e0) / max(now - t0, 1e-9)
        merged = MetricStats.sum([MetricStats.from_json(s["stats"]) for s in st])
        auc = merged.auc()
        pass_now = min(s["pass"] for s in st)
        if len(st) == self.workers and all(s["pass_done"] for s in st) and (
                self.total is None or all(s["pass"] == pass_now for s in st)):
            # a whole pass was read: its exact size for the next passes' %
            self.total = sum(s["pass_examples"] for s in st) or self.total
        record = {"time": now, "pass": pass_now, "examples": examples,
                  "examples_per_sec": rate, "loss": loss, "auc": auc,
                  "calibration": _finite(merged.calibration()),
                  "ne": _finite(merged.normalized_entropy())}
        resumed = sum(s.get("base_examples", 0) for s in st)
        if resumed:  # the counts went on from a checkpoint's (TensorBoard's step needs it)
            record["resumed_from"] = resumed
        line = f"pass {pass_now}/{self.last}"
        if self.total:
            share = self.total / self.workers
            done = [(s["pass"] - self.first) + (1.0 if s["pass_done"] else
                                                min(s["pass_examples"] / share, 1.0))
                    for s in st] + [0.0] * (self.workers - len(st))
            overall = sum(done) / self.workers
            frac = 1.0 if all(s["pass_done"] for s in st) and len(st) == self.workers \
                else min(overall - (pass_now - self.first), 1.0)
            record["pass_fraction"] = frac
            line += f"  {frac:4.0%}"
            elapsed = max(s["seconds"] for s in st)
            passes = self.last - self.first + 1
            # this run's own rate: a resumed run's restored share took no time here
            trained = examples - sum(s.get("base_examples", 0) for s in st)
            if 0 < overall < passes and trained > 0 and elapsed > 0:
                eta = (passes - overall) * self.total / (trained / elapsed)
                record["eta_seconds"] = eta
                line += f"  ETA {_clock(eta)}"
        line += (f"  {examples:>10,} examples  {rate:>8,.0f} ex/s  loss {loss:.4f}  "
                 f"AUC {auc:.4f}")
        self._record(record)
        self.say(line)

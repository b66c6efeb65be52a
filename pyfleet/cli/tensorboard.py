"""``pyfleet train --tensorboard``: the job's progress and every pass's test as
TensorBoard scalars in ``RUN_DIR/tensorboard`` (``tensorboard --logdir runs`` then
compares runs), written live as the progress line is, through tensorboardX (the
optional ``tensorboard`` extra).

Scalars, against the examples trained (the step): ``train/loss`` (the logloss of
each progress window), ``train/auc`` (running), ``train/examples_per_sec``,
``test/auc`` and ``test/logloss`` after each pass. A run resumed in place goes on
from the examples its first run reached.
"""

import json
import os

from pyfleet._extras import install_hint

DIRNAME = "tensorboard"
NEEDS = f"pyfleet train: --tensorboard needs tensorboardX: {install_hint('tensorboard')}"


def check_available():
    """Refuse ``--tensorboard`` by name, before anything is written, without tensorboardX."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        raise SystemExit(NEEDS) from None


def _examples_so_far(run_dir):
    """The examples the progress records of ``run_dir``'s metrics.jsonl reached (0)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    last = 0
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if "loss" in r and isinstance(r.get("examples"), int):
                    last = max(last, r["examples"])
    return last


class TensorBoard:
    """Turns the monitor's records (``Monitor.listeners``) into event files."""

    def __init__(self, run_dir):
        from tensorboardX import SummaryWriter
        self.path = os.path.join(run_dir, DIRNAME)
        self.offset = _examples_so_far(run_dir)
        self.step = self.offset
        self.writer = SummaryWriter(logdir=self.path, flush_secs=5)

    def add(self, record):
        t = record.get("time")
        if record.get("resumed_from"):
            self.offset = 0  # the workers' counts went on from the checkpoint's position
        if "loss" in record:
            self.step = self.offset + int(record["examples"])
            for tag, key in (("train/loss", "loss"), ("train/auc", "auc"),
                             ("train/examples_per_sec", "examples_per_sec")):
                if record.get(key) is not None:
                    self.writer.add_scalar(tag, record[key], self.step, walltime=t)
        elif record.get("test_auc") is not None:
            step = self.step if record.get("examples") is None else \
                self.offset + int(record["examples"])
            self.writer.add_scalar("test/auc", record["test_auc"], step, walltime=t)
            if record.get("test_logloss") is not None:
                self.writer.add_scalar("test/logloss", record["test_logloss"], step,
                                       walltime=t)

    def close(self):
        self.writer.close()

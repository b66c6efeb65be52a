"""`pyfleet train --tensorboard`: the progress and every pass's test as
TensorBoard scalars in RUN_DIR/tensorboard, read back from the event files (TFRecord
framing, tensorboardX's Event protobuf) and checked against metrics.jsonl; without
tensorboardX the option is refused by name before anything is written."""

import glob
import json
import os
import struct

import pytest
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--rows", "6000", "--workers", "1", "--layers", "8", "--embedding-dim", "4",
         "--mode", "sync", "--log-interval", "0.05"]



def _scalars(logdir):
    """``{tag: [(step, value), ...]}`` of every event file under ``logdir``."""
    from tensorboardX.proto import event_pb2
    out = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4  # length, its crc, the record, its crc
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_tensorboard_scalars_match_the_metrics(tmp_path):
    pytest.importorskip("tensorboardX", reason="tensorboardX missing: pip install "
                                               "'.[tensorboard]' to test --tensorboard")
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--epochs", "2", "--tensorboard", "--run-dir", run, "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["tensorboard"] == str(run / "tensorboard")
    scalars = _scalars(run / "tensorboard")
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    progress = [x for x in records if "loss" in x]
    assert progress
    for tag, key in (("train/loss", "loss"), ("train/auc", "auc")):
        assert [s for s, _ in scalars[tag]] == [x["examples"] for x in progress]
        assert [v for _, v in scalars[tag]] == pytest.approx([x[key] for x in progress],
                                                             rel=1e-6)
    tests = [x for x in records if x.get("test_auc") is not None]
    assert len(tests) == 2
    assert [v for _, v in scalars["test/auc"]] == pytest.approx(
        [x["test_auc"] for x in tests], rel=1e-6)
    assert [v for _, v in scalars["test/logloss"]] == pytest.approx(
        [x["test_logloss"] for x in tests], rel=1e-6)


def test_a_pass_test_is_logged_at_the_examples_its_pass_ended(tmp_path):
    """Passes shorter than the progress interval: no progress line came before the test
    (pass 1's test AUC was logged at step 0)."""
    pytest.importorskip("tensorboardX", reason="tensorboardX missing")
    run = tmp_path / "run"
    args = [a if a != "0.05" else "600" for a in SMALL]
    r = pyfleet("train", *args, "--epochs", "2", "--tensorboard", "--run-dir", run, "--json",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    per_pass = json.loads(r.stdout)["train_examples"] // 2
    scalars = _scalars(run / "tensorboard")
    assert [s for s, _ in scalars["test/auc"]] == [per_pass, 2 * per_pass]


def test_without_tensorboardx_the_option_is_refused_by_name(tmp_path):
    fake = tmp_path / "fake" / "tensorboardX"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no tensorboardX here')\n")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    r = pyfleet("train", *SMALL, "--tensorboard", "--run-dir", tmp_path / "run", cwd=tmp_path,
                env=env)
    assert r.returncode != 0
    # a hint right outside the checkout too: the extra's own packages
    assert r.stderr.strip() == ('pyfleet train: --tensorboard needs tensorboardX: pip install '
                                '"tensorboardX>=2.1" (pyfleet\'s "tensorboard" extra)')
    assert not (tmp_path / "run").exists()

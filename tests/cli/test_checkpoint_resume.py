"""``pyfleet train --resume DIR`` continues a run from its last checkpoint."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pyfleet.service import checkpoint as _checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Sync mode: two workers' averaged steps do not depend on which arrives first,
# so a run is repeatable and a resumed run can be compared with an uninterrupted
# one exactly. (Async runs this short differ by up to 0.3 in pass-1 loss from
# run to run, more than the resume is meant to save.)
ARGS = ["--rows", "8000", "--servers", "2", "--workers", "2", "--layers", "16",
        "--embedding-dim", "4", "--lr", "0.01", "--batch-size", "256", "--seed", "4",
        "--mode", "sync"]


def _train(run_dir, *extra):
    """Run ``pyfleet train``; ``({pass: example-weighted training loss}, test
    predictions)`` (the losses from worker 0's progress lines)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--run-dir",
                        str(run_dir), *extra], env=env, capture_output=True, text=True, check=False,
                       timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(os.path.join(run_dir, "summary.json")) as f:
        losses = {int(k): v for k, v in json.load(f)["train_loss_by_pass"].items()}
    with np.load(os.path.join(run_dir, "worker0.test.npz")) as z:
        pred = z["pred"]
    return losses, pred


def test_resumed_run_goes_on_as_an_uninterrupted_one(tmp_path):
    first, _ = _train(tmp_path / "a", "--epochs", "2")
    m = _checkpoint.read_manifest(tmp_path / "a" / "checkpoint")
    assert m["server_num"] == 2 and [g["mode"] for g in m["chain"]] == ["full"]
    assert m["meta"]["pass"] == 2
    resumed, resumed_pred = _train(tmp_path / "b", "--epochs", "1", "--resume",
                                   str(tmp_path / "a"))
    straight, straight_pred = _train(tmp_path / "c", "--epochs", "3")
    print(f"\ntraining loss per pass: first run {first}; resumed run {resumed}; "
          f"uninterrupted {straight}")
    # the resumed run's summary covers the whole run: passes 1 and 2 are the first run's
    assert list(first) == [1, 2] and list(resumed) == [1, 2, 3] and list(straight) == [1, 2, 3]
    for k in (1, 2):
        assert resumed[k] == first[k]
    assert first[2] < first[1]
    # the same passes, in the same order, from the same parameters: a resumed
    # pass 3 is the uninterrupted run's pass 3 (from scratch it would be near
    # first[1]), and so is the model it leaves
    for k in (1, 2):
        assert straight[k] == pytest.approx(first[k], rel=1e-5)
    assert resumed[3] == pytest.approx(straight[3], rel=1e-5)
    assert resumed[3] < first[2] < first[1]
    np.testing.assert_allclose(resumed_pred, straight_pred, rtol=1e-4, atol=1e-6)
    assert _checkpoint.read_manifest(tmp_path / "b" / "checkpoint")["meta"]["pass"] == 3
    # another architecture than job.json's: refused by name before anything is
    # written (loaded, the 16-wide layer's blocks would fill an 8-wide one)
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--layers", "8",
                        "--run-dir", str(tmp_path / "d"), "--resume", str(tmp_path / "a")],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0 and "--layers 8 conflicts with the run resumed (16 in " in p.stderr
    assert not (tmp_path / "d").exists()


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--run-dir",
                        str(tmp_path / "b"), "--resume", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0 and "no checkpoint there" in p.stderr


def test_resume_from_a_damaged_manifest_is_refused_by_name(tmp_path):
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "MANIFEST.json").write_text('{"format": "pyfleet-chec')
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--run-dir",
                        str(tmp_path / "b"), "--resume", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0 and "MANIFEST.json is unreadable" in p.stderr, p.stderr[-1000:]

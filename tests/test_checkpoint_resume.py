"""``pyfleet train --resume DIR`` continues a run from its last checkpoint."""

import json
import os
import subprocess
import sys

import pytest

from pyfleet import _checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARGS = ["--rows", "8000", "--servers", "2", "--workers", "2", "--layers", "16",
        "--embedding-dim", "4", "--lr", "0.01", "--batch-size", "256", "--seed", "4"]


def _train(run_dir, *extra):
    """Run ``pyfleet train``; the example-weighted training loss of each pass
    (from worker 0's progress lines)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--run-dir",
                        str(run_dir), *extra], env=env, capture_output=True, text=True, check=False,
                       timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    sums, seen = {}, 0
    for m in lines:
        n = m["examples"] - seen
        seen = m["examples"]
        loss, count = sums.get(m["pass"], (0.0, 0))
        sums[m["pass"]] = (loss + m["loss"] * n, count + n)
    return [sums[k][0] / sums[k][1] for k in sorted(sums)]


def test_resumed_run_starts_where_the_first_ended(tmp_path):
    first = _train(tmp_path / "a", "--epochs", "2")
    m = _checkpoint.read_manifest(tmp_path / "a" / "checkpoint")
    assert m["server_num"] == 2 and [g["mode"] for g in m["chain"]] == ["full"]
    (resumed,) = _train(tmp_path / "b", "--epochs", "1", "--resume", str(tmp_path / "a"))
    print(f"\ntraining loss per pass: first run {first[0]:.4f}, {first[1]:.4f}; resumed "
          f"run {resumed:.4f}")
    assert first[1] < first[0]
    # from scratch, pass 1 would again be near first[0]; resumed, it goes on
    # from first[1] (one more pass over the same rows: a little lower still)
    assert resumed < first[1] + 0.25 * (first[0] - first[1])


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", *ARGS, "--run-dir",
                        str(tmp_path / "b"), "--resume", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode != 0 and "no checkpoint there" in p.stderr

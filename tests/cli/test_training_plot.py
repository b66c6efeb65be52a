"""The training plot of `pyfleet train`: the summary names it; it draws the
train loss and AUC against the examples, every pass's test AUC, the pass boundaries,
the ground truth's AUC of generated data and a title saying what ran. What it drew is
read back from the figure into training.plot.json, which the test checks against the
run's metrics; the PNG is opened."""

import json
import os
import struct

import pytest
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--rows", "6000", "--workers", "1", "--layers", "8", "--embedding-dim", "4",
         "--mode", "sync", "--log-interval", "0.05"]



def test_plot_shows_what_ran(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib missing: pip install '.[plot]' "
                                             "to test the training plot")
    import matplotlib.pyplot as plt
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--epochs", "3", "--model", "widedeep", "--run-dir", run,
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    png = run / "training.png"
    assert f"plot                       {png}" in r.stdout or \
        any(line.split() == ["plot", str(png)] for line in r.stdout.splitlines())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["plot"] == str(png)
    # a valid PNG of nonzero size, which matplotlib reads back
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    width, height = struct.unpack(">II", head[16:24])
    assert width > 100 and height > 100
    assert plt.imread(str(png)).shape[:2] == (height, width)
    drawn = json.loads((run / "training.plot.json").read_text())
    title = drawn["title"]
    for part in ("widedeep", "emb 4", "layers 8", "adam", "1 server(s) x 1 worker(s) sync",
                 "generated data"):
        assert part in title, title
    loss_ax, auc_ax, calibration_ax = drawn["axes"]
    assert calibration_ax["ylabel"] == "predicted / actual CTR"
    assert loss_ax["xlabel"] == auc_ax["xlabel"] == "examples trained"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    progress = [x for x in records if "loss" in x]
    train_loss = loss_ax["lines"]["train logloss (window)"]
    assert train_loss["x"] == [x["examples"] for x in progress]
    assert train_loss["y"] == pytest.approx([x["loss"] for x in progress])
    assert auc_ax["lines"]["train AUC (running)"]["y"] == pytest.approx(
        [x["auc"] for x in progress])
    tests = auc_ax["lines"]["test AUC after each pass"]
    assert tests["y"] == pytest.approx([p["test_auc"] for p in summary["passes"]])
    per_pass = summary["train_examples"] / 3
    assert tests["x"] == pytest.approx([per_pass, 2 * per_pass, 3 * per_pass])
    truth = auc_ax["lines"]["ground truth's test AUC"]["y"]
    assert truth == pytest.approx([summary["truth_auc_test"]] * 2)
    cal = calibration_ax["lines"]
    assert cal["train calibration (running)"]["y"] == pytest.approx(
        [x["calibration"] for x in progress])
    assert cal["test calibration after each pass"]["y"] == pytest.approx(
        [p["test_calibration"] for p in summary["passes"]])
    for ax in (loss_ax, auc_ax, calibration_ax):  # the ends of passes 1 and 2
        assert ax["pass_boundaries"] == pytest.approx([per_pass, 2 * per_pass])


def test_without_matplotlib_the_summary_says_how_to_get_the_plot(tmp_path):
    fake = tmp_path / "fake" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    r = pyfleet("train", *SMALL, "--run-dir", tmp_path / "run", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ('none (needs matplotlib: pip install "matplotlib>=3.5" (pyfleet\'s "plot" '
            'extra))') in r.stdout
    assert not (tmp_path / "run" / "training.png").exists()

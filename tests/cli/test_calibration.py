"""Calibration (predicted / actual CTR) and normalized entropy (logloss over the actual
CTR's entropy), TorchRec's standard metrics, against plain numpy: in the metrics module,
in `pyfleet train`'s summary and metrics.jsonl."""

import json

import numpy as np
import pytest
from support.cli import pyfleet

from pyfleet.metrics import MetricStats, calibration, normalized_entropy


def _reference(pred, label):
    p = np.clip(pred.astype(np.float64), 1e-15, 1 - 1e-15)
    y = label.astype(np.float64)
    ll = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    ctr = y.mean()
    h = -(ctr * np.log(ctr) + (1 - ctr) * np.log(1 - ctr))
    return pred.astype(np.float64).sum() / y.sum(), ll / h


def test_metrics_match_numpy():
    rng = np.random.default_rng(5)
    label = (rng.random(5000) < 0.2).astype(np.int64)
    pred = np.clip(0.15 + 0.3 * label + rng.normal(0, 0.1, 5000), 0.01, 0.99).astype(np.float32)
    cal, ne = _reference(pred, label)
    assert calibration(pred, label) == pytest.approx(cal, rel=1e-9)
    assert normalized_entropy(pred, label) == pytest.approx(ne, rel=1e-9)
    halves = [MetricStats().update(pred[:2000], label[:2000]),
              MetricStats().update(pred[2000:], label[2000:])]
    merged = MetricStats.sum(halves)
    assert merged.calibration() == pytest.approx(cal, rel=1e-6)
    assert merged.normalized_entropy() == pytest.approx(ne, rel=1e-6)
    # a constant prediction at the actual CTR: calibrated, NE 1
    const = np.full(5000, label.mean(), dtype=np.float64)
    assert calibration(const, label) == pytest.approx(1.0)
    assert normalized_entropy(const, label) == pytest.approx(1.0, rel=1e-6)
    assert np.isnan(calibration(pred, np.zeros_like(label)))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_reports_calibration_and_ne(tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", "--rows", 6000, "--layers", "8", "--embedding-dim", 4, "--epochs", 2,
                "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "test calibration" in r.stdout and "test normalized entropy" in r.stdout
    summary = json.loads((run / "summary.json").read_text())
    parts = [np.load(run / f"worker{i}.test.npz") for i in range(2)]
    pred = np.concatenate([p["pred"] for p in parts])
    label = np.concatenate([p["label"] for p in parts])
    cal, ne = _reference(pred, label)
    assert summary["test_calibration"] == pytest.approx(cal, rel=1e-6)
    assert summary["test_ne"] == pytest.approx(ne, rel=1e-6)
    assert summary["passes"][-1]["test_calibration"] == pytest.approx(cal, rel=1e-6)
    assert 0 < summary["train_ne"] < 1.2 and 0.5 < summary["train_calibration"] < 2
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    tests = [x for x in records if x.get("test_auc") is not None]
    assert [x["test_ne"] for x in tests] == pytest.approx(
        [p["test_ne"] for p in summary["passes"]])
    assert all("calibration" in x and "ne" in x for x in records if "loss" in x)

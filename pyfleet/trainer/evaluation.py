"""The test after every pass and the job's summary: the AUC and logloss of every worker's
predictions together, never an average of the workers'."""

import contextlib
import json
import os

import numpy as np

from pyfleet.data.readers import describe_malformed
from pyfleet.metrics import MetricStats, calibration, exact_auc, logloss, normalized_entropy
from pyfleet.trainer.job import feed_of


def _finite(x):
    """A float that JSON (and a manifest's meta) can hold: NaN becomes None."""
    x = float(x)
    return x if np.isfinite(x) else None


def _evaluate(exe, program, model, data):
    """``(pred, label)`` of every example of ``data``."""
    preds, labels = [], []
    for batch in data:
        (pred,) = exe.run(program, feed=feed_of(batch, model), fetch_list=[model.predict])
        preds.append(pred.reshape(-1))
        labels.append(batch.labels)
    if not preds:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(preds), np.concatenate(labels)


def _pass_metrics(run_dir, epoch, workers):
    """The test AUC and logloss of pass ``epoch`` over every worker's
    predictions together (exact, not an average of the workers')."""
    parts = [np.load(_test_file(run_dir, epoch, i)) for i in range(workers)]
    pred = np.concatenate([p["pred"] for p in parts])
    label = np.concatenate([p["label"] for p in parts])
    if label.shape[0] == 0:
        return {"pass": epoch, "test_examples": 0, "test_auc": None, "test_logloss": None,
                "test_calibration": None, "test_ne": None}
    return {"pass": epoch, "test_examples": int(label.shape[0]),
            "test_auc": _finite(exact_auc(pred, label)),
            "test_logloss": _finite(logloss(pred, label)),
            "test_calibration": _finite(calibration(pred, label)),
            "test_ne": _finite(normalized_entropy(pred, label))}


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _test_file(run_dir, epoch, worker):
    return os.path.join(run_dir, "progress", f"test-pass{epoch}.worker{worker}.npz")


def _malformed_of(data):
    """``{"malformed", "first_malformed": ["file:line: reason", ...]}`` of a
    dataset's latest pass."""
    st = data.stats()
    return {"malformed": st["malformed"], "first_malformed": describe_malformed(st)}


def summarize(run_dir, workers):
    """Combine every worker's file into the job summary (a JSON-friendly dict)."""
    results = []
    for i in range(workers):
        with open(os.path.join(run_dir, f"worker{i}.json")) as f:
            results.append(json.load(f))
    test = MetricStats.sum([MetricStats.from_json(r["test_stats"]) for r in results])
    train = MetricStats.sum([MetricStats.from_json(r["train_stats"]) for r in results])
    summary = {"workers": workers, "train_examples": sum(r["examples"] for r in results)}
    seconds = max(r["train_seconds"] for r in results)
    summary["train_seconds"] = seconds
    # CPU of the workers' training loops (all threads: parsing, pushes), summed.
    summary["train_cpu_seconds"] = sum(r.get("train_cpu_seconds", 0.0) for r in results)
    summary["train_examples_per_sec"] = summary["train_examples"] / max(seconds, 1e-9)
    summary["train_logloss"] = train.logloss()
    summary["train_auc"] = train.auc()
    summary["train_calibration"] = _finite(train.calibration())
    summary["train_ne"] = _finite(train.normalized_entropy())
    # Malformed lines skipped in the last pass (each worker reads its own share).
    last = [r["passes"][-1] for r in results if r.get("passes")]
    summary["train_malformed"] = sum(p.get("malformed", 0) for p in last)
    summary["first_malformed"] = [m for p in last for m in p.get("first_malformed", [])][:3]
    tests = [r.get("test_read") or {} for r in results]
    summary["test_malformed"] = sum(t.get("malformed", 0) for t in tests)
    summary["first_test_malformed"] = [m for t in tests for m in t.get("first_malformed", [])][:3]
    parts = [np.load(os.path.join(run_dir, f"worker{i}.test.npz"))
             for i in range(workers)
             if os.path.exists(os.path.join(run_dir, f"worker{i}.test.npz"))]
    if parts:
        pred = np.concatenate([p["pred"] for p in parts])
        label = np.concatenate([p["label"] for p in parts])
        summary["test_examples"] = int(label.shape[0])
        summary["test_auc"] = float(exact_auc(pred, label))
        summary["test_auc_bucketed"] = test.auc()
        summary["test_logloss"] = float(logloss(pred, label))
        summary["test_calibration"] = _finite(calibration(pred, label))
        summary["test_ne"] = _finite(normalized_entropy(pred, label))
    # Each pass's mean training loss over every worker's examples (cumulative sums).
    by_pass = {}
    for r in results:
        seen = loss = 0.0
        for p in r.get("passes", []):
            if "loss_sum" in p:
                n, s = by_pass.get(p["pass"], (0, 0.0))
                by_pass[p["pass"]] = (n + p["examples"] - seen, s + p["loss_sum"] - loss)
                seen, loss = p["examples"], p["loss_sum"]
    summary["train_loss_by_pass"] = {str(k): s / n for k, (n, s) in sorted(by_pass.items())
                                     if n}
    if results[0].get("checkpoint_rounds"):  # worker 0's pauses for checkpoints in passes
        summary["checkpoint_rounds"] = results[0]["checkpoint_rounds"]
    if results[0].get("evaluations"):
        summary["passes"] = results[0]["evaluations"]
    if results[0].get("best"):
        summary["best_pass"] = results[0]["best"]["pass"]
        summary["best_test_auc"] = results[0]["best"]["test_auc"]
        summary["best_checkpoint"] = results[0]["best"]["checkpoint"]
    servers = results[0].get("servers") or []
    rows = {}
    for s in servers:
        for name, t in s.get("tables", {}).items():
            if "rows" in t:
                rows[name] = rows.get(name, 0) + int(t["rows"])
    summary["table_rows"] = rows
    summary["server_rss_bytes"] = [int(s.get("rss_bytes", 0)) for s in servers]
    summary["server_peak_rss_bytes"] = [int(s.get("peak_rss_bytes", -1)) for s in servers]
    # each server's sparse tables at the end: RAM (rows, index, counters) and rows on disk
    sparse = [[t for t in s.get("tables", {}).values() if "rows" in t] for s in servers]
    summary["server_table_bytes"] = [sum(int(t.get("memory_bytes", 0)) for t in ts)
                                     for ts in sparse]
    summary["server_spilled_rows"] = [sum(int(t.get("spilled_rows", 0)) for t in ts)
                                      for ts in sparse]
    return summary

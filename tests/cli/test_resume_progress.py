"""The progress of a resumed run: the monitor's first line and ETA start from what the
workers restored, and a worker with nothing new to report prints nothing (no error)."""

import json
import os

import pytest

from pyfleet.cli.monitor import Monitor
from pyfleet.metrics import MetricStats


def _status(run_dir, i, **fields):
    status = {"time": 0.0, "worker": i, "pass": 2, "pass_done": False, "pass_examples": 0,
              "step": 0, "examples": 0, "loss_sum": 0.0, "seconds": 1.0,
              "stats": MetricStats().to_json(), **fields}
    with open(os.path.join(run_dir, "progress", f"worker{i}.json"), "w") as f:
        json.dump(status, f)


@pytest.mark.parametrize("restored", [0, 500])
def test_a_resumed_worker_with_no_new_example_prints_nothing(tmp_path, restored):
    os.makedirs(tmp_path / "progress")
    lines = []
    m = Monitor(str(tmp_path), 1, 2, 2, 1000, 60, lines.append)
    # resumed with its whole share of the pass done already: no example since
    _status(tmp_path, 0, pass_done=True, pass_examples=restored, examples=restored,
            loss_sum=0.6 * restored, base_examples=restored, base_loss_sum=0.6 * restored)
    m.poll()  # a ZeroDivisionError here stopped the progress for the rest of the run
    assert lines == []
    assert not (tmp_path / "metrics.jsonl").exists()


def test_the_first_line_after_a_resume_counts_only_this_runs_examples(tmp_path):
    os.makedirs(tmp_path / "progress")
    lines = []
    m = Monitor(str(tmp_path), 1, 2, 2, 1000, 60, lines.append)
    stats = MetricStats().update([0.2, 0.8, 0.3, 0.9], [0, 1, 0, 1])
    # 400 examples of pass 2 restored (loss sum 240), 100 more trained in 10 s (loss sum 50)
    _status(tmp_path, 0, pass_examples=500, examples=500, loss_sum=290.0, seconds=10.0,
            base_examples=400, base_loss_sum=240.0, stats=stats.to_json())
    m.poll()
    (record,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert record["loss"] == 0.5                      # (290 - 240) / (500 - 400)
    assert record["pass_fraction"] == 0.5             # 500 of the pass's 1000
    # 500 examples left at this run's 10 examples/s, not at 500 examples in 10 s
    assert abs(record["eta_seconds"] - 50.0) < 1e-6
    assert "50%" in lines[0] and "ETA 0:00:50" in lines[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_resumed_run_goes_on_with_its_counts_summary_and_metrics(tmp_path):
    from support.cli import pyfleet
    run = tmp_path / "run"
    args = ["--rows", 6000, "--layers", "8", "--embedding-dim", 4, "--workers", 1,
            "--log-interval", 0.05]
    r = pyfleet("train", *args, "--epochs", 1, "--run-dir", run, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout)
    before = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    r = pyfleet("train", "--resume", run, "--epochs", 1, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["train_examples"] == 2 * first["train_examples"]
    assert [p["pass"] for p in summary["passes"]] == [1, 2]
    assert summary["passes"][0] == first["passes"][0]
    assert sorted(summary["train_loss_by_pass"]) == ["1", "2"]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    progress = [x for x in records if "loss" in x]
    examples = [x["examples"] for x in progress]
    assert examples == sorted(examples)  # no fall back to 0 at the resume
    after = [x for x in records[len(before):] if "loss" in x]
    assert after and after[0]["resumed_from"] == first["train_examples"]
    assert after[0]["pass"] == 2 and after[0]["examples"] > first["train_examples"]

"""`pyfleet train` during training: a test after every pass over every
worker's predictions, --keep/--keep-best, one progress line for the job, the phases,
--quiet, logs per role, and Ctrl-C naming what was kept and how to go on."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
from support.cli import pyfleet
from support.wait import wait_for_text

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--layers", "8", "--embedding-dim", "4", "--mode", "sync"]



@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("loop") / "data"
    r = pyfleet("gen-data", "--rows", 3000, "--out", out, cwd=out.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_valid_fraction_is_tested_after_every_pass_over_all_workers(data, tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", "--train", data["train"], "--valid-fraction", 0.2, "--workers", 2,
                "--epochs", 3, "--keep", 1, "--keep-best", *SMALL, "--lr", 0.01,
                "--run-dir", run, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    passes = summary["passes"]
    assert [p["pass"] for p in passes] == [1, 2, 3]
    held_out = passes[0]["test_examples"]
    # Every worker's share together: the held-out rows and the trained ones are the file.
    assert held_out + summary["train_examples"] // 3 == 2700
    assert 0.1 * 2700 < held_out < 0.3 * 2700
    assert all(p["test_examples"] == held_out for p in passes)
    assert summary["test_auc"] == passes[-1]["test_auc"]
    for p in passes:
        line = f"pass {p['pass']}: test AUC {p['test_auc']:.4f} logloss {p['test_logloss']:.4f}"
        assert line in r.stderr
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["pass"] for x in records if "test_auc" in x] == [1, 2, 3]
    # --keep-best: the pass with the highest test AUC; --keep 1: the last pass too.
    best = max(passes, key=lambda p: p["test_auc"])["pass"]
    assert summary["best_pass"] == best
    assert os.readlink(run / "checkpoints" / "best") == f"pass-{best:04d}"
    kept = sorted(os.listdir(run / "checkpoints"))
    assert kept == sorted({"best", f"pass-{best:04d}", "pass-0003"})
    manifest = json.loads((run / "checkpoints" / "best" / "MANIFEST.json").read_text())
    assert manifest["meta"]["pass"] == best
    for gen in manifest["chain"]:
        for name in gen["files"]:
            assert (run / "checkpoints" / "best" / gen["dir"] / name).is_file()


def test_one_progress_line_for_the_job_the_phases_and_logs_per_role(data, tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", "--train", data["train"], "--test", data["test"], "--workers", 2,
                "--epochs", 2, *SMALL, "--log-interval", 0.05, "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    assert "[worker." not in out + r.stderr  # no role's own lines on the console
    for phase in ("checking the data", "starting 1 server(s) and 2 worker(s)",
                  "pass 1/2: training", "pass 2/2: training", "pass 1: evaluating",
                  "pass 2: test AUC", "pass 2: saving the checkpoint",
                  "pass 2: checkpoint saved", "exporting the inference model"):
        assert phase in out, phase
    lines = [x for x in out.splitlines() if re.match(r"pass \d/2 +\d+%", x)]
    assert lines and all("ex/s" in x and "loss" in x and "AUC" in x for x in lines)
    # The job's examples, not one worker's: the last line counts both passes of both.
    assert re.search(r"pass 2/2 +100% .* 5,400 examples", lines[-1]), lines[-1]
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO ")
    for role in ("server.0", "worker.0", "worker.1"):
        text = (run / "logs" / f"{role}.log").read_text()
        assert text and all(stamp.match(x) for x in text.splitlines()), role
        assert f" {role} " in text.splitlines()[0]
    assert "pass 2: test AUC" in (run / "logs" / "pyfleet.log").read_text()

    q = pyfleet("train", "--train", data["train"], "--workers", 1, *SMALL, "--quiet",
                "--run-dir", tmp_path / "quiet", cwd=tmp_path)
    assert q.returncode == 0, q.stderr[-3000:]
    assert "pass 1" not in q.stdout and "train examples" in q.stdout
    assert not [x for x in q.stderr.splitlines() if not x.startswith("pyfleet.launch:")]
    assert (tmp_path / "quiet" / "metrics.jsonl").stat().st_size > 0


@pytest.mark.parametrize("args, message", [
    (["--valid-fraction", "1.5"], "--valid-fraction must be in (0, 1)"),
    (["--valid-fraction", "0.1", "--test", "{test}"], "--valid-fraction and --test"),
    (["--keep", "0"], "--keep must be >= 1"),
    (["--keep-best"], "--keep-best needs test data"),
    (["--log-interval", "0"], "--log-interval must be > 0"),
])
def test_bad_training_loop_options_are_refused_by_name_before_anything(data, tmp_path, args,
                                                                         message):
    args = [a.format(test=data["test"]) for a in args]
    r = pyfleet("train", "--train", data["train"], *args, "--run-dir", tmp_path / "run",
                cwd=tmp_path)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_ctrl_c_names_the_checkpoint_kept_and_the_exact_resume_command(data, tmp_path):
    run = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "pyfleet.cli", "train", "--train",
                          data["train"], "--test", data["test"], "--workers", "1", "--epochs",
                          "12", *SMALL, "--run-dir", str(run)], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = run / "progress" / "events.jsonl"
    wait_for_text(events, '"saved"', 240, "the run's first checkpoint", alive=p)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    m = re.search(r"kept: (\S+)/checkpoint \(after pass (\d+)\)", err)
    assert m and m.group(1) == str(run), err
    done = int(m.group(2))
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    assert manifest["meta"]["pass"] == done
    command = err.strip().splitlines()[-1].strip()
    assert command == f"pyfleet train --resume {shlex.quote(str(run))} --epochs {12 - done}"
    r = pyfleet(*shlex.split(command)[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming after pass {done}" in r.stdout and "pass 12: checkpoint saved" in r.stdout
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    assert manifest["meta"]["pass"] == 12

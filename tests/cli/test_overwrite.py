"""`pyfleet train --overwrite` deletes only what a pyfleet run wrote, only in a
pyfleet run directory, and never the data, config or checkpoint the new run reads."""

import json
import shutil

import pytest
from support import DATA
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--workers", "1", "--layers", "8", "--embedding-dim", "4", "--mode", "sync"]
SAMPLE = DATA / "criteo-paddlerec-part0" / "part-0.tsv"


def _user_dir(root):
    """A directory that was never a pyfleet run, holding the names a run writes."""
    (root / "data").mkdir(parents=True)
    shutil.copy(SAMPLE, root / "data" / "train.tsv")
    (root / "model").mkdir()
    (root / "model" / "weights.bin").write_bytes(b"\x01" * 64)
    (root / "summary.json").write_text('{"mine": true}')
    return root


def _snapshot(root):
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() else None)
                  for p in root.rglob("*"))


def test_overwrite_refuses_a_directory_that_was_never_a_pyfleet_run(tmp_path):
    user = _user_dir(tmp_path / "work")
    before = _snapshot(user)
    r = pyfleet("train", *SMALL, "--train", user / "data" / "train.tsv",
                "--run-dir", user, "--overwrite", cwd=tmp_path)
    assert r.returncode != 0
    assert "holds no pyfleet job.json" in r.stderr and "nothing was deleted" in r.stderr
    assert _snapshot(user) == before  # the data it was about to read, and the rest


def test_a_job_json_that_is_not_pyfleets_does_not_make_a_run(tmp_path):
    user = _user_dir(tmp_path / "work")
    (user / "job.json").write_text(json.dumps({"name": "my batch job", "model": "x"}))
    before = _snapshot(user)
    r = pyfleet("train", *SMALL, "--rows", "2000", "--run-dir", user, "--overwrite",
                cwd=tmp_path)
    assert r.returncode != 0 and "holds no pyfleet job.json" in r.stderr
    assert _snapshot(user) == before


def test_overwrite_refuses_when_the_training_data_is_inside_what_it_deletes(tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--rows", "2000", "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # the user keeps the next run's data in the old run's model/ folder
    shutil.copy(SAMPLE, run / "model" / "train.tsv")
    config = run / "logs" / "job.toml"
    config.write_text('epochs = 1\n')
    before = _snapshot(run)
    r = pyfleet("train", *SMALL, "--train", run / "model" / "train.tsv",
                "--run-dir", run, "--overwrite", cwd=tmp_path)
    assert r.returncode != 0
    assert "would delete" in r.stderr and "--train" in r.stderr and "model" in r.stderr
    assert _snapshot(run) == before
    r = pyfleet("train", "--config", config, *SMALL, "--rows", "2000",
                "--run-dir", run, "--overwrite", cwd=tmp_path)
    assert r.returncode != 0 and "--config" in r.stderr and "would delete" in r.stderr
    assert _snapshot(run) == before


def test_overwrite_replaces_a_run_and_keeps_the_users_own_files(tmp_path):
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--rows", "2000", "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (run / "data").mkdir()  # pyfleet never writes a data/ folder: it is the user's
    shutil.copy(SAMPLE, run / "data" / "train.tsv")
    (run / "worker_notes.json").write_text("{}")  # not a worker<N>.json of pyfleet's
    old_job = json.loads((run / "job.json").read_text())
    r = pyfleet("train", *SMALL, "--train", run / "data" / "train.tsv",
                "--run-dir", run, "--overwrite", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run / "data" / "train.tsv").read_bytes() == SAMPLE.read_bytes()
    assert (run / "worker_notes.json").read_text() == "{}"
    job = json.loads((run / "job.json").read_text())
    assert job["train"] != old_job["train"]  # the new run's, written after the old one went
    assert (run / "model").is_dir() and (run / "summary.json").is_file()

"""`pyfleet export --checkpoint DIR --out MODEL`, `--keep-best` making RUN_DIR/model the
best pass's model, and `pyfleet predict` pointed at a checkpoint telling to export it."""

import json

import pytest
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 passes with a learning rate that overfits the small data set after pass 2."""
    where = tmp_path_factory.mktemp("best")
    r = pyfleet("train", "--rows", 4000, "--layers", "32", "--embedding-dim", 8,
                "--epochs", 4, "--lr", 0.02, "--workers", 1, "--keep-best",
                "--run-dir", where / "run", "--json", cwd=where)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    job = json.loads((where / "run" / "job.json").read_text())
    return where, summary, job["test"]


def _predict(cwd, model, data, out):
    r = pyfleet("predict", "--model", model, "--data", data, "--out", out, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), (cwd / out).read_text()


def test_keep_best_makes_model_the_best_pass(run):
    where, summary, test = run
    assert summary["best_pass"] < 4, summary  # the data overfits: pass 4 is not the best
    assert summary["inference_model_pass"] == summary["best_pass"]
    r = pyfleet("export", "--checkpoint", where / "run" / "checkpoints" / "best",
                "--out", where / "best-model", cwd=where)
    assert r.returncode == 0, r.stderr
    assert f"pass {summary['best_pass']}" in r.stdout
    model, model_lines = _predict(where, where / "run" / "model", test, "model.txt")
    best, best_lines = _predict(where, where / "best-model", test, "best.txt")
    assert model_lines == best_lines
    assert abs(model["auc"] - summary["best_test_auc"]) < 1e-9


def test_export_of_the_last_checkpoint_is_the_last_pass(run):
    where, summary, test = run
    r = pyfleet("export", "--checkpoint", where / "run" / "checkpoint",
                "--out", where / "last-model", cwd=where)
    assert r.returncode == 0, r.stderr
    assert "pass 4" in r.stdout
    last, last_lines = _predict(where, where / "last-model", test, "last.txt")
    assert abs(last["auc"] - summary["test_auc"]) < 1e-9  # the summary's: the last pass's
    _, model_lines = _predict(where, where / "run" / "model", test, "model2.txt")
    assert last_lines != model_lines


def test_predict_on_a_checkpoint_says_to_export_and_export_refuses_bad_input(run):
    where, _, test = run
    ckpt = where / "run" / "checkpoint"
    r = pyfleet("predict", "--model", ckpt, "--data", test, cwd=where)
    assert r.returncode != 0
    assert f"pyfleet export --checkpoint {ckpt} --out MODEL" in r.stderr
    r = pyfleet("export", "--checkpoint", where / "run" / "logs", "--out", where / "x",
                cwd=where)
    assert r.returncode != 0 and "no checkpoint there" in r.stderr
    (where / "busy").mkdir()
    (where / "busy" / "keep.txt").write_text("mine")
    r = pyfleet("export", "--checkpoint", ckpt, "--out", where / "busy", cwd=where)
    assert r.returncode != 0 and "is not an empty directory" in r.stderr
    assert (where / "busy" / "keep.txt").read_text() == "mine"

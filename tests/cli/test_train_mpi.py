"""``pyfleet train --mode hybrid`` and ``--mode collective``: the trainer's workers as one MPI
job (real processes on 127.0.0.1, bounded by timeouts) on a small generated data set. Both
train every row, write a checkpoint and an inference model; with the servers in sync mode
a hybrid job computes what the collective job computes (both are one process of batch
2*B); a collective checkpoint resumes; options the modes cannot honour are refused."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.mpi import MPI_MARKS

pytestmark = MPI_MARKS

ROWS = 10000
SMALL = ["--batch-size", "128", "--layers", "16", "--embedding-dim", "4", "--lr", "0.01",
         "--timeout", "240", "--json"]


def pyfleet(*args, cwd, timeout=300):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "OMPI_", "PMI", "TRAINING_ROLE"))}
    env.update({"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_oob_tcp_if_include": "lo"})
    if "PYFLEET_CACHE_DIR" in os.environ:
        env["PYFLEET_CACHE_DIR"] = os.environ["PYFLEET_CACHE_DIR"]
    return subprocess.run([sys.executable, "-m", "pyfleet.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    r = pyfleet("gen-data", "--rows", str(ROWS), "--out", str(d), cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def train(data, run, *args):
    r = pyfleet("train", "--train", str(data / "train.tsv"), "--test", str(data / "test.tsv"),
                "--run-dir", str(run), *SMALL, *args, cwd=run.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_run(run, summary, mode, servers, server_files):
    assert (summary["mode"], summary["servers"], summary["workers"]) == (mode, servers, 2)
    assert summary["train_examples"] == 2 * (ROWS - ROWS // 10)   # every row, both passes
    assert summary["test_examples"] == ROWS // 10
    assert summary["test_auc"] > 0.6, summary
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    assert manifest["meta"]["pass"] == 2
    assert manifest["server_num"] == server_files
    names = {t["name"] for t in manifest["tables"]}
    assert "SparseFeatFactors" in names and len(names) > 2, names   # sparse + dense
    assert (run / "logs" / "workers.log").is_file()
    # The inference model scores the test rows.
    r = pyfleet("predict", "--model", str(run / "model"), "--data", summary["test_file"],
                "--out", str(run / "p.txt"), cwd=run)
    assert r.returncode == 0, r.stderr[-3000:]
    pred = np.loadtxt(run / "p.txt")
    assert pred.shape == (ROWS // 10,) and np.all((pred > 0) & (pred < 1))


def test_hybrid_and_collective_train_and_agree(data, tmp_path):
    hybrid = train(data, tmp_path / "h", "--mode", "hybrid", "--sparse-mode", "sync",
                   "--servers", "1", "--workers", "2", "--epochs", "2")
    check_run(tmp_path / "h", {**hybrid, "test_file": str(data / "test.tsv")}, "hybrid", 1, 2)
    coll = train(data, tmp_path / "c", "--mode", "collective", "--workers", "2", "--epochs", "2")
    check_run(tmp_path / "c", {**coll, "test_file": str(data / "test.tsv")}, "collective", 0, 1)
    # Sync sparse + all-reduced dense is the collective job's arithmetic (one process of
    # batch 2*128, the ranks' halves in order): the same losses and test AUC.
    for p in ("1", "2"):
        np.testing.assert_allclose(hybrid["train_loss_by_pass"][p],
                                   coll["train_loss_by_pass"][p], rtol=1e-4)
    assert abs(hybrid["test_auc"] - coll["test_auc"]) < 1e-4


def test_a_collective_run_resumes_from_its_checkpoint(data, tmp_path):
    first = train(data, tmp_path / "c", "--mode", "collective", "--workers", "2")
    again = train(data, tmp_path / "c2", "--resume", str(tmp_path / "c"), "--epochs", "1")
    assert again["mode"] == "collective" and again["servers"] == 0
    manifest = json.loads((tmp_path / "c2" / "checkpoint" / "MANIFEST.json").read_text())
    assert manifest["meta"]["pass"] == 2
    # Pass 2 starts from pass 1's weights: its loss is well below pass 1's (a fresh
    # model's first pass).
    assert again["train_loss_by_pass"]["2"] < 0.95 * first["train_loss_by_pass"]["1"]


@pytest.mark.parametrize("args, message", [
    (["--mode", "async", "--sparse-mode", "sync"], "--sparse-mode is the servers' side"),
    (["--mode", "collective", "--servers", "2"], "--mode collective has no server"),
    (["--mode", "collective", "--show-click"], "--show-click acts on the servers' tables"),
    (["--mode", "async", "--collective-timeout", "30"],
     "--collective-timeout 30: a number of seconds > 0, for --mode collective or hybrid"),
    (["--mode", "collective", "--collective-timeout", "0"], "--collective-timeout 0: a number"),
])
def test_options_the_mode_cannot_honour_are_refused(data, tmp_path, args, message):
    r = pyfleet("train", "--train", str(data / "train.tsv"), "--run-dir", str(tmp_path / "r"),
                *args, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "r").exists()

"""`pyfleet train` / `predict` / `fleetrun` at their edges: output, inputs
checked first, run directories, resume settings, optimizers, the data cache, help."""

import json
import os
import subprocess
import sys

import pytest
from support import REPO
from support.cli import pyfleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SMALL = ["--rows", "3000", "--workers", "1", "--layers", "8", "--embedding-dim", "4",
         "--mode", "sync"]



def test_json_output_is_the_json_alone(tmp_path):
    r = pyfleet("train", *SMALL, "--run-dir", tmp_path / "run", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)  # the whole of stdout
    assert summary["train_examples"] == 2700
    assert "pass 1/1" in r.stderr  # the job's progress went to stderr


def test_no_doc_or_message_sends_users_to_the_index_by_name():
    hits = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "runs")]
        for name in files:
            if not name.endswith((".py", ".md", ".toml", ".txt", ".pyx", ".cfg", ".yaml",
                                  ".yml", ".rst", "Dockerfile")):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for bad in ("pip install 'pyfleet", 'pip install "pyfleet', "pip install pyfleet"):
                if bad in text and path != __file__:
                    hits.append(f"{path}: {bad}")
    assert hits == []


def _csv(path, rows=50):
    lines = ["label," + ",".join(f"I{i}" for i in range(1, 14))
             + "," + ",".join(f"C{i}" for i in range(1, 27))]
    for k in range(rows):
        lines.append(f"{k % 2}," + ",".join(str(k % 7) for _ in range(13)) + ","
                     + ",".join(f"{(k * j) % 97:08x}" for j in range(1, 27)))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_csv_file_trains_by_default_and_a_wrong_format_is_refused_first(tmp_path):
    data = _csv(tmp_path / "train.csv", 400)
    r = pyfleet("train", "--train", data, *SMALL[2:], "--run-dir", tmp_path / "run",
                "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["train_examples"] == 400  # read as CSV, not 0 as criteo
    # read as criteo: refused, naming the file's first line, before anything is written
    r = pyfleet("train", "--train", data, "--format", "criteo", "--run-dir", tmp_path / "r2",
                cwd=tmp_path)
    assert r.returncode != 0
    assert f"none of the first 20 lines of {data} reads as criteo ({data}:1:" in r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "r2").exists()
    # a directory whose second file is in another format: named, nothing written
    shards = tmp_path / "shards"
    shards.mkdir()
    _csv(shards / "a.csv")
    (shards / "b.csv").write_text("1\t2\t3\n")
    r = pyfleet("train", "--train", shards, "--run-dir", tmp_path / "r3", cwd=tmp_path)
    assert r.returncode != 0 and f"{shards / 'b.csv'} looks like criteo" in r.stderr
    assert not (tmp_path / "r3").exists()


def test_predict_checks_the_format_before_writing(tmp_path):
    r = pyfleet("train", *SMALL, "--run-dir", tmp_path / "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    bad = tmp_path / "bad.tsv"
    bad.write_text("id,x\n" * 30)
    out = tmp_path / "pred.txt"
    r = pyfleet("predict", "--model", tmp_path / "run" / "model", "--data", bad,
                "--format", "criteo", "--out", out, cwd=tmp_path)
    assert r.returncode != 0 and "none of the first 20 lines" in r.stderr
    assert not out.exists()


def test_a_used_run_directory_is_refused_unless_resume_or_overwrite(tmp_path):
    run = tmp_path / "run"
    assert pyfleet("train", *SMALL, "--run-dir", run, cwd=tmp_path).returncode == 0
    before = (run / "metrics.jsonl").read_text()
    r = pyfleet("train", *SMALL, "--run-dir", run, cwd=tmp_path)
    assert r.returncode != 0 and "is not empty" in r.stderr and "--overwrite" in r.stderr
    assert (run / "metrics.jsonl").read_text() == before  # untouched
    (run / "notes.txt").write_text("mine")
    r = pyfleet("train", *SMALL, "--run-dir", run, "--overwrite", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    # not appended to the old run's: one progress and one test record, of pass 1
    assert [(x["pass"], "loss" in x) for x in lines] == [(1, True), (1, False)]
    assert (run / "notes.txt").read_text() == "mine"  # only pyfleet's files were replaced


def test_resume_inherits_the_settings_and_refuses_another_architecture(tmp_path):
    a = tmp_path / "a"
    r = pyfleet("train", *SMALL, "--model", "lr", "--optimizer", "adagrad", "--lr", "0.05",
                "--run-dir", a, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # nothing but --resume: the model, optimizer, rows and cluster come from job.json
    r = pyfleet("train", "--resume", a, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["model"] == "lr" and summary["workers"] == 1 and summary["mode"] == "sync"
    assert summary["run_dir"] == str(a)  # went on in place
    job = json.loads((a / "job.json").read_text())
    assert job["first_pass"] == 2
    assert job["optimizer"] == {"name": "adagrad", "learning_rate": 0.05}
    passes = [json.loads(x)["pass"] for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert passes == [1, 1, 2, 2]  # each pass: its progress, then its test
    # a flag given wins: --batch-size changes, into another run directory
    r = pyfleet("train", "--resume", a, "--batch-size", "100", "--run-dir", tmp_path / "b",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    job = json.loads((tmp_path / "b" / "job.json").read_text())
    assert job["batch_size"] == 100 and job["model"] == "lr" and job["first_pass"] == 3
    # another architecture: refused by name, and no directory is left behind
    for flag, value in (("--model", "dnn"), ("--optimizer", "adam")):
        r = pyfleet("train", "--resume", a, flag, value, "--run-dir", tmp_path / "c",
                    cwd=tmp_path)
        assert r.returncode != 0 and f"{flag} {value} conflicts with the run resumed" \
            in r.stderr, r.stderr
        assert not (tmp_path / "c").exists()


def test_optimizer_parameters_take_effect_or_are_refused_by_name(tmp_path):
    r = pyfleet("train", "--optimizer", "ftrl", "--beta1", "0.5", cwd=tmp_path)
    assert r.returncode != 0 and "--beta1 is a parameter of adam, not of --optimizer ftrl" \
        in r.stderr
    r = pyfleet("train", "--optimizer", "ftrl", "--lr-power", "1", cwd=tmp_path)
    assert r.returncode != 0 and "lr_power" in r.stderr
    assert os.listdir(tmp_path) == []
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--optimizer", "ftrl", "--l1", "0.5", "--lr", "0.1",
                "--run-dir", run, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = (run / "checkpoint" / "MANIFEST.json").read_text()
    assert '"FTRL"' in manifest and '"l1": 0.5' in manifest.replace("0.5,", "0.5")


def test_momentum_and_rmsprop_train_on_the_servers(tmp_path):
    r = pyfleet("train", "--optimizer", "adam", "--rho", "0.9", cwd=tmp_path)
    assert r.returncode != 0 and "--rho is a parameter of rmsprop, not of --optimizer adam" \
        in r.stderr
    run = tmp_path / "run"
    r = pyfleet("train", *SMALL, "--optimizer", "momentum", "--momentum", "0.8",
                "--use-nesterov", "--run-dir", run, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    tables = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())["tables"]
    assert {"type": "Momentum", "learning_rate": 0.01, "momentum": 0.8,
            "use_nesterov": True} in [t["optimizer"] for t in tables]


def test_generated_data_is_cached_and_a_damaged_entry_regenerated(tmp_path):
    cache = tmp_path / "cache"
    args = ("train", *SMALL, "--cache-dir", cache)
    r = pyfleet(*args, "--run-dir", tmp_path / "r1", cwd=tmp_path)
    assert r.returncode == 0 and "generating 3,000 synthetic rows" in r.stdout, r.stderr
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert "rows3000-seed0" in entry.name
    first = (entry / "train.tsv").read_bytes()
    r = pyfleet(*args, "--run-dir", tmp_path / "r2", "--json", cwd=tmp_path)
    assert r.returncode == 0 and "(cached)" in r.stderr
    s1 = json.loads((tmp_path / "r1" / "summary.json").read_text())
    assert json.loads(r.stdout)["truth_auc_test"] == s1["truth_auc_test"]
    (entry / "train.tsv").write_bytes(first[: len(first) // 2])  # a truncated entry
    r = pyfleet(*args, "--run-dir", tmp_path / "r3", cwd=tmp_path)
    assert r.returncode == 0 and "generating it again" in r.stdout, r.stdout
    assert (entry / "train.tsv").read_bytes() == first
    assert json.loads((tmp_path / "r3" / "summary.json").read_text())["train_examples"] == 2700


def test_help_shows_every_option_with_its_default_and_the_version(tmp_path):
    r = pyfleet("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("pyfleet 0.")
    for cmd in ("train", "predict", "gen-data", "keygen"):
        text = pyfleet(cmd, "--help", cwd=tmp_path).stdout
        assert "``" not in text and ":func:" not in text and ":class:" not in text
        entries = text.split("options:")[1].split("\n  -")[1:]
        assert entries, cmd
        for entry in entries:
            flag = entry.split()[0]
            words = entry.split(None, 1)
            assert len(words) == 2 and len(words[1].split()) > 1, (cmd, flag)
            if flag.startswith("h,") or flag in ("-show-click", "-overwrite", "-json",
                                                 "-skip-malformed"):
                continue
            assert "default" in entry or "required" in entry, (cmd, entry)
    top = pyfleet("--help", cwd=tmp_path).stdout
    assert "``" not in top and "--version" in top


def test_fleetrun_speaks_paddles_flags(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import os\nprint(os.environ['PYFLEET_ROLE'], "
                      "os.environ['PYFLEET_SERVER_ENDPOINTS'], os.environ['PYFLEET_WORKER_NUM'])\n")
    from pyfleet.launch import free_ports
    eps = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--servers", eps, "--workers",
                        "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "--log_dir",
                        tmp_path / "logs", script], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(
        [f"[server.{i}] server {eps} 3" for i in range(2)]
        + [f"[worker.{i}] worker {eps} 3" for i in range(3)])
    assert sorted(os.listdir(tmp_path / "logs")) == sorted(
        ["server.0.log", "server.1.log", "worker.0.log", "worker.1.log", "worker.2.log"])
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--server_num", "1",
                        "--worker_num", "2", script], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3, r.stderr
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--server_num", "3",
                        "--servers", eps, script], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "--server_num 3 disagrees with the 2" in r.stderr
    fleetrun = os.path.join(os.path.dirname(sys.executable), "fleetrun")
    r = subprocess.run([fleetrun, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: fleetrun ")
    assert "--server_num" in r.stdout and "--log_dir" in r.stdout


def test_a_checkout_shadowing_the_installed_package_is_named(tmp_path):
    # The checkout's pyfleet/ first on sys.path, without compiled modules: as after a
    # plain `pip install .` run from the checkout. -S keeps the editable finder out.
    import shutil

    import numpy
    shutil.copytree(REPO / "pyfleet", tmp_path / "pyfleet",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(numpy.__file__))}
    r = subprocess.run([sys.executable, "-S", "-m", "pyfleet.cli", "--version"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert ("the checkout's pyfleet/ folder shadows the installed package: run from another "
            "directory or use pip install -e .") in r.stderr, r.stderr
    assert "circular import" not in r.stderr


def test_deepfm_trains_at_least_as_well_as_lr(tmp_path):
    aucs = {}
    for model in ("lr", "deepfm"):
        r = pyfleet("train", "--rows", "40000", "--workers", "1", "--mode", "sync",
                    "--model", model, "--run-dir", tmp_path / model, "--json", cwd=tmp_path,
                    timeout=400)
        assert r.returncode == 0, r.stderr[-3000:]
        aucs[model] = json.loads(r.stdout)["test_auc"]
    print(aucs)
    assert aucs["deepfm"] >= aucs["lr"], aucs


def _table_rates(run):
    """{table name: its learning rate} of the servers' tables in a run's checkpoint."""
    manifest = json.loads((run / "checkpoint" / "MANIFEST.json").read_text())
    return {t["name"]: (t["kind"], t["optimizer"]["type"], t["optimizer"]["learning_rate"])
            for t in manifest["tables"]}


def test_sparse_lr_reaches_the_servers_sparse_tables_only(tmp_path):
    r = pyfleet("train", "--sparse-lr", "0", cwd=tmp_path)
    assert r.returncode != 0 and "--sparse-lr must be a finite number > 0, got 0.0" in r.stderr
    assert os.listdir(tmp_path) == []
    # the default with adam (the DNN): the sparse rate 10x --lr, the dense parameters at --lr
    run = tmp_path / "default"
    r = pyfleet("train", *SMALL, "--lr", "0.002", "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rates = _table_rates(run)
    assert rates["SparseFeatFactors"] == ("sparse", "Adam", pytest.approx(0.02))
    dense = {v for v in rates.values() if v[0] == "dense"}
    assert dense == {("dense", "Adam", 0.002)}
    assert json.loads((run / "job.json").read_text())["sparse_lr"] == pytest.approx(0.02)
    # given: every sparse table at it (LR's first-order weights too), any optimizer
    run = tmp_path / "given"
    r = pyfleet("train", *SMALL, "--model", "lr", "--optimizer", "adagrad",
                "--sparse-lr", "0.004", "--run-dir", run, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rates = _table_rates(run)
    assert rates["SparseFeatFactors_first_order"] == ("sparse", "Adagrad", pytest.approx(0.004))
    assert {v for v in rates.values() if v[0] == "dense"} == {("dense", "Adagrad", 0.01)}
    # 10x with adam but for DeepFM; DeepFM's and other optimizers' rows take --lr
    from pyfleet.trainer import sparse_lr_of
    adam = {"name": "adam", "learning_rate": 0.001}
    for model in ("dnn", "wide_deep", "widedeep", "lr"):
        assert sparse_lr_of({"model": model, "optimizer": adam}) == pytest.approx(0.01)
    assert sparse_lr_of({"model": "deepfm", "optimizer": adam}) == pytest.approx(0.001)
    assert sparse_lr_of({"model": "dnn", "optimizer": {"name": "sgd", "learning_rate": 0.1},
                         "sparse_lr": 0.3}) == pytest.approx(0.3)

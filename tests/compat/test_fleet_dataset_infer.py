"""The era's Fleet Dataset trainer (ctr_dataset_fleet_train.py: split_files,
StrategyFactory, fluid.io.save_persistables on the first worker) and its infer
script (ctr_infer.py: a plain local program, fluid.io.load_persistables of the
Fleet checkpoint, AUC states reset through the scope), each with only its
imports changed, run through the launcher with 2 servers and 2 workers on the
2000 Criteo rows of support.DATA: every role exits 0, and the infer script's
AUC equals the one the servers' model gives on the same rows. Variants: a
script that never calls stop_worker, and a sync script without init_worker."""

import csv
import os
import re
import subprocess
import sys

import pytest
from support import DATA, REPO

HERE = REPO / "tests" / "compat"
TRAIN = HERE / "ctr_dataset_fleet_train.py"
INFER = HERE / "ctr_infer.py"
CSV = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
pytestmark = pytest.mark.skipif(not CSV.exists(), reason="shared Criteo sample missing")


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    return env


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Criteo TSV (label, I1..I13, C1..C26): 4 training files of 450 rows, 200 test rows."""
    d = tmp_path_factory.mktemp("criteo")
    with open(CSV) as f:
        rows = ["\t".join([r["Label"]] + [r[f"I{j}"] for j in range(1, 14)]
                          + [r[f"C{j}"] for j in range(1, 27)]) + "\n"
                for r in csv.DictReader(f)]
    (d / "train").mkdir()
    for i in range(4):
        (d / "train" / f"part-{i:05d}").write_text("".join(rows[450 * i:450 * (i + 1)]))
    (d / "test.txt").write_text("".join(rows[1800:]))
    return d


def _train(cwd, data, *extra):
    cmd = [sys.executable, "-m", "pyfleet.launch", "--servers", "2", "--workers", "2",
           "--timeout", "300", str(TRAIN), "--train_data_path", str(data / "train"),
           "--test_data_path", str(data / "test.txt"), "--model_path", "model", *extra]
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=360,
                       check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"the job exited {r.returncode}\n{out[-5000:]}"
    return out


def _infer(cwd, data):
    r = subprocess.run([sys.executable, str(INFER), "--test_data_path", str(data / "test.txt"),
                        "--model_path", str(cwd / "model")], cwd=cwd, env=_env(),
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return float(re.search(r"infer auc: (\S+)", r.stdout).group(1))


def _servers_auc(out):
    found = re.findall(r"servers auc: (\S+)", out)
    assert len(found) == 1, out[-4000:]   # the first worker only
    return float(found[0])


def _assert_clean_exit(out):
    assert "exited with code" not in out and "terminating" not in out, out[-4000:]
    assert out.count("Distributed Train Success!") == 2, out[-4000:]


@pytest.mark.parametrize("variant", [[], ["--no_stop_worker"], ["--no_init_worker"]],
                         ids=["plain", "no_stop_worker", "no_init_worker"])
def test_dataset_trainer_and_local_infer_agree(tmp_path, data, variant):
    out = _train(tmp_path, data, *variant)
    _assert_clean_exit(out)
    # every worker read its own contiguous half of the files (fleet.split_files)
    assert "part-00000', " in out and "part-00002', " in out, out[-4000:]
    servers = _servers_auc(out)
    assert 0.5 < servers < 1.0
    assert (tmp_path / "model" / "MANIFEST.json").is_file()
    local = _infer(tmp_path, data)
    assert local == pytest.approx(servers, abs=1e-9)

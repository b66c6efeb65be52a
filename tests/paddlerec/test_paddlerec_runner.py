"""PaddleRec 1.8.5's own runner (``python -m paddlerec.run -m config.yaml``, the
``paddle-rec`` wheel installed with ``--no-deps``) under ``pyfleet run``: a model
written for these tests in PaddleRec's model interface (ctr_dnn/model.py) on
generated slot data, in PaddleRec's single-process mode (train, checkpoints,
an inference model, infer from ``init_model_path``) and its ``local_cluster``
mode (2 servers + 2 workers as new interpreters; a warm start from a cluster
checkpoint), and a layer pyfleet refuses under Fleet failing by name.

CI installs the wheel (.ci/run) and sets PYFLEET_REQUIRE_PADDLEREC=1: there a
missing paddlerec fails the module instead of skipping it."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from support import REPO

if importlib.util.find_spec("paddlerec") is None:
    if os.environ.get("PYFLEET_REQUIRE_PADDLEREC"):
        raise ImportError("paddlerec is not installed (pip install --no-deps "
                          "paddle-rec==1.8.5.1), and PYFLEET_REQUIRE_PADDLEREC is set")
    pytest.skip("paddle-rec is not installed: pip install --no-deps paddle-rec==1.8.5.1",
                allow_module_level=True)

MODEL = REPO / "tests" / "paddlerec" / "ctr_dnn"
SPARSE = [f"s{i}" for i in range(1, 7)]
VOCAB = 200


def _lines(rng, n, weights):
    """Slot lines ``click:y dense_var:x1 .. s1:id ...``; clicks drawn from a logistic
    model of the ids and the dense values, so a model can learn them."""
    ids = rng.integers(1, VOCAB, (n, len(SPARSE)))
    dense = rng.normal(size=(n, 3))
    logit = weights[ids].sum(axis=1) + dense @ np.array([1.5, -1.0, 0.5])
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    out = []
    for y, row, x in zip(clicks, ids, dense):
        fields = [f"click:{y}"] + [f"dense_var:{v:.4f}" for v in x]
        fields += [f"{s}:{i}" for s, i in zip(SPARSE, row)]
        out.append(" ".join(fields) + "\n")
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    rng = np.random.default_rng(7)
    weights = rng.normal(scale=1.2, size=VOCAB)
    (d / "train").mkdir()
    (d / "test").mkdir()
    for i in range(2):   # two files: one a worker in the local cluster
        (d / "train" / f"part-{i}").write_text("".join(_lines(rng, 320, weights)))
    (d / "test" / "part-0").write_text("".join(_lines(rng, 320, weights)))
    return d


def _config(data, runners, batch_norm=False):
    slots = "click " + " ".join(SPARSE)
    return {
        "workspace": str(MODEL),
        "dataset": [{"name": n, "batch_size": 16, "type": "DataLoader",
                     "data_path": str(data / part), "sparse_slots": slots,
                     "dense_slots": "dense_var:3"}
                    for n, part in (("train_set", "train"), ("test_set", "test"))],
        # 100001 rows: a sparse table (PaddleRec's Adam is lazy: pyfleet refuses it on a
        # dense embedding); only the ids seen get rows.
        "hyper_parameters": {"optimizer": {"class": "Adam", "learning_rate": 0.02},
                             "sparse_feature_number": 100001, "sparse_feature_dim": 4,
                             "hidden": 16, "batch_norm": batch_norm},
        "mode": [r["name"] for r in runners],
        "runner": runners,
        "phase": [{"name": "train_phase", "model": "{workspace}/model.py",
                   "dataset_name": "train_set", "thread_num": 1},
                  {"name": "infer_phase", "model": "{workspace}/model.py",
                   "dataset_name": "test_set", "thread_num": 1}],
    }


def _run(cwd, config, timeout=300):
    path = cwd / f"config_{len(list(cwd.glob('config_*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE", "FLAGS_"))}
    env.pop("PYTHONPATH", None)
    env.update(OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "run", "-m", "paddlerec.run", "-m",
                        str(path)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout, check=False)
    return r.returncode, r.stdout + r.stderr


def _values(text, name, tag="[Train]"):
    return [float(v) for line in text.splitlines() if tag in line
            for v in re.findall(rf"\b{name}: \[([-\d.e]+)\]", line)]


def _global(text, name, what="Infer"):
    return [float(v) for line in text.splitlines() if line.startswith(what)
            for v in re.findall(rf"\b{name}=\[([-\d.e]+)\]", line)]


def test_single_process_trains_saves_and_infers(tmp_path, data):
    from pyfleet import fluid
    runners = [
        {"name": "train_runner", "class": "train", "epochs": 3, "device": "cpu",
         "save_checkpoint_interval": 1, "save_checkpoint_path": "ckpt",
         "save_inference_interval": 3, "save_inference_path": "inference",
         "save_inference_feed_varnames": ["dense_var", *SPARSE],
         "save_inference_fetch_varnames": ["ctr_prob"],
         "print_interval": 5, "phases": ["train_phase"]},
        {"name": "infer_runner", "class": "infer", "device": "cpu", "init_model_path": "ckpt",
         "phases": ["infer_phase"]},
    ]
    code, out = _run(tmp_path, _config(data, runners))
    assert code == 0 and "except:" not in out, out[-4000:]
    loss = _values(out, "LOSS")
    assert len(loss) >= 6 and np.mean(loss[-3:]) < np.mean(loss[:3]) * 0.9, loss
    for epoch in range(3):
        assert (tmp_path / "ckpt" / str(epoch)).is_dir()         # save_checkpoint_interval 1
    assert not (tmp_path / "inference" / "0").exists()           # save_inference_interval 3
    exe = fluid.Executor(fluid.CPUPlace())
    program, feeds, fetches = fluid.io.load_inference_model(str(tmp_path / "inference" / "2"),
                                                            exe)
    assert sorted(feeds) == sorted(["dense_var", *SPARSE]) and len(fetches) == 1
    aucs = _global(out, "AUC")                                   # one infer pass per checkpoint
    assert len(aucs) == 3 and all(a > 0.6 for a in aucs), aucs


def _cluster(name, epochs, strategy, init="", path="cluster", phases=("train_phase",)):
    return {"name": name, "class": "local_cluster_train", "epochs": epochs, "device": "cpu",
            "worker_num": 2, "server_num": 2, "distribute_strategy": strategy,
            "save_checkpoint_interval": 1, "save_checkpoint_path": path,
            "init_model_path": init, "print_interval": 5, "phases": list(phases)}


def _logs(cwd):
    return {p.name: p.read_text() for p in (cwd / "logs").iterdir()}


@pytest.mark.slow
def test_local_cluster_two_servers_two_workers_with_a_warm_start(tmp_path, data):
    code, out = _run(tmp_path, _config(data, [_cluster("cluster_run", 2, "async")]))
    logs = _logs(tmp_path)
    assert code == 0, out[-3000:]
    assert sorted(logs) == ["server.0", "server.1", "worker.0", "worker.1"]
    for name, text in logs.items():
        assert "except:" not in text, (name, text[-3000:])
        # servers: stop_worker() after run_server() returns; PaddleRec's engine may
        # terminate a server once the workers are done, before it prints this
        assert "PaddleRec Finish" in text or name.startswith("server"), (name, text[-3000:])
    assert (tmp_path / "cluster" / "1" / "MANIFEST.json").is_file()
    cold = _values(logs["worker.0"], "LOSS")

    (tmp_path / "logs").rename(tmp_path / "logs_cold")
    code, out = _run(tmp_path, _config(data, [_cluster("warm_run", 1, "async", init="cluster/1",
                                                        path="cluster_warm")]))
    logs = _logs(tmp_path)
    assert code == 0 and all("except:" not in t for t in logs.values()), logs
    assert all("PaddleRec Finish" in logs[f"worker.{i}"] for i in range(2)), logs
    warm = _values(logs["worker.0"], "LOSS")
    assert warm[0] < cold[0] * 0.95, (cold, warm)                # init_model_path loaded

    infer = {"name": "infer_runner", "class": "infer", "device": "cpu",
             "init_model_path": "cluster", "phases": ["infer_phase"]}
    code, out = _run(tmp_path, _config(data, [infer]))           # a Fleet checkpoint, locally
    assert code == 0 and "except:" not in out, out[-3000:]
    assert all(a > 0.6 for a in _global(out, "AUC")), out[-2000:]


@pytest.mark.slow
def test_local_cluster_sync_strategy(tmp_path, data):
    code, out = _run(tmp_path, _config(data, [_cluster("sync_run", 1, "sync")]))
    logs = _logs(tmp_path)
    assert code == 0 and len(logs) == 4, out[-3000:]
    assert all("except:" not in t for t in logs.values()), logs
    assert all("PaddleRec Finish" in logs[f"worker.{i}"] for i in range(2)), logs
    assert len(_values(logs["worker.1"], "LOSS")) >= 2


@pytest.mark.slow
def test_a_layer_pyfleet_refuses_under_fleet_fails_by_name(tmp_path, data):
    code, out = _run(tmp_path, _config(data, [_cluster("bn_run", 1, "async")], batch_norm=True))
    worker = _logs(tmp_path)["worker.0"]
    assert "except:" in worker and "batch_norm" in worker, worker[-3000:]
    assert "AttributeError" not in worker and "PaddleRec Finish" not in worker

"""PaddleRec 1.8.5's own runner (``python -m paddlerec.run -m config.yaml``, the
``paddle-rec`` wheel installed with ``--no-deps``) under ``pyfleet run``: a model
written for pyfleet in PaddleRec's model interface on generated slot data, in PaddleRec's single-process mode (train, checkpoints,
an inference model, infer from ``init_model_path``) and its ``local_cluster``
mode (2 servers + 2 workers as new interpreters; a warm start from a cluster
checkpoint), and a layer pyfleet refuses under Fleet failing by name. The model,
its config and its data generator are examples/paddlerec/ctr_dnn.

CI installs the wheel (.ci/run) and sets PYFLEET_REQUIRE_PADDLEREC=1: there a
missing paddlerec fails the module instead of skipping it."""

import importlib.util
import json
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

EXAMPLE = REPO / "examples" / "paddlerec" / "ctr_dnn"
SPARSE = [f"s{i}" for i in range(1, 7)]


def _example():
    spec = importlib.util.spec_from_file_location("ctr_dnn_gen_data", EXAMPLE / "gen_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("slots")
    _example().write(str(d))
    return d


def _config(data, runners, batch_norm=False):
    """The example's config.yaml with these runners, its data in ``data``."""
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    config["workspace"] = str(EXAMPLE)
    for ds in config["dataset"]:
        ds["data_path"] = str(data / ds["data_path"].rsplit("/", 1)[1])
    config["hyper_parameters"]["batch_norm"] = batch_norm
    config["runner"], config["mode"] = runners, [r["name"] for r in runners]
    return config


def _runner(example_name, **changes):
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    return {**next(r for r in config["runner"] if r["name"] == example_name), **changes}


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
    """The example's own runners: 3 epochs, a checkpoint each, an inference model
    at the third, then infer from each checkpoint; then a train runner starting
    from the last checkpoint (init_model_path)."""
    from pyfleet import fluid
    runners = [_runner("train_runner"), _runner("infer_runner")]
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

    warm = _runner("train_runner", epochs=1, init_model_path="ckpt/2",
                   save_checkpoint_path="ckpt_warm", save_inference_interval=0)
    code, out = _run(tmp_path, _config(data, [warm]))            # a train runner's warm start
    assert code == 0 and "load from ckpt/2 success" in out, out[-3000:]
    assert _values(out, "LOSS")[0] < loss[0] * 0.7, (loss[0], _values(out, "LOSS")[:3])


def _cluster(name, epochs, strategy, init="", path="cluster"):
    return _runner("local_cluster_runner", name=name, epochs=epochs,
                   distribute_strategy=strategy, init_model_path=init,
                   save_checkpoint_path=path)


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
def test_local_cluster_lazy_adam_on_a_dense_embedding(tmp_path, data):
    """A vocabulary under 100 000 rows: a dense embedding looked up with
    is_sparse=True under PaddleRec's lazy Adam, whose servers move only the rows
    a push looked up (tests/fluid/test_lazy_adam.py has the numbers)."""
    config = _config(data, [_cluster("lazy_run", 2, "async")])
    config["hyper_parameters"]["sparse_feature_number"] = 1000
    code, out = _run(tmp_path, config)
    logs = _logs(tmp_path)
    assert code == 0 and all("except:" not in t for t in logs.values()), logs
    assert all("PaddleRec Finish" in logs[f"worker.{i}"] for i in range(2)), logs
    loss = _values(logs["worker.0"], "LOSS")
    assert len(loss) >= 4 and np.mean(loss[-2:]) < np.mean(loss[:2]), loss
    manifest = json.loads((tmp_path / "cluster" / "1" / "MANIFEST.json").read_text())
    assert "lazy_row_width" in json.dumps(manifest), json.dumps(manifest)[:2000]


@pytest.mark.slow
def test_a_layer_pyfleet_refuses_under_fleet_fails_by_name(tmp_path, data):
    code, out = _run(tmp_path, _config(data, [_cluster("bn_run", 1, "async")], batch_norm=True))
    worker = _logs(tmp_path)["worker.0"]
    assert "except:" in worker and "batch_norm" in worker, worker[-3000:]
    assert "AttributeError" not in worker and "PaddleRec Finish" not in worker


@pytest.mark.parametrize("name", ["test_auc_metrics", "test_pairwise_pn",
                                  "test_precision_recall_metrics", "test_recall_k"])
def test_paddlerecs_own_unit_tests_pass(tmp_path, name):
    """The wheel's paddlerec/tests, each file in its own process as its tests
    declare the same inputs with other shapes (Fluid refuses that in one program
    too), under pyfleet run."""
    tests = os.path.join(os.path.dirname(importlib.util.find_spec("paddlerec").origin),
                         "tests", name + ".py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYFLEET_", "PADDLE_"))}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "run", "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", tests], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0 and re.search(r"\b2 passed\b", r.stdout), r.stdout + r.stderr

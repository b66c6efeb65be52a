"""examples/fleet_ctr.py as users run it: real server and worker processes on
127.0.0.1 started by ``python -m pyfleet.launch``, on the shared Criteo sample."""

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from support import REPO

EXAMPLE = REPO / "examples" / "fleet_ctr.py"
TINY = REPO.parent / "shared" / "data" / "criteo-kaggle-tiny" / "train.tiny.csv"
pytestmark = pytest.mark.skipif(not TINY.exists(), reason="shared Criteo sample missing")

# Small enough for a shared 2-core machine, large enough to learn in 2 passes.
ARGS = ["--data", str(TINY), "--hidden", "16", "--embedding-size", "4", "--lr", "0.01",
        "--batch-size", "64"]
LINE = re.compile(r"^(?:\[worker\.(\d+)\] )?pass (\d+) batch (\d+) loss (\S+) auc (\S+)")
DONE = re.compile(r"^(?:\[worker\.(\d+)\] )?pass (\d+) done: examples (\d+) loss (\S+) auc (\S+)")


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def _run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=240,
                       check=False)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


def launch(cwd, servers, workers, *args):
    return _run([sys.executable, "-m", "pyfleet.launch", "--servers", str(servers),
                 "--workers", str(workers), "--timeout", "200", str(EXAMPLE), *ARGS, *args], cwd)


def local(cwd, *args):
    return _run([sys.executable, str(EXAMPLE), "--local", *ARGS, *args], cwd)


def losses(out, worker=0):
    """The per-batch losses of one worker, in order."""
    return np.array([float(m.group(4)) for m in map(LINE.match, out.splitlines())
                     if m and int(m.group(1) or 0) == worker])


def passes(out, worker=0):
    """``[(examples, mean loss, auc)]`` per pass of one worker."""
    return [(int(m.group(3)), float(m.group(4)), float(m.group(5)))
            for m in map(DONE.match, out.splitlines()) if m and int(m.group(1) or 0) == worker]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_example_two_servers_two_workers_learns(tmp_path, mode):
    out = launch(tmp_path, 2, 2, "--passes", "2", "--mode", mode)
    seen = 0
    for w in (0, 1):
        p = passes(out, w)
        assert len(p) == 2, out[-3000:]
        seen += p[0][0]
        assert p[1][2] > 0.55, f"worker {w} AUC {p[1][2]} after 2 passes ({mode})"
        assert p[1][1] < p[0][1], f"worker {w} loss did not fall: {p}"
    assert seen == 1999  # the workers split the file, every line read once


def test_one_sync_worker_through_servers_matches_one_process(tmp_path):
    ref = losses(local(tmp_path, "--passes", "1"))
    got = losses(launch(tmp_path, 2, 1, "--passes", "1", "--mode", "sync"))
    assert ref.shape == got.shape == (32,)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-6)


def test_save_with_two_servers_restore_with_three_continues(tmp_path):
    first = launch(tmp_path, 2, 1, "--passes", "1", "--mode", "sync", "--model-dir", "ckpt")
    assert (tmp_path / "ckpt").is_dir()
    resumed = losses(launch(tmp_path, 3, 1, "--passes", "1", "--mode", "sync",
                            "--init-model-dir", "ckpt"))
    fresh = losses(first)
    # What an uninterrupted run sees in its second pass.
    straight = losses(local(tmp_path, "--passes", "2"))[32:]
    k = 4
    assert resumed[:k].mean() < fresh[:k].mean() - 0.05, (resumed[:k], fresh[:k])
    # Every weight and optimizer state (sparse rows now spread over 3 servers,
    # dense parameters on other servers than before) carries over exactly.
    np.testing.assert_allclose(resumed, straight, rtol=2e-5, atol=1e-6)


def _example_module():
    spec = importlib.util.spec_from_file_location("fleet_ctr_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fleet_inference_model_equals_training_forward(tmp_path):
    from pyfleet import fluid
    from pyfleet.fluid import inference
    launch(tmp_path, 2, 1, "--passes", "1", "--mode", "sync", "--inference-dir", "infer",
           "--predict-out", "pred.txt")
    want = np.loadtxt(tmp_path / "pred.txt")
    model = inference.load(tmp_path / "infer")
    assert model.tables["SparseFeatFactors"] > 1000
    ex = _example_module()
    data = next(fluid.batch(ex.criteo_reader([str(TINY)]), batch_size=64)())
    feeder = fluid.DataFeeder(model.feed_names, program=model.program)
    (prob,) = model.predict(feeder.feed([sample[:-1] for sample in data]))
    assert prob.shape == (64, 2) and want.shape == (64,)
    np.testing.assert_allclose(prob[:, 1], want, rtol=1e-5, atol=1e-6)
    # and the command line scores a whole file with it
    out = _run([sys.executable, "-m", "pyfleet.cli", "predict", "--model", "infer",
                "--data", str(TINY), "--format", "csv", "--out", "all.txt"], tmp_path)
    assert "1,999" in out
    scores = np.loadtxt(tmp_path / "all.txt")
    assert scores.shape == (1999,) and ((scores > 0) & (scores < 1)).all()


def test_reader_names_a_line_that_is_not_criteo(tmp_path):
    reader = _example_module().criteo_reader
    assert sum(1 for _ in reader([str(TINY)])()) == 1999
    slot = tmp_path / "slot.txt"
    slot.write_text("click:1 dense_feature:0.5 1:123 2:456\n")
    with pytest.raises(ValueError, match=rf"{slot}:1: 1 fields, a Criteo line has 40"):
        next(reader([str(slot)])())

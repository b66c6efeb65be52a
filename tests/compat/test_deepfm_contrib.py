"""The era's DeepFM with fluid.contrib imports, batch_norm and dropout
(deepfm_contrib_train.py, only imports changed) trains locally as a user runs
it: the loss falls, every fetched value prints with %f, and its inference
model (dropout and batch_norm in test mode) predicts what its test program did."""

import importlib.util
import re
import subprocess
import sys

import numpy as np
from support import DATA, REPO

from pyfleet import fluid

SCRIPT = REPO / "tests" / "compat" / "deepfm_contrib_train.py"
TINY = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
FLOAT = r"(-?\d+\.\d{6})"


def _script():
    spec = importlib.util.spec_from_file_location("deepfm_contrib_train", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_deepfm_trains_and_its_inference_model_matches(tmp_path, one_blas_thread):
    out = subprocess.run([sys.executable, str(SCRIPT), "--train_data_path", str(TINY),
                          "--num_passes", "2", "--model_output_dir", str(tmp_path / "model")],
                         capture_output=True, text=True, timeout=600, env=one_blas_thread,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    batches = [ln for ln in lines if ln.startswith("pass: ")]
    assert len(batches) == 8
    for ln in batches:   # "%f" of each fetched [1] array: loss, auc, batch_auc
        assert re.fullmatch(rf"pass: \d, batch: \d+, loss: {FLOAT}, auc: {FLOAT}, "
                            rf"batch_auc: {FLOAT}", ln), ln
    means = [float(m.group(1)) for ln in lines
             if (m := re.fullmatch(rf"pass \d mean loss {FLOAT} auc {FLOAT}", ln))]
    assert len(means) == 2 and means[1] < means[0]
    test_line = [ln for ln in lines if ln.startswith("test predictions")]
    n, mean = re.fullmatch(rf"test predictions (\d+) mean {FLOAT}", test_line[0]).groups()

    mod = _script()
    exe = fluid.Executor(fluid.CPUPlace())
    prog, feed_names, fetches = fluid.io.load_inference_model(str(tmp_path / "model"), exe)
    ops = {op.type: op for op in prog.global_block().ops}
    assert ops["dropout"].attrs["is_test"] and ops["batch_norm"].attrs["is_test"]
    feeder = fluid.DataFeeder(feed_list=feed_names, place=fluid.CPUPlace(), program=prog)
    rows = [r[:-1] for r in mod.data_reader(str(TINY))()]
    preds = np.concatenate([exe.run(prog, feed=feeder.feed(rows[a:a + 500]),
                                    fetch_list=fetches)[0] for a in range(0, len(rows), 500)])
    assert preds.shape[0] == int(n)
    assert abs(float(preds.mean()) - float(mean)) < 2e-6

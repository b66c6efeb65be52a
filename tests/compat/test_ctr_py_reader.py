"""The era's py_reader CTR trainer (ctr_py_reader_train.py, only imports
changed) trains as a user runs it, and one of its regularized, clipped SGD
steps equals a numpy reference built from the unregularized step."""

import importlib.util
import subprocess
import sys

import numpy as np
from support import DATA, REPO

from pyfleet import fluid

SCRIPT = REPO / "tests" / "compat" / "ctr_py_reader_train.py"
TINY = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"


def _script():
    spec = importlib.util.spec_from_file_location("ctr_py_reader_train", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_script_trains_as_users_run_it(tmp_path, one_blas_thread):
    out = subprocess.run([sys.executable, str(SCRIPT), "--train_data_path", str(TINY),
                          "--model_output_dir", str(tmp_path), "--num_passes", "2"],
                         capture_output=True, text=True, timeout=600, env=one_blas_thread,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    means = [float(line.split()[4]) for line in out.stdout.splitlines()
             if line.startswith("pass ") and "mean loss" in line]
    aucs = [float(line.split()[6]) for line in out.stdout.splitlines()
            if line.startswith("pass ") and "mean loss" in line]
    assert len(means) == 2 and means[1] < means[0]
    assert aucs[1] > 0.5
    assert (tmp_path / "pass-1" / "SparseFeatFactors.table").is_file()


def _one_step(mod, rules, clip_norm, l2, lr, batch):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        avg_cost, _, _, py_reader, _words = mod.ctr_dnn_model(4, mod.hash_dim_, l2)
        if rules:
            mod.set_optimizer(avg_cost, clip_norm, l2, lr)
        else:   # the raw gradient: no clip, and the ParamAttr's regularizer taken off
            for p in main.all_parameters():
                p.regularizer = None
            fluid.optimizer.SGD(lr).minimize(avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    be = main.backend
    dense = [p.name for p in main.all_parameters() if not p.is_sparse_table]
    keys = np.unique(np.array([s[j][0] for s in batch for j in range(1, 27)], np.uint64))
    before = {n: be.pull_dense(n).astype(np.float64) for n in dense}
    rows0 = be.pull_sparse("SparseFeatFactors", keys).astype(np.float64)
    py_reader.decorate_paddle_reader(lambda: iter([batch]))
    py_reader.start()
    exe.run(main, fetch_list=[avg_cost])
    py_reader.reset()
    after = {n: be.pull_dense(n).astype(np.float64) for n in dense}
    rows1 = be.pull_sparse("SparseFeatFactors", keys).astype(np.float64)
    return before, after, rows0, rows1


def test_regularized_clipped_step_equals_numpy_reference():
    mod = _script()
    batch = list(mod.ctr_reader(str(TINY))())[:64]
    lr, clip_norm, l2 = 0.5, 0.05, 1e-2
    w0, w1_raw, r0, r1_raw = _one_step(mod, False, clip_norm, l2, lr, batch)
    g = {n: (w0[n] - w1_raw[n]) / lr for n in w0}
    g_rows = (r0 - r1_raw) / lr
    norm = np.sqrt(sum(np.sum(v * v) for v in g.values()) + np.sum(g_rows * g_rows))
    assert norm > clip_norm                      # the clip bites
    scale = clip_norm / norm
    v0, v1, q0, q1 = _one_step(mod, True, clip_norm, l2, lr, batch)
    for n in w0:
        np.testing.assert_allclose(v0[n], w0[n])
        want = w0[n] - lr * (g[n] * scale + l2 * w0[n])       # the optimizer's L2
        np.testing.assert_allclose(v1[n], want, rtol=1e-4, atol=2e-6, err_msg=n)
    np.testing.assert_allclose(q0, r0)
    want_rows = r0 - lr * (g_rows * scale + 10 * l2 * r0)      # ParamAttr's L2 wins
    np.testing.assert_allclose(q1, want_rows, rtol=1e-4, atol=2e-6)

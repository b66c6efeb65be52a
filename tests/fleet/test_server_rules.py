"""Momentum and the regularizers applied by the servers of a real sync Fleet
job (1 server, 2 workers on 127.0.0.1, started by ``python -m
pyfleet.launch``): the servers' parameters and optimizer state after a few
steps equal a numpy reference of Fluid's rule (the two workers' gradients
merged, averaged over the workers, the decay added once for each touched
row, then the rule), where the workers touch overlapping and disjoint rows;
and the first worker's auc counters travel with ``fleet.save_persistables``
into ``fluid.io.load_persistables`` and ``fleet.load_persistables``."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support import REPO
from support.mpi import MPI_MARKS, mpi_env

import pyfleet
from pyfleet import fluid

SCRIPT = REPO / "tests" / "fleet" / "server_rules_job.py"
spec = importlib.util.spec_from_file_location("server_rules_job", SCRIPT)
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)
STEPS = 6


def _launch(cwd, *args, mode="sync", launcher=()):
    """The job under the launcher; ``mode="hybrid"``: its workers as one MPI job."""
    if mode == "hybrid":
        env = mpi_env()
    else:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    env["PYFLEET_CHECKPOINT_DIR"] = str(cwd)
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--mode", mode, "--servers", "1",
                        "--workers", "2", "--timeout", "120", *launcher, str(SCRIPT), *args],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
                       check=False)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _decay(reg, w):
    if job.REG[reg] is None:
        return 0.0
    kind, c = job.REG[reg]
    return c * w if kind == "L2Decay" else c * np.sign(w)


def _reference(opt, reg, emb0, steps):
    """Fluid's sync pserver step, in float64: ``{key: (row, velocity)}``,
    ``(bias, bias velocity)`` and each worker's losses."""
    w = {k: v.astype(np.float64) for k, v in emb0.items()}
    vel = {k: np.zeros(job.DIM) for k in w}
    b, vb = np.array([job.BIAS0]), np.zeros(1)
    losses = {0: [], 1: []}
    for _ in range(steps):
        grads, gb = {}, np.zeros(1)
        for worker in (0, 1):
            ids, lengths, labels = job.batch(worker)
            seg = np.repeat(np.arange(len(lengths)), lengths)
            logit = np.zeros(len(lengths)) + b
            for j, k in enumerate(ids.tolist()):
                logit[seg[j]] += w[k].sum()
            y = labels[:, 0]
            p = 1 / (1 + np.exp(-logit))
            losses[worker].append(float(np.mean(np.maximum(logit, 0) - logit * y
                                                + np.log1p(np.exp(-np.abs(logit))))))
            d = (p - y) / len(lengths)
            for j, k in enumerate(ids.tolist()):
                grads[k] = grads.get(k, np.zeros(job.DIM)) + d[seg[j]]
            gb += d.sum()

        def step(x, v, g):
            g = g / 2 + _decay(reg, x)          # merged over the 2 workers, then decayed once
            if opt == "momentum":
                v = job.MU * v + g
                return x - job.LR * v, v
            return x - job.LR * g, v
        for k, g in grads.items():
            w[k], vel[k] = step(w[k], vel[k], g)
        b, vb = step(b, vb, gb)
    return w, vel, (b, vb), losses


def _local_program():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        _, states, _ = job.build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    return main, exe, states


@pytest.mark.parametrize(("opt", "reg", "extra", "mode"), [
    ("momentum", "none", (), "sync"), ("sgd", "l2", (), "sync"), ("sgd", "l1", (), "sync"),
    ("momentum", "l2", (), "sync"),
    ("sgd", "l2", ("--no-init-worker",), "sync"),   # the first step connects: decayed once still
    # Hybrid, sync sparse side: the server decays the sparse rows once a step, each
    # worker its dense replica's gradient before the averaging all-reduce (one decay).
    pytest.param("sgd", "l2", (), "hybrid", marks=MPI_MARKS),
    pytest.param("momentum", "l1", (), "hybrid", marks=MPI_MARKS),
], ids=["momentum", "sgd-l2", "sgd-l1", "momentum-l2", "sgd-l2-no-init-worker",
        "hybrid-sgd-l2", "hybrid-momentum-l1"])
def test_server_state_equals_fluid_reference(tmp_path, opt, reg, extra, mode):
    _launch(tmp_path, "--optimizer", opt, "--reg", reg, "--steps", str(STEPS), "--save", "ckpt",
            *extra, mode=mode)
    manifest = json.loads((tmp_path / "ckpt" / "MANIFEST.json").read_text())
    cfg = {t["name"]: t for t in manifest["tables"]}
    assert cfg["emb"]["optimizer"]["type"] == ("Momentum" if opt == "momentum" else "SGD")
    want_reg = None if job.REG[reg] is None else {
        "type": job.REG[reg][0], "regularization_coeff": job.REG[reg][1]}
    assert cfg["emb"].get("regularizer") == want_reg
    # A hybrid job's dense replicas live on the workers, which decay them.
    assert cfg["bias"].get("regularizer") == (None if mode == "hybrid" else want_reg)
    ids = [set(job.batch(w)[0].tolist()) for w in (0, 1)]
    assert ids[0] & ids[1] and ids[0] - ids[1] and ids[1] - ids[0]   # shared and own rows
    keys = np.array(sorted(ids[0] | ids[1]), dtype=np.uint64)
    init = pyfleet.SparseTable.from_config({k: v for k, v in cfg["emb"].items() if k != "kind"})
    emb0 = dict(zip(keys.tolist(), init.initial_values(keys)))
    want_w, want_v, (want_b, want_vb), want_losses = _reference(opt, reg, emb0, STEPS)

    main, exe, states = _local_program()
    fluid.io.load_persistables(exe, str(tmp_path / "ckpt"), main)
    table = main.backend.sparse["emb"]
    assert sorted(table.keys().tolist()) == keys.tolist()   # every row a worker touched
    got = table.export(keys, with_state=True)
    for i, k in enumerate(keys.tolist()):
        np.testing.assert_allclose(got["weights"][i], want_w[k], rtol=1e-5, atol=1e-6)
        if opt == "momentum":
            np.testing.assert_allclose(got["state"][i], want_v[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(main.backend.pull_dense("bias"), want_b, rtol=1e-5, atol=1e-6)
    if opt == "momentum":
        np.testing.assert_allclose(main.backend.dense["bias"].state(), want_vb,
                                   rtol=1e-5, atol=1e-6)
    for worker in (0, 1):
        losses = json.loads((tmp_path / f"worker{worker}.json").read_text())
        np.testing.assert_allclose(losses, want_losses[worker], rtol=1e-5)
        assert losses[-1] < losses[0]               # it trains

    # The first worker's auc counters: saved beside the manifest, read back
    # into a local program's scope by fluid.io.load_persistables.
    saved = np.load(tmp_path / "auc_saved.npz")
    assert sorted(saved.files) == sorted(v.name for v in states)
    assert sum(int(saved[n].sum()) for n in saved.files) > 0
    scope = fluid.global_scope()
    for n in saved.files:
        np.testing.assert_array_equal(np.array(scope.find_var(n).get_tensor()), saved[n])


def test_fleet_load_persistables_restores_the_workers_auc_counters(tmp_path):
    _launch(tmp_path, "--steps", "3", "--save", "ckpt")
    saved = np.load(tmp_path / "auc_saved.npz")
    assert sum(int(saved[n].sum()) for n in saved.files) > 0
    _launch(tmp_path, "--steps", "0", "--load", "ckpt")
    for worker in (0, 1):
        loaded = np.load(tmp_path / f"auc_loaded{worker}.npz")
        assert sorted(loaded.files) == sorted(saved.files)
        for n in saved.files:
            np.testing.assert_array_equal(loaded[n], saved[n])


def test_a_restarted_job_goes_on_with_the_saving_workers_auc_counters(tmp_path):
    # The undisturbed job saves after step 3 of 6 and trains on; the other is killed
    # there (worker 1) and restarted by the launcher from that checkpoint. The
    # saving worker's auc counters come back after its startup program, so its
    # running AUC after the last step is the undisturbed job's (sync: bit-identical).
    calm, healed = tmp_path / "calm", tmp_path / "healed"
    calm.mkdir(), healed.mkdir()
    _launch(calm, "--steps", "6", "--save", "ckpt", "--save-at", "3")
    r = _launch(healed, "--steps", "6", "--save", "ckpt", "--save-at", "3",
                "--die-after-save", launcher=("--max-restarts", "1", "--restore-dir", "ckpt"))
    assert "worker.1 was killed by SIGKILL; restarting the whole job" in r.stderr
    assert json.loads((healed / "ckpt" / "MANIFEST.json").read_text())["state_worker"] == 0
    # the restarted workers trained steps 4..6 only
    assert len(json.loads((healed / "worker0.json").read_text())) == 3
    want, got = np.load(calm / "final0.npz"), np.load(healed / "final0.npz")
    assert sorted(got.files) == sorted(want.files) and len(want.files) == 5  # auc, 4 states
    for n in want.files:
        np.testing.assert_array_equal(got[n], want[n])
    assert float(got["auc"]) > 0.5
    # Worker 1's counters are in no checkpoint (Fluid saves one trainer's): its AUC
    # counts the restarted steps only.
    one, whole = np.load(healed / "final1.npz"), np.load(calm / "final1.npz")
    states = [n for n in one.files if n != "auc"]
    assert sum(int(one[n].sum()) for n in states) < sum(int(whole[n].sum()) for n in states)

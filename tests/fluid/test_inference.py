"""pyfleet.fluid.inference (local source, unseen keys, predict_file, the CLI), the
EXPORT_SPARSE paging it uses, Fleet's error paths and Fluid's import-path shims."""

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from support import DATA

import pyfleet
from pyfleet import fluid, models
from pyfleet.distributed.fleet import Fleet
from pyfleet.errors import ConfigError
from pyfleet.fluid import inference

TINY = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
needs_data = pytest.mark.skipif(not TINY.exists(), reason="shared Criteo sample missing")


def _trained(steps=6, batch_size=200):
    from pyfleet.data import Dataset
    from pyfleet.trainer import feed_of
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 7
    with fluid.program_guard(main, startup):
        m = models.build("dnn", num_dense=13, num_slots=26, embedding_dim=4, layers=(16, 8))
        test = main.clone(for_test=True)
        fluid.optimizer.Adam(learning_rate=0.01).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    batches = list(Dataset(str(TINY), format="csv", batch_size=batch_size))
    for b in batches[:steps]:
        exe.run(main, feed=feed_of(b, m), fetch_list=[m.avg_cost])
    return main, test, m, exe, batches, feed_of


@needs_data
def test_local_inference_model_equals_training_forward(tmp_path):
    main, test, m, exe, batches, feed_of = _trained()
    feeds = [v.name for v in m.inputs if v is not m.label]
    names = inference.save(tmp_path / "model", main, feeds, [m.predict],
                           inference.LocalSource(main.backend))
    assert names == [m.predict.name]
    files = set(os.listdir(tmp_path / "model"))
    assert {"__model__.json", "SparseFeatFactors.keys.npy",
            "SparseFeatFactors.weights.npy"} <= files
    assert not any(f.endswith(".table") for f in files)  # no optimizer state
    table = main.backend.sparse["SparseFeatFactors"]
    p = inference.load(tmp_path / "model")
    assert p.tables == {"SparseFeatFactors": len(table)}
    # Seen keys (first batches) and unseen ones (the last batch) alike.
    for b in (batches[0], batches[-1]):
        feed = feed_of(b, m)
        (want,) = exe.run(test, feed=feed, fetch_list=[m.predict])
        del feed[m.label.name]
        (got,) = p.predict(feed)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@needs_data
def test_unseen_key_gets_the_servers_initial_row(tmp_path):
    main, _, m, _, _, _ = _trained(steps=2)
    feeds = [v.name for v in m.inputs if v is not m.label]
    inference.save(tmp_path, main, feeds, [m.predict], inference.LocalSource(main.backend))
    p = inference.load(tmp_path)
    table = main.backend.sparse["SparseFeatFactors"]
    seen = table.keys()[:5]
    unseen = np.array([2**63 + 12345, 987654321987], dtype=np.uint64)
    assert not np.isin(unseen, table.keys()).any()
    backend = p.program.backend
    rows = backend.pull_sparse("SparseFeatFactors", np.concatenate([seen, unseen]))
    np.testing.assert_array_equal(rows[:5], table.export(seen)["weights"])
    np.testing.assert_array_equal(rows[5:], table.initial_values(unseen))
    assert np.abs(rows[5:]).max() > 0  # the initializer's row, not zeros


def _saved_model(tmp_path, steps, batch_size):
    """``(model dir, _trained's result)``: a model trained here, saved by inference.save."""
    trained = _trained(steps=steps, batch_size=batch_size)
    main, m = trained[0], trained[2]
    feeds = [v.name for v in m.inputs if v is not m.label]
    model = tmp_path / "model"
    inference.save(model, main, feeds, [m.predict], inference.LocalSource(main.backend))
    return model, trained


@needs_data
def test_predict_file_and_cli(tmp_path):
    model, (_, test, m, exe, batches, feed_of) = _saved_model(tmp_path, 3, 500)
    want = np.concatenate([exe.run(test, feed=feed_of(b, m), fetch_list=[m.predict])[0]
                           for b in batches]).reshape(-1)
    out = tmp_path / "pred.txt"
    rows = subprocess.run([sys.executable, "-m", "pyfleet.cli", "predict", "--model", str(model),
                           "--data", str(TINY), "--format", "csv", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert rows.returncode == 0, rows.stderr
    got = np.loadtxt(out)
    assert got.shape == (1999,) == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    n = inference.load(model).predict_file(str(TINY), str(tmp_path / "p2.txt"), format="csv",
                                           batch_size=333)
    assert n == 1999
    np.testing.assert_allclose(np.loadtxt(tmp_path / "p2.txt"), want, rtol=1e-6, atol=1e-7)


@needs_data
def test_predict_cli_stops_at_a_malformed_line_unless_told_to_skip(tmp_path):
    model, _ = _saved_model(tmp_path, 1, 500)
    lines = TINY.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines[:4] + ["garbage line"] + lines[4:]) + "\n")
    out = tmp_path / "pred.txt"

    def predict(*extra, model=model):
        return subprocess.run([sys.executable, "-m", "pyfleet.cli", "predict", "--model",
                               str(model), "--data", str(bad), "--format", "csv", "--out",
                               str(out), *extra],
                              capture_output=True, text=True, timeout=120, check=False)

    r = predict()
    # a skipped line would shift every later prediction against its input line
    assert r.returncode == 1 and f"pyfleet predict: {bad}:5" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
    assert set(os.listdir(tmp_path)) == {"model", "bad.csv"}  # no temporary file left
    r = predict("--skip-malformed")
    assert r.returncode == 0 and "skipped 1 malformed line(s)" in r.stderr, r.stderr
    assert np.loadtxt(out).shape == (len(lines) - 1,)  # a line per valid example
    r = predict(model=tmp_path)
    assert r.returncode == 1 and f"pyfleet predict: --model {tmp_path}" in r.stderr
    assert "Traceback" not in r.stderr


def test_load_refuses_missing_or_foreign(tmp_path):
    with pytest.raises(ValueError, match="no inference model"):
        inference.load(tmp_path)
    (tmp_path / "__model__.json").write_text(json.dumps({"format": "pyfleet.fluid.program"}))
    with pytest.raises(ValueError, match="not written by pyfleet.inference.save"):
        inference.load(tmp_path)


def test_export_sparse_pages_every_row_of_every_server():
    from support.service import ServerGroup

    from pyfleet.optimizer import Adagrad
    from pyfleet.service.client import Client
    cfg = {"kind": "sparse", "name": "emb", "dim": 3, "optimizer": Adagrad(0.1).to_config(),
           "initializer": pyfleet.initializer.Uniform(-0.1, 0.1).to_config(), "seed": 5,
           "entry": None}
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**64, size=1000, dtype=np.uint64))
    keys = np.concatenate([keys, np.array([0, 2**64 - 1], dtype=np.uint64)])
    with ServerGroup(2, 1) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([cfg])
        c.push_sparse("emb", keys, rng.standard_normal((keys.shape[0], 3)).astype(np.float32))
        want = c.pull_sparse("emb", keys)
        pages = list(c.export_sparse("emb", page_rows=97))
        assert max(k.shape[0] for k, _ in pages) <= 97
        assert len(pages) >= keys.shape[0] // 97
        got_k = np.concatenate([k for k, _ in pages])
        got_w = np.concatenate([w for _, w in pages])
        assert got_k.shape == (keys.shape[0],) and np.unique(got_k).shape == got_k.shape
        order = np.argsort(got_k)
        ref = np.argsort(keys)
        np.testing.assert_array_equal(got_k[order], keys[ref])
        np.testing.assert_array_equal(got_w[order], want[ref])
        with pytest.raises(ValueError, match="page_rows"):
            next(c.export_sparse("emb", page_rows=0))
        # Hostile requests get an error reply naming the problem; the server goes on.
        from pyfleet.errors import RemoteError
        from pyfleet.service.protocol import Op
        ch = c._channel()
        for payload, what in [({"limit": 0}, "limit"), ({"limit": True}, "limit"),
                              ({"after": -1}, "after"), ({"after": 2**64}, "after"),
                              ({"after": "7"}, "after"), (None, "payload frame")]:
            call = c._send(ch, 0, Op.EXPORT_SPARSE, table=c._ids[0]["emb"], dim=3,
                           payload=payload)
            with pytest.raises(RemoteError, match=what):
                ch.wait([call])
        call = c._send(ch, 0, Op.EXPORT_SPARSE, table=999, dim=3, payload={})
        with pytest.raises(RemoteError, match="unknown table"):
            ch.wait([call])
        assert sum(k.shape[0] for k, _ in c.export_sparse("emb")) == keys.shape[0]
        c.stop_worker()


# ------------------------------------------------------------ Fleet errors


@pytest.fixture
def no_role_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("PYFLEET_", "PADDLE_", "OMPI_", "PMI", "TRAINING_ROLE", "POD_IP")):
            monkeypatch.delenv(k, raising=False)


def test_init_without_role_maker_or_environment_says_what_to_set(no_role_env):
    with pytest.raises(ConfigError, match="PYFLEET_ROLE"):
        Fleet().init()


def _minimized(f, role):
    from pyfleet.distributed.role_maker import UserDefinedRoleMaker
    f.init(UserDefinedRoleMaker(current_id=0, role=role, worker_num=1,
                                server_endpoints=["127.0.0.1:1"]))
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        m = models.build("lr", num_dense=2, num_slots=2, embedding_dim=2)
        f.distributed_optimizer(fluid.optimizer.SGD(0.1)).minimize(m.avg_cost)
    return f


def test_role_errors():
    from pyfleet.distributed.role_maker import Role
    with pytest.raises(ConfigError, match="fleet.init"):
        Fleet().is_worker()
    with pytest.raises(ConfigError, match="init_server.*worker"):
        _minimized(Fleet(), Role.WORKER).init_server()
    with pytest.raises(ConfigError, match="init_worker.*server"):
        _minimized(Fleet(), Role.SERVER).init_worker()
    with pytest.raises(ConfigError, match=r"fleet\.init"):
        Fleet().init_server()
    from pyfleet.distributed.role_maker import UserDefinedRoleMaker
    f = Fleet()
    f.init(UserDefinedRoleMaker(current_id=0, role=Role.SERVER, worker_num=1,
                                server_endpoints=["127.0.0.1:1"]))
    with pytest.raises(ConfigError, match="minimize"):
        f.init_server()
    with pytest.raises(ConfigError, match="run_server"):
        _minimized(Fleet(), Role.SERVER).run_server()
    with pytest.raises(ConfigError, match="init_worker"):
        _minimized(Fleet(), Role.WORKER).save_persistables(None, "x")
    with pytest.raises(ValueError, match="optimizer"):
        Fleet().distributed_optimizer("adam")
    with pytest.raises(ConfigError, match="role_maker"):
        Fleet().init(role_maker="worker")


def test_a_worker_program_without_init_worker_trains_through_the_servers_or_fails():
    """As in Fluid's sync mode, init_worker is optional: the first run that needs a
    parameter connects (never a silent local model), so with no server there it
    fails within connect_timeout, naming the server."""
    from pyfleet.distributed.role_maker import Role
    from pyfleet.errors import PeerTimeout
    f = _minimized(Fleet(), Role.WORKER)
    f._strategy.runtime.connect_timeout = 1.0
    exe = fluid.Executor()
    exe.run(f.startup_program)  # allowed before init_worker, as in Fluid scripts
    block = f.main_program.global_block()
    feed = {v.name: (np.array([1, 2], np.int64), np.array([0, 1, 2])) if v.lod_level else
            np.zeros((2, *v.shape[1:]), v.dtype)
            for v in block.vars.values() if getattr(v, "is_data", False)}
    assert feed
    with pytest.raises(PeerTimeout, match="127.0.0.1:1"):
        exe.run(f.main_program, feed=feed)


def test_fluid_import_paths_are_the_same_objects():
    # pyfleet.role_maker and pyfleet.inference are old paths: their DeprecationWarning
    # is asserted by test_architecture's test of the old paths
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import pyfleet.inference as old_inference
        from pyfleet import role_maker
    from pyfleet import config
    from pyfleet.fluid.incubate.fleet.base.role_maker import (
        PaddleCloudRoleMaker,
        Role,
        UserDefinedRoleMaker,
    )
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet
    from pyfleet.fluid.transpiler import DistributeTranspilerConfig as C2
    from pyfleet.fluid.transpiler.distribute_transpiler import DistributeTranspilerConfig
    assert fleet is pyfleet.fleet
    assert UserDefinedRoleMaker is role_maker.UserDefinedRoleMaker
    assert Role is role_maker.Role and PaddleCloudRoleMaker is role_maker.PaddleCloudRoleMaker
    assert DistributeTranspilerConfig is C2 is config.DistributeTranspilerConfig
    assert old_inference.load is inference.load and old_inference.save is inference.save
    assert old_inference.LocalSource is inference.LocalSource


def test_the_package_loads_fluid_and_fleet_on_first_use_only():
    code = ("import sys, pyfleet\n"
            "assert not [m for m in sys.modules if m.startswith(('pyfleet.fluid', "
            "'pyfleet.distributed', 'pyfleet.models'))], sorted(sys.modules)\n"
            "from pyfleet import fleet\n"
            "from pyfleet.distributed.fleet import Fleet\n"
            "assert isinstance(fleet, Fleet) and pyfleet.batch and pyfleet.models.build\n"
            "assert set(pyfleet.__all__) <= set(dir(pyfleet))\n"
            "print(pyfleet.__version__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    from pyfleet._version import __version__
    assert r.stdout.strip() == __version__ == pyfleet.__version__

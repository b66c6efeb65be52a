"""Fleet checkpoints through the service: manifest, verification, delta chains, resharding.

Servers are real ``Server`` endpoints on 127.0.0.1 (each its own ``Fleet``, run
in a thread of this process so their tables can be read back exactly); the
worker trains a small DNN on synthetic Criteo rows through ``fleet``.
"""

import contextlib
import json
import os
import threading

import numpy as np
import pytest

import pyfleet
from pyfleet import _atomic, fluid
from pyfleet.data import Dataset, synthetic
from pyfleet.distributed.fleet import MANIFEST_NAME, Fleet
from pyfleet.distributed.role_maker import Role, UserDefinedRoleMaker
from pyfleet.launch import free_ports
from pyfleet.optimizer import Adam
from pyfleet.service import checkpoint as _checkpoint
from pyfleet.service.checkpoint import body_digest
from pyfleet.trainer import JOB_DEFAULTS, build_program, feed_of, strategy_of

JOB = {**JOB_DEFAULTS, "embedding_dim": 4, "layers": [8], "batch_size": 128, "lr": 0.01,
       "request_timeout": 20.0, "connect_timeout": 20.0}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return synthetic.generate(d, rows=3000, seed=3)["train"]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFLEET_CHECKPOINT_DIR", str(tmp_path))
    return tmp_path


class Cluster:
    """``S`` servers (threads) + one worker fleet in this process."""

    def __init__(self, num_servers, data, model_dir=None, job=JOB):
        self.data = data
        schema = Dataset(data, format="criteo").schema
        with fluid.unique_name.guard():  # the same parameter names in every cluster
            main, startup, self.model = build_program(job, schema.n_dense, schema.n_slots)
        eps = [f"127.0.0.1:{p}" for p in free_ports(num_servers)]
        strategy = strategy_of(JOB)
        self.worker = Fleet()
        self.worker.init(UserDefinedRoleMaker(0, Role.WORKER, 1, eps))
        with fluid.program_guard(main, startup):
            self.worker.distributed_optimizer(Adam(JOB["lr"]), strategy).minimize(
                self.model.avg_cost)
        self.servers, self.threads = [], []
        try:
            for i in range(num_servers):
                f = Fleet()
                f.init(UserDefinedRoleMaker(i, Role.SERVER, 1, eps))
                f._set_program(main, startup, strategy)
                f.init_server(model_dir)
                self.servers.append(f._server)
                t = threading.Thread(target=f.run_server, daemon=True)
                t.start()
                self.threads.append(t)
            self.worker.init_worker()
        except BaseException:
            self.close()
            raise
        self.main = main
        self.exe = fluid.Executor(fluid.CPUPlace())
        self.exe.run(startup)

    def train(self, batches, seed):
        for i, batch in enumerate(Dataset(self.data, format="criteo",
                                          batch_size=JOB["batch_size"], shuffle=True,
                                          seed=seed)):
            if i == batches:
                break
            self.exe.run(self.main, feed=feed_of(batch, self.model),
                         fetch_list=[self.model.avg_cost])
        self.worker._backend.finish()

    def state(self):
        """Every sparse row (weights, optimizer state, update count) merged over
        the servers, sorted by key; every dense parameter's weights."""
        sparse, dense = {}, {}
        for s in self.servers:
            for e in s.registry.entries.values():
                if e.kind == "sparse":
                    sparse.setdefault(e.name, []).append(e.table.export(with_state=True))
                else:
                    dense.setdefault(e.name, []).append((e.start, e.table.pull().reshape(-1)))
        out = {}
        for name, parts in sparse.items():
            keys = np.concatenate([p["keys"] for p in parts])
            assert np.unique(keys).shape[0] == keys.shape[0], f"{name}: a key on two servers"
            order = np.argsort(keys)
            out[name] = {f: np.concatenate([p[f] for p in parts])[order]
                         for f in ("keys", "weights", "state", "update_count")}
        for name, blocks in dense.items():
            out[name] = np.concatenate([b for _, b in sorted(blocks, key=lambda b: b[0])])
        return out

    def close(self):
        if self.worker._client is not None:
            self.worker.stop_worker()
        for s in self.servers:
            s.stop()
        for t in self.threads:
            t.join(30)


@contextlib.contextmanager
def cluster(num_servers, data, model_dir=None, job=JOB):
    c = Cluster(num_servers, data, model_dir, job)
    try:
        yield c
    finally:
        c.close()


def assert_same_state(a, b, optimizer_state=True):
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], dict):
            fields = ("keys", "weights", "state", "update_count") if optimizer_state \
                else ("keys", "weights")
            for f in fields:
                np.testing.assert_array_equal(a[name][f], b[name][f], err_msg=f"{name}.{f}")
        else:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_manifest_lists_every_file_with_its_checksum_and_rows(root, data):
    with cluster(2, data) as c:
        c.train(5, seed=1)
        for bad, why in (([1], "must be a dict"), ({"t": object()}, "JSON-serializable"),
                         ({"x": float("nan")}, "JSON-serializable")):
            with pytest.raises(ValueError, match=why):
                c.worker.save_persistables(c.exe, "ck", meta=bad)
        assert not (root / "ck").exists()  # refused before anything was written
        m = c.worker.save_persistables(c.exe, "ck", meta={"pass": 3, "note": "x"})
        rows = {n: v["keys"].shape[0] for n, v in c.state().items() if isinstance(v, dict)}
    on_disk = json.loads((root / "ck" / MANIFEST_NAME).read_text())
    assert on_disk == json.loads(json.dumps(m))
    assert m["version"] == 2 and m["server_num"] == 2 and m["mode"] == "full"
    assert on_disk["meta"] == {"pass": 3, "note": "x"}
    (gen,) = m["chain"]
    # the manifest and the generation only; the saving worker's auc counters are
    # in the generation, committed with it
    assert sorted(os.listdir(root / "ck")) == sorted([MANIFEST_NAME, gen["dir"]])
    states = [n for n in gen["files"] if n.endswith(".state.npy")]
    assert states and m["state_dir"] == gen["dir"] and m["state_worker"] == 0
    # every file of the generation (shards, dense blocks, the servers' own json,
    # the auc counters) is checksummed, and so is the manifest's body
    assert sorted(os.listdir(root / "ck" / gen["dir"])) == sorted(gen["files"])
    assert {"server0-of-2.json", "server1-of-2.json"} <= set(gen["files"])
    assert m["beside"] == {}
    assert m["body_sha256"] == body_digest(m)
    for name, f in gen["files"].items():
        where = root / "ck" / gen["dir"] / name
        assert where.stat().st_size == f["bytes"]
        assert len(f["sha256"]) == 64
    for table, n in rows.items():
        assert gen["rows"][table] == n
        assert sum(f["rows"] for f in gen["files"].values() if f.get("table") == table) == n


def _scope_states(main):
    scope = fluid.global_scope()
    return {v.name: np.array(scope.vars[v.name]) for v in main.list_vars()
            if getattr(v, "persistable", False) and not isinstance(v, fluid.framework.Parameter)
            and v.name in scope.vars}


def test_a_save_cut_short_before_its_commit_leaves_the_committed_checkpoint_whole(
        root, data, monkeypatch):
    """Ctrl-C reached a job while worker 0 was saving a pass's checkpoint, after its
    auc counters were written and before the manifest was committed: the committed
    (previous) checkpoint must still read, with the counters it was saved with."""
    with cluster(2, data) as c:
        c.train(4, seed=1)
        m1 = c.worker.save_persistables(c.exe, "ck", meta={"pass": 1})
        saved = _scope_states(c.main)
        assert saved and any(v.sum() > 0 for v in saved.values())
        c.train(4, seed=2)
        later = _scope_states(c.main)
        assert any(not np.array_equal(saved[n], later[n]) for n in saved)

        def interrupted(path, manifest):
            raise KeyboardInterrupt   # the signal, between writing and committing
        with monkeypatch.context() as mp:
            mp.setattr(_checkpoint, "commit", interrupted)
            with pytest.raises(KeyboardInterrupt):
                c.worker.save_persistables(c.exe, "ck", meta={"pass": 2})
        path = str(root / "ck")
        m = _checkpoint.read_manifest(path)   # not refused: nothing it names changed
        assert m == json.loads(json.dumps(m1)) and m["meta"] == {"pass": 1}
        sdir = _checkpoint.state_dir(path, m)
        got = {n[:-len(".state.npy")]: np.load(os.path.join(sdir, n))
               for n in os.listdir(sdir) if n.endswith(".state.npy")}
        assert got.keys() == saved.keys()
        for n, v in saved.items():
            np.testing.assert_array_equal(got[n], v, err_msg=n)
        # and the worker reads the committed counters back
        c.worker.load_persistables(c.exe, "ck", c.main)
        for n, v in _scope_states(c.main).items():
            np.testing.assert_array_equal(v, saved[n], err_msg=n)


def test_restore_is_exact_and_a_damaged_file_is_refused_by_name(root, data):
    with cluster(2, data) as c:
        c.train(5, seed=1)
        m = c.worker.save_persistables(c.exe, "ck")
        want = c.state()
    with cluster(2, data, model_dir="ck") as c:
        assert_same_state(c.state(), want)
    gen = m["chain"][0]["dir"]
    victim = min(m["chain"][0]["files"])
    path = root / "ck" / gen / victim
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=f"{gen}/{victim}.*damaged"):
        Cluster(2, data, model_dir="ck")
    path.write_bytes(bytes(raw[:-5]))
    with pytest.raises(ValueError, match=f"{gen}/{victim}.*truncated"):
        Cluster(2, data, model_dir="ck")
    path.unlink()
    with pytest.raises(ValueError, match=f"{gen}/{victim} is missing"):
        Cluster(2, data, model_dir="ck")


def test_a_checkpoint_of_another_model_is_refused_naming_the_parameter(root, data):
    with cluster(2, data) as c:
        c.train(2, seed=1)
        m = c.worker.save_persistables(c.exe, "ck")
    n_in = next(t["shape"][0] for t in m["tables"] if t["name"] == "fc_0.w_0")
    # other hidden layer sizes: every dense block would load, as flat ranges
    # of the old weights, without this check
    wide = {**JOB, "layers": [6]}
    with pytest.raises(ValueError, match=rf"'fc_0.w_0' as a dense parameter of shape "
                                         rf"\[{n_in}, 8\]; this program has it as a dense "
                                         rf"parameter of shape \[{n_in}, 6\]"):
        Cluster(2, data, model_dir="ck", job=wide)
    with pytest.raises(ValueError, match=r"'SparseFeatFactors' as a sparse table of dim 4; "
                                         r"this program has it as a sparse table of dim 5"):
        Cluster(1, data, model_dir="ck", job={**JOB, "embedding_dim": 5})
    # the servers check too, for a save directory without a manifest
    gen = m["chain"][0]["dir"]
    with cluster(2, data, job=wide) as c, \
            pytest.raises(ValueError, match=rf"dense 'fc_0.w_0' has shape \[{n_in}, 8\] in "
                                            rf"'ck/{gen}', \[{n_in}, 6\] here"):
        c.servers[0].load_checkpoint(f"ck/{gen}")


def test_a_server_whose_model_dir_does_not_load_lets_go_of_its_port(root, data):
    schema = Dataset(data, format="criteo").schema
    with fluid.unique_name.guard():
        main, startup, model = build_program(JOB, schema.n_dense, schema.n_slots)
    eps = [f"127.0.0.1:{free_ports(1)[0]}"]
    worker = Fleet()  # minimizes the program, as the worker of Cluster does
    worker.init(UserDefinedRoleMaker(0, Role.WORKER, 1, eps))
    with fluid.program_guard(main, startup):
        worker.distributed_optimizer(Adam(JOB["lr"]), strategy_of(JOB)).minimize(
            model.avg_cost)
    for _ in range(2):  # the second binds the port the first let go of
        f = Fleet()
        f.init(UserDefinedRoleMaker(0, Role.SERVER, 1, eps))
        f._set_program(main, startup, strategy_of(JOB))
        with pytest.raises(ValueError, match=f"'nowhere' has no {MANIFEST_NAME}"):
            f.init_server("nowhere")
        assert f._server is None


def test_init_server_loads_from_outside_the_root_but_requests_may_not(root, data,
                                                                     monkeypatch):
    with cluster(2, data) as c:
        c.train(3, seed=1)
        c.worker.save_persistables(c.exe, "ck")
        want = c.state()
    (root / "other").mkdir()
    monkeypatch.setenv("PYFLEET_CHECKPOINT_DIR", str(root / "other"))
    with cluster(2, data, model_dir=str(root / "ck")) as c:  # the server's own load
        assert_same_state(c.state(), want)
        with pytest.raises(ValueError, match="must be inside the checkpoint root"):
            c.worker.save_persistables(c.exe, str(root / "ck2"))
        with pytest.raises(pyfleet.errors.RemoteError, match="escapes the checkpoint dir"):
            c.worker._client.load("../ck")  # a request from the network stays confined


def test_runs_after_stop_worker_are_refused_by_name(root, data):
    from pyfleet.errors import ConfigError
    c = Cluster(1, data)
    c.close()
    with pytest.raises(ConfigError, match=r"fleet.stop_worker\(\) was called"):
        c.train(1, seed=1)


def test_fluid_io_on_a_worker_saves_what_fleet_saves_and_loads_into_a_local_program(
        root, data, tmp_path_factory, monkeypatch):
    """fluid.io.save_persistables on a worker's program is fleet.save_persistables
    (Fluid's Fleet calls it); fluid.io.load_persistables reads that checkpoint of
    2 servers into a plain local program exactly (every row with its optimizer
    state, every dense weight); save_inference_model gathers from the servers.
    A relative dirname is the servers' (under the checkpoint root) for the
    worker's auc counters too, each written once (before the manifest's commit):
    nothing is written under the working directory."""
    cwd = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(cwd)
    written = []
    save_npy = _atomic.save_npy
    monkeypatch.setattr(_atomic, "save_npy",
                        lambda path, value: (written.append(path), save_npy(path, value)))
    with cluster(2, data) as c:
        c.train(6, seed=1)
        fluid.io.save_persistables(c.exe, "ckpt", main_program=c.main)
        states = [p for p in written if p.endswith(".state.npy")]
        assert states and len(states) == len(set(states)), states
        feeds = [v.name for v in c.model.inputs if v is not c.model.label]
        fluid.io.save_inference_model(str(root / "m"), feeds, [c.model.predict], c.exe,
                                      main_program=c.main)
        want = c.state()
    assert (root / "ckpt" / MANIFEST_NAME).is_file()
    assert list((root / "ckpt").glob("g*/*.state.npy")), sorted((root / "ckpt").iterdir())
    assert list(cwd.iterdir()) == []
    schema = Dataset(data, format="criteo").schema
    with fluid.unique_name.guard():  # the infer script's own plain program
        main, startup, model = build_program(JOB, schema.n_dense, schema.n_slots)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    fluid.io.load_persistables(exe, str(root / "ckpt"), main)
    be = main.backend
    for name, value in want.items():
        if isinstance(value, dict):
            got = be.sparse[name].export(with_state=True)
            order = np.argsort(got["keys"])
            for f in ("keys", "weights", "state", "update_count"):
                np.testing.assert_array_equal(got[f][order], value[f], err_msg=f"{name}.{f}")
        else:
            np.testing.assert_array_equal(be.pull_dense(name).reshape(-1), value, err_msg=name)
    batch = next(iter(Dataset(data, format="criteo", batch_size=256)))
    test = main.clone(for_test=True)
    local = exe.run(test, feed=feed_of(batch, model), fetch_list=[model.predict])[0]
    program, feed_names, fetch = fluid.io.load_inference_model(str(root / "m"), exe)
    served = exe.run(program, feed={n: v for n, v in feed_of(batch, model).items()
                                    if n in feed_names}, fetch_list=fetch)[0]
    np.testing.assert_array_equal(local, served)


def test_a_directory_without_a_manifest_is_refused(root, data):
    (root / "half").mkdir()
    with pytest.raises(ValueError, match="no MANIFEST.json"):
        Cluster(1, data, model_dir="half")


def test_delta_chain_restores_the_state_of_a_full_save(root, data):
    with cluster(2, data) as c:
        c.train(4, seed=1)
        c.worker.save_persistables(c.exe, "ck")
        c.train(3, seed=2)
        m1 = c.worker.save_persistables(c.exe, "ck", mode="delta")
        c.train(3, seed=3)
        m2 = c.worker.save_persistables(c.exe, "ck", mode="delta")
        assert [g["mode"] for g in m2["chain"]] == ["full", "delta", "delta"]
        assert m2["chain"][:2] == m1["chain"]
        # a delta holds only the rows changed since the previous save
        (emb,) = [n for n, v in c.state().items() if isinstance(v, dict)]
        assert 0 < m2["chain"][2]["rows"][emb] < c.state()[emb]["keys"].shape[0]
        c.train(2, seed=4)
        other = c.worker.save_persistables(c.exe, "elsewhere", mode="delta")
        want_last = c.state()
        c.worker.save_persistables(c.exe, "full")
        want = c.state()
    assert want_last.keys() == want.keys()
    assert sorted(os.listdir(root / "ck")) == \
        sorted([MANIFEST_NAME] + [g["dir"] for g in m2["chain"]])
    with cluster(2, data, model_dir="ck") as c:
        got_chain = c.state()
    with cluster(2, data, model_dir="full") as c:
        assert_same_state(c.state(), want)
    with cluster(2, data, model_dir=["ck", "elsewhere"]) as c:
        assert_same_state(c.state(), want)
    with cluster(2, data) as c:  # the same through the service, into running servers
        loaded = c.worker._client.load(["ck", "elsewhere"])
        assert len(loaded) == 2
        assert_same_state(c.state(), want)
    assert other["parent"] == m2["id"]
    # the chain in "ck" alone is the state two batches earlier, not the last one
    assert any(not np.array_equal(got_chain[n]["update_count"].sum(),
                                  want[n]["update_count"].sum())
               for n in want if isinstance(want[n], dict))
    with pytest.raises(ValueError, match="load it after its base"):
        Cluster(2, data, model_dir="elsewhere")
    with pytest.raises(ValueError, match="full checkpoint: only the first"):
        Cluster(2, data, model_dir=["ck", "full"])


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 2)])
def test_reshard_keeps_every_key_once_with_its_state(root, data, before, after):
    with cluster(before, data) as c:
        c.train(5, seed=1)
        c.worker.save_persistables(c.exe, "ck")
        want = c.state()
    with cluster(after, data, model_dir="ck") as c:
        got = c.state()  # asserts no key is on two servers
        counts = [len(e.table) for s in c.servers for e in s.registry.entries.values()
                  if e.kind == "sparse"]
    assert len(counts) == after * sum(isinstance(v, dict) for v in want.values())
    assert min(counts) > 0
    # dense blocks move between servers: their weights are exact, their
    # optimizer state restarts (docs/operations.md); sparse rows keep everything
    assert_same_state(got, want)


def test_a_manifest_naming_files_outside_its_generation_is_refused(root, data):
    with cluster(1, data) as c:
        m = c.worker.save_persistables(c.exe, "ck")
    gen = m["chain"][0]
    gen["files"]["../../escape.bin"] = next(iter(gen["files"].values()))
    (root / "ck" / MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(ValueError, match="bad file names"):
        Cluster(1, data, model_dir="ck")


def test_sync_worker_with_a_refused_push_stays_in_step(data):
    """A NaN gradient is refused by the servers; the worker gets the error for
    that step only, and its later steps still pair with the other worker's."""
    from pyfleet.config import DistributeTranspilerConfig
    from pyfleet.errors import RemoteError
    schema = Dataset(data, format="criteo").schema
    eps = [f"127.0.0.1:{p}" for p in free_ports(1)]
    strategy = DistributeTranspilerConfig()
    strategy.sync_mode = True
    strategy.runtime.request_timeout = strategy.runtime.connect_timeout = 20.0
    strategy.runtime.barrier_timeout = 20.0

    def program():
        with fluid.unique_name.guard():
            main, startup, model = build_program(JOB, schema.n_dense, schema.n_slots)
        return main, startup, model

    server = Fleet()
    server.init(UserDefinedRoleMaker(0, Role.SERVER, 2, eps))
    main, startup, _ = program()
    with fluid.program_guard(main, startup):
        Adam(JOB["lr"]).minimize(_.avg_cost)
    server._set_program(main, startup, strategy)
    server.init_server()
    srv = server._server
    t = threading.Thread(target=server.run_server, daemon=True)
    t.start()
    batches = list(Dataset(data, format="criteo", batch_size=64))[:4]
    results = [[], []]

    workers = []  # built here: fluid's program and name guards are process-wide
    for i in range(2):
        f = Fleet()
        f.init(UserDefinedRoleMaker(i, Role.WORKER, 2, eps))
        main, startup, model = program()
        with fluid.program_guard(main, startup):
            f.distributed_optimizer(Adam(JOB["lr"]), strategy).minimize(model.avg_cost)
        workers.append((f, model))

    def worker(i):
        f, model = workers[i]
        f.init_worker()
        exe = fluid.Executor()
        exe.run(f.startup_program)
        backend, push = f._backend, f._backend.push_dense_many
        for step, b in enumerate(batches):
            feed = feed_of(b, model)
            # worker 1's step 1 pushes a NaN gradient (as a diverging model would)
            backend.push_dense_many = (lambda g: push({k: np.full_like(v, np.nan)
                                                       for k, v in g.items()})) \
                if (i, step) == (1, 1) else push
            try:
                (loss,) = exe.run(f.main_program, feed=feed, fetch_list=[model.avg_cost])
                results[i].append(float(np.asarray(loss).reshape(-1)[0]))
            except RemoteError as e:
                results[i].append(str(e))
        f.stop_worker()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for w in threads:
        w.start()
    for w in threads:
        w.join(60)
    srv.stop()
    t.join(30)
    assert isinstance(results[1][1], str) and "NaN or Inf" in results[1][1]
    # one error, at its step; the later steps train (and no step of either
    # worker fails with the refused step's leftovers)
    assert all(isinstance(x, float) for k, x in enumerate(results[1]) if k != 1)
    assert all(isinstance(x, float) for x in results[0])
    # in step: both feed the same batches, so reading the same parameters at
    # every step they see the same loss (a skipped barrier would pair worker
    # 1's step 2 with worker 0's step 3)
    for step in (0, 2, 3):
        assert results[0][step] == pytest.approx(results[1][step], rel=1e-6), step
    assert srv.barriers.count == len(batches)

"""A collective checkpoint is a parameter-server checkpoint: rank 0 saves under ``mpirun``,
two parameter servers load it (``init_server(model_dir)``) with every value, a
parameter-server worker saves it again, and a collective job loads that back with
the same checksum (weights, optimizer state, update counts) as the job that saved it."""

import json
import threading

import numpy as np
import pytest
from support.collective_job import build, examples, feed_of
from test_collective import pytestmark as _mpi_marks
from test_collective import run_job

from pyfleet import fluid
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.distributed.fleet import Fleet
from pyfleet.distributed.role_maker import Role, UserDefinedRoleMaker
from pyfleet.fluid import inference
from pyfleet.launch import free_ports
from pyfleet.optimizer import Adam

pytestmark = _mpi_marks


def ps_job(num_servers, model_dir):
    """``num_servers`` servers (threads) loading ``model_dir`` and one worker fleet."""
    eps = [f"127.0.0.1:{p}" for p in free_ports(num_servers)]
    main, startup, avg, _ = build()
    strategy = DistributeTranspilerConfig()
    worker = Fleet()
    worker.init(UserDefinedRoleMaker(0, Role.WORKER, 1, eps))
    with fluid.program_guard(main, startup):
        worker.distributed_optimizer(Adam(0.05), strategy).minimize(avg)
    servers, threads = [], []
    for i in range(num_servers):
        f = Fleet()
        f.init(UserDefinedRoleMaker(i, Role.SERVER, 1, eps))
        f._set_program(main, startup, strategy)
        f.init_server(model_dir)
        servers.append(f._server)
        t = threading.Thread(target=f.run_server, daemon=True)
        t.start()
        threads.append(t)
    worker.init_worker()
    return worker, servers, threads


def server_values(servers):
    sparse, dense = [], {}
    for s in servers:
        for e in s.registry.entries.values():
            if e.kind == "sparse":
                sparse.append(e.table.export())
            else:
                dense[e.name] = e.table.pull().reshape(-1)
    keys = np.concatenate([p["keys"] for p in sparse])
    order = np.argsort(keys)
    return keys[order], np.concatenate([p["weights"] for p in sparse])[order], dense


def test_collective_checkpoint_round_trips_through_a_parameter_server_job(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("PYFLEET_CHECKPOINT_DIR", str(tmp_path))
    res = run_job(tmp_path / "a", 2, "--save", str(tmp_path / "ckpt_a"))
    assert res.returncode == 0, res.stdout + res.stderr
    saved = np.load(tmp_path / "a" / "rank0.npz")
    checksum = json.loads((tmp_path / "a" / "rank0.json").read_text())["checksum"]
    manifest = json.loads((tmp_path / "ckpt_a" / "MANIFEST.json").read_text())
    assert manifest["server_num"] == 1
    assert {t["name"] for t in manifest["tables"]} == {
        "emb", "fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}

    worker, servers, threads = ps_job(2, str(tmp_path / "ckpt_a"))
    try:
        keys, weights, dense = server_values(servers)
        np.testing.assert_array_equal(keys, saved["emb.keys"])
        np.testing.assert_array_equal(weights, saved["emb.weights"])
        for name, value in dense.items():
            np.testing.assert_array_equal(value, saved["dense." + name].reshape(-1))
        worker.save_persistables(None, "ckpt_b")
    finally:
        worker.stop_worker()
        for s in servers:
            s.stop()
        for t in threads:
            t.join(30)

    res = run_job(tmp_path / "b", 2, "--load", str(tmp_path / "ckpt_b"), "--steps", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(2):
        back = json.loads((tmp_path / "b" / f"rank{r}.json").read_text())["checksum"]
        assert back == checksum

    # The inference model rank 0 saved predicts with the trained weights.
    model = inference.load(str(tmp_path / "ckpt_a.inference"))
    feed = feed_of(examples(999, 4))
    del feed["label"]
    got = model.predict(feed)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(np.asarray(got), saved["predict"], rtol=1e-6)


@pytest.mark.parametrize("n", [2])
def test_only_rank_0_writes_the_checkpoint(tmp_path, n):
    res = run_job(tmp_path / "a", n, "--save", str(tmp_path / "ckpt"))
    assert res.returncode == 0, res.stdout + res.stderr
    gens = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert gens == ["MANIFEST.json", "g000001-full"]
    files = sorted(p.name for p in (tmp_path / "ckpt" / "g000001-full").iterdir())
    assert "server0-of-1.json" in files and "emb.shard0-of-1.bin" in files

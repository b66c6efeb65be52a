"""Hybrid mode under a real ``mpirun``: one parameter server (a process) holds the sparse
table, two workers (one MPI job on 127.0.0.1) hold replicas of the dense parameters and
all-reduce their gradients. With the servers in sync mode the job equals one process
training on both halves; in any mode the dense replicas stay bit-identical and the
servers hold no dense table; a hybrid checkpoint loads into a parameter-server job and
back into a hybrid job."""

import json
import socket
import subprocess
import sys
import threading

import numpy as np
from support.collective_job import build, examples, feed_of
from support.mpi import MPI_MARKS, mpi_env
from support.service import ServerGroup

from pyfleet import fluid
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.distributed.fleet import Fleet
from pyfleet.distributed.role_maker import Role, UserDefinedRoleMaker
from pyfleet.fluid import inference
from pyfleet.optimizer import Adam

pytestmark = MPI_MARKS

STEPS, BATCH = 6, 8
DENSE = ["fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"]



def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_single(out):
    """One process, no MPI, training on both workers' halves at once."""
    out.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "support.collective_job", "single", str(out),
                        "--steps", str(STEPS), "--batch", str(BATCH), "--ranks", "2"],
                       capture_output=True, text=True, timeout=120, env=mpi_env({}),
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.load(out / "single.npz")


def run_workers(out, endpoints, root, *args, np_=2):
    out.mkdir(exist_ok=True)
    env = mpi_env({"PYFLEET_ROLE": "worker", "PYFLEET_SERVER_ENDPOINTS": ",".join(endpoints),
                   "PYFLEET_WORKER_NUM": str(np_), "PYFLEET_CHECKPOINT_DIR": str(root)})
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--allow-run-as-root", sys.executable,
           "-m", "support.hybrid_job", str(out), "--batch", str(BATCH), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=root,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [(np.load(out / f"rank{i}.npz"), json.loads((out / f"rank{i}.json").read_text()))
            for i in range(np_)]


def hybrid_job(tmp_path, name, sparse, *args):
    with ServerGroup(1, 2, mode=sparse, checkpoint_dir=tmp_path) as servers:
        got = run_workers(tmp_path / name, servers.endpoints, tmp_path, "--sparse", sparse,
                          *args)
        assert servers.wait(30) == [0]
    return got


def check_replicas_and_servers(got, sparse):
    a0, info0 = got[0]
    for a, info in got[1:]:
        assert info["checksum"] == info0["checksum"]
        for n in DENSE:
            assert np.array_equal(a["dense." + n], a0["dense." + n]), n
    for _, info in got:
        for s in info["stats"]:   # the servers run the sparse mode and hold no dense table
            assert s["mode"] == sparse
            tables = s["tables"] if isinstance(s["tables"], list) else list(s["tables"].values())
            assert [t.get("name") for t in tables] == ["emb"], tables
            assert all(t.get("kind", "sparse") == "sparse" for t in tables), tables


def test_sync_sparse_hybrid_equals_one_process_with_the_whole_batch(tmp_path):
    got = hybrid_job(tmp_path, "h", "sync", "--steps", str(STEPS))
    check_replicas_and_servers(got, "sync")
    ref = run_single(tmp_path / "s")
    mean_loss = np.mean([a["losses"] for a, _ in got], axis=0)
    np.testing.assert_allclose(mean_loss, ref["losses"], rtol=1e-5, atol=1e-6)
    a0 = got[0][0]
    for n in DENSE:
        np.testing.assert_allclose(a0["dense." + n], ref["dense." + n], rtol=1e-4, atol=1e-6,
                                   err_msg=n)
    np.testing.assert_array_equal(a0["emb.keys"], ref["emb.keys"])
    assert len(ref["emb.keys"]) > 100
    np.testing.assert_allclose(a0["emb.weights"], ref["emb.weights"], rtol=1e-4, atol=1e-6)


def test_async_sparse_hybrid_keeps_replicas_identical_and_trains(tmp_path):
    # Async sparse pushes make the steps' order on the server a race, so the job is
    # not a function of the data alone: the dense replicas must still be identical
    # (their updates are all-reduced), and training on one repeated batch must fit it.
    got = hybrid_job(tmp_path, "h", "async", "--steps", "25", "--repeat")
    check_replicas_and_servers(got, "async")
    for a, _ in got:
        assert a["losses"][-3:].mean() < 0.7 * a["losses"][:3].mean(), a["losses"]


def test_geo_sparse_hybrid_keeps_replicas_identical(tmp_path):
    got = hybrid_job(tmp_path, "h", "geo", "--steps", "4")
    check_replicas_and_servers(got, "geo")


def fleet_servers(num_servers, model_dir, strategy, workers):
    eps = [f"127.0.0.1:{p}" for p in free_ports(num_servers)]
    main, startup, avg, _ = build()
    with fluid.program_guard(main, startup):
        Adam(0.05).minimize(avg)
    fleets, threads = [], []
    for i in range(num_servers):
        f = Fleet()
        f.init(UserDefinedRoleMaker(i, Role.SERVER, workers, eps))
        f._set_program(main, startup, strategy)
        f.init_server(model_dir)
        fleets.append(f)
        t = threading.Thread(target=f.run_server, daemon=True)
        t.start()
        threads.append(t)
    return eps, fleets, threads, (main, startup, avg)


def test_hybrid_checkpoint_resumes_in_a_parameter_server_job_and_a_hybrid_job(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("PYFLEET_CHECKPOINT_DIR", str(tmp_path))
    got = hybrid_job(tmp_path, "a", "sync", "--steps", str(STEPS), "--save", "ckpt")
    saved = got[0][0]
    manifest = json.loads((tmp_path / "ckpt" / "MANIFEST.json").read_text())
    assert {t["name"] for t in manifest["tables"]} == {"emb", *DENSE}
    files = set(manifest["chain"][0]["files"])
    assert "emb.shard0-of-1.bin" in files and "fc_0.w_0.0-32.bin" in files

    # A parameter-server job (2 servers: dense placed on them) loads every value.
    ps = DistributeTranspilerConfig()
    eps, fleets, threads, (main, startup, avg) = fleet_servers(2, "ckpt", ps, 1)
    worker = Fleet()
    worker.init(UserDefinedRoleMaker(0, Role.WORKER, 1, eps))
    with fluid.program_guard(main, startup):
        worker.distributed_optimizer(Adam(0.05), ps).minimize(avg)
    worker.init_worker()
    try:
        client = worker._client
        for n in DENSE:
            np.testing.assert_array_equal(client.pull_dense(n), saved["dense." + n])
        pages = list(client.export_sparse("emb"))
        keys = np.concatenate([k for k, _ in pages])
        order = np.argsort(keys)
        np.testing.assert_array_equal(keys[order], saved["emb.keys"])
        np.testing.assert_array_equal(np.concatenate([w for _, w in pages])[order],
                                      saved["emb.weights"])
    finally:
        worker.stop_worker()
        for t in threads:
            t.join(30)

    # A hybrid job resumes: its server loads the sparse shards (no dense table), its
    # workers load the dense replicas; with no step taken they are the saved values.
    hy = DistributeTranspilerConfig()
    hy.mode = "hybrid"
    eps, fleets, threads, _ = fleet_servers(1, "ckpt", hy, 2)
    try:
        back = run_workers(tmp_path / "b", eps, tmp_path, "--steps", "0", "--load", "ckpt")
    finally:
        for f in fleets:
            if f._server is not None:
                f._server.stop()
        for t in threads:
            t.join(30)
    check_replicas_and_servers(back, "sync")
    for n in DENSE:
        np.testing.assert_array_equal(back[0][0]["dense." + n], saved["dense." + n])
    np.testing.assert_array_equal(back[0][0]["emb.keys"], saved["emb.keys"])
    np.testing.assert_array_equal(back[0][0]["emb.weights"], saved["emb.weights"])

    # The inference model rank 0 saved predicts with the trained weights.
    model = inference.load(str(tmp_path / "ckpt.inference"))
    feed = feed_of(examples(999, 4))
    del feed["label"]
    out = model.predict(feed)
    out = out[0] if isinstance(out, (list, tuple)) else out
    np.testing.assert_allclose(np.asarray(out), saved["predict"], rtol=1e-6)

"""Unix sockets between processes of one machine (``ipc_dir``, ``PYFLEET_IPC_DIR``):
a loopback server listens on both, clients given the directory use the socket (no
TCP, no CURVE), the rows are the same either way, the directory is what admits
a peer, and the launcher gives every job one."""

import os
import shutil
import stat
import tempfile
import textwrap
import threading

import numpy as np
import pytest
import zmq
from support.reference import init_state, update
from support.service import run_launched_script

from pyfleet.errors import PeerTimeout
from pyfleet.optimizer import SGD, Adam
from pyfleet.service import auth
from pyfleet.service import wire as Z
from pyfleet.service.client import Client
from pyfleet.service.server import Server

pytestmark = pytest.mark.timeout(180)

DIM = 4
SPARSE = {"kind": "sparse", "name": "emb", "dim": DIM, "optimizer": Adam(0.01).to_config(),
          "initializer": {"type": "Constant", "value": 0.25}, "seed": 5}
DENSE = {"kind": "dense", "name": "d", "shape": [6], "optimizer": SGD(0.1).to_config()}


@pytest.fixture
def ipc_dir():
    # not under tmp_path: a socket's path must stay under 108 bytes
    path = tempfile.mkdtemp(prefix="pyfleet-ipc-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _Serving:
    def __init__(self, **kw):
        self.server = Server("127.0.0.1:0", 0, 1, 1, heartbeat_timeout=600, **kw)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def close(self):
        self.server.stop()
        self.thread.join(30)


def _transport(client):
    """The endpoint this thread's channel to server 0 connected to."""
    return client._conn.channel().socks[0].getsockopt(zmq.LAST_ENDPOINT).decode()


def test_ipc_and_tcp_clients_read_the_same_rows_as_the_numpy_reference(ipc_dir):
    srv = _Serving(ipc_dir=ipc_dir)
    try:
        port = srv.server.endpoint.rsplit(":", 1)[1]
        assert stat.S_ISSOCK(os.stat(os.path.join(ipc_dir, f"127.0.0.1-{port}")).st_mode)
        with Client([srv.server.endpoint], timeout=20, heartbeat_interval=0,
                    ipc_dir=ipc_dir) as near, \
                Client([srv.server.endpoint], timeout=20, heartbeat_interval=0) as far:
            assert _transport(near).startswith("ipc://")
            assert _transport(far).startswith("tcp://")
            near.create_tables([SPARSE, DENSE])
            far.create_tables([SPARSE, DENSE])
            rng = np.random.default_rng(0)
            opt = Adam(0.01)
            ref_w = {k: np.full(DIM, 0.25, np.float32) for k in range(40)}
            ref_s = {k: init_state(opt, DIM) for k in range(40)}
            dense = np.zeros(6, np.float32)
            for step in range(6):
                keys = np.unique(rng.integers(0, 40, 25)).astype(np.uint64)
                grads = rng.standard_normal((keys.size, DIM)).astype(np.float32)
                dgrad = rng.standard_normal(6).astype(np.float32)
                by = near if step % 2 else far          # both ways in turn
                by.push_sparse("emb", keys, grads, unique=True)
                by.push_dense("d", dgrad)
                for k, g in zip(keys.tolist(), grads):
                    update(opt, ref_w[k], ref_s[k], g)
                dense -= np.float32(0.1) * dgrad
            keys = np.arange(40, dtype=np.uint64)
            want = np.stack([ref_w[k] for k in range(40)])
            np.testing.assert_allclose(near.pull_sparse("emb", keys), want, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(near.pull_sparse("emb", keys),
                                          far.pull_sparse("emb", keys))
            np.testing.assert_allclose(near.pull_dense("d"), dense, rtol=1e-6)
            np.testing.assert_array_equal(near.pull_dense("d"), far.pull_dense("d"))
    finally:
        srv.close()


def test_the_directory_admits_where_tcp_needs_the_keys(ipc_dir, tmp_path):
    auth.keygen(tmp_path / "keys")
    _, secret = auth.load_keypair(tmp_path / "keys" / "server.key_secret")
    srv = _Serving(ipc_dir=ipc_dir, curve_secret_key=secret,
                   curve_client_keys=tmp_path / "keys" / "authorized_clients")
    try:
        with Client([srv.server.endpoint], timeout=20, heartbeat_interval=0,
                    ipc_dir=ipc_dir) as c:   # no keys: through the directory
            c.create_tables([DENSE])
            np.testing.assert_array_equal(c.pull_dense("d"), np.zeros(6, np.float32))
        with pytest.raises(PeerTimeout):      # no keys, over TCP: refused as before
            Client([srv.server.endpoint], timeout=2, connect_deadline=2,
                   heartbeat_interval=0).close()
    finally:
        srv.close()


def test_a_directory_others_may_enter_or_too_deep_is_refused_by_name(ipc_dir, tmp_path):
    os.chmod(ipc_dir, 0o755)
    with pytest.raises(ValueError, match="ipc_dir.*0700.*0755"):
        Server("127.0.0.1:0", 0, 1, 1, ipc_dir=ipc_dir)
    with pytest.raises(ValueError, match="PYFLEET_IPC_DIR.*0755"):
        auth.server_options_from_env({"PYFLEET_IPC_DIR": ipc_dir})
    with pytest.raises(ValueError, match="PYFLEET_IPC_DIR.*No such file"):
        auth.client_options_from_env({"PYFLEET_IPC_DIR": str(tmp_path / "nope")})
    deep = tmp_path / ("d" * 100)
    deep.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="too long for a Unix socket"):
        Z.check_ipc_dir(str(deep))
    os.chmod(ipc_dir, 0o700)
    assert auth.client_options_from_env({"PYFLEET_IPC_DIR": ipc_dir}) == {"ipc_dir": ipc_dir}
    assert auth.client_options_from_env({"PYFLEET_IPC_DIR": ""}) == {}


def test_a_server_not_listening_there_is_reached_over_tcp(ipc_dir):
    srv = _Serving()   # no ipc_dir: an older server, or one started by hand
    try:
        with Client([srv.server.endpoint], timeout=20, heartbeat_interval=0,
                    ipc_dir=ipc_dir) as c:
            assert _transport(c).startswith("tcp://")
            c.create_tables([DENSE])
            assert c.pull_dense("d").shape == (6,)
    finally:
        srv.close()


WORKER = textwrap.dedent("""
    import json, os, stat, sys
    import zmq
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
    from pyfleet.service import auth
    from pyfleet.service.client import Client
    role = PaddleCloudRoleMaker()
    role.generate_role()
    d = os.environ.get("PYFLEET_IPC_DIR")
    out = {"dir": d, "mode": stat.S_IMODE(os.stat(d).st_mode) if d else None}
    with Client(role.server_endpoints(), worker_index=0, timeout=20,
                **auth.client_options_from_env()) as c:
        out["servers"] = len(c.stats())
        out["via"] = c._conn.channel().socks[0].getsockopt(zmq.LAST_ENDPOINT).decode()
        c.stop_worker()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
""")


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("PYFLEET_"):
            monkeypatch.delenv(k)


@pytest.mark.parametrize("env", [{}, {"PYFLEET_IPC_DIR": ""}], ids=["default", "off"])
def test_a_launched_job_talks_through_its_own_directory(tmp_path, env, clean_env):
    out = run_launched_script(tmp_path, WORKER, env)
    assert out["servers"] == 1
    if env:
        assert out["dir"] == "" and out["via"].startswith("tcp://")
    else:
        assert out["mode"] == 0o700
        host_port = out["via"].rsplit("/", 1)[1]
        assert out["via"] == f"ipc://{out['dir']}/{host_port}"
        assert host_port.startswith("127.0.0.1-")
        assert not os.path.exists(out["dir"])   # removed with the job

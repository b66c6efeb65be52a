"""CURVE authentication: key files, the environment contract, refused clients,
the protocol fuzz behind authentication, and what received data can never reach."""

import io
import logging
import os
import stat
import threading
import tokenize
from pathlib import Path

import numpy as np
import pytest
import test_faults as F  # the fuzz tests, reused against an authenticated server
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

import pyfleet
from pyfleet.errors import PeerTimeout, RemoteError
from pyfleet.optimizer import SGD, Adam
from pyfleet.service import auth
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op
from pyfleet.service.server import Server

pytestmark = [pytest.mark.timeout(180)]

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4, "optimizer": Adam(0.01).to_config(),
          "initializer": {"type": "Uniform", "low": -0.1, "high": 0.1}, "seed": 5}
DENSE = {"kind": "dense", "name": "d", "shape": [6], "optimizer": SGD(0.1).to_config()}
PACKAGE = Path(pyfleet.__file__).resolve().parent


# ------------------------------------------------------------------ key files

def test_keygen_writes_private_pairs_and_the_admitted_list(tmp_path):
    paths = auth.keygen(tmp_path / "k", names=["server", "w0", "w1"])
    k = tmp_path / "k"
    assert [Path(p) for p in paths] == [
        k / "server.key", k / "server.key_secret", k / "w0.key", k / "w0.key_secret",
        k / "w1.key", k / "w1.key_secret", k / "authorized_clients" / "w0.key",
        k / "authorized_clients" / "w1.key"]
    for name in ("server", "w0", "w1"):
        assert stat.S_IMODE(os.stat(k / f"{name}.key_secret").st_mode) == 0o600
        public, secret = auth.load_keypair(k / f"{name}.key_secret")
        assert zmq.curve_public(secret) == public == auth.load_public_key(k / f"{name}.key")
    assert sorted(os.listdir(k / "authorized_clients")) == ["w0.key", "w1.key"]
    with pytest.raises(ValueError, match="refusing to overwrite"):
        auth.keygen(k, names=["w0"])
    for bad in (["../x"], ["a b"], [], ["c", "c"]):
        with pytest.raises(ValueError):
            auth.keygen(tmp_path / "bad", names=bad)


def test_key_loading_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        auth.load_keypair(tmp_path / "nope")
    auth.keygen(tmp_path)
    with pytest.raises(ValueError, match="no secret key"):
        auth.load_keypair(tmp_path / "server.key")
    (tmp_path / "junk").write_text("not a certificate")
    with pytest.raises(ValueError, match="junk"):
        auth.load_keypair(tmp_path / "junk")
    public = zmq.curve_keypair()[0].decode()
    assert auth.load_public_key(public) == public.encode()


def test_environment_contract(tmp_path):
    auth.keygen(tmp_path)
    assert auth.server_options_from_env({}) == {} == auth.client_options_from_env({})
    server = auth.server_options_from_env({"PYFLEET_CURVE_DIR": str(tmp_path)})
    client = auth.client_options_from_env({"PYFLEET_CURVE_DIR": str(tmp_path)})
    spub, ssec = auth.load_keypair(tmp_path / "server.key_secret")
    assert server == {"curve_secret_key": ssec,
                      "curve_client_keys": str(tmp_path / "authorized_clients")}
    assert client == {"curve_server_keys": spub,
                      "curve_client_key": auth.load_keypair(tmp_path / "client.key_secret")}
    # the specific variables win over the directory
    other = tmp_path / "other"
    auth.keygen(other, names=["server"])
    got = auth.server_options_from_env({
        "PYFLEET_CURVE_DIR": str(tmp_path),
        "PYFLEET_CURVE_SERVER_SECRET": str(other / "server.key_secret")})
    assert got["curve_secret_key"] == auth.load_keypair(other / "server.key_secret")[1]
    with pytest.raises(ValueError, match="PYFLEET_CURVE_SERVER_SECRET"):
        auth.server_options_from_env({"PYFLEET_CURVE_SERVER_SECRET": str(tmp_path / "x")})
    with pytest.raises(ValueError, match="PYFLEET_CURVE_CLIENT_KEYS_DIR"):
        auth.server_options_from_env({"PYFLEET_CURVE_CLIENT_KEYS_DIR": str(tmp_path)})
    with pytest.raises(ValueError, match="PYFLEET_CURVE_SERVER_PUBLIC"):
        auth.client_options_from_env({"PYFLEET_CURVE_SERVER_PUBLIC": "too-short"})
    with pytest.raises(ValueError, match="PYFLEET_CURVE_CLIENT_SECRET"):
        auth.client_options_from_env({"PYFLEET_CURVE_CLIENT_SECRET": str(tmp_path / "c")})


def test_binding_beyond_loopback_without_authentication_warns(tmp_path, caplog):
    auth.keygen(tmp_path)
    _, secret = auth.load_keypair(tmp_path / "server.key_secret")
    assert auth.is_loopback_host("127.0.0.1") and auth.is_loopback_host("::1")
    assert auth.is_loopback_host("localhost") and auth.is_loopback_host("127.3.0.1")
    assert not any(auth.is_loopback_host(h) for h in ("0.0.0.0", "*", "10.1.2.3", "example"))
    cases = [("127.0.0.1", {}, False), ("0.0.0.0", {}, True),
             ("0.0.0.0", {"curve_secret_key": secret}, True),  # encryption alone: still open
             ("0.0.0.0", {"curve_secret_key": secret,
                          "curve_client_keys": tmp_path / "authorized_clients"}, False)]
    for host, kw, warns in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pyfleet.server"):
            s = Server(f"{host}:0", 0, 1, 1, insecure=True, **kw)  # no traffic is sent
            s.stop()
            s.run()  # returns at once and closes the sockets
        assert any("without client authentication" in r.getMessage()
                   for r in caplog.records) == warns, (host, kw)
    # without insecure=True, an unauthenticated non-loopback bind is refused
    with pytest.raises(ValueError, match="refusing to serve 0.0.0.0 without client auth"):
        Server("0.0.0.0:0", 0, 1, 1, curve_secret_key=secret)
    with pytest.raises(ValueError, match="refusing to serve"):
        Server("0.0.0.0:0", 0, 1, 1, insecure=False)
    with pytest.raises(ValueError, match="needs curve_secret_key"):
        Server("127.0.0.1:0", 0, 1, 1, curve_client_keys=tmp_path / "authorized_clients")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no \\*.key file"):
        Server("127.0.0.1:0", 0, 1, 1, curve_secret_key=secret, curve_client_keys=empty)


# ------------------------------------------------- an authenticated server

class _Cluster:
    """One authenticating server (in a thread) and the keys around it."""

    def __init__(self, root):
        self.keys = root / "keys"
        auth.keygen(self.keys, names=["server", "client", "intruder"])
        # the intruder has a well-formed pair that the server does not list
        os.remove(self.keys / "authorized_clients" / "intruder.key")
        self.server_public, secret = auth.load_keypair(self.keys / "server.key_secret")
        self.ck = root / "ck"
        self.ck.mkdir()
        self.server = Server("127.0.0.1:0", 0, 1, 1, checkpoint_dir=self.ck, curve_secret_key=secret,
                             curve_client_keys=self.keys / "authorized_clients",
                             max_message_bytes=1 << 20,
                             # clients here skip heartbeats; a server whose every
                             # worker looks dead exits, which is not under test
                             heartbeat_timeout=600)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.endpoint = self.server.endpoint

    def client(self, **kw):
        return Client([self.endpoint], curve_server_keys=self.server_public,
                      curve_client_key=self.keys / "client.key_secret", **kw)

    def raw_socket(self, name=None):
        """A DEALER speaking CURVE with ``name``'s key pair (None: a fresh pair,
        "plain": no CURVE at all)."""
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # A DEALER whose handshake the server refused may have no pipe to queue
        # on for a moment: a send then blocks (it hung a CI run for 180 s).
        sock.setsockopt(zmq.SNDTIMEO, 3000)
        if name != "plain":
            pair = (zmq.curve_keypair() if name is None
                    else auth.load_keypair(self.keys / f"{name}.key_secret"))
            sock.curve_serverkey = self.server_public
            sock.curve_publickey, sock.curve_secretkey = pair
        sock.connect("tcp://" + self.endpoint)
        return sock

    def close(self):
        self.server.stop()
        self.thread.join(30)


@pytest.fixture
def cluster(tmp_path):
    c = _Cluster(tmp_path)
    yield c
    c.close()


def _requests(ids):
    keys = np.array([11, 12, 13], np.uint64)
    return {
        "pull": P.request(Op.PULL_SPARSE, 1, table=ids["emb"], keys=keys, dim=4, worker=0),
        "push": P.request(Op.PUSH_SPARSE, 2, table=ids["emb"], keys=keys,
                          values=np.full((3, 4), 5.0, np.float32), dim=4, worker=0),
        "save": P.request(Op.SAVE, 3, payload={"dir": "stolen"}, worker=0),
        "stop": P.request(Op.STOP_WORKER, 4, payload={"worker": 0}, worker=0),
    }


def test_unlisted_clients_cannot_pull_push_save_or_stop(cluster):
    with cluster.client(timeout=10, heartbeat_interval=0) as c:
        c.create_tables([SPARSE, DENSE])
        ids = dict(c._ids[0])
    keys = np.array([11, 12, 13], np.uint64)
    for who in ("intruder", None, "plain"):
        kw = {} if who == "plain" else {"curve_server_keys": cluster.server_public}
        if who == "intruder":
            kw["curve_client_key"] = cluster.keys / "intruder.key_secret"
        with pytest.raises(PeerTimeout, match="HEARTBEAT"):
            Client([cluster.endpoint], timeout=1, connect_deadline=1, **kw)
        for op, frames in _requests(ids).items():
            sock = cluster.raw_socket(who)
            try:
                try:
                    sock.send_multipart([bytes(f) if not isinstance(f, np.ndarray)
                                         else f.tobytes() for f in frames])
                except zmq.Again:
                    continue  # not even queued: the refused connection had no pipe
                assert not sock.poll(700), f"{who!r} got an answer to {op}"
            finally:
                sock.close(0)
    # nothing reached the tables, the disk or the worker count
    assert cluster.thread.is_alive()
    assert not (cluster.ck / "stolen").exists()
    with cluster.client(timeout=10) as c:
        stats = c.stats()[0]
        assert stats["tables"]["emb"]["rows"] == 0 and stats["stopped_workers"] == []
        ref = pyfleet.SparseTable.from_config({k: v for k, v in SPARSE.items() if k != "kind"})
        np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.initial_values(keys))
        # the same frames from the listed client do all of it (the refusals above were
        # the authenticator's, not malformed requests)
        sock = cluster.raw_socket("client")
        try:
            for op, frames in _requests(ids).items():
                h, _ = F._roundtrip(sock, F._bytes(frames))
                assert h.status == P.Status.OK, op
        finally:
            sock.close(0)
        cluster.thread.join(10)
        assert not cluster.thread.is_alive()  # the listed client's STOP_WORKER ended it
    assert (cluster.ck / "stolen" / "server0-of-1.json").exists()


def test_checkpoint_paths_cannot_escape_through_an_authenticated_client(cluster, tmp_path):
    os.symlink(tmp_path, cluster.ck / "link")
    with cluster.client(timeout=10) as c:
        c.create_tables([SPARSE, DENSE])
        for bad, why in [("../x", "escapes"), (str(tmp_path / "abs"), "relative"),
                         ("a/../../x", "escapes"), ("link/x", "escapes"),
                         ("link", "escapes"), ("", "non-empty")]:
            with pytest.raises(RemoteError, match=why):
                c.save(bad)
            with pytest.raises(RemoteError, match=why):
                c.load(bad)
        for bad in ([1], {"a": 1}, None, "x\x00y"):
            with pytest.raises(RemoteError):
                c._control_all(Op.SAVE, {"dir": bad})
        assert sorted(os.listdir(tmp_path)) == ["ck", "keys"]
        assert sorted(os.listdir(cluster.ck)) == ["link"]
        assert c.save("ok")[0]["files"][0] == "emb.shard0-of-1.bin"
        c.stop_worker()


# ------------------------------------- the protocol fuzz, authenticated

@pytest.fixture(scope="module")
def auth_fuzz_target(tmp_path_factory):
    cluster = _Cluster(tmp_path_factory.mktemp("authfuzz"))
    try:
        with cluster.client(timeout=10, heartbeat_interval=0) as c:
            c.create_tables([SPARSE, DENSE])
            # The job's worker 0 pushes first: its index is its own (fuzzed requests
            # carry other request ids, and their pushes for worker 0 are refused).
            c.push_sparse("emb", np.array([1 << 63], np.uint64), np.zeros((1, 4), np.float32))
            c.flush()
            sock = cluster.raw_socket("client")
            try:
                yield cluster, c, sock, dict(c._ids[0])
            finally:
                sock.close(0)
    finally:
        cluster.close()


_auth_fuzz = settings(F._fuzz_settings, max_examples=400)


@_auth_fuzz
@given(frames=st.lists(st.binary(max_size=120), min_size=1, max_size=4))
def test_fuzz_random_frames_authenticated(auth_fuzz_target, frames):
    F.test_fuzz_random_frames_get_error_replies.hypothesis.inner_test(auth_fuzz_target, frames)


@_auth_fuzz
@given(data=st.data())
def test_fuzz_mutated_requests_authenticated(auth_fuzz_target, data):
    F.test_fuzz_mutated_requests_never_break_the_server.hypothesis.inner_test(
        auth_fuzz_target, data)


def test_after_authenticated_fuzzing_the_server_still_serves(auth_fuzz_target):
    cluster, c, _, _ = auth_fuzz_target
    assert cluster.thread.is_alive()
    assert c.stats()[0]["counters"].get("protocol_errors", 0) > 0
    keys = np.arange(50_000, 50_020, dtype=np.uint64)
    ref = pyfleet.SparseTable.from_config({k: v for k, v in SPARSE.items() if k != "kind"})
    grads = np.random.default_rng(2).standard_normal((20, 4)).astype(np.float32)
    np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
    c.push_sparse("emb", keys, grads)
    ref.push(keys, grads)
    np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))



# ------------------------------------------ what received data can reach

# Modules and calls that turn bytes into objects or code.
_FORBIDDEN = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve",
              "recv_pyobj", "send_pyobj", "recv_serialized", "import_module"}
# Builtins that execute text; as attributes (re.compile) they are harmless, and so is a
# method of that name being defined (Fluid's metrics have ``def eval(self)``).
_FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__"}
# The one module that imports by name: zero-edit mode's import hook, which maps the
# ``paddle.*`` names of the process's own import statements onto ``pyfleet.*`` modules.
# Nothing it imports comes from data, a file or a socket.
_IMPORT_BY_NAME_OK = {"as_paddle/__init__.py": {"import_module"}}


def _forbidden_names(src):
    out, prev = [], None
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME and (
                tok.string in _FORBIDDEN
                or (tok.string in _FORBIDDEN_BUILTINS and prev not in (".", "def"))):
            out.append((tok.string, tok.start[0]))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            prev = tok.string
    return out


def test_no_pickle_or_eval_anywhere_in_the_package():
    """Names that deserialize or execute data never appear in the package's code
    (comments and strings aside), and no np.load accepts pickles (numpy's
    default refuses them)."""
    hits, files = [], 0
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix not in (".py", ".pyx", ".pxd") or "__pycache__" in path.parts:
            continue
        files += 1
        src = path.read_text()
        rel = path.relative_to(PACKAGE)
        allowed = _IMPORT_BY_NAME_OK.get(rel.as_posix(), set())
        hits += [f"{rel}:{line}: {name}" for name, line in _forbidden_names(src)
                 if name not in allowed]
        for i, line in enumerate(src.splitlines()):
            if "allow_pickle=True" in line.replace(" ", ""):
                hits.append(f"{rel}:{i + 1}: allow_pickle=True")
    assert files > 20  # the scan really looked at the package
    assert not hits, "\n".join(hits)


def test_the_scan_catches_what_it_looks_for():
    src = ("import pickle\nx = eval(data)\n# eval in a comment is fine\ns = 'exec'\n"
           "r = re.compile('x')\ny = sock.recv_pyobj()\ndef eval(self):\n    pass\n"
           "z = m.eval()\nw = importlib.import_module(n)\n")
    assert _forbidden_names(src) == [("pickle", 1), ("eval", 2), ("recv_pyobj", 6),
                                     ("import_module", 10)]


def test_the_server_command_refuses_an_unauthenticated_public_bind():
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "pyfleet.service", "--endpoint", "0.0.0.0:0", "--index", "0",
           "--num-servers", "1", "--workers", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYFLEET_")}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 1 and "refusing to serve 0.0.0.0" in p.stderr
    assert "--insecure" in p.stderr and "ready on" not in p.stdout

"""Control requests a peer must not be able to abuse ("Secure by default"):

- a SAVE never writes into an existing save, a checkpoint's directory or a committed
  generation (the attack: a SAVE into the committed generation overwrote the only
  recovery point in place);
- pushes, STOP_WORKER and BARRIER for a worker are accepted only from the client that
  speaks for that worker, the first that pushed, waited at a barrier or stopped as it (the
  attack: a spoofed STOP_WORKER ended the servers under live workers; a spoofed push
  changed the model);
- a key directory without ``authorized_clients/`` is refused by name (it used to admit any
  client key).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.service import auth
from pyfleet.service import checkpoint as ck
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.owners import Owners
from pyfleet.service.protocol import Op, Refused

pytestmark = pytest.mark.timeout(300)

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 0.1},
          "initializer": {"type": "Constant", "value": 0.0}, "seed": 0}


def _snapshot(path):
    return {n: (path / n).read_bytes() for n in sorted(os.listdir(path))}


def test_a_save_never_writes_into_a_save_a_checkpoint_or_a_committed_generation(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    with ServerGroup(2, 1, checkpoint_dir=root) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        keys = np.arange(1, 101, dtype=np.uint64)
        c.push_sparse("emb", keys, np.ones((100, 4), np.float32))
        # a committed checkpoint: generation g000001-full named by ckpt/MANIFEST.json
        replies = c.save("ckpt/g000001-full")
        ck.commit(str(root / "ckpt"), ck.build_manifest(None, "g000001-full", "full", replies,
                                                        [SPARSE], None, None))
        gen = root / "ckpt" / "g000001-full"
        before = _snapshot(gen)
        c.push_sparse("emb", keys, np.ones((100, 4), np.float32))  # rows change
        with pytest.raises(RemoteError, match="MANIFEST.json commits"):
            c.save("ckpt/g000001-full")                  # the attack: over the committed save
        with pytest.raises(RemoteError, match="holds MANIFEST.json"):
            c.save("ckpt")                               # into the checkpoint itself
        # a committed generation whose files this job would not overwrite (another server
        # count): still refused, since its manifest commits it
        other = root / "ckpt" / "g000002-full"
        other.mkdir()
        manifest = ck.read_manifest(str(root / "ckpt"))
        manifest["chain"].append({**manifest["chain"][0], "dir": "g000002-full", "files": {}})
        ck.commit(str(root / "ckpt"), manifest)  # sealed: its checksums recorded again
        with pytest.raises(RemoteError, match="commits"):
            c.save("ckpt/g000002-full")
        assert os.listdir(other) == []
        # a plain save directory is written once
        c.save("plain")
        with pytest.raises(RemoteError, match="already holds"):
            c.save("plain")
        # a new generation is fine, and nothing of the committed one changed
        assert c.save("ckpt/g000003-full")[0]["rows"] == {"emb": 100 - _on_server_1(keys)}
        assert _snapshot(gen) == before
        for _, gen_entry, path in ck.resolve(str(root), "ckpt")[:1]:
            ck.verify_generation(path, gen_entry)        # still loads


def _on_server_1(keys):
    from pyfleet import route
    return int((route(keys, 2) == 1).sum())


def _raw(endpoint):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("tcp://" + endpoint)
    return sock


def _ask(sock, op, rid, payload):
    sock.send_multipart([bytes(f) for f in P.request(op, rid, payload=payload, worker=0)])
    assert sock.poll(10_000), f"no answer to {op.name}"
    reply = sock.recv_multipart()
    return P.unpack_header(reply[0]), P.parse_json(reply[-1])


def test_a_spoofed_stop_worker_or_barrier_is_refused_while_the_worker_runs():
    with ServerGroup(1, 1, heartbeat_timeout=30) as g:
        with Client(g.endpoints, timeout=20) as c:          # worker 0, heartbeats on
            c.create_tables([SPARSE])
            c.push_sparse("emb", np.array([1], np.uint64), np.zeros((1, 4), np.float32))
            spoof = _raw(g.endpoints[0])
            try:
                rid = (0x5EED << 24) | 1                      # another process's request ids
                for op, payload in ((Op.STOP_WORKER, {"worker": 0}),
                                    (Op.BARRIER, {"worker": 0, "kind": "pass"})):
                    h, body = _ask(spoof, op, rid, payload)
                    assert h.status == P.Status.ERROR, (op, body)
                    assert "another client speaks for worker 0" in body["error"], body
                    rid += 1
                # a heartbeat naming worker 0 is answered (how clients connect)
                h, body = _ask(spoof, Op.HEARTBEAT, rid, {"worker": 0})
                assert h.status == P.Status.OK and body["worker_num"] == 1
            finally:
                spoof.close(0)
            assert g.procs[0].poll() is None                  # still serving
            np.testing.assert_array_equal(c.pull_sparse("emb", np.array([5], np.uint64)),
                                          np.zeros((1, 4), np.float32))
            assert c.stats()[0]["stopped_workers"] == []
            c.stop_worker()                                   # the real worker's stop works
        assert g.wait(30) == [0]


# A second client, in a process of its own (so request ids of its own), that says it is
# worker 0 and pushes: a sparse gradient, a dense one, both far from the real worker's.
_SPOOF = """
import json, sys
import numpy as np
from pyfleet.errors import RemoteError
from pyfleet.service.client import Client
endpoints = json.loads(sys.argv[1])
out = []
with Client(endpoints, worker_index=0, timeout=20, heartbeat_interval=0) as c:
    for push in (lambda: c.push_sparse("emb", np.arange(1, 11, dtype=np.uint64),
                                       np.full((10, 4), 100.0, np.float32)),
                 lambda: c.push_dense("w", np.full(8, 100.0, np.float32))):
        try:
            push()
            c.flush()
            out.append("applied")
        except RemoteError as e:
            out.append(str(e))
print(json.dumps(out))
"""

DENSE = {"kind": "dense", "name": "w", "shape": [8],
         "optimizer": {"type": "SGD", "learning_rate": 0.1},
         "initial": {"type": "Constant", "value": 0.0}, "seed": 0}


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_pushes_from_a_client_spoofing_worker_0_are_refused(mode, tmp_path):
    keys = np.arange(1, 11, dtype=np.uint64)
    with ServerGroup(2, 1, mode=mode, heartbeat_timeout=30) as g, \
            Client(g.endpoints, timeout=20) as c:                 # the real worker 0
        c.create_tables([SPARSE, DENSE])
        grads = np.ones((10, 4), np.float32)
        c.push_sparse("emb", keys, grads)                        # claims worker 0
        c.push_dense("w", np.ones(8, np.float32))
        if mode == "sync":
            c.barrier()                                          # step 1 applied
        spoof = tmp_path / "spoof.py"
        spoof.write_text(_SPOOF)
        r = subprocess.run([sys.executable, str(spoof), json.dumps(g.endpoints)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.splitlines()[-1])
        assert "refused PUSH_SPARSE" in out[0] and "refused PUSH_DENSE" in out[1], out
        for text in out:
            assert "another client speaks for worker 0" in text, text
        if mode == "sync":  # the real worker's next step has its gradient alone
            c.push_sparse("emb", keys, grads)
            c.push_dense("w", np.ones(8, np.float32))
            c.barrier()
        steps = 2 if mode == "sync" else 1
        # SGD from 0 with lr 0.1: -0.1 per step of gradient 1 (numpy reference)
        want = np.full((10, 4), -0.1 * steps, np.float32)
        np.testing.assert_allclose(c.pull_sparse("emb", keys), want, rtol=1e-6)
        np.testing.assert_allclose(c.pull_dense("w"), np.full(8, -0.1 * steps, np.float32),
                                   rtol=1e-6)
        stats = c.stats()
        assert sum(s["counters"].get("refused_requests", 0) for s in stats) >= 2
        c.stop_worker()
    assert g.wait(30) == [0, 0]


def test_a_raw_push_as_another_clients_worker_is_refused_by_name():
    with ServerGroup(1, 1, heartbeat_timeout=30) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        c.push_sparse("emb", np.array([1], np.uint64), np.zeros((1, 4), np.float32))
        c.flush()
        spoof = _raw(g.endpoints[0])
        try:
            rid = (0x5EED << 24) | 1
            frames = P.request(Op.PUSH_SPARSE, rid, table=c._ids[0]["emb"],
                               keys=np.array([1], np.uint64),
                               values=np.full((1, 4), 9.0, np.float32), dim=4, worker=0)
            spoof.send_multipart([bytes(f) for f in frames])
            assert spoof.poll(10_000)
            reply = spoof.recv_multipart()
            h = P.unpack_header(reply[0])
            assert h.status == P.Status.ERROR, "the spoofed push was applied"
            body = P.parse_json(reply[-1])
            assert body["error"].startswith("PUSH_SPARSE: PUSH_SPARSE for worker 0 refused: "
                                            "another client speaks for worker 0"), body
        finally:
            spoof.close(0)
        np.testing.assert_array_equal(c.pull_sparse("emb", np.array([1], np.uint64)),
                                      np.zeros((1, 4), np.float32))
        c.stop_worker()


def test_owner_rules_with_a_fake_clock():
    o = Owners(2, heartbeat_timeout=5.0)
    a, b = 7 << 24, 20 << 24                                  # two clients' request ids
    assert o.claim(0, b | 1, 0.0, False, "HEARTBEAT", take=False)  # connecting claims nothing
    assert o.claim(0, a | 1, 0.0, False, "PUSH_SPARSE")       # free: a's first push takes it
    assert not o.claim(0, b | 1, 1.0, False, "HEARTBEAT", refuse=False, take=False)
    with pytest.raises(Refused, match="STOP_WORKER for worker 0 refused"):
        o.claim(0, b | 2, 1.0, False, "STOP_WORKER")
    assert o.claim(1, b | 3, 1.0, False, "BARRIER")           # worker 1 is b's
    o.heard(0, a | 5, 4.0)                                    # a's data requests keep it
    with pytest.raises(Refused):
        o.claim(0, b | 4, 8.0, False, "BARRIER")              # 4 s after a was heard
    assert o.claim(0, (8 << 24) | 1, 8.5, False, "BARRIER")   # a's counter carried: still a
    o.pause(10.0)                                             # the server's own stall
    with pytest.raises(Refused):
        o.claim(0, b | 5, 20.0, False, "BARRIER")
    assert o.claim(0, b | 6, 24.0, False, "STOP_WORKER")      # a silent > 5 s: b takes over
    with pytest.raises(Refused):
        o.claim(0, a | 9, 24.5, False, "BARRIER")             # and a is the stranger now
    assert o.claim(0, a | 10, 25.0, True, "BARRIER")          # after b stopped, a restart may


def test_a_key_directory_without_authorized_clients_is_refused_by_name(tmp_path):
    keys = tmp_path / "keys"
    auth.keygen(keys)
    assert auth.server_options_from_env({"PYFLEET_CURVE_DIR": str(keys)})["curve_client_keys"]
    shutil.rmtree(keys / "authorized_clients")
    with pytest.raises(ValueError, match=r"PYFLEET_CURVE_DIR: .* has no authorized_clients/"):
        auth.server_options_from_env({"PYFLEET_CURVE_DIR": str(keys)})
    # an explicit client list still works with the directory's secret
    listed = tmp_path / "listed"
    listed.mkdir()
    shutil.copy(keys / "client.key", listed / "client.key")
    assert auth.server_options_from_env({"PYFLEET_CURVE_DIR": str(keys),
                                         "PYFLEET_CURVE_CLIENT_KEYS_DIR": str(listed)})
    os.remove(keys / "server.key_secret")
    with pytest.raises(ValueError, match="holds no server.key_secret"):
        auth.server_options_from_env({"PYFLEET_CURVE_DIR": str(keys)})
    # the command line says so before starting anything
    os.makedirs(tmp_path / "k2")
    auth.keygen(tmp_path / "k2")
    shutil.rmtree(tmp_path / "k2" / "authorized_clients")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYFLEET_")}
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pyfleet.service", "--index", "0",
                        "--num-servers", "1", "--workers", "1"], capture_output=True,
                       text=True, timeout=60, env={**env, "PYFLEET_CURVE_DIR": str(tmp_path / "k2")})
    assert p.returncode != 0 and "authorized_clients/" in p.stderr, p.stderr
    assert "ready on" not in p.stdout and time.monotonic() - start < 60
    p = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", "--run-dir",
                        str(tmp_path / "run"), "--curve-dir", str(tmp_path / "k2")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "--curve-dir" in p.stderr and "authorized_clients/" in p.stderr, p.stderr
    assert not (tmp_path / "run" / "checkpoint").exists()

"""Kept tested: a real server keeps serving 500 concurrent connections, and save
and load request paths stay inside the checkpoint root (``..``, absolute paths, NUL,
symbolic links at any depth, a list naming one bad path, a link planted where a save would
write), with nothing written or changed outside it.
"""

import os
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op

pytestmark = pytest.mark.timeout(300)

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 0.5},
          "initializer": {"type": "Constant", "value": 0.25}, "seed": 0}
PEERS = 500


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_five_hundred_concurrent_connections_are_all_served():
    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, 2 * PEERS)
    socks = []
    try:
        with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
            c.create_tables([SPARSE])
            tid = c._ids[0]["emb"]
            pid = g.procs[0].pid
            before = _rss(pid)
            for _ in range(PEERS):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect("tcp://" + g.endpoints[0])
                socks.append(s)
            # every peer sends before any reads: 500 requests in flight at once, each
            # peer asking for its own key
            for i, s in enumerate(socks):
                s.send_multipart([bytes(f) if not isinstance(f, np.ndarray) else f.tobytes()
                                  for f in P.request(Op.PULL_SPARSE, i + 1, table=tid,
                                                     keys=np.array([1000 + i], np.uint64),
                                                     dim=4)])
            poller = zmq.Poller()
            for s in socks:
                poller.register(s, zmq.POLLIN)
            answered, deadline = {}, time.monotonic() + 120
            while len(answered) < PEERS and time.monotonic() < deadline:
                for s, _ in poller.poll(1000):
                    reply = s.recv_multipart()
                    h = P.unpack_header(reply[0])
                    answered[socks.index(s)] = (h, np.frombuffer(reply[1], np.float32))
                    poller.unregister(s)
            # still serving, and correctly, with the 500 peers connected
            np.testing.assert_array_equal(c.pull_sparse("emb", np.array([7], np.uint64)),
                                          np.full((1, 4), 0.25, np.float32))
            grown = _rss(pid) - before
            stats = c.stats()[0]
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    assert len(answered) == PEERS, f"{PEERS - len(answered)} peers got no answer"
    for i, (h, values) in answered.items():
        assert h.status == P.Status.OK and h.request == i + 1
        np.testing.assert_array_equal(values, np.full(4, 0.25, np.float32))
    assert stats["counters"]["op_pull_sparse"] >= PEERS
    assert stats["counters"].get("dropped_replies", 0) == 0
    assert grown < 200 << 20, f"{PEERS} connections grew the server by {grown >> 20} MiB"


def _tree(path):
    """Every file under ``path`` with its bytes (links as their targets)."""
    out = {}
    for d, dirs, files in os.walk(path):
        for n in dirs + files:
            p = os.path.join(d, n)
            out[os.path.relpath(p, path)] = (os.readlink(p) if os.path.islink(p) else
                                             Path(p).read_bytes() if os.path.isfile(p) else None)
    return out


def test_save_and_load_paths_stay_inside_the_checkpoint_root(tmp_path):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"s" * 1000)
    (root / "sub").mkdir()
    os.symlink(outside, root / "link")                    # a directory link out
    os.symlink(outside, root / "sub" / "deep")            # one level down
    os.symlink("../../outside", root / "sub" / "rel")     # a relative link out
    # a link planted where a save would write its shard: never written through
    (root / "planted").mkdir()
    os.symlink(outside / "secret.bin", root / "planted" / "emb.shard0-of-1.bin")
    outside_before, root_before = _tree(outside), _tree(root)
    with ServerGroup(1, 1, checkpoint_dir=root) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        c.push_sparse("emb", np.arange(1, 11, dtype=np.uint64), np.ones((10, 4), np.float32))
        bad = [("..", "escapes"), ("../outside", "escapes"), ("a/../../outside", "escapes"),
               (str(outside), "relative"), ("/etc", "relative"), ("x\x00y", "relative"),
               ("link", "escapes"), ("link/x", "escapes"), ("sub/deep", "escapes"),
               ("sub/deep/new", "escapes"), ("sub/rel", "escapes"), ("", "non-empty")]
        for path, why in bad:
            with pytest.raises(RemoteError, match=why):
                c.save(path)
            with pytest.raises(RemoteError, match=why):
                c.load(path)
        with pytest.raises(RemoteError, match="escapes"):
            c.load(["ok-never-saved", "../outside"])          # one bad path in a list
        with pytest.raises(RemoteError, match="already holds"):
            c.save("planted")                                   # the link is not followed
        for payload in ({"dir": ["a"]}, {"dir": {"a": 1}}, {"dir": None}, {"dir": 7}):
            with pytest.raises(RemoteError):
                c._control_all(Op.SAVE, payload)
            with pytest.raises(RemoteError):
                c._control_all(Op.LOAD, payload)
        assert _tree(outside) == outside_before and _tree(root) == root_before
        # a path inside is still saved and loaded
        c.save("sub/ok")
        assert c.load("sub/ok")[0]["rows"] == {"emb": 10}
    assert _tree(outside) == outside_before
    assert set(_tree(root)) - set(root_before) == {
        "sub/ok", "sub/ok/emb.shard0-of-1.bin", "sub/ok/server0-of-1.json"}

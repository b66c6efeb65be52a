"""A table config sent over the wire (CREATE_TABLES) is a peer's word, not the
operator's: every number is checked by type and range, a peer never chooses where a
server writes, and the rows and bytes a peer can make a server allocate are capped,
each refused by name (real ``python -m pyfleet.service`` processes on 127.0.0.1)."""

import json
import re

import numpy as np
import pytest
import zmq
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op

pytestmark = pytest.mark.timeout(300)

MIB = 1 << 20
SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 0.1},
          "initializer": {"type": "Constant", "value": 0.0}, "seed": 0}
DENSE = {"kind": "dense", "name": "w", "shape": [16],
         "optimizer": {"type": "SGD", "learning_rate": 0.1}}


def _peak(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _raw_create(endpoint, configs):
    """The error of a CREATE_TABLES sent as a bare peer would (no client-side checks;
    NaN allowed in the JSON), or None when the server accepted it."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("tcp://" + endpoint)
    try:
        frames = P.request(Op.CREATE_TABLES, 7)
        sock.send_multipart(frames + [json.dumps({"tables": configs}).encode()])
        assert sock.poll(30_000), "no answer to CREATE_TABLES"
        reply = sock.recv_multipart()
    finally:
        sock.close(0)
    if P.unpack_header(reply[0]).status == P.Status.OK:
        return None
    return P.parse_json(reply[-1]).get("error", "")


def test_a_peer_cannot_make_a_server_write_outside_the_operators_spill_root(tmp_path):
    root, outside = tmp_path / "spill", tmp_path / "elsewhere"
    root.mkdir()
    with ServerGroup(1, 1, extra_args=["--spill-dir", root]) as g, \
            Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        attack = {**SPARSE, "name": "evil", "memory_budget": 1 << 20,
                  "spill_dir": str(outside)}
        with pytest.raises(RemoteError, match=r"spill_dir .*elsewhere.* outside this server's "
                                              r"spill directory"):
            c.create_tables([attack])
        with pytest.raises(RemoteError, match="outside"):  # a way out through '..'
            c.create_tables([{**attack, "spill_dir": str(root / ".." / "elsewhere")}])
        # inside the operator's root it is the operator's disk tier
        c.create_tables([{**attack, "name": "ok", "spill_dir": str(root / "ok")}])
        assert c.pull_sparse("ok", np.arange(1, 11, dtype=np.uint64)).shape == (10, 4)
    assert not outside.exists()


def test_a_server_without_a_spill_root_refuses_any_disk_tier_from_a_peer(tmp_path):
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        with pytest.raises(RemoteError, match=r"gave it no spill directory \(--spill-dir\)"):
            c.create_tables([{**SPARSE, "memory_budget": 1 << 20,
                              "spill_dir": str(tmp_path / "spill")}])
        with pytest.raises(RemoteError, match="no spill directory"):  # a budget alone too
            c.create_tables([{**SPARSE, "memory_budget": 1 << 20}])
        assert c.stats()[0]["tables"] == {}
    assert not (tmp_path / "spill").exists()


@pytest.mark.parametrize("key, value, words", [
    ("dim", 65536.0, r"dim must be an int >= 1, got 65536\.0"),
    ("dim", True, "dim must be an int"),
    ("dim", 0, "dim must be an int >= 1"),
    ("dim", 65536, r"dim 65536 is over this server's max_sparse_dim=4096"),
    ("seed", 1.5, r"seed must be an int"),
    ("seed", "7", r"seed must be an int"),
    ("memory_budget", 1e6, r"memory_budget must be an int"),
    ("optimizer", {"type": "SGD", "learning_rate": float("nan")}, "must be finite"),
    ("extra", 1, r"unknown key\(s\) \['extra'\]"),
])
def test_every_number_of_a_peers_sparse_config_is_checked_by_type(key, value, words):
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        error = _raw_create(g.endpoints[0], [{**SPARSE, key: value}])
        assert error is not None and re.search(words, error), error
        assert c.stats()[0]["tables"] == {}
        assert _raw_create(g.endpoints[0], [SPARSE]) is None  # the same, well formed


@pytest.mark.parametrize("key, value, words", [
    ("shape", [16.0], "shape must be a list"),
    ("seed", 2.0, "seed must be an int"),
    ("shape", [1 << 10] * 9, "shape must be a list of 1 to 8"),
    ("start", "0", "start must be an int"),
    ("end", 16.0, "end must be an int"),
])
def test_every_number_of_a_peers_dense_config_is_checked_by_type(key, value, words):
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        error = _raw_create(g.endpoints[0], [{**DENSE, key: value}])
        assert error is not None and re.search(words, error), error
        assert c.stats()[0]["tables"] == {}
        assert _raw_create(g.endpoints[0], [DENSE]) is None


def test_rows_a_peer_makes_are_capped_per_table_and_per_server():
    # a dim-1024 SGD row counts 4 * 1024 + 64 bytes: 1000 rows 4.16 MB
    flags = ["--max-table-bytes", 6 * MIB, "--max-server-bytes", 9 * MIB]
    wide = {**SPARSE, "dim": 1024}
    with ServerGroup(1, 1, extra_args=flags) as g, \
            Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
        c.create_tables([wide, {**wide, "name": "emb2"}])
        before = _peak(g.procs[0].pid)
        c.pull_sparse("emb", np.arange(1, 1001, dtype=np.uint64))
        with pytest.raises(RemoteError, match=r"table 'emb'.*max_table_bytes=6291456 "
                                              r"\(--max-table-bytes\)"):
            c.pull_sparse("emb", np.arange(10_000, 12_000, dtype=np.uint64))
        with pytest.raises(RemoteError, match="max_table_bytes"):  # a push creates rows too
            c.push_sparse("emb", np.arange(10_000, 12_000, dtype=np.uint64),
                          np.zeros((2000, 1024), np.float32))
        c.pull_sparse("emb2", np.arange(1, 1001, dtype=np.uint64))
        # 500 more fit emb2's own cap (6.24 of 6.29 MB), not the server's (10.4 of 9.4)
        with pytest.raises(RemoteError, match=r"max_server_bytes=9437184 "
                                              r"\(--max-server-bytes\)"):
            c.pull_sparse("emb2", np.arange(5_000, 5_500, dtype=np.uint64))
        # the rows already held are still served, and reads that create nothing pass
        assert c.pull_sparse("emb", np.arange(1, 1001, dtype=np.uint64)).shape == (1000, 1024)
        rows = {k: v["rows"] for k, v in c.stats()[0]["tables"].items()}
        grown = _peak(g.procs[0].pid) - before
    assert rows == {"emb": 1000, "emb2": 1000}
    assert grown < 64 * MIB, f"server peak grew by {grown / MIB:.0f} MiB"

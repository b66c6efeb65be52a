"""Lifecycle, dead peers, hostile frames and checkpoints of the service."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.service import ServerGroup, batch, start_worker

import pyfleet
from pyfleet.errors import BarrierError, PeerTimeout, RemoteError
from pyfleet.optimizer import SGD, Adam
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op
from pyfleet.service.server import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4, "optimizer": Adam(0.01).to_config(),
          "initializer": {"type": "Uniform", "low": -0.1, "high": 0.1}, "seed": 5}


def test_in_process_run_returns_once_every_worker_stopped():
    server = Server("127.0.0.1:0", 0, 1, 2, tables=[SPARSE])
    t = threading.Thread(target=server.run)
    t.start()
    try:
        with Client([server.endpoint], worker_index=0, timeout=10) as a, \
                Client([server.endpoint], worker_index=1, timeout=10) as b:
            a.stop_worker()
            assert t.is_alive()
            assert b.pull_sparse("emb", np.array([3], np.uint64)).shape == (1, 4)
            b.stop_worker()
        t.join(10)
        assert not t.is_alive()
    finally:
        server.stop()
        t.join(10)


def test_a_worker_that_never_connects_fails_the_run_after_the_barrier_timeout():
    server = Server("127.0.0.1:0", 0, 1, 2, tables=[SPARSE], barrier_timeout=1.5,
                    heartbeat_timeout=1.0)
    t = threading.Thread(target=server.run)
    t0 = time.monotonic()
    t.start()
    try:
        with Client([server.endpoint], worker_index=0, timeout=10) as a:
            a.pull_sparse("emb", np.array([3], np.uint64))
            a.stop_worker()  # worker 1 died before its first request
        t.join(15)
        assert not t.is_alive()  # it used to serve forever
        assert time.monotonic() - t0 >= 1.5
        assert "worker(s) [1] never connected within 1.5 s" in server.failure
    finally:
        server.stop()
        t.join(10)


def test_killed_server_is_a_peer_timeout_naming_it():
    with ServerGroup(2, 1) as g, Client(g.endpoints, timeout=2, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        keys = np.arange(100, dtype=np.uint64)
        c.pull_sparse("emb", keys)
        g.kill(1)
        with pytest.raises(PeerTimeout, match=f"{g.endpoints[1]}.*PULL_SPARSE"):
            c.pull_sparse("emb", keys)
        with pytest.raises(PeerTimeout, match="PUSH_SPARSE"):
            c.push_sparse("emb", keys, np.ones((100, 4), np.float32))
        # the live server still answers
        assert c._control_all(Op.STATS, {}, servers=[0])[0]["server_index"] == 0


def test_silent_server_fails_a_one_key_pull_then_its_late_answer_is_ignored():
    # A 1-key pull to one server waits with blocking receives (no poll): the
    # deadline must still hold there, and the answer that arrives after it
    # must not be taken for the next request's.
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=1, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        key = np.array([7], np.uint64)
        before = c.pull_sparse("emb", key)
        c.push_sparse("emb", key, np.ones((1, 4), np.float32))
        after_push = c.pull_sparse("emb", key)
        assert not np.array_equal(before, after_push)
        g.procs[0].send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(PeerTimeout, match=f"{g.endpoints[0]}.*PULL_SPARSE"):
                c.pull_sparse("emb", key)
            assert time.monotonic() - t0 < 30  # bounded, not a hang
        finally:
            g.procs[0].send_signal(signal.SIGCONT)
        np.testing.assert_array_equal(c.pull_sparse("emb", key), after_push)
        other = np.array([8], np.uint64)
        assert not np.array_equal(c.pull_sparse("emb", other), after_push)


def test_client_waits_for_servers_started_after_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = {}

    def connect():
        try:
            box["client"] = Client([f"127.0.0.1:{port}"], timeout=5, connect_deadline=30)
        except Exception as e:  # surfaced below
            box["error"] = e

    t = threading.Thread(target=connect)
    t.start()
    server = Server(f"127.0.0.1:{port}", 0, 1, 1, tables=[SPARSE])
    st_ = threading.Thread(target=server.run)
    st_.start()
    t.join(30)
    try:
        assert "error" not in box, box.get("error")
        c = box["client"]
        assert c.pull_sparse("emb", np.array([1], np.uint64)).shape == (1, 4)
        c.stop_worker()
        c.close()
    finally:
        server.stop()
        st_.join(10)


def test_no_server_is_a_peer_timeout_after_the_connect_deadline():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PeerTimeout, match=f"127.0.0.1:{port}.*HEARTBEAT"):
        Client([f"127.0.0.1:{port}"], timeout=1, connect_deadline=1)


def test_killed_worker_fails_the_sync_barrier_naming_it(tmp_path):
    with ServerGroup(2, 2, mode="sync", heartbeat_timeout=3.0, barrier_timeout=60) as g, \
            Client(g.endpoints, worker_index=0, timeout=10) as c:
        c.create_tables([{**SPARSE, "optimizer": SGD(0.1).to_config()}])
        peer = start_worker("sync_steps", endpoints=g.endpoints, worker=1, steps=10, n=8,
                            dim=4, table="emb", hang_after=2)
        try:
            for step in range(2):
                keys, grads = batch(0, step, 8, 4, dyadic=True)
                c.pull_sparse("emb", keys)
                c.push_sparse("emb", keys, grads)
                c.barrier()
        finally:
            peer.kill()
            peer.wait(10)
        keys, grads = batch(0, 2, 8, 4, dyadic=True)
        c.push_sparse("emb", keys, grads)
        with pytest.raises(BarrierError, match="worker 1"):
            c.barrier()


def test_a_taken_port_is_an_error_naming_it(tmp_path):
    taken = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        with pytest.raises(pyfleet.PyfleetError, match=rf"server 0: cannot serve on "
                                                       rf"127.0.0.1:{port}: Address already in use"):
            Server(f"127.0.0.1:{port}", 0, 1, 1)
        r = subprocess.run([sys.executable, "-m", "pyfleet.service", "--endpoint",
                            f"127.0.0.1:{port}", "--index", "0", "--num-servers", "1",
                            "--workers", "1"], capture_output=True, text=True, timeout=60,
                           check=False)
        assert r.returncode == 75 and "Address already in use" in r.stderr  # EX_TEMPFAIL
        assert "Traceback" not in r.stderr
    finally:
        taken.close(linger=0)
    r = subprocess.run([sys.executable, "-m", "pyfleet.service", "--index", "0", "--num-servers",
                        "1", "--workers", "1", "--checkpoint-dir", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "is not a directory" in r.stderr


def test_bad_control_requests_and_checkpoint_paths_are_refused(tmp_path):
    (tmp_path / "ck").mkdir()
    os.symlink(tmp_path, tmp_path / "ck" / "link")
    with ServerGroup(1, 1, checkpoint_dir=tmp_path / "ck") as g, \
            Client(g.endpoints, timeout=10) as c:
        c.create_tables([SPARSE])
        for bad, why in [("../x", "escapes"), (str(tmp_path / "abs"), "relative"),
                         ("a/../../x", "escapes"), ("link/x", "escapes")]:
            with pytest.raises(RemoteError, match=why):
                c.save(bad)
            with pytest.raises(RemoteError, match=why):
                c.load(bad)
        with pytest.raises(RemoteError, match="does not exist"):
            c.load("never-saved")
        with pytest.raises(RemoteError, match="unknown shrink argument"):
            c._control_all(Op.SHRINK, {"rm": "-rf"})
        assert not (tmp_path / "x").exists() and not (tmp_path / "abs").exists()
        assert c.save("ok")[0]["files"] == ["emb.shard0-of-1.bin"]


def test_save_on_two_servers_load_on_three(tmp_path):
    dense = {"kind": "dense", "name": "fc.w", "shape": [4, 5], "optimizer": Adam(0.1).to_config(),
             "initial": {"type": "Uniform", "low": -1.0, "high": 1.0}, "seed": 1}
    keys = np.arange(1, 2001, dtype=np.uint64) * np.uint64(7919)
    rng = np.random.default_rng(0)
    with ServerGroup(2, 1, checkpoint_dir=tmp_path) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([SPARSE, dense], placement=[("fc.w", 0, 9, 1), ("fc.w", 9, 20, 0)])
        c.push_sparse("emb", keys, rng.standard_normal((2000, 4)).astype(np.float32))
        c.push_dense("fc.w", np.ones((4, 5), np.float32))
        c.save("full")
        c.push_sparse("emb", keys[:300], rng.standard_normal((300, 4)).astype(np.float32))
        c.push_dense("fc.w", np.ones((4, 5), np.float32))
        c.save("delta", mode="delta")
        want, want_dense = c.pull_sparse("emb", keys), c.pull_dense("fc.w")
        c.stop_worker()
        assert g.wait(30) == [0, 0]
    assert sorted(os.listdir(tmp_path / "full")) == [
        "emb.shard0-of-2.bin", "emb.shard1-of-2.bin", "fc.w.0-9.bin", "fc.w.9-20.bin",
        "server0-of-2.json", "server1-of-2.json"]
    with ServerGroup(3, 1, checkpoint_dir=tmp_path) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([SPARSE, dense], placement=[("fc.w", 0, 7, 0), ("fc.w", 7, 14, 1),
                                                    ("fc.w", 14, 20, 2)])
        loaded = c.load("full")
        assert sum(r["rows"]["emb"] for r in loaded) == 2000
        c.load("delta")
        np.testing.assert_array_equal(c.pull_sparse("emb", keys), want)
        np.testing.assert_array_equal(c.pull_dense("fc.w"), want_dense)
        rows = [s["tables"]["emb"]["rows"] for s in c.stats()]
        assert sum(rows) == 2000 and min(rows) > 0


# ------------------------------------------------------------------ fuzzing

@pytest.fixture(scope="module")
def fuzz_target():
    # Two workers: the client is worker 0, the fuzzing socket pushes as worker 1 (a push
    # must name a worker of the job).
    with ServerGroup(1, 2, max_message_bytes=1 << 20) as g:
        with Client(g.endpoints, timeout=10, heartbeat_interval=0) as c:
            c.create_tables([SPARSE, {"kind": "dense", "name": "d", "shape": [6],
                                      "optimizer": SGD(0.1).to_config()}])
            ids = c._ids[0]
            # The job's worker 0 pushes first: its index is its own (fuzzed requests
            # carry other request ids, and their pushes for worker 0 are refused).
            c.push_sparse("emb", np.array([1 << 63], np.uint64), np.zeros((1, 4), np.float32))
            c.flush()
            ctx = zmq.Context.instance()
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect("tcp://" + g.endpoints[0])
            yield g, c, sock, ids
            sock.close(0)


def _roundtrip(sock, frames):
    sock.send_multipart(frames)
    assert sock.poll(5000), "the server did not answer a malformed request"
    reply = sock.recv_multipart()
    return P.unpack_header(reply[0]), reply


def _valid_requests(ids):
    keys = np.array([1, 2, 3], np.uint64)
    vals = np.ones((3, 4), np.float32)
    return [
        P.request(Op.PULL_SPARSE, 1, table=ids["emb"], keys=keys, dim=4),
        P.request(Op.PUSH_SPARSE, 2, table=ids["emb"], keys=keys, values=vals * 1e-3, dim=4,
                  worker=1),
        P.request(Op.PULL_DENSE, 3, table=ids["d[0:6]"], dim=1),
        P.request(Op.PUSH_DENSE, 4, table=ids["d[0:6]"], values=np.ones(6, np.float32), dim=1,
                  worker=1),
        P.request(Op.STATS, 5, payload={}),
        P.request(Op.TABLES, 6, payload={}),
        P.dense_many_request(Op.PULL_DENSE_MANY, 7, [ids["d[0:6]"]], count=6),
        P.dense_many_request(Op.PUSH_DENSE_MANY, 8, [ids["d[0:6]"]],
                             [np.ones(6, np.float32)], flags=P.Flag.PULL_AFTER, worker=1),
    ]


def _bytes(frames):
    return [bytes(f) if not isinstance(f, np.ndarray) else f.tobytes() for f in frames]


_fuzz_settings = settings(max_examples=1500, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))


@_fuzz_settings
@given(frames=st.lists(st.binary(max_size=120), min_size=1, max_size=4))
def test_fuzz_random_frames_get_error_replies(fuzz_target, frames):
    _, _, sock, _ = fuzz_target
    h, reply = _roundtrip(sock, frames)
    assert h.status == P.Status.ERROR and P.parse_json(reply[1])["error"]


@_fuzz_settings
@given(data=st.data())
def test_fuzz_mutated_requests_never_break_the_server(fuzz_target, data):
    _, _, sock, ids = fuzz_target
    frames = _bytes(data.draw(st.sampled_from(_valid_requests(ids))))
    how = data.draw(st.sampled_from(["field", "flip", "truncate", "drop", "extend", "nan"]))
    if how == "field":  # overwrite one header field: version, op, flags, table, ..., dim
        offset, size = data.draw(st.sampled_from([(4, 1), (5, 1), (6, 2), (8, 4), (12, 4),
                                                  (16, 8), (24, 8), (32, 4)]))
        h = bytearray(frames[0])
        h[offset:offset + size] = data.draw(st.binary(min_size=size, max_size=size))
        frames[0] = bytes(h)
    elif how == "flip":
        i = data.draw(st.integers(0, len(frames) - 1))
        f = bytearray(frames[i])
        if f:
            f[data.draw(st.integers(0, len(f) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        frames[i] = bytes(f)
    elif how == "truncate":
        i = data.draw(st.integers(0, len(frames) - 1))
        frames[i] = frames[i][:data.draw(st.integers(0, max(0, len(frames[i]) - 1)))]
    elif how == "drop" and len(frames) > 1:
        del frames[data.draw(st.integers(1, len(frames) - 1))]
    elif how == "extend":
        frames.append(data.draw(st.binary(max_size=64)))
    elif how == "nan" and len(frames) == 3:
        g = np.frombuffer(frames[2], np.float32).copy()
        g[data.draw(st.integers(0, g.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf]))
        frames[2] = g.tobytes()
    h, reply = _roundtrip(sock, frames)
    assert h.flags & P.Flag.REPLY
    if h.status != P.Status.OK:
        assert P.parse_json(reply[1])["error"]


def test_after_fuzzing_the_server_is_correct_and_small(fuzz_target):
    g, c, sock, ids = fuzz_target
    before = c.stats()[0]
    # oversized frame: MAXMSGSIZE drops that peer's connection, nobody else's
    big = zmq.Context.instance().socket(zmq.DEALER)
    big.setsockopt(zmq.LINGER, 0)
    big.connect("tcp://" + g.endpoints[0])
    big.send_multipart([P.pack_header(Op.PULL_SPARSE, 1, ids["emb"], 300_000, 4),
                        np.zeros(300_000, np.uint64)])
    assert not big.poll(500)
    big.close(0)
    # a request whose frames add up to more than the limit gets a reply
    h, reply = _roundtrip(sock, P.request(
        Op.PUSH_SPARSE, 8, table=ids["emb"], keys=np.zeros(50_000, np.uint64),
        values=np.zeros((50_000, 4), np.float32), dim=4))
    assert h.status == P.Status.ERROR and b"max_message_bytes" in reply[1]
    rss = [before["rss_bytes"]]
    for _ in range(3):
        for frames in _valid_requests(ids) * 200:
            _roundtrip(sock, [b"junk"] + list(frames[1:]))
        rss.append(c.stats()[0]["rss_bytes"])
    # a leak of even a few hundred bytes per refused request would show here
    assert rss[-1] - rss[1] < 8 << 20, rss
    nan = np.ones((3, 4), np.float32)
    nan[1, 2] = np.nan
    # A NaN gradient from the job's worker 0 (the client: request ids of its own, which no
    # fuzzed message carries, and an index no fuzzed push could claim) is refused.
    with pytest.raises(RemoteError, match="NaN"):
        c.push_sparse("emb", np.array([7, 8, 9], np.uint64), nan)
    counters, old = c.stats()[0]["counters"], before["counters"]
    assert counters["protocol_errors"] - old.get("protocol_errors", 0) == \
        3 * 200 * len(_valid_requests(ids)) + 1
    assert counters["rejected_nonfinite"] - old.get("rejected_nonfinite", 0) == 1
    # still correct: compare against an in-process table fed the same pushes
    fresh = np.arange(10_000, 10_050, dtype=np.uint64)
    ref = pyfleet.SparseTable.from_config({k: v for k, v in SPARSE.items() if k != "kind"})
    np.testing.assert_array_equal(c.pull_sparse("emb", fresh), ref.pull(fresh))
    grads = np.random.default_rng(1).standard_normal((50, 4)).astype(np.float32)
    c.push_sparse("emb", fresh, grads)
    ref.push(fresh, grads)
    np.testing.assert_array_equal(c.pull_sparse("emb", fresh), ref.pull(fresh))


def test_curve_endpoint_needs_the_servers_public_key():
    public, secret = zmq.curve_keypair()
    server = Server("127.0.0.1:0", 0, 1, 1, tables=[SPARSE], curve_secret_key=secret)
    t = threading.Thread(target=server.run)
    t.start()
    try:
        with pytest.raises(PeerTimeout, match="HEARTBEAT"):
            Client([server.endpoint], timeout=1, connect_deadline=1.5)
        with pytest.raises(PeerTimeout):
            Client([server.endpoint], timeout=1, connect_deadline=1.5,
                   curve_server_keys=zmq.curve_keypair()[0])
        with Client([server.endpoint], timeout=10, curve_server_keys=public) as c:
            assert c.pull_sparse("emb", np.array([9], np.uint64)).shape == (1, 4)
            c.stop_worker()
        t.join(10)
        assert not t.is_alive()
    finally:
        server.stop()
        t.join(10)


def test_endpoints_in_the_wrong_order_are_refused():
    with ServerGroup(2, 1) as g:
        with pytest.raises(pyfleet.errors.PyfleetError, match="check the endpoint order"):
            Client(g.endpoints[::-1], timeout=5)

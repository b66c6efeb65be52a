"""Multi-block dense requests (PULL_DENSE_MANY, PUSH_DENSE_MANY, PULL_AFTER):
equal to the per-block ops and to in-process DenseTables; bad ones refused."""

import threading

import numpy as np
import pytest
import zmq
from support.service import ServerGroup

import pyfleet
from pyfleet.errors import RemoteError
from pyfleet.optimizer import SGD, Adam
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op
from pyfleet.service.server import Server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

SHAPES = {"fc.w": (6, 5), "fc.b": (5,), "out.w": (5, 1)}


def _configs(opt):
    return [{"kind": "dense", "name": n, "shape": list(s), "optimizer": opt.to_config(),
             "initial": np.linspace(-1, 1, int(np.prod(s))).tolist()}
            for n, s in SHAPES.items()]


def _refs(opt):
    return {n: pyfleet.DenseTable(s, opt, initial=np.linspace(-1, 1, int(np.prod(s)),
                                                              dtype=np.float32).reshape(s))
            for n, s in SHAPES.items()}


def _per_block(c, name):
    """``name``'s value read with one PULL_DENSE per block (the old ops)."""
    ch = c._channel()
    shape, blocks = c._dense_blocks(name)
    out = np.empty(int(np.prod(shape)), np.float32)
    for start, end, s, tid in blocks:
        ((_, frames),) = ch.wait([c._send(ch, s, Op.PULL_DENSE, table=tid)])
        out[start:end] = P.values_from(frames[0], end - start, 1).reshape(-1)
    return out.reshape(shape)


def test_many_ops_equal_per_block_ops_and_in_process_tables():
    opt = Adam(learning_rate=0.05)
    refs = _refs(opt)
    # fc.w split over both servers; server 1 holds three blocks of two params.
    placement = [("fc.w", 0, 11, 0), ("fc.w", 11, 30, 1), ("fc.b", 0, 5, 1),
                 ("out.w", 0, 5, 1)]
    rng = np.random.default_rng(0)
    with ServerGroup(2, 1) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables(_configs(opt), placement=placement)
        for step in range(5):
            grads = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
            for n, gr in grads.items():
                refs[n].push(gr)
            if step % 2:
                got = c.push_pull_dense_many(grads)
            else:
                assert c.push_dense_many(grads) is None
                got = c.pull_dense_many(list(SHAPES))
            assert set(got) == set(SHAPES)
            for n, shape in SHAPES.items():
                assert got[n].shape == shape and got[n].dtype == np.float32
                np.testing.assert_array_equal(got[n], refs[n].pull())
                np.testing.assert_array_equal(_per_block(c, n), refs[n].pull())
        # one request per server per call, not one per block
        counts = [s["counters"] for s in c.stats()]
        assert [k.get("op_push_dense_many", 0) for k in counts] == [5, 5]
        assert sum(k.get("op_push_dense", 0) for k in counts) == 0
        # a parameter held whole by one server comes back as a view of the reply
        whole = c.pull_dense_many(["fc.b"])["fc.b"]
        assert not whole.flags.owndata
        whole += 1  # the caller owns it: writable, and the servers do not see it
        np.testing.assert_array_equal(c.pull_dense("fc.b"), refs["fc.b"].pull())


@pytest.fixture
def raw_server():
    server = Server("127.0.0.1:0", 0, 1, 1, tables=[
        {"kind": "sparse", "name": "emb", "dim": 4, "optimizer": SGD(0.1).to_config(),
         "initializer": {"type": "Constant", "value": 0.0}}] + _configs(SGD(1.0)))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    ids = {k: e.id for k, e in server.registry.by_key.items()}
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("tcp://" + server.endpoint)
    try:
        yield server, sock, ids
    finally:
        sock.close(0)
        server.stop()
        t.join(10)


def _roundtrip(sock, frames):
    sock.send_multipart([f.tobytes() if isinstance(f, np.ndarray) else f for f in frames])
    assert sock.poll(5000), "the server did not answer"
    reply = sock.recv_multipart()
    return P.unpack_header(reply[0]), reply


def _error(sock, frames):
    h, reply = _roundtrip(sock, frames)
    assert h.status == P.Status.ERROR
    return P.parse_json(reply[1])["error"]


def test_bad_dense_many_requests_get_error_replies_and_the_server_serves_on(raw_server):
    server, sock, ids = raw_server
    w, b, o = ids["fc.w[0:30]"], ids["fc.b[0:5]"], ids["out.w[0:5]"]
    ones = [np.ones(30, np.float32), np.ones(5, np.float32)]
    push = P.dense_many_request(Op.PUSH_DENSE_MANY, 1, [w, b], ones, worker=0)

    # the header says 3 blocks, the ids frame holds 2
    bad = list(push)
    bad[0] = P.pack_header(Op.PUSH_DENSE_MANY, 2, 0, 35, 3, 0, 1)
    assert "needs 4 payload frame" in _error(sock, bad)
    bad = [P.pack_header(Op.PULL_DENSE_MANY, 2, 0, 35, 3), push[1]]
    assert "table ids frame has 8 bytes, header says 3 blocks" in _error(sock, bad)
    # a grad frame of the wrong size names its block
    bad = P.dense_many_request(Op.PUSH_DENSE_MANY, 3, [w, b],
                               [np.ones(30, np.float32), np.ones(4, np.float32)], worker=0)
    assert "block 1 ('fc.b[0:5]', 5 floats)" in _error(sock, bad)
    # count disagreeing with the blocks' sizes
    bad = P.dense_many_request(Op.PULL_DENSE_MANY, 4, [w, b], count=36)
    assert "header says 36 floats" in _error(sock, bad)
    # unknown, sparse and repeated ids
    assert "block 1: unknown table id 999" in _error(
        sock, P.dense_many_request(Op.PULL_DENSE_MANY, 5, [w, 999], count=35))
    assert "sparse table 'emb'" in _error(
        sock, P.dense_many_request(Op.PULL_DENSE_MANY, 6, [ids["emb"]], count=4))
    assert "twice" in _error(sock, P.dense_many_request(
        Op.PUSH_DENSE_MANY, 7, [b, b], [np.ones(5, np.float32)] * 2, worker=0))
    assert "at least one block" in _error(
        sock, [P.pack_header(Op.PULL_DENSE_MANY, 8, 0, 0, 0), b""])
    # geo deltas on an async server
    assert "ADD_DELTA" in _error(sock, P.dense_many_request(
        Op.PUSH_DENSE_MANY, 9, [b], [np.ones(5, np.float32)], flags=P.Flag.ADD_DELTA,
        worker=0))
    assert server.stats()["counters"]["protocol_errors"] >= 5

    # nothing was applied by the refused requests; a good one works (SGD lr 1)
    init = {n: np.linspace(-1, 1, int(np.prod(s)), dtype=np.float32) for n, s in SHAPES.items()}
    h, reply = _roundtrip(sock, P.dense_many_request(
        Op.PUSH_DENSE_MANY, 10, [w, b], ones, flags=P.Flag.PULL_AFTER, worker=0))
    assert h.status == P.Status.OK and len(reply) == 3
    np.testing.assert_array_equal(np.frombuffer(reply[1], "<f4"), init["fc.w"] - 1)
    np.testing.assert_array_equal(np.frombuffer(reply[2], "<f4"), init["fc.b"] - 1)
    h, reply = _roundtrip(sock, P.dense_many_request(Op.PULL_DENSE_MANY, 11, [o, b], count=10))
    assert h.status == P.Status.OK and h.count == 10 and h.dim == 2
    np.testing.assert_array_equal(np.frombuffer(reply[1], "<f4"), init["out.w"])
    np.testing.assert_array_equal(np.frombuffer(reply[2], "<f4"), init["fc.b"] - 1)


def test_pull_after_is_refused_by_a_sync_server():
    server = Server("127.0.0.1:0", 0, 1, 1, mode="sync", tables=_configs(SGD(1.0)))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        with Client([server.endpoint], timeout=10) as c:
            grads = {n: np.ones(s, np.float32) for n, s in SHAPES.items()}
            with pytest.raises(RemoteError, match="PULL_AFTER"):
                c.push_pull_dense_many(grads)
            c.push_dense_many(grads)  # buffered until the barrier
            c.barrier()
            np.testing.assert_array_equal(
                c.pull_dense("fc.b"), np.linspace(-1, 1, 5, dtype=np.float32) - 1)
    finally:
        server.stop()
        t.join(10)


def test_async_push_pull_answers_on_result_and_raises_there():
    """push_pull_dense_many_async sends at once; ``result()`` gives the values
    after the push, and a refused push raises there (not at the send)."""
    opt = SGD(0.5)
    refs = _refs(opt)
    with ServerGroup(2, 1) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables(_configs(opt))
        grads = {n: np.full(s, 2.0, np.float32) for n, s in SHAPES.items()}
        fut = c.push_pull_dense_many_async(grads)
        # pulls on the same thread in between are answered and leave the push alone
        before = c.pull_dense_many(list(SHAPES))
        got = fut.result()
        assert fut.done() and fut.result() is got
        for n in SHAPES:
            refs[n].push(grads[n])
            np.testing.assert_array_equal(got[n], refs[n].pull())
            assert before[n].shape == SHAPES[n]
        bad = dict(grads, **{"fc.b": np.full(5, np.nan, np.float32)})
        fut = c.push_pull_dense_many_async(bad)
        with pytest.raises(RemoteError, match="non-finite|NaN|nan"):
            fut.result()


def test_dense_many_request_checks_its_arguments():
    with pytest.raises(ValueError, match="2 blocks for 1 table ids"):
        P.dense_many_request(Op.PUSH_DENSE_MANY, 1, [3], [np.ones(2, np.float32)] * 2)
    frames = P.dense_many_request(Op.PUSH_DENSE_MANY, 1, [3, 4],
                                  [np.ones(2, np.float32), np.ones(3, np.float32)])
    h = P.unpack_header(frames[0])
    assert (h.op, h.count, h.dim, h.table) == (Op.PUSH_DENSE_MANY, 5, 2, 0)
    np.testing.assert_array_equal(P.table_ids_from(frames[1], 2), [3, 4])
    with pytest.raises(P.ProtocolError, match="header says 3 blocks"):
        P.table_ids_from(frames[1], 3)


@pytest.mark.parametrize("inline_limit", [0, 40, 1 << 19])
def test_handler_and_inline_paths_give_the_same_answers(inline_limit):
    """inline_limit 0 sends every data request to the handler threads, 40
    splits them (small inline, big handed off), the default answers all inline."""
    opt = Adam(learning_rate=0.05)
    refs = _refs(opt)
    sparse = pyfleet.SparseTable(4, SGD(0.1), seed=2, name="emb")
    server = Server("127.0.0.1:0", 0, 1, 1, inline_limit=inline_limit,
                    tables=[{"kind": "sparse", **sparse.config()}] + _configs(opt))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    rng = np.random.default_rng(3)
    try:
        with Client([server.endpoint], timeout=10) as c:
            for _ in range(3):
                keys = rng.choice(50, size=rng.integers(1, 30), replace=False).astype(np.uint64)
                np.testing.assert_array_equal(c.pull_sparse("emb", keys), sparse.pull(keys))
                g = rng.normal(size=(keys.shape[0], 4)).astype(np.float32)
                c.push_sparse("emb", keys, g)
                sparse.push(keys, g)
                grads = {n: rng.normal(size=s).astype(np.float32) for n, s in SHAPES.items()}
                got = c.push_pull_dense_many(grads)
                for n, gr in grads.items():
                    refs[n].push(gr)
                    np.testing.assert_array_equal(got[n], refs[n].pull())
            assert c.stats()[0]["counters"].get("internal_errors", 0) == 0
    finally:
        server.stop()
        t.join(10)

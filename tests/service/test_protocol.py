"""The wire format: headers, frame sizes, zero-copy views, and refusals."""

import numpy as np
import pytest
import zmq

from pyfleet.service import protocol as P
from pyfleet.service.protocol import Op, ProtocolError


def test_header_round_trip():
    buf = P.pack_header(Op.PUSH_SPARSE, 2**63 + 5, table=7, count=2**40, dim=16,
                        flags=P.Flag.ADD_DELTA, status=3)
    assert len(buf) == P.HEADER_SIZE
    h = P.unpack_header(buf)
    assert (h.op, h.request, h.table, h.count, h.dim, h.flags, h.status) == (
        Op.PUSH_SPARSE, 2**63 + 5, 7, 2**40, 16, P.Flag.ADD_DELTA, 3)


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:-1], "header frame must be"),
    (lambda b: b + b"x", "header frame must be"),
    (lambda b: b"XXXX" + b[4:], "bad magic"),
    (lambda b: b[:4] + bytes([P.PROTOCOL_VERSION + 1]) + b[5:], "protocol version"),
])
def test_bad_headers_are_refused_by_name(mutate, message):
    good = P.pack_header(Op.PULL_SPARSE, 1, count=1, dim=4)
    with pytest.raises(ProtocolError, match=message):
        P.unpack_header(mutate(good))


def test_request_frames_are_the_callers_buffers():
    keys = np.arange(10, dtype=np.uint64)
    vals = np.ones((10, 4), dtype=np.float32)
    frames = P.request(Op.PUSH_SPARSE, 9, table=1, keys=keys, values=vals, dim=4, worker=2)
    assert np.shares_memory(frames[1], keys) and np.shares_memory(frames[2], vals)
    h = P.unpack_header(frames[0])
    assert (h.count, h.dim, h.status) == (10, 4, 3)


def test_receiving_is_zero_copy_over_zmq():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://proto-zero-copy")
    b.connect("inproc://proto-zero-copy")
    try:
        keys = np.arange(100_000, dtype=np.uint64) * np.uint64(3)
        vals = np.random.default_rng(0).random((100_000, 2), dtype=np.float32)
        a.send_multipart(P.request(Op.PUSH_SPARSE, 1, keys=keys, values=vals, dim=2), copy=False)
        frames = b.recv_multipart(copy=False)
        h = P.unpack_header(frames[0].buffer)
        k = P.keys_from(frames[1], h.count)
        v = P.values_from(frames[2], h.count, h.dim)
        assert np.array_equal(k, keys) and np.array_equal(v, vals)
        assert np.shares_memory(k, np.frombuffer(frames[1].buffer, dtype=np.uint8))
    finally:
        a.close(0)
        b.close(0)


def test_frame_sizes_must_match_the_header():
    with pytest.raises(ProtocolError, match="keys frame has 12 bytes, header says 2 keys"):
        P.keys_from(b"x" * 12, 2)
    with pytest.raises(ProtocolError, match="grads frame has 8 bytes"):
        P.values_from(b"x" * 8, 1, 4, "grads")
    assert P.values_from(b"", 0, 4).shape == (0, 4)


def test_json_payloads():
    assert P.parse_json(P.json_frame({"a": [1, 2]})) == {"a": [1, 2]}
    for bad in (b"\xff\xfe", b"[1, 2]", b"{", b"nul"):
        with pytest.raises(ProtocolError):
            P.parse_json(bad)
    with pytest.raises(ProtocolError, match="exceeds"):
        P.parse_json(b'{"a": 1}', max_bytes=4)
    with pytest.raises(ValueError):
        P.json_frame({"x": float("nan")})


def test_error_reply_carries_status_and_message():
    frames = P.error_reply(Op.BARRIER, 5, "worker 1 died", P.Status.BARRIER_FAILED)
    h = P.unpack_header(frames[0])
    assert h.status == P.Status.BARRIER_FAILED and h.flags & P.Flag.REPLY and h.request == 5
    assert P.parse_json(frames[1]) == {"error": "worker 1 died"}


def test_control_and_data_ops_partition_the_ops():
    assert set(Op) == P.CONTROL_OPS | P.DATA_OPS and not P.CONTROL_OPS & P.DATA_OPS

"""The pyfleet wire protocol between workers (DEALER) and servers (ROUTER).

Every message is a ZeroMQ multipart message. A request is::

    frame 0   header      HEADER_SIZE bytes, struct HEADER_FORMAT (little endian):
                magic     4s   b"PFPS"
                version   u8   PROTOCOL_VERSION; any other version is refused
                op        u8   an :class:`Op`
                flags     u16  :class:`Flag` bits (REPLY on replies, ADD_DELTA on geo pushes,
                               NO_CREATE on evaluation pulls)
                table     u32  table id (from the CREATE_TABLES / TABLES reply), 0 for control
                status    u32  :class:`Status` on replies; on requests the sender's
                               worker index + 1 (0: anonymous)
                request   u64  request id chosen by the client, echoed by the reply
                count     u64  keys (sparse ops) or floats (dense ops, all blocks); 0 for control
                dim       u32  floats per row (sparse ops), 1 for dense, blocks (n) for
                               the *_DENSE_MANY ops, 0 for control
    frame 1.. payload     depends on the op:

    op             request payload                         reply payload
    PULL_SPARSE    keys (count x uint64 LE)                values (count x dim x float32)
    PUSH_SPARSE    keys, grads (count x dim x float32)     -
    PULL_DENSE     -                                       values (count x float32)
    PUSH_DENSE     grad (count x float32)                  -
    PULL_DENSE_MANY ids (n x uint32 LE: dense        n values frames, one per block
                   block table ids, n = dim)             in the order of ids
    PUSH_DENSE_MANY ids, then n grad frames (one per     -; with Flag.PULL_AFTER: n values
                   block, in the order of ids)           frames, each block's values after
                                                         its push (push + pull, one trip)
    EXPORT_SPARSE  JSON {"after": key|null, "limit": n}    keys, values (count x dim), JSON
                   (one page of a table shard's rows in     {"next": last key|null}; the next
                   ascending key order, weights only)       page starts after "next"
    PUSH_SHOW_CLICK keys, values (count x 2 x float32:     -
                   show, click per key; dim = 2)
    control ops    JSON object (UTF-8)                     JSON object (UTF-8)

The *_DENSE_MANY ops carry every dense block one server owns in one request
(instead of a request per block); the table field is 0 and ``count`` the sum of
the block sizes, which the receiver checks frame by frame.

An error reply has ``status`` != OK and one JSON frame ``{"error": message}``.
On the server side the ROUTER adds an identity frame in front; it never
reaches this module's parsers.

Keys and values travel as raw little-endian buffers: senders pass numpy arrays
to the socket as they are, without a copy when large (frames under
``pyfleet.service.wire.COPY_LIMIT`` are cheaper copied); receivers wrap
``frame.buffer`` with ``np.frombuffer`` (views of the received message, no
copy). Control payloads are JSON.
Nothing that crosses the socket is unpickled.

The functions here are pure (no sockets, no state) and safe from any thread.
Parsing never trusts a length field: every frame size is checked against the
header before a buffer is wrapped, and a violation raises :class:`ProtocolError`
(a ``ValueError``) whose message names the problem.
"""

import enum
import json
import struct
import sys

import numpy as np

__all__ = [
    "CONTROL_OPS",
    "DATA_OPS",
    "HEADER_FORMAT",
    "HEADER_SIZE",
    "MAGIC",
    "PROTOCOL_VERSION",
    "Flag",
    "Header",
    "Op",
    "ProtocolError",
    "Refused",
    "Status",
    "dense_many_request",
    "error_reply",
    "json_frame",
    "keys_from",
    "pack_header",
    "parse_json",
    "reply",
    "request",
    "table_ids_from",
    "unpack_header",
    "values_from",
]

MAGIC = b"PFPS"
# 2: PULL_DENSE_MANY / PUSH_DENSE_MANY and Flag.PULL_AFTER (a version-1 peer
# would refuse them mid-training; the version check refuses it at connect).
PROTOCOL_VERSION = 2
HEADER_FORMAT = "<4sBBHIIQQI"
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)
_HEADER = struct.Struct(HEADER_FORMAT)

if sys.byteorder != "little":  # raw buffers are sent as the host lays them out
    raise ImportError("pyfleet.protocol supports little-endian hosts only")


class Op(enum.IntEnum):
    PULL_SPARSE = 1
    PUSH_SPARSE = 2
    PULL_DENSE = 3
    PUSH_DENSE = 4
    EXPORT_SPARSE = 5
    PUSH_SHOW_CLICK = 6
    PULL_DENSE_MANY = 7
    PUSH_DENSE_MANY = 8
    BARRIER = 16
    HEARTBEAT = 17
    STOP_WORKER = 18
    SAVE = 19
    LOAD = 20
    SHRINK = 21
    STATS = 22
    CREATE_TABLES = 23
    TABLES = 24
    JOIN = 25


DATA_OPS = frozenset({Op.PULL_SPARSE, Op.PUSH_SPARSE, Op.PULL_DENSE, Op.PUSH_DENSE,
                      Op.EXPORT_SPARSE, Op.PUSH_SHOW_CLICK, Op.PULL_DENSE_MANY,
                      Op.PUSH_DENSE_MANY})
CONTROL_OPS = frozenset(set(Op) - DATA_OPS)


class Flag(enum.IntFlag):
    NONE = 0
    ADD_DELTA = 1     # PUSH_SPARSE/PUSH_DENSE(_MANY) in geo mode: values are deltas added to rows
    PULL_AFTER = 2    # PUSH_DENSE_MANY: reply with each block's values after the push
    NO_CREATE = 4     # PULL_SPARSE: a key without a row gets its initial row, none is made
    REPLY = 0x8000


class Status(enum.IntEnum):
    OK = 0
    ERROR = 1          # the request was refused or failed; raised as RemoteError
    BARRIER_FAILED = 2  # a barrier could not complete; raised as BarrierError


class ProtocolError(ValueError):
    """A frame violates the protocol (bad magic, version, op, size...)."""


class Refused(Exception):
    """A well-formed request the server will not carry out (unknown table,
    wrong mode, bad argument...): answered with an error reply saying why."""


class Header:
    """A decoded header. Plain attributes; ``op`` is the raw int (may be unknown)."""

    __slots__ = ("count", "dim", "flags", "op", "request", "status", "table")

    def __init__(self, op, flags, table, status, request, count, dim):
        self.op, self.flags, self.table, self.status = op, flags, table, status
        self.request, self.count, self.dim = request, count, dim

    def __repr__(self):
        return (f"Header(op={self.op}, flags={self.flags:#x}, table={self.table}, "
                f"status={self.status}, request={self.request}, count={self.count}, "
                f"dim={self.dim})")


def pack_header(op, request, table=0, count=0, dim=0, flags=0, status=0):
    # struct takes any integer (IntEnum, numpy) through __index__.
    return _HEADER.pack(MAGIC, PROTOCOL_VERSION, op, flags, table, status, request, count, dim)


def unpack_header(buf):
    """Decode frame 0; raises ProtocolError naming what is wrong."""
    n = len(buf)
    if n != HEADER_SIZE:
        raise ProtocolError(f"header frame must be {HEADER_SIZE} bytes, got {n}")
    magic, version, op, flags, table, status, rid, count, dim = _HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version} not supported "
                            f"(this side speaks {PROTOCOL_VERSION})")
    return Header(op, flags, table, status, rid, count, dim)


_U8, _F4 = np.dtype("<u8"), np.dtype("<f4")


def _raw(array, dtype):
    # A C-contiguous little-endian array is its own wire form: no copy.
    if type(array) is np.ndarray and array.dtype == dtype and array.ndim == 1 \
            and array.flags.c_contiguous:
        return array  # the common case, checked first: a 1-key pull is latency-bound
    return np.ascontiguousarray(array, dtype=dtype).reshape(-1)


def request(op, rid, table=0, keys=None, values=None, payload=None, dim=0, flags=0, worker=None):
    """Frames of one request. ``keys`` uint64, ``values`` float32 (any shape),
    ``payload`` a JSON-able dict for control ops, ``worker`` the sender's index.
    Arrays are not copied when already contiguous with the right dtype; the
    caller must not modify them until the message has been sent."""
    frames = [None]
    count = 0
    if keys is not None:
        keys = _raw(keys, _U8)
        count = keys.shape[0]
        frames.append(keys)
    if values is not None:
        values = _raw(values, _F4)
        if keys is None:
            count = values.shape[0]
        frames.append(values)
    if payload is not None:
        frames.append(json_frame(payload))
    frames[0] = pack_header(op, rid, table, count, dim, flags,
                            0 if worker is None else int(worker) + 1)
    return frames


def dense_many_request(op, rid, ids, blocks=None, flags=0, worker=None, count=0):
    """Frames of a PULL_DENSE_MANY (``blocks`` None, ``count`` the total
    floats expected back) or PUSH_DENSE_MANY (``blocks`` one float32 array per
    id) request. Blocks are sent as they are (no concatenation, no copy when
    contiguous); the caller must not modify them until the message has left."""
    ids = np.ascontiguousarray(ids, dtype="<u4").reshape(-1)
    frames = [None, ids]
    if blocks is not None:
        if len(blocks) != ids.shape[0]:
            raise ValueError(f"{len(blocks)} blocks for {ids.shape[0]} table ids")
        count = 0
        for b in blocks:
            b = _raw(b, _F4)
            count += b.shape[0]
            frames.append(b)
    frames[0] = pack_header(op, rid, 0, count, ids.shape[0], flags,
                            0 if worker is None else int(worker) + 1)
    return frames


def table_ids_from(frame, n):
    """A uint32 view (no copy) of the ids frame of a *_DENSE_MANY request."""
    buf = _buffer(frame)
    if n < 1:
        raise ProtocolError(f"a dense-many request needs at least one block, header says {n}")
    if buf.nbytes != 4 * n:
        raise ProtocolError(f"table ids frame has {buf.nbytes} bytes, header says {n} blocks "
                            f"({4 * n} bytes)")
    return np.frombuffer(buf, dtype="<u4", count=n)


def reply(header, values=None, payload=None, count=None, dim=None):
    """Frames of a success reply to ``header``."""
    frames = [None]
    if values is not None:
        frames.append(_raw(values, _F4))
    if payload is not None:
        frames.append(json_frame(payload))
    frames[0] = pack_header(header.op, header.request, header.table,
                            header.count if count is None else count,
                            header.dim if dim is None else dim,
                            Flag.REPLY, Status.OK)
    return frames


def error_reply(op, rid, message, status=Status.ERROR, table=0):
    return [pack_header(op, rid, table, 0, 0, Flag.REPLY, status),
            json_frame({"error": str(message)})]


def json_frame(obj):
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def parse_json(frame, max_bytes=None):
    """Decode a control payload; it must be a JSON object."""
    buf = frame.buffer if hasattr(frame, "buffer") else frame
    if max_bytes is not None and len(buf) > max_bytes:
        raise ProtocolError(f"JSON payload of {len(buf)} bytes exceeds {max_bytes}")
    try:
        obj = json.loads(bytes(buf).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"control payload is not valid UTF-8 JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"control payload must be a JSON object, got {type(obj).__name__}")
    return obj


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def keys_from(frame, count):
    """A uint64 view (no copy) of a keys frame holding exactly ``count`` keys."""
    buf = _buffer(frame)
    if len(buf) != 8 * count:
        raise ProtocolError(f"keys frame has {len(buf)} bytes, header says {count} keys "
                            f"({8 * count} bytes)")
    return np.frombuffer(buf, dtype="<u8", count=count)


def values_from(frame, count, dim, what="values"):
    """A float32 ``[count, dim]`` view (no copy) of a values frame."""
    buf = _buffer(frame)
    n = count * dim
    if len(buf) != 4 * n:
        raise ProtocolError(f"{what} frame has {len(buf)} bytes, header says {count} x {dim} "
                            f"float32 ({4 * n} bytes)")
    return np.frombuffer(buf, dtype="<f4", count=n).reshape(count, dim)

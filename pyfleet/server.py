"""The parameter server: one process per endpoint, serving table shards over ZeroMQ.

A :class:`Server` holds, for one ``server_index`` among ``server_num``:

- every sparse table's shard (the keys ``pyfleet.route(key, server_num)`` sends
  here), as a :class:`pyfleet.SparseTable`;
- the dense parameter blocks placed on it, as :class:`pyfleet.DenseTable`.

Threads: the thread calling :meth:`run` owns the ROUTER socket (the
endpoint). It answers the requests of a training step itself (at most
``inline_limit`` floats of keys x dim, 512k by default, and cheap control ops):
they then cost no thread hand-off. Larger requests, and save/load/shrink/
create_tables, go over inproc PUSH/PULL sockets to ``handler_threads`` Python
threads that call into the C++ tables (which release the GIL), so the big
pulls and pushes of different workers run in parallel; their replies come
back the same way and leave through the ROUTER. A sparse pull of at least
``split_pull_keys`` keys is itself pulled in parts by several threads at
once. A barrier never parks a thread: the waiting requests' envelopes are
kept and answered when the barrier completes (or fails, detected by the
ROUTER thread's housekeeping).

Modes (see docs/service.md):

- ``async``: every push is applied on arrival (Hogwild).
- ``sync``: pushes are buffered per table; when every live worker has reached
  the barrier the buffered gradients are summed per key, divided by the number
  of live workers and applied once, then the barrier replies. A worker's pull
  after the barrier sees every worker's update of that step.
- ``geo``: workers train locally and push deltas (``Flag.ADD_DELTA``) that are
  added to the rows (``w += delta``); gradient pushes to sparse tables are
  refused. A sparse table is stored with ``SGD(learning_rate=1)`` so that
  ``push(-delta)`` is exactly ``w + delta``; its configured optimizer runs in
  the workers. Dense parameters in geo mode take gradients (applied on
  arrival) or deltas.

Every malformed request (bad magic, version, op, sizes, table, dim, non-finite
gradient...) gets an error reply naming the problem and is counted in
``stats()``; the server keeps serving.

``python -m pyfleet.server --endpoint HOST:PORT --index I --num-servers S
--workers W --mode MODE`` runs one server and exits 0 once every worker has
called ``stop_worker`` (port 0 picks a free port; the line
``pyfleet.server ready on HOST:PORT`` is printed when it serves).
"""

import argparse
import json
import logging
import os
import re
import signal
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import numpy as np
import zmq

import pyfleet
from pyfleet import _checkpoint, _core
from pyfleet import _service_zmq as Z
from pyfleet import auth as _auth
from pyfleet import initializer as _init
from pyfleet import optimizer as _opt
from pyfleet import protocol as P
from pyfleet.endpoint import split_endpoint
from pyfleet.errors import PyfleetError
from pyfleet.protocol import Op, ProtocolError, Status

__all__ = ["Server", "main", "segment_sum"]

log = logging.getLogger("pyfleet.server")

MODES = ("async", "sync", "geo")
# Table names become file names: no separators, no leading dot.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@:+-]{0,199}")
_MAX_JSON_BYTES = 64 << 20
# How long run() waits at exit for a handler busy with (say) a save.
_HANDLER_JOIN_SECONDS = 30.0
# op (u8 at 5), count (u64 at 24), dim (u32 at 32) of a header, read without decoding it all.
_PEEK = struct.Struct("<5xB18xQI")
_ADD_DELTA = int(P.Flag.ADD_DELTA)
_PULL_AFTER = int(P.Flag.PULL_AFTER)
_NO_CREATE = int(P.Flag.NO_CREATE)
# Ops whose header dim is a block count, not a row width: their size is count.
_DENSE_MANY_OPS = frozenset({int(Op.PULL_DENSE_MANY), int(Op.PUSH_DENSE_MANY)})
_OP_BY_INT = {int(o): o for o in Op}
_OP_COUNTER = {o: f"op_{o.name.lower()}" for o in Op}
# Control ops that may take long: never answered by the ROUTER thread.
_HANDLER_OPS = frozenset({int(Op.SAVE), int(Op.LOAD), int(Op.SHRINK), int(Op.CREATE_TABLES),
                          int(Op.EXPORT_SPARSE)})
# Requests of at most this many floats are answered by the ROUTER thread: a
# training step's requests (a client chunk of 32768 keys x dim 16, every dense
# block of a server) then cost no inproc hand-off (two thread wake-ups, and
# the zero-copy frames' garbage-collector wake-ups): ~10-20% less server CPU
# for the reference DNN. Bigger ones go to the handler threads in parallel.
INLINE_LIMIT = 1 << 19
# A sparse pull of at least this many keys is cut into up to
# ``handler_threads`` parts pulled at once (the serving thread takes one, pull
# helper threads the others; the table releases the GIL), as Paddle's sparse
# tables spread a pull over their shards' task pools: a big pull is bound by
# memory latency, which more cores hide (measured on 2 cores, 16k keys from a
# 512k-row table: 1.6 ms -> 0.8 ms). Smaller pulls are not worth a hand-off.
SPLIT_PULL_KEYS = 8192
# Rows per EXPORT_SPARSE page unless the request asks for fewer.
_EXPORT_PAGE_ROWS = 65536


_SERVER_JSON_RE = re.compile(r"server\d+-of-\d+\.json")


def _saved_dense_shapes(path, names):
    """``{name: shape}`` of the dense parameters a save directory's
    ``server<i>-of-<S>.json`` files describe (empty for a directory without
    them). An unreadable one is refused, naming it."""
    shapes = {}
    for n in sorted(names):
        if not _SERVER_JSON_RE.fullmatch(n):
            continue
        try:
            with open(os.path.join(path, n)) as f:
                tables = json.load(f).get("tables") or []
            for t in tables:
                if t.get("kind") == "dense":
                    shapes[t["name"]] = [int(x) for x in t["shape"]]
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
            raise _Refused(f"{os.path.join(path, n)} is unreadable: {e}") from None
    return shapes


def segment_sum(keys, values):
    """``(unique_keys, sums)``: rows of ``values`` with equal keys summed, in
    input order, keys in first-occurrence order (the core's hashing kernels,
    as the client uses). ``values`` is float32 ``[n, dim]``. Without
    duplicates the inputs themselves are returned (not copies)."""
    uniq, inverse = _core.unique_inverse(keys)
    if uniq.shape[0] == keys.shape[0]:
        return keys, values
    return uniq, _core.sum_rows(values, inverse, uniq.shape[0])


class _Refused(Exception):
    """A request the server answers with an error reply (message says why)."""


class _Entry:
    __slots__ = (
        "canonical",
        "config",
        "dim",
        "end",
        "id",
        "key",
        "kind",
        "lock",
        "name",
        "shape",
        "start",
        "table",
    )

    def info(self):
        d = {"id": self.id, "kind": self.kind, "name": self.name}
        if self.kind == "sparse":
            d.update(dim=self.dim, config=self.config)
        else:
            d.update(shape=list(self.shape), start=self.start, end=self.end)
        return d


def _canonical(cfg):
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def _dense_key(name, start, end):
    return f"{name}[{start}:{end}]"


class Server:
    """One parameter-server endpoint.

    Args:
        endpoint: ``"host:port"`` (or ``"tcp://host:port"``); port 0 picks a free
            port, readable afterwards as :attr:`endpoint`. Bound in the constructor.
        server_index, server_num: this server's place among all servers.
        worker_num: workers that will connect; :meth:`run` returns after each of
            them called ``stop_worker``.
        mode: ``"async"``, ``"sync"`` or ``"geo"``.
        tables: table configs to create at start (see :meth:`create_tables`).
        handler_threads: Python threads calling into the tables.
        max_message_bytes: largest accepted message (``zmq.MAXMSGSIZE`` drops
            the connection of a peer sending one larger frame; a message whose
            frames add up to more gets an error reply).
        heartbeat_timeout: seconds without a heartbeat after which a worker
            missing at a barrier is declared dead and the barrier fails.
        barrier_timeout: seconds a barrier may wait in all.
        checkpoint_dir: root of ``save``/``load`` directories (None: refused).
        inline_limit: requests of at most this many floats (keys x dim) are
            answered by the ROUTER thread itself; 0 sends all to the handlers.
        split_pull_keys: sparse pulls of at least this many keys are pulled in
            up to ``handler_threads`` parts at once (not under an admission
            policy, whose counts are per call); 0 never splits.
        curve_secret_key: a Z85 secret key (``zmq.curve_keypair()[1]``): the
            endpoint then speaks CURVE (encrypted; a client needs the matching
            public key). None: plain TCP, for trusted networks.
        curve_client_keys: a directory of admitted client public keys
            (``*.key`` certificates, see :mod:`pyfleet.auth`); needs
            ``curve_secret_key``. A ZAP authenticator thread then refuses the
            handshake of any other client. The server uses its own ZeroMQ
            context (ZAP handlers are per context) unless ``context`` is given.

    Binding a host other than loopback without ``curve_client_keys`` logs a
    warning: anyone who can reach the port can then read and change the model.

    Thread safety: :meth:`stop` may be called from any thread (or a signal
    handler); everything else is driven by :meth:`run`.
    """

    def __init__(self, endpoint, server_index, server_num, worker_num, mode="async",
                 tables=None, handler_threads=2, max_message_bytes=1 << 30,
                 heartbeat_timeout=10.0, barrier_timeout=300.0, checkpoint_dir=None,
                 inline_limit=INLINE_LIMIT, curve_secret_key=None, curve_client_keys=None,
                 context=None, split_pull_keys=SPLIT_PULL_KEYS):
        self.server_index, self.server_num = int(server_index), int(server_num)
        self.worker_num = int(worker_num)
        if not 0 <= self.server_index < self.server_num:
            raise ValueError(f"server_index must be in [0, {self.server_num}), "
                             f"got {server_index!r}")
        if self.worker_num < 1:
            raise ValueError(f"worker_num must be >= 1, got {worker_num!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if int(handler_threads) < 1:
            raise ValueError(f"handler_threads must be >= 1, got {handler_threads!r}")
        self.mode = mode
        self.handler_threads = int(handler_threads)
        self.max_message_bytes = int(max_message_bytes)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.barrier_timeout = float(barrier_timeout)
        self.checkpoint_dir = None if checkpoint_dir is None else os.path.realpath(
            str(checkpoint_dir))
        self.inline_limit = int(inline_limit)
        self.split_pull_keys = int(split_pull_keys)
        if self.split_pull_keys < 0:
            raise ValueError(f"split_pull_keys must be >= 0, got {split_pull_keys!r}")
        # Threads start on first use (a split pull).
        self._pull_helpers = ThreadPoolExecutor(
            max(self.handler_threads - 1, 1), thread_name_prefix="pyfleet-pull")

        self._lock = threading.RLock()           # tables, sync buffers, barrier, workers
        self._entries = {}                        # id -> _Entry
        self._by_key = {}                         # "name" / "name[s:e]" -> _Entry
        self._sync_buf = {}                       # id -> [(worker, keys, grads)]
        self._waiting = {}                        # worker -> (identity, Header, kind)
        self._barrier_started = None
        self._barrier_count = 0
        self._last_seen = {}
        self._stopped = set()
        self._counters = {}
        self._counter_lock = threading.Lock()
        self._last_house = 0.0
        self._serving_since = None  # monotonic time run() began
        self._done = threading.Event()
        self._ran = False
        self._export_snapshots = {}               # table id -> sorted keys of an export
        self.failure = None  # why run() ended before every worker stopped (None: it did not)

        host, port = split_endpoint(endpoint, "server endpoint", allow_zero=True)
        if curve_client_keys is not None and curve_secret_key is None:
            raise ValueError("curve_client_keys needs curve_secret_key (the server's key pair)")
        if curve_client_keys is None and not _auth.is_loopback_host(host):
            log.warning("binding %s without client authentication: anyone who can reach this "
                        "port can read and change the model (see docs/operations.md, "
                        "'Secure a cluster')", host)
        self._own_ctx = context is None and curve_client_keys is not None
        self._ctx = zmq.Context() if self._own_ctx else (context or zmq.Context.instance())
        self._zap = None
        self._frontend = self._ctx.socket(zmq.ROUTER)
        self._work = self._replies = None
        try:
            if curve_client_keys is not None:
                self._zap = _auth.ZapAuthenticator(self._ctx, curve_client_keys).start()
            self._frontend.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
            self._frontend.setsockopt(zmq.LINGER, 1000)
            self._frontend.setsockopt(zmq.SNDHWM, 0)
            self._frontend.setsockopt(zmq.RCVHWM, 0)
            if curve_secret_key is not None:
                # Encrypted, and clients must know this server's public key.
                self._frontend.curve_server = True
                self._frontend.curve_secretkey = _z85(curve_secret_key)
            try:
                if port == 0:
                    port = self._frontend.bind_to_random_port(f"tcp://{host}")
                else:
                    self._frontend.bind(f"tcp://{host}:{port}")
            except zmq.ZMQError as e:
                hint = (" (another process listens there: stop it or choose another port)"
                        if e.errno == zmq.EADDRINUSE else "")
                raise PyfleetError(f"server {server_index}: cannot serve on {host}:{port}: "
                                   f"{e.strerror}{hint}") from None
            self.endpoint = f"{host}:{port}"
            inproc = f"inproc://pyfleet-server-{id(self):x}"
            self._work_addr, self._reply_addr = inproc + "-work", inproc + "-reply"
            self._work = self._inproc(zmq.PUSH, self._work_addr)
            self._replies = self._inproc(zmq.PULL, self._reply_addr)
            if tables:
                self.create_tables(tables)
        except BaseException:
            for sock in (self._frontend, self._work, self._replies):
                if sock is not None:
                    sock.close(linger=0)
            self._close_auth()
            raise

    def _close_auth(self):
        if self._zap is not None:
            self._zap.stop()
            self._zap = None
        if self._own_ctx:
            self._own_ctx = False
            self._ctx.term()

    # ---------------------------------------------------------------- lifecycle

    def _inproc(self, kind, addr, bind=True):
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
        (sock.bind if bind else sock.connect)(addr)
        return sock

    def run(self):
        """Serve until every worker has called ``stop_worker`` or :meth:`stop`,
        or until every worker has stopped or died, one at least dead (then
        :attr:`failure` says which; ``python -m pyfleet.server`` exits 1).
        Blocks; returns normally (closing the sockets) in every case."""
        if self._ran:
            raise RuntimeError("Server.run() may be called once")
        self._ran = True
        self._serving_since = time.monotonic()
        handlers = [threading.Thread(target=self._handler_loop, name=f"pyfleet-handler-{i}",
                                     daemon=True) for i in range(self.handler_threads)]
        for t in handlers:
            t.start()
        log.info("server %d/%d serving %s (%s mode)", self.server_index, self.server_num,
                 self.endpoint, self.mode)
        front, replies = self._frontend, self._replies
        try:
            while not self._done.is_set():
                for sock in Z.readable([front, replies], 100):
                    msg = Z.recv_frames(sock)
                    if sock is replies:
                        Z.send_frames(front, msg, copy=False)
                    elif self._inline(msg):
                        for out in self._handle(msg):
                            Z.send_frames(front, out)
                    else:
                        Z.send_frames(self._work, msg, copy=False)
                self._housekeeping(front)
        finally:
            self._done.set()
            for t in handlers:
                t.join(_HANDLER_JOIN_SECONDS)
            self._pull_helpers.shutdown(wait=False)
            self._forward_replies()
            self._frontend.close(linger=1000)
            self._work.close(linger=0)
            self._replies.close(linger=0)
            if not any(t.is_alive() for t in handlers):  # term() would wait for their sockets
                self._close_auth()

    def _forward_replies(self):
        while Z.readable([self._replies], 0):
            Z.send_frames(self._frontend, Z.recv_frames(self._replies), copy=False)

    def _inline(self, msg):
        """Whether the ROUTER thread answers ``msg`` itself (cheap requests)."""
        if len(msg) < 2 or len(msg[1]) != P.HEADER_SIZE:
            return True  # an error reply
        op, count, dim = _PEEK.unpack_from(msg[1].buffer)
        if op in _HANDLER_OPS:
            return False
        if op in _DENSE_MANY_OPS:
            return count <= self.inline_limit
        return count * max(dim, 1) <= self.inline_limit

    def stop(self):
        """Make :meth:`run` return. Thread-safe and idempotent."""
        self._done.set()

    def _handler_loop(self):
        work = self._inproc(zmq.PULL, self._work_addr, bind=False)
        out = self._inproc(zmq.PUSH, self._reply_addr, bind=False)
        try:
            while not self._done.is_set():
                if Z.readable([work], 100):
                    for reply in self._handle(Z.recv_frames(work)):
                        Z.send_frames(out, reply)
        finally:
            work.close(linger=0)
            out.close(linger=1000)

    # ------------------------------------------------------------------ helpers

    def _count(self, name, n=1):
        with self._counter_lock:
            self._counters[name] = self._counters.get(name, 0) + n

    def _entry(self, table_id, kind, op):
        e = self._entries.get(table_id)
        if e is None:
            raise _Refused(f"unknown table id {table_id} for {op.name} on server "
                           f"{self.server_index} (known: {sorted(self._entries)})")
        if e.kind != kind:
            raise _Refused(f"table {e.key!r} is {e.kind}, {op.name} needs a {kind} table")
        return e

    # ---------------------------------------------------------------- dispatch

    def _handle(self, msg):
        """Replies (each a frame list starting with the identity) for one message."""
        ident, frames = msg[0], msg[1:]
        if not frames:
            self._count("protocol_errors")
            return [[ident] + P.error_reply(0, 0, "empty message: no header frame")]
        try:
            h = P.unpack_header(frames[0].buffer)
        except ProtocolError as e:
            self._count("protocol_errors")
            _log_bad(self._counters.get("protocol_errors", 0), e)
            return [[ident] + P.error_reply(0, 0, e)]
        try:
            op = _OP_BY_INT.get(h.op)
            if op is None:
                raise ProtocolError(f"unknown op {h.op}")
            total = sum(len(f) for f in frames) if len(frames) > 2 else 0
            if total > self.max_message_bytes:
                raise ProtocolError(f"message of {total} bytes exceeds max_message_bytes="
                                    f"{self.max_message_bytes}")
            if h.status and h.status - 1 < self.worker_num:
                self._last_seen[h.status - 1] = time.monotonic()
            self._count(_OP_COUNTER[op])
            out = self._ops[op](self, h, op, frames[1:], ident)
            return [] if out is None else out
        except (ProtocolError, _Refused, ValueError, TypeError, KeyError, OSError) as e:
            kind = "protocol_errors" if isinstance(e, ProtocolError) else "refused_requests"
            self._count(kind)
            _log_bad(self._counters.get(kind, 0), e)
            msg = str(e) if not isinstance(e, KeyError) else f"missing field {e}"
            return [[ident] + P.error_reply(h.op, h.request, f"{_op_name(h.op)}: {msg}",
                                            table=h.table)]
        except Exception as e:  # a server bug must not end the server
            self._count("internal_errors")
            log.exception("internal error on %s", _op_name(h.op))
            return [[ident] + P.error_reply(h.op, h.request,
                                            f"{_op_name(h.op)}: internal error: {e!r}")]

    @staticmethod
    def _frames(frames, n, op):
        if len(frames) != n:
            raise ProtocolError(f"{op.name} needs {n} payload frame(s), got {len(frames)}")

    # ------------------------------------------------------------- data ops

    def _sparse_rows(self, h, op, frames, n_frames):
        """``(entry, keys)`` of a request on a sparse table's rows: ``n_frames``
        payload frames, the first the keys, rows of the table's dim."""
        self._frames(frames, n_frames, op)
        e = self._entry(h.table, "sparse", op)
        if h.dim != e.dim:
            raise ProtocolError(f"dim {h.dim} does not match table {e.key!r} dim {e.dim}")
        return e, P.keys_from(frames[0], h.count)

    def _pull_sparse(self, h, op, frames, ident):
        e, keys = self._sparse_rows(h, op, frames, 1)
        n = keys.shape[0]
        create = not h.flags & _NO_CREATE
        parts = min(self.handler_threads, n // max(self.split_pull_keys // 2, 1)) \
            if self.split_pull_keys and e.table.entry is None else 1
        if parts < 2:
            return [[ident] + P.reply(h, values=e.table.pull(keys, create=create))]
        out = np.empty((n, e.dim), dtype=np.float32)
        bounds = [n * i // parts for i in range(parts + 1)]
        rest = [self._pull_helpers.submit(e.table.pull, keys[a:b], out[a:b], create)
                for a, b in zip(bounds[1:-1], bounds[2:])]
        e.table.pull(keys[:bounds[1]], out[:bounds[1]], create)
        for f in rest:
            f.result()
        return [[ident] + P.reply(h, values=out)]

    def _push_sparse(self, h, op, frames, ident):
        e, keys = self._sparse_rows(h, op, frames, 2)
        grads = P.values_from(frames[1], h.count, e.dim, "grads")
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode == "geo" and not delta:
            raise _Refused(f"geo-mode server takes deltas (ADD_DELTA) for sparse table "
                           f"{e.key!r}, not gradients")
        if self.mode != "geo" and delta:
            raise _Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        self._apply(e, h, keys, grads, delta)
        return [[ident] + P.reply(h)]

    def _push_show_click(self, h, op, frames, ident):
        self._frames(frames, 2, op)
        e = self._entry(h.table, "sparse", op)
        if h.dim != 2:
            raise ProtocolError(f"PUSH_SHOW_CLICK carries 2 floats a key (show, click), "
                                f"got dim {h.dim}")
        keys = P.keys_from(frames[0], h.count)
        values = P.values_from(frames[1], h.count, 2, "show/click")
        e.table.add_show_click(keys, np.ascontiguousarray(values[:, 0]),
                               np.ascontiguousarray(values[:, 1]))
        return [[ident] + P.reply(h)]

    def _pull_dense(self, h, op, frames, ident):
        self._frames(frames, 0, op)
        e = self._entry(h.table, "dense", op)
        out = e.table.pull().reshape(-1)
        return [[ident] + P.reply(h, values=out, count=out.shape[0], dim=1)]

    def _push_dense(self, h, op, frames, ident):
        self._frames(frames, 1, op)
        e = self._entry(h.table, "dense", op)
        size = e.end - e.start
        if h.count != size:
            raise ProtocolError(f"dense push of {h.count} floats to {e.key!r} of {size}")
        grads = P.values_from(frames[0], h.count, 1, "grad").reshape(-1)
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode != "geo" and delta:
            raise _Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        self._apply(e, h, None, grads, delta)
        return [[ident] + P.reply(h)]

    def _dense_many(self, h, op, frames, grads):
        """The entries of a *_DENSE_MANY request, every block checked (ids,
        kinds, sizes against ``count``, frame count) before any is touched."""
        n = h.dim
        want = 1 + (n if grads else 0)
        if len(frames) != want:
            raise ProtocolError(f"{op.name} of {n} block(s) needs {want} payload frame(s), "
                                f"got {len(frames)}")
        ids = P.table_ids_from(frames[0], n).tolist()
        if len(set(ids)) != n:
            raise _Refused(f"{op.name} names a dense block twice: table ids {ids}")
        entries, total = [], 0
        for i, tid in enumerate(ids):
            e = self._entries.get(tid)
            if e is None or e.kind != "dense":
                what = "unknown table id" if e is None else f"sparse table {e.key!r}, id"
                raise _Refused(f"block {i}: {what} {tid} is not a dense block on server "
                               f"{self.server_index}")
            size = e.end - e.start
            if grads and len(frames[1 + i]) != 4 * size:
                raise ProtocolError(f"block {i} ({e.key!r}, {size} floats): grad frame has "
                                    f"{len(frames[1 + i])} bytes, expected {4 * size}")
            entries.append(e)
            total += size
        if total != h.count:
            raise ProtocolError(f"{op.name}: header says {h.count} floats, the {n} block(s) "
                                f"named hold {total}")
        return entries

    def _pull_dense_many(self, h, op, frames, ident):
        entries = self._dense_many(h, op, frames, False)
        return [[ident] + P.reply(h) + [e.table.pull().reshape(-1) for e in entries]]

    def _push_dense_many(self, h, op, frames, ident):
        """Blocks are applied in request order; a block refused when applied
        (a non-finite gradient) ends the request with earlier blocks applied."""
        entries = self._dense_many(h, op, frames, True)
        delta = bool(h.flags & _ADD_DELTA)
        if self.mode != "geo" and delta:
            raise _Refused(f"ADD_DELTA pushes need a geo-mode server (this one is {self.mode})")
        pull = bool(h.flags & _PULL_AFTER)
        if pull and self.mode == "sync":
            raise _Refused("PULL_AFTER is meaningless on a sync-mode server (pushes apply at "
                           "the barrier); pull after the barrier instead")
        out = [ident] + P.reply(h)
        for i, e in enumerate(entries):
            grads = np.frombuffer(frames[1 + i].buffer, dtype="<f4")
            self._apply(e, h, None, grads, delta)
            if pull:
                out.append(e.table.pull().reshape(-1))
        return [out]

    def _export_sparse(self, h, op, frames, ident):
        """One page of this shard's rows, weights only, keys ascending after
        ``after`` (the cursor: the last key sent). ``after=null`` starts an
        export from a sorted snapshot of the keys, kept until its last page so
        each page costs O(page); a later page with no snapshot (another export
        finished it) sorts a new one, so the cursor stays correct."""
        self._frames(frames, 1, op)
        payload = P.parse_json(frames[0], _MAX_JSON_BYTES)
        e = self._entry(h.table, "sparse", op)
        limit, after = payload.get("limit", _EXPORT_PAGE_ROWS), payload.get("after")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _Refused(f"limit must be a positive integer, got {limit!r}")
        # A page must fit in one message: keys (8 bytes) + a row per key.
        limit = min(limit, max(1, self.max_message_bytes // (2 * (8 + 4 * e.dim))))
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or
                                  not 0 <= after < 1 << 64):
            raise _Refused(f"after must be a uint64 key or null, got {after!r}")
        snapshot = None if after is None else self._export_snapshots.get(e.id)
        if snapshot is None:
            snapshot = np.sort(e.table.keys())
            self._export_snapshots[e.id] = snapshot
        start = 0 if after is None else int(np.searchsorted(snapshot, np.uint64(after), "right"))
        keys = snapshot[start:start + limit]
        full = start + limit < snapshot.shape[0]
        if not full:
            self._export_snapshots.pop(e.id, None)
        rows = e.table.export(keys)  # rows dropped since the snapshot are left out
        k = np.ascontiguousarray(rows["keys"], dtype="<u8")
        w = np.ascontiguousarray(rows["weights"], dtype="<f4").reshape(k.shape[0], e.dim)
        nxt = int(keys[-1]) if full else None
        return [[ident, P.pack_header(h.op, h.request, h.table, k.shape[0], e.dim,
                                      P.Flag.REPLY, Status.OK),
                 k, w, P.json_frame({"next": nxt})]]

    def _apply(self, e, h, keys, grads, delta):
        if self.mode == "sync":
            if not np.isfinite(grads).all():
                self._count("rejected_nonfinite")
                raise _Refused(f"gradient for {e.key!r} holds NaN or Inf; push rejected")
            if h.status == 0:
                raise _Refused("a sync-mode push must carry the worker index in its header")
            with self._lock:
                self._sync_buf.setdefault(e.id, []).append((h.status - 1, keys, grads))
            return
        try:
            if e.kind == "sparse":
                if delta:
                    e.table.add(keys, grads)
                else:
                    e.table.push(keys, grads)
            elif delta:
                e.table.add(grads.reshape(e.table.shape))
            else:
                e.table.push(grads.reshape(e.table.shape))
        except ValueError:
            if not np.isfinite(grads).all():
                self._count("rejected_nonfinite")
                raise _Refused(f"gradient for {e.key!r} holds NaN or Inf; push rejected") \
                    from None
            raise

    def _apply_sync(self, n_live):
        """Average and apply the buffered pushes; caller holds ``self._lock``."""
        scale = np.float32(max(n_live, 1))
        for tid, items in self._sync_buf.items():
            e = self._entries[tid]
            items.sort(key=lambda it: it[0])  # add workers' gradients in worker order
            if e.kind == "sparse":
                keys = np.concatenate([it[1] for it in items])
                grads = np.concatenate([it[2] for it in items])
                keys, grads = segment_sum(keys, grads)
                e.table.push(keys, grads / scale)
            else:
                total = items[0][2].copy()
                for it in items[1:]:
                    total += it[2]
                e.table.push((total / scale).reshape(e.table.shape))
        self._sync_buf = {}

    # ------------------------------------------------------------ control ops

    def _control_payload(self, frames, op):
        if len(frames) > 1:
            raise ProtocolError(f"{op.name} takes at most one JSON frame, got {len(frames)}")
        return P.parse_json(frames[0], _MAX_JSON_BYTES) if frames else {}

    def _worker_of(self, payload):
        w = payload.get("worker")
        if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w < self.worker_num:
            raise _Refused(f"worker must be an integer in [0, {self.worker_num}), got {w!r}")
        return w

    def _barrier(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        w = self._worker_of(payload)
        kind = payload.get("kind", "step")
        if kind not in ("step", "pass"):
            raise _Refused(f"barrier kind must be 'step' or 'pass', got {kind!r}")
        with self._lock:
            self._last_seen[w] = time.monotonic()
            if w in self._waiting:
                raise _Refused(f"worker {w} is already waiting at this barrier")
            if not self._waiting:
                self._barrier_started = time.monotonic()
            self._waiting[w] = (ident, h, kind)
            return self._complete_barrier_locked()

    def _complete_barrier_locked(self):
        """Release the barrier once every live worker waits at one. A *step*
        barrier (sync mode: the end of a training step) completes with the
        workers at it; workers waiting at a *pass* barrier
        (``fleet.barrier_worker``: done with their share) take no part in it,
        as stopped ones, and are released once every live worker is at the
        pass barrier. So workers with fewer batches wait for the others
        instead of releasing, or deadlocking, their steps."""
        live = set(range(self.worker_num)) - self._stopped
        if not self._waiting or not live <= self._waiting.keys():
            return None
        step = {w: v for w, v in self._waiting.items() if v[2] == "step"}
        release = step or self._waiting
        if self.mode == "sync" and step:
            self._apply_sync(len(step))
        self._barrier_count += 1
        out = [[ident] + P.reply(hh, payload={"barrier": self._barrier_count})
               for ident, hh, _ in release.values()]
        if step:
            self._waiting = {w: v for w, v in self._waiting.items() if v[2] != "step"}
            self._barrier_started = time.monotonic() if self._waiting else None
        else:
            self._waiting = {}
            self._barrier_started = None
        return out

    def _housekeeping(self, sock):
        """Fail a barrier whose missing worker died or that waited too long.
        Called by the ROUTER thread only (``sock`` is the ROUTER)."""
        now = time.monotonic()
        if now - self._last_house < 0.1:
            return
        self._last_house = now
        with self._lock:
            self._check_abandoned(now)
            if not self._waiting:
                return
            live = set(range(self.worker_num)) - self._stopped
            missing = sorted(live - self._waiting.keys())
            dead = [w for w in missing if w in self._last_seen
                    and now - self._last_seen[w] > self.heartbeat_timeout]
            waited = now - self._barrier_started
            if dead:
                why = "; ".join(f"worker {w} sent nothing for "
                                f"{now - self._last_seen[w]:.1f} s (dead?)" for w in dead)
            elif waited > self.barrier_timeout:
                why = (f"worker(s) {missing} did not reach the barrier within "
                       f"{self.barrier_timeout:g} s")
            else:
                return
            msg = f"barrier failed on server {self.server_index} ({self.endpoint}): {why}"
            log.error("%s", msg)
            self._count("barrier_failures")
            out = [[ident] + P.error_reply(hh.op, hh.request, msg, Status.BARRIER_FAILED)
                   for ident, hh, _ in self._waiting.values()]
            self._waiting = {}
            self._barrier_started = None
            self._sync_buf = {}  # that step's gradients die with it
        for m in out:
            Z.send_frames(sock, m, copy=False)

    def _check_abandoned(self, now):
        """End :meth:`run` (``failure`` set) once every worker has stopped or
        gone silent for ``heartbeat_timeout``, at least one silent: a killed
        worker never sends ``stop_worker``, and nothing is left to serve.
        Caller holds ``self._lock``."""
        if self.failure is not None:
            return
        gone = sorted(w for w in set(range(self.worker_num)) - self._stopped
                      if w in self._last_seen
                      and now - self._last_seen[w] > self.heartbeat_timeout)
        # A worker that died before its first request is never seen: it counts
        # as gone once it has not appeared within barrier_timeout of the start.
        never = sorted(w for w in set(range(self.worker_num)) - self._stopped
                       if w not in self._last_seen)
        late = self._serving_since is not None and \
            now - self._serving_since > self.barrier_timeout
        if (gone or never) and len(self._stopped) + len(gone) + len(never) == self.worker_num \
                and (self._stopped or gone) and (not never or late):
            why = []
            if gone:
                why.append(f"worker(s) {gone} sent nothing for more than "
                           f"{self.heartbeat_timeout:g} s (dead?)")
            if never:
                why.append(f"worker(s) {never} never connected within "
                           f"{self.barrier_timeout:g} s")
            self.failure = (f"server {self.server_index} ({self.endpoint}) gives up: "
                            f"{'; '.join(why)}, and every other worker has stopped")
            log.error("%s", self.failure)
            self._done.set()

    def _heartbeat(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        if "worker" in payload:
            self._last_seen[self._worker_of(payload)] = time.monotonic()
        return [[ident] + P.reply(h, payload={
            "server_index": self.server_index, "server_num": self.server_num,
            "worker_num": self.worker_num, "mode": self.mode,
            "heartbeat_timeout": self.heartbeat_timeout, "barrier_timeout": self.barrier_timeout})]

    def _stop_worker(self, h, op, frames, ident):
        w = self._worker_of(self._control_payload(frames, op))
        with self._lock:
            self._stopped.add(w)
            out = [[ident] + P.reply(h, payload={"stopped": sorted(self._stopped)})]
            out += self._complete_barrier_locked() or []
            if len(self._stopped) == self.worker_num:
                log.info("every worker stopped; server %d exits", self.server_index)
                self._done.set()
        return out

    def _checkpoint_path(self, payload, root=None):
        """The real path of ``payload["dir"]``, which must stay inside ``root``
        (default: ``checkpoint_dir``, the only root a request may use)."""
        root = self.checkpoint_dir if root is None else root
        if root is None:
            raise _Refused("this server has no checkpoint_dir; save/load are disabled")
        rel = payload.get("dir")
        if not isinstance(rel, str) or not rel:
            raise _Refused(f"dir must be a non-empty relative path, got {rel!r}")
        if os.path.isabs(rel) or "\x00" in rel:
            raise _Refused(f"dir {rel!r} must be relative to the checkpoint dir")
        path = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([path, root]) != root:
            raise _Refused(f"dir {rel!r} escapes the checkpoint dir")
        return path

    def _save(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        out = self.save_checkpoint(payload.get("dir"), payload.get("mode", "full"))
        return [[ident] + P.reply(h, payload=out)]

    def save_checkpoint(self, rel, mode="full"):
        """Save every table under ``<checkpoint_dir>/<rel>`` (``mode="delta"``:
        sparse rows changed since the last save). Returns ``{"rows": {table:
        rows}, "files": [...], "file_info": [{"file", "table", "rows", "sha256",
        "bytes"}]}`` (checksums computed from the written files, for the
        checkpoint manifest); raises ValueError when refused. Thread-safe."""
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        try:
            path = self._checkpoint_path({"dir": rel})
        except _Refused as e:
            raise ValueError(str(e)) from None
        os.makedirs(path, exist_ok=True)
        rows, files, info = {}, [], []
        with self._lock:
            entries = list(self._entries.values())
            for e in entries:
                if e.kind == "sparse":
                    f = os.path.join(path, f"{e.name}.shard{self.server_index}-of-"
                                           f"{self.server_num}.bin")
                    rows[e.key] = e.table.save(f, delta=(mode == "delta"))
                else:
                    f = os.path.join(path, f"{e.name}.{e.start}-{e.end}.bin")
                    with e.lock:
                        rows[e.key] = e.table.save(f)
                files.append(os.path.basename(f))
                info.append({"file": files[-1], "table": e.key, "rows": int(rows[e.key])})
            manifest = {"server_index": self.server_index, "server_num": self.server_num,
                        "mode": mode, "tables": [e.config for e in entries], "files": files}
        mpath = os.path.join(path, f"server{self.server_index}-of-{self.server_num}.json")
        with open(mpath + ".tmp", "w") as fh:
            json.dump(manifest, fh, indent=1)
        os.replace(mpath + ".tmp", mpath)
        for fi in info:  # outside the lock: training goes on while the files are hashed
            fi.update(_checkpoint.file_info(os.path.join(path, fi["file"])))
        return {"rows": rows, "files": files, "file_info": info}

    def _load(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        rows = self.load_checkpoint(payload.get("dir"))
        return [[ident] + P.reply(h, payload={"rows": rows})]

    def load_checkpoint(self, rel, root=None):
        """Load every table from ``<checkpoint_dir>/<rel>`` (written by any
        number of servers). ``rel`` may be a checkpoint of
        ``fleet.save_persistables`` (its manifest's chain is replayed, every
        file verified first) or a list of them (a base, then its deltas in
        order), or a plain ``Client.save`` directory. Returns ``{table: rows}``
        (rows read, summed over a chain); raises ValueError naming what is
        missing, damaged or refused. Thread-safe.

        ``root``: the directory ``rel`` is relative to, for a load this
        process asks for itself (``fleet.init_server(model_dir)``); a LOAD
        request from the network is always confined to ``checkpoint_dir``."""
        root = None if root is None else os.path.realpath(os.fspath(root))
        base = self.checkpoint_dir if root is None else root
        if isinstance(rel, (list, tuple)) or (isinstance(rel, str) and rel):
            for r in [rel] if isinstance(rel, str) else rel:
                try:
                    self._checkpoint_path({"dir": r}, root)
                except _Refused as e:
                    raise ValueError(str(e)) from None
            chain = _checkpoint.resolve(base, rel)
            if chain is not None:
                total = {}
                for _, gen, path in chain:
                    _checkpoint.verify_generation(path, gen)
                for grel, _, _ in chain:
                    for k, n in self._load_dir(grel, root).items():
                        total[k] = total.get(k, 0) + n
                return total
        return self._load_dir(rel, root)

    def _load_dir(self, rel, root=None):
        try:
            path = self._checkpoint_path({"dir": rel}, root)
            if not os.path.isdir(path):
                raise _Refused(f"checkpoint dir {rel!r} does not exist")
            names = os.listdir(path)
            saved = _saved_dense_shapes(path, names)
            rows = {}
            with self._lock:
                for e in self._entries.values():
                    if e.kind == "sparse":
                        pat = re.compile(re.escape(e.name) + r"\.shard(\d+)-of-(\d+)\.bin")
                        shard_files = sorted(n for n in names if pat.fullmatch(n))
                        if not shard_files:
                            raise _Refused(f"no shard files for table {e.name!r} in {rel!r}")
                        rows[e.key] = sum(e.table.load(os.path.join(path, n),
                                                       filter=(self.server_num,
                                                               self.server_index))
                                          for n in shard_files)
                    else:
                        shape = saved.get(e.name)
                        if shape is not None and shape != list(e.shape):
                            # Blocks are flat ranges: loaded, they would fill
                            # this shape with another parameter's values.
                            raise _Refused(f"dense {e.name!r} has shape {shape} in {rel!r}, "
                                           f"{list(e.shape)} here: a checkpoint of another "
                                           f"model")
                        rows[e.key] = self._load_dense(e, path, names, rel)
            return rows
        except _Refused as e:
            raise ValueError(str(e)) from None

    def _load_dense(self, e, path, names, rel):
        """Load dense block ``e`` from the files ``names`` of ``path``."""
        exact = f"{e.name}.{e.start}-{e.end}.bin"
        with e.lock:
            if exact in names:
                return e.table.load(os.path.join(path, exact))
            # A different placement: assemble this block from overlapping blocks
            # (optimizer state restarts, the weights are exact).
            pat = re.compile(re.escape(e.name) + r"\.(\d+)-(\d+)\.bin")
            out = np.full(e.end - e.start, np.nan, dtype=np.float32)
            for n in names:
                m = pat.fullmatch(n)
                if not m:
                    continue
                s, t = int(m.group(1)), int(m.group(2))
                lo, hi = max(s, e.start), min(t, e.end)
                if lo >= hi:
                    continue
                block = pyfleet.DenseTable(t - s, e.table.optimizer)
                block.load(os.path.join(path, n))
                out[lo - e.start:hi - e.start] = block.pull()[lo - s:hi - s]
            if np.isnan(out).any():
                raise _Refused(f"files in {rel!r} do not cover dense block {e.key!r}")
            e.table.set(out.reshape(e.table.shape))
            return int(out.shape[0])

    def _shrink(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        allowed = {"max_unseen_passes", "min_update_count", "min_score", "decay", "tables"}
        extra = set(payload) - allowed
        if extra:
            raise _Refused(f"unknown shrink argument(s) {sorted(extra)}")
        names = payload.pop("tables", None)
        dropped = {}
        with self._lock:
            for e in self._entries.values():
                if e.kind == "sparse" and (names is None or e.name in names):
                    dropped[e.name] = e.table.shrink(**payload)
        return [[ident] + P.reply(h, payload={"dropped": dropped})]

    def _stats(self, h, op, frames, ident):
        self._control_payload(frames, op)
        return [[ident] + P.reply(h, payload=self.stats())]

    def stats(self):
        """Counters of this server and of each table (JSON-friendly). Thread-safe."""
        with self._counter_lock:
            counters = dict(self._counters)
        with self._lock:
            tables = {}
            for e in self._entries.values():
                if e.kind == "sparse":
                    tables[e.key] = {k: _jsonable(v) for k, v in e.table.stats().items()}
                else:
                    tables[e.key] = {"size": e.end - e.start,
                                     "memory_bytes": int(e.table.memory_bytes())}
            return {"server_index": self.server_index, "server_num": self.server_num,
                    "endpoint": self.endpoint, "mode": self.mode, "counters": counters,
                    "tables": tables, "stopped_workers": sorted(self._stopped),
                    "barriers": self._barrier_count, "rss_bytes": _rss_bytes()}

    def _tables(self, h, op, frames, ident):
        self._control_payload(frames, op)
        return [[ident] + P.reply(h, payload=self._table_map())]

    def _table_map(self):
        with self._lock:
            return {"tables": {e.key: e.info() for e in self._entries.values()},
                    "server_index": self.server_index, "server_num": self.server_num,
                    "mode": self.mode}

    def _create_tables_op(self, h, op, frames, ident):
        payload = self._control_payload(frames, op)
        configs = payload.get("tables")
        if not isinstance(configs, list):
            raise _Refused("CREATE_TABLES needs {'tables': [config, ...]}")
        self.create_tables(configs)
        return [[ident] + P.reply(h, payload=self._table_map())]

    def create_tables(self, configs):
        """Create tables from JSON configs (idempotent: an identical config again
        is a no-op; a different config under an existing name is a ValueError).

        Sparse: ``{"kind": "sparse", "name", **SparseTable.config()}``, holding
        this server's shard. Dense: ``{"kind": "dense", "name", "shape",
        "optimizer", "initial"?, "seed"?, "start"?, "end"?}``: this server holds
        elements ``[start, end)`` of the flattened parameter (default: all);
        ``initial`` is a flat list of the whole parameter or an initializer
        config. Thread-safe. Returns the name -> id map."""
        built = []
        for cfg in configs:
            if not isinstance(cfg, dict):
                raise ValueError(f"a table config must be a JSON object, got {cfg!r}")
            kind, name = cfg.get("kind"), cfg.get("name")
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                raise ValueError(f"table name {name!r} must match {_NAME_RE.pattern}")
            if kind == "sparse":
                key = name
            elif kind == "dense":
                size = int(np.prod(_shape(cfg.get("shape"), name)))
                start, end = int(cfg.get("start", 0)), int(cfg.get("end", size))
                if not 0 <= start < end <= size:
                    raise ValueError(f"dense {name!r}: block [{start}, {end}) not inside "
                                     f"[0, {size})")
                if 4 * (end - start) > self.max_message_bytes:
                    raise ValueError(f"dense {name!r}: a block of {end - start} floats does "
                                     f"not fit in max_message_bytes={self.max_message_bytes}; "
                                     f"slice it over more blocks")
                key = _dense_key(name, start, end)
            else:
                raise ValueError(f"table kind must be 'sparse' or 'dense', got {kind!r}")
            built.append((key, cfg))
        with self._lock:
            for key, cfg in built:
                old = self._by_key.get(key)
                if old is not None:
                    if old.canonical != _canonical(cfg):
                        raise ValueError(f"table {key!r} already exists with a different "
                                         f"config: {old.config} vs {cfg}")
                    continue
                if cfg["kind"] == "sparse" and any(
                        e.kind == "sparse" and e.name == cfg["name"] for e in self._by_key.values()):
                    raise ValueError(f"table {cfg['name']!r} already exists")
                e = self._build(key, cfg)
                e.id = len(self._entries) + 1
                self._entries[e.id] = e
                self._by_key[key] = e
            return {k: e.id for k, e in self._by_key.items()}

    def _build(self, key, cfg):
        e = _Entry()
        e.key, e.kind, e.name, e.config = key, cfg["kind"], cfg["name"], cfg
        e.canonical = _canonical(cfg)
        e.lock = threading.Lock()
        if e.kind == "sparse":
            c = {k: v for k, v in cfg.items() if k != "kind"}
            e.table = pyfleet.SparseTable.from_config(c)
            e.dim = e.table.dim
            e.start = e.end = e.shape = None
        else:
            e.shape = _shape(cfg["shape"], e.name)
            size = int(np.prod(e.shape))
            e.start, e.end = int(cfg.get("start", 0)), int(cfg.get("end", size))
            opt = _opt.from_config(cfg["optimizer"])
            initial = cfg.get("initial")
            if isinstance(initial, dict):
                initial = _init.from_config(initial).generate(
                    e.shape, seed=int(cfg.get("seed", 0))).reshape(-1)
            elif initial is not None:
                initial = np.asarray(initial, dtype=np.float32).reshape(-1)
                if initial.shape[0] != size:
                    raise ValueError(f"dense {e.name!r}: initial has {initial.shape[0]} "
                                     f"values, shape {e.shape} needs {size}")
            if initial is not None:
                initial = initial[e.start:e.end]
            e.table = pyfleet.DenseTable(e.end - e.start, opt, initial=initial, name=key)
            e.dim = 1
        return e

    _ops: ClassVar[dict] = {Op.PULL_SPARSE: _pull_sparse, Op.PUSH_SPARSE: _push_sparse,
            Op.PULL_DENSE: _pull_dense, Op.PUSH_DENSE: _push_dense,
            Op.PULL_DENSE_MANY: _pull_dense_many, Op.PUSH_DENSE_MANY: _push_dense_many,
            Op.EXPORT_SPARSE: _export_sparse, Op.PUSH_SHOW_CLICK: _push_show_click,
            Op.BARRIER: _barrier, Op.HEARTBEAT: _heartbeat, Op.STOP_WORKER: _stop_worker,
            Op.SAVE: _save, Op.LOAD: _load, Op.SHRINK: _shrink, Op.STATS: _stats,
            Op.CREATE_TABLES: _create_tables_op, Op.TABLES: _tables}


def _shape(shape, name):
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = [shape]
    if (not isinstance(shape, (list, tuple)) or not shape
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                       for s in shape)):
        raise ValueError(f"dense {name!r}: shape must be a list of positive ints, got {shape!r}")
    return tuple(shape)


def _z85(key):
    key = key.encode() if isinstance(key, str) else bytes(key)
    if len(key) != 40:
        raise ValueError("a CURVE key must be 40 Z85 characters (zmq.curve_keypair())")
    return key


def _op_name(op):
    try:
        return Op(op).name
    except ValueError:
        return f"op {op}"


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def _log_bad(n, err):
    # Hostile peers must not flood the log: the first few, then every power of ten.
    if n <= 10 or (n & (n - 1)) == 0:
        log.warning("refused request (#%d): %s", n, err)


def _rss_bytes():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pyfleet.server", description=__doc__.split("\n")[0])
    p.add_argument("--endpoint", default="127.0.0.1:0",
                   help="host:port to bind (port 0: any free port; default 127.0.0.1:0)")
    p.add_argument("--index", type=int, required=True, help="this server's index")
    p.add_argument("--num-servers", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--mode", choices=MODES, default="async")
    p.add_argument("--handler-threads", type=int, default=2)
    p.add_argument("--inline-limit", type=int, default=INLINE_LIMIT,
                   help="requests of at most this many floats are served by the socket thread")
    p.add_argument("--split-pull-keys", type=int, default=SPLIT_PULL_KEYS,
                   help="pull sparse requests of at least this many keys in up to "
                        "--handler-threads parts at once (0: never)")
    p.add_argument("--max-message-bytes", type=int, default=1 << 30)
    p.add_argument("--heartbeat-timeout", type=float, default=10.0)
    p.add_argument("--barrier-timeout", type=float, default=300.0)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--tables", default=None, help="JSON file: a list of table configs")
    p.add_argument("--curve-secret-key-file", default=None,
                   help="file holding a Z85 CURVE secret key, or a certificate from "
                        "'pyfleet keygen' (NAME.key_secret): encrypt the endpoint "
                        "(default: $PYFLEET_CURVE_SERVER_SECRET)")
    p.add_argument("--curve-client-keys", default=None,
                   help="directory of admitted client public keys (*.key): authenticate "
                        "clients (default: $PYFLEET_CURVE_CLIENT_KEYS_DIR)")
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    env_auth = _auth.server_options_from_env()
    curve = env_auth.get("curve_secret_key")
    clients = a.curve_client_keys or env_auth.get("curve_client_keys")
    if a.curve_secret_key_file:
        with open(a.curve_secret_key_file) as f:
            text = f.read().strip()
        curve = text if len(text) == 40 else _auth.load_keypair(a.curve_secret_key_file)[1]
    tables = None
    if a.tables:
        with open(a.tables) as f:
            tables = json.load(f)
    if a.checkpoint_dir is not None and not os.path.isdir(a.checkpoint_dir):
        print(f"pyfleet.server: --checkpoint-dir {a.checkpoint_dir} is not a directory",
              file=sys.stderr)
        return 2
    try:
        server = Server(a.endpoint, a.index, a.num_servers, a.workers, mode=a.mode,
                        tables=tables, handler_threads=a.handler_threads,
                        max_message_bytes=a.max_message_bytes,
                        heartbeat_timeout=a.heartbeat_timeout,
                        barrier_timeout=a.barrier_timeout, checkpoint_dir=a.checkpoint_dir,
                        inline_limit=a.inline_limit, curve_secret_key=curve,
                        curve_client_keys=clients, split_pull_keys=a.split_pull_keys)
    except (PyfleetError, ValueError) as e:  # a taken port, a bad table config
        print(f"pyfleet.server: {e}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    print(f"pyfleet.server ready on {server.endpoint}", flush=True)
    server.run()
    if server.failure is not None:
        print(f"pyfleet.server: {server.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

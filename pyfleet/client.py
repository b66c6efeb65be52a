"""The worker side of the parameter-server service: :class:`Client` (and :class:`GeoClient`).

A :class:`Client` talks to S servers (:mod:`pyfleet.server`) over ZeroMQ
DEALER sockets, with the frames of :mod:`pyfleet.protocol`.

Sparse keys are deduplicated and routed with ``pyfleet.route(key, S)`` in one
O(n) hash pass (``pyfleet._core.unique_route``), each server's share sent as
contiguous requests in parallel (views of one buffer, no copy), and the answers
gathered into the caller's order by one C++ pass over the reply buffers; a
push sums the gradients of equal keys first (``_core.sum_rows``). Dense
parameters are split by a block placement ``(name, start, end, server_index)``
over the flattened parameter, learned from the servers (``create_tables``
places them).

Threads and sockets: sockets are never shared between threads. Each thread
that makes requests gets its own DEALER sockets (a "channel"), so a trainer's
synchronous pull goes straight from the calling thread to the wire. Pushes go
through one background pusher thread with a bounded queue: pushes queued to
the same table while the previous one is on the wire are merged (gradients of
equal keys summed) into one request. A heartbeat thread pings every server
every third of its heartbeat timeout.

Blocking: every request has a deadline (``timeout`` seconds; barriers wait for
the server's barrier timeout plus ``timeout``). A server that does not answer
in time raises :class:`pyfleet.errors.PeerTimeout` naming its endpoint and the
operation; an error reply raises :class:`pyfleet.errors.RemoteError` (a failed
barrier :class:`pyfleet.errors.BarrierError`) with the server's message.
A client started before its servers waits for them up to ``connect_deadline``.

Thread safety: every public method may be called from any thread. A future
returned by ``pull_sparse_async`` may be resolved from any thread.
"""

import itertools
import logging
import threading
import time
from concurrent.futures import Future

import numpy as np
import zmq

from pyfleet import _core
from pyfleet import _service_zmq as Z
from pyfleet import protocol as P
from pyfleet.errors import BarrierError, PeerTimeout, PyfleetError, RemoteError
from pyfleet.protocol import Op, Status

__all__ = ["Client", "GeoClient", "PullFuture", "unique_keys"]

log = logging.getLogger("pyfleet.client")

_RIDS = itertools.count(1)
_NO_CREATE = int(P.Flag.NO_CREATE)
_SLICE_MS = 50  # longest uninterrupted wait on a channel's sockets


class _Call:
    """One request to one server, waiting for its reply."""

    __slots__ = ("deadline", "done", "error", "op", "reply", "server", "timeout")

    def __init__(self, server, op, timeout):
        self.server, self.op, self.timeout = server, op, timeout
        self.deadline = time.monotonic() + timeout
        self.reply = self.error = None
        self.done = False


class _Channel:
    """One thread's DEALER sockets to every server, and its calls in flight.

    Guarded by its own lock, so a call may be waited for from another thread."""

    def __init__(self, client):
        self.client = client
        self.lock = threading.RLock()
        self.socks = [self._socket(i) for i in range(len(client.endpoints))]
        self.pending = {}  # request id -> _Call

    def _socket(self, i):
        s = self.client._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        # Queue only on live connections: a request to a dead server fails to
        # send (and is retried until its deadline) instead of waiting forever
        # in a queue and reaching a restarted server late.
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.RECONNECT_IVL, 20)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        # A blocking receive (wait's one-call path) gives up after this slice
        # to check its deadline; after a poll a receive never waits.
        s.setsockopt(zmq.RCVTIMEO, _SLICE_MS)
        keys = self.client._curve
        if keys is not None:
            s.curve_serverkey = keys[0][i]
            s.curve_publickey, s.curve_secretkey = keys[1]
        s.connect("tcp://" + self.client.endpoints[i])
        return s

    def send(self, server, frames, op, timeout, rid):
        call = _Call(server, op, timeout)
        deadline = call.deadline
        backoff = 0.001
        with self.lock:
            while True:
                try:
                    Z.send_frames(self.socks[server], frames, None, Z.NOBLOCK)
                    break
                except zmq.Again:
                    pass
                if time.monotonic() + backoff > deadline:
                    raise self.client._timeout(server, op, timeout, "could not connect")
                self.lock.release()  # let other users of this channel go on meanwhile
                try:
                    time.sleep(backoff)
                finally:
                    self.lock.acquire()
                backoff = min(backoff * 2, 0.1)
            self.pending[rid] = call
        return call

    def wait(self, calls):
        """Block until every call is answered or expired; raise the first failure
        as soon as one call fails (the others are abandoned: a barrier on a live
        server must not outwait a dead one). A long call (a barrier, a save) to
        a server that stopped answering heartbeats fails once it has been
        silent for the client's ``timeout``, not at the call's own deadline."""
        if len(calls) == 1:
            call = calls[0]
            self._wait_alone(call)
            if call.done and call.error is None:
                return [call.reply]
        while True:
            with self.lock:
                now = time.monotonic()
                for c in calls:
                    if not c.done and c.timeout > self.client.timeout and \
                            c.op != Op.HEARTBEAT:
                        err = self.client._silent_error(c.server, now)
                        if err is not None:
                            self._drop(c)
                            c.done, c.error = True, err
                failed = next((c for c in calls if c.done and c.error is not None), None)
                if failed is not None:
                    for c in calls:
                        self._drop(c)
                    raise failed.error
                waiting = [c for c in calls if not c.done]
                if not waiting:
                    return [c.reply for c in calls]
                late = [c for c in waiting if c.deadline <= now]
                for c in late:
                    if not c.done:
                        self._expire(c.server)
                if late:
                    continue
                left = min(c.deadline for c in waiting) - now
                # Short slices let other threads use this channel too.
                self._pump(min(_SLICE_MS, max(1, int(1000 * left))))

    def _wait_alone(self, call):
        """Wait for ``call`` with blocking receives on its socket, if it is the
        only call in flight on this channel and an ordinary one (no heartbeat
        watch): no poll, no bookkeeping per slice. A 1-key pull's latency is
        mostly Python and ZeroMQ calls on both sides, and a poll is the
        dearest of them. Leaves ``call`` done, or expired, or, if other calls
        came meanwhile, to :meth:`wait`'s general loop."""
        if call.timeout > self.client.timeout:
            return
        with self.lock:
            sock = self.socks[call.server]
            while not call.done and len(self.pending) == 1:
                try:
                    msg = Z.recv_frames(sock)
                except zmq.Again:  # a slice passed without the answer
                    if time.monotonic() >= call.deadline:
                        self._expire(call.server)
                    continue
                self._dispatch(msg)

    def _drop(self, call):
        """Forget ``call`` (its late answer, if any, is then ignored)."""
        if not call.done:
            for rid, c in list(self.pending.items()):
                if c is call:
                    del self.pending[rid]

    def _pump(self, wait_ms):
        servers = {c.server for c in self.pending.values()}
        if not servers:
            return
        for sock in Z.readable([self.socks[s] for s in servers], wait_ms):
            self._dispatch(Z.recv_frames(sock))

    def _dispatch(self, msg):
        try:
            h = P.unpack_header(msg[0].buffer)
        except P.ProtocolError as e:
            log.warning("dropping a malformed reply: %s", e)
            return
        call = self.pending.pop(h.request, None)
        if call is None:
            return  # the answer to a request that already timed out
        call.done = True
        if h.status == Status.OK:
            call.reply = (h, msg[1:])
            return
        try:
            text = P.parse_json(msg[1])["error"] if len(msg) > 1 else "(no message)"
        except (P.ProtocolError, KeyError):
            text = "(unreadable error reply)"
        ep = self.client.endpoints[call.server]
        cls = BarrierError if h.status == Status.BARRIER_FAILED else RemoteError
        call.error = cls(f"server {call.server} ({ep}) refused {call.op.name}: {text}")

    def _expire(self, server):
        """Fail every expired call to ``server``, and every call sharing its socket,
        then replace that socket so late answers cannot be mistaken for new ones."""
        for rid, c in list(self.pending.items()):
            if c.server == server:
                del self.pending[rid]
                c.done = True
                c.error = self.client._timeout(server, c.op, c.timeout, "no answer")
        self.socks[server].close(linger=0)
        self.socks[server] = self._socket(server)

    def close(self):
        with self.lock:
            for s in self.socks:
                s.close(linger=0)
            self.pending.clear()


class ReplyFuture:
    """A value assembled from the replies to some calls of a channel when
    :meth:`result` is called (the replies travel meanwhile). Resolve it once,
    from any thread; ``result()`` raises the first call's error."""

    def __init__(self, channel, calls, assemble):
        self._channel, self._calls, self._assemble = channel, calls, assemble
        self._value = None

    def done(self):
        return self._value is not None or all(c.done for c in self._calls)

    def result(self):
        if self._value is None:
            self._value = self._assemble(self._channel.wait(self._calls))
            self._calls = self._assemble = None
        return self._value


class PullFuture(ReplyFuture):
    """The rows of one ``pull_sparse_async`` call."""

    def __init__(self, channel, calls, parts, inverse, dim):
        super().__init__(channel, calls,
                         lambda replies: _pull_rows(replies, parts, inverse, dim))


def _pull_rows(replies, parts, inverse, dim):
    """The rows answering a pull, in the caller's order, from the replies to
    its ``parts``."""
    # Views of the reply buffers, in the order of the keys sent (no copy).
    pieces = [P.values_from(frames[0], _expect(h.count, b - a), dim)
              for (h, frames), (_, a, b) in zip(replies, parts)]
    if inverse is not None:
        return _core.gather_rows(pieces, inverse, dim)
    if len(pieces) == 1:
        return pieces[0]  # the keys were distinct and went in one request
    return np.concatenate(pieces)


class _Pusher:
    """The background thread sending pushes, merging those queued to one table."""

    def __init__(self, client, max_queue):
        self.client = client
        self.max_queue = max_queue
        self.cond = threading.Condition()
        self.queue = []        # (table, flags, keys, grads, future, unique)
        self.busy = False
        self.closed = False
        self.unobserved = []   # errors of pushes since the last flush()
        self.thread = threading.Thread(target=self._loop, name="pyfleet-pusher", daemon=True)
        self.thread.start()

    def submit(self, table, flags, keys, grads, unique=False):
        fut = Future()
        with self.cond:
            if self.closed:
                raise PyfleetError("the client is closed")
            while len(self.queue) >= self.max_queue:
                self.cond.wait()
            self.queue.append((table, flags, keys, grads, fut, unique))
            self.cond.notify_all()
        return fut

    def flush(self):
        with self.cond:
            while self.queue or self.busy:
                self.cond.wait()
            errors, self.unobserved = self.unobserved, []
        if errors:
            raise errors[0]

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(self.client.timeout + 1.0)

    def _loop(self):
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue:
                    return
                batch, self.queue = self.queue, []
                self.busy = True
                self.cond.notify_all()
            groups = {}
            for item in batch:
                groups.setdefault((item[0], item[1]), []).append(item)
            for (table, flags), items in groups.items():
                if len(items) == 1:
                    keys, grads, unique = items[0][2], items[0][3], items[0][5]
                else:  # merged pushes may share keys
                    keys = np.concatenate([it[2] for it in items])
                    grads = np.concatenate([it[3] for it in items])
                    unique = False
                try:
                    self.client._push_now(table, keys, grads, flags, unique)
                    err = None
                except Exception as e:  # handed to the futures and to flush()
                    err = e
                for it in items:
                    if err is None:
                        it[4].set_result(None)
                    else:
                        it[4].set_exception(err)
                if err is not None:
                    with self.cond:
                        self.unobserved.append(err)
            with self.cond:
                self.busy = False
                self.cond.notify_all()


class Client:
    """A worker's connection to every server.

    Args:
        endpoints: ``["host:port", ...]``, server ``i`` at index ``i``.
        worker_index: this worker's index (barriers, heartbeats, sync pushes).
        timeout: seconds any one request may take.
        connect_deadline: seconds to wait for servers that are not up yet.
        heartbeat_interval: seconds between heartbeats; default a third of the
            servers' heartbeat timeout; 0 disables the heartbeat thread.
        max_queued_pushes: pushes that may wait for the pusher thread before
            ``push_sparse_async`` blocks.
        max_request_keys: larger shares of a push are cut into several
            requests to the same server, so its handler threads apply them in
            parallel while later ones travel.
        max_pull_keys: the same for pulls. Larger by default: a server pulls
            a big request over its handler threads itself, and the rows of a
            share sent in one request come back without a copy (measured:
            128k keys to one server 15% faster in one request than in four).
        curve_server_keys: the servers' Z85 CURVE public keys (one, or one per
            endpoint) when they run with ``curve_secret_key``.
        curve_client_key: this client's ``(public, secret)`` Z85 key pair, or
            the path of its secret certificate (``pyfleet keygen``); needed by
            servers that authenticate clients (``curve_client_keys``). Default:
            a throwaway pair (enough for encryption only).

    The constructor returns once every server answered (or raises PeerTimeout).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, endpoints, worker_index=0, timeout=30.0, connect_deadline=60.0,
                 heartbeat_interval=None, max_queued_pushes=16, max_request_keys=32768,
                 curve_server_keys=None, curve_client_key=None, context=None,
                 max_pull_keys=1 << 20):
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e]
        self.endpoints = [e.removeprefix("tcp://") for e in endpoints]
        if not self.endpoints:
            raise ValueError("endpoints must name at least one server")
        self.worker_index = int(worker_index)
        self.timeout = float(timeout)
        self.connect_deadline = float(connect_deadline)
        self.num_servers = len(self.endpoints)
        self.max_request_keys = int(max_request_keys)
        if self.max_request_keys < 1:
            raise ValueError(f"max_request_keys must be >= 1, got {max_request_keys!r}")
        self.max_pull_keys = int(max_pull_keys)
        if self.max_pull_keys < 1:
            raise ValueError(f"max_pull_keys must be >= 1, got {max_pull_keys!r}")
        self._curve = None
        if curve_server_keys is not None:
            if isinstance(curve_server_keys, (str, bytes)):
                curve_server_keys = [curve_server_keys] * self.num_servers
            if len(curve_server_keys) != self.num_servers:
                raise ValueError(f"curve_server_keys needs one key per endpoint "
                                 f"({self.num_servers}), got {len(curve_server_keys)}")
            if curve_client_key is None:
                # Throwaway pair: enough unless the servers check a client list.
                curve_client_key = zmq.curve_keypair()
            elif not isinstance(curve_client_key, (tuple, list)):
                from pyfleet.auth import load_keypair
                curve_client_key = load_keypair(curve_client_key)
            pair = tuple(k.encode() if isinstance(k, str) else bytes(k)
                         for k in curve_client_key)
            if len(pair) != 2 or any(len(k) != 40 for k in pair):
                raise ValueError("curve_client_key must be a (public, secret) pair of "
                                 "40-character Z85 keys or a secret certificate path")
            self._curve = ([k.encode() if isinstance(k, str) else bytes(k)
                            for k in curve_server_keys], pair)
        elif curve_client_key is not None:
            raise ValueError("curve_client_key needs curve_server_keys")
        self._ctx = context or zmq.Context.instance()
        self._local = threading.local()
        self._channels = []
        self._channels_lock = threading.Lock()
        self._tables_lock = threading.Lock()
        self._ids = [{} for _ in self.endpoints]  # per server: key -> id
        self._sparse = {}   # name -> dim
        self._sparse_cfg = {}  # name -> config
        self._dense = {}    # name -> (shape, [(start, end, server, id)])
        self._closed = False
        try:
            hello = self._control_all(Op.HEARTBEAT, {"worker": self.worker_index},
                                      timeout=self.connect_deadline)
            for i, info in enumerate(hello):
                if info.get("server_index") != i or info.get("server_num") != self.num_servers:
                    raise PyfleetError(
                        f"server at {self.endpoints[i]} says it is server "
                        f"{info.get('server_index')} of {info.get('server_num')}, expected "
                        f"{i} of {self.num_servers}: check the endpoint order")
        except BaseException:
            self._close_channels()
            raise
        self.server_info = hello
        self.mode = hello[0].get("mode")
        self.barrier_timeout = max(float(h.get("barrier_timeout", 300.0)) for h in hello)
        hb = min(float(h.get("heartbeat_timeout", 10.0)) for h in hello)
        self.heartbeat_interval = hb / 3.0 if heartbeat_interval is None else float(
            heartbeat_interval)
        self._pusher = _Pusher(self, max(1, int(max_queued_pushes)))
        self._hb_stop = threading.Event()
        self._hb_thread = None
        self._answered = [time.monotonic()] * self.num_servers  # last heartbeat answer
        if self.heartbeat_interval > 0:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop,
                                               name="pyfleet-heartbeat", daemon=True)
            self._hb_thread.start()

    # ------------------------------------------------------------- plumbing

    def _channel(self):
        ch = getattr(self._local, "channel", None)
        if ch is None:
            if self._closed:
                raise PyfleetError("the client is closed")
            ch = self._local.channel = _Channel(self)
            with self._channels_lock:
                self._channels.append(ch)
        return ch

    def _timeout(self, server, op, timeout, why):
        return PeerTimeout(f"server {server} ({self.endpoints[server]}) did not answer "
                           f"{op.name} within {timeout:g} s ({why}); is it running?")

    def _send(self, ch, server, op, timeout=None, **kw):
        rid = next(_RIDS)
        frames = P.request(op, rid, worker=self.worker_index, **kw)
        return ch.send(server, frames, op, self.timeout if timeout is None else timeout, rid)

    def _send_dense_many(self, ch, server, op, blocks, grads=None, flags=0):
        """One *_DENSE_MANY request for ``blocks`` ``[(name, start, end, id)]``
        of one server (``grads``: the flat gradient of each name, for a push)."""
        rid = next(_RIDS)
        ids = [b[3] for b in blocks]
        if grads is None:
            frames = P.dense_many_request(op, rid, ids, count=sum(e - a for _, a, e, _ in blocks),
                                          worker=self.worker_index)
        else:
            frames = P.dense_many_request(op, rid, ids, [grads[n][a:e] for n, a, e, _ in blocks],
                                          flags=flags, worker=self.worker_index)
        return ch.send(server, frames, op, self.timeout, rid)

    def _control_all(self, op, payload, timeout=None, servers=None):
        ch = self._channel()
        servers = range(self.num_servers) if servers is None else servers
        calls = [self._send(ch, s, op, timeout, payload=payload) for s in servers]
        return [P.parse_json(frames[0]) if frames else {}
                for _, frames in ch.wait(calls)]

    def _refresh_tables(self):
        maps = self._control_all(Op.TABLES, {})
        self._learn(maps)

    def _learn(self, maps):
        with self._tables_lock:
            dense = {}
            for s, m in enumerate(maps):
                for key, info in m["tables"].items():
                    self._ids[s][key] = info["id"]
                    if info["kind"] == "sparse":
                        self._sparse[info["name"]] = info["dim"]
                        self._sparse_cfg[info["name"]] = info["config"]
                    else:
                        shape, blocks = dense.setdefault(info["name"], (tuple(info["shape"]), []))
                        blocks.append((info["start"], info["end"], s, info["id"]))
            for name, (shape, blocks) in dense.items():
                blocks.sort()
                pos = 0
                for start, end, _, _ in blocks:
                    if start != pos:
                        break
                    pos = end
                if pos == int(np.prod(shape)):
                    self._dense[name] = (shape, blocks)

    def _sparse_dim(self, table):
        if table not in self._sparse:
            self._refresh_tables()
            if table not in self._sparse:
                raise ValueError(f"no sparse table {table!r} on the servers "
                                 f"(known: {sorted(self._sparse)})")
        return self._sparse[table]

    def sparse_dim(self, name):
        """The row width of sparse table ``name``; ValueError if no server has it."""
        return self._sparse_dim(name)

    def dense_shape(self, name):
        """The shape of dense parameter ``name``; ValueError unless fully placed."""
        return self._dense_blocks(name)[0]

    def _sparse_configs(self):
        """``{name: config}`` of every sparse table the servers hold."""
        self._refresh_tables()
        return dict(self._sparse_cfg)

    def _dense_blocks(self, name):
        if name not in self._dense:
            self._refresh_tables()
            if name not in self._dense:
                raise ValueError(f"no dense parameter {name!r} fully placed on the servers "
                                 f"(known: {sorted(self._dense)})")
        return self._dense[name]

    def _plan(self, keys, unique, step):
        """``(grouped, inverse, parts)`` for a batch of keys: ``grouped`` the
        distinct keys grouped by owning server, ``inverse`` the position in
        ``grouped`` of each key (None when ``grouped`` is ``keys`` itself), and
        ``parts`` the ``(server, start, end)`` ranges of ``grouped`` to send,
        at most ``step`` keys each, in ``grouped`` order.
        ``unique``: the caller says the keys are distinct; with one server
        they are then sent as they are (no hash pass). A wrong claim is the
        caller's bug: pulls still answer every key, but a push may then
        update a repeated key once per request instead of once in all."""
        n = keys.shape[0]
        if self.num_servers == 1 and (unique or n == 1):  # no kernel call
            return keys, None, [(0, a, min(a + step, n)) for a in range(0, n, step)]
        grouped, inverse, offsets = _core.unique_route(keys, self.num_servers)
        offsets = offsets.tolist()
        parts = [(s, a, min(a + step, offsets[s + 1]))
                 for s in range(self.num_servers)
                 for a in range(offsets[s], offsets[s + 1], step)]
        if grouped.shape[0] == n and (not parts or parts[0][0] == parts[-1][0]):
            # Distinct keys all owned by one server: grouped == keys (a group
            # keeps first-occurrence order), so no gather is needed.
            return keys, None, parts
        return grouped, inverse, parts

    # ---------------------------------------------------------- sparse data

    def pull_sparse_async(self, table, keys, unique=False, create=True):
        """Send the pull now; the rows (float32 ``[len(keys), dim]``, in the
        order of ``keys``) come from ``.result()``. Lets a trainer prefetch.
        ``keys`` must not be modified until the result is taken.
        ``unique=True``: the caller already deduplicated ``keys``, so the
        client may skip its own dedup (see :meth:`_plan`). ``create=False``:
        keys without a row get their initial row and the servers make none
        (evaluation: test-only ids do not grow the tables)."""
        ch, calls, parts, inverse, dim = self._send_pull(table, keys, unique, create)
        if not calls:  # no keys at all
            return _Done(np.empty((0, dim), dtype=np.float32))
        return PullFuture(ch, calls, parts, inverse, dim)

    def pull_sparse(self, table, keys, unique=False, create=True):
        """Rows of ``keys`` (uint64 1-D) as float32 ``[len(keys), dim]``. Blocks.
        ``unique`` and ``create``: as :meth:`pull_sparse_async`."""
        ch, calls, parts, inverse, dim = self._send_pull(table, keys, unique, create)
        if not calls:
            return np.empty((0, dim), dtype=np.float32)
        # No future to build: its bookkeeping is a tenth of a 1-key pull here.
        return _pull_rows(ch.wait(calls), parts, inverse, dim)

    def _send_pull(self, table, keys, unique, create=True):
        """``(channel, calls, parts, inverse, dim)`` of a pull sent now."""
        keys = _check_keys(keys)
        dim = self._sparse_dim(table)
        grouped, inverse, parts = self._plan(keys, unique, self.max_pull_keys)
        ch = self._channel()
        flags = 0 if create else _NO_CREATE
        calls = [self._send(ch, s, Op.PULL_SPARSE, table=self._ids[s][table],
                            keys=grouped[a:b], dim=dim, flags=flags) for s, a, b in parts]
        return ch, calls, parts, inverse, dim

    def push_sparse_async(self, table, keys, grads, delta=False, unique=False, copy=True):
        """Queue a push (gradients, or with ``delta=True`` geo deltas); returns a
        ``concurrent.futures.Future`` set when every server applied it. Blocks
        only while the push queue is full.

        Ownership: with ``copy=True`` the arrays are copied when queued, so the
        caller may reuse them at once. ``copy=False`` hands them over: the
        caller must not modify them until the future is done (they may be
        sent as they are). ``unique=True``: ``keys`` are distinct (no dedup
        needed; see :meth:`_plan`)."""
        keys = _check_keys(keys)
        dim = self._sparse_dim(table)
        grads = _check_values(grads, (keys.shape[0], dim), "grads")
        if copy:
            keys, grads = keys.copy(), grads.copy()
        return self._pusher.submit(table, P.Flag.ADD_DELTA if delta else 0, keys, grads,
                                   unique)

    def push_sparse(self, table, keys, grads, delta=False, unique=False):
        """Push and wait until every server applied it (or raise)."""
        keys = _check_keys(keys)
        dim = self._sparse_dim(table)
        grads = _check_values(grads, (keys.shape[0], dim), "grads")
        self._pusher.submit(table, P.Flag.ADD_DELTA if delta else 0, keys, grads,
                            unique).result()

    def push_show_click(self, table, keys, shows, clicks):
        """Add show and click counts (float32 ``[n]`` each) to the rows of ``keys``
        (equal keys summed first); the servers' ``shrink(min_score=...)`` reads
        them. Waits until every server applied them."""
        keys = _check_keys(keys)
        self._sparse_dim(table)
        n = keys.shape[0]
        values = np.stack([_check_values(shows, (n,), "shows"),
                           _check_values(clicks, (n,), "clicks")], axis=1)
        self._send_rows(Op.PUSH_SHOW_CLICK, table, keys, values, 0)

    def _push_now(self, table, keys, grads, flags, unique=False):
        self._send_rows(Op.PUSH_SPARSE, table, keys, grads, flags, unique)

    def _send_rows(self, op, table, keys, values, flags, unique=False):
        """Send rows of ``values`` (those of equal keys summed) to their
        servers, and wait until every server applied them."""
        grouped, inverse, parts = self._plan(keys, unique, self.max_request_keys)
        if inverse is not None:
            values = _core.sum_rows(values, inverse, grouped.shape[0])
        dim = values.shape[1]
        ch = self._channel()
        calls = [self._send(ch, s, op, table=self._ids[s][table], keys=grouped[a:b],
                            values=values[a:b], dim=dim, flags=flags) for s, a, b in parts]
        ch.wait(calls)

    def flush(self):
        """Wait until every queued push is applied; raise the first push error
        since the previous flush (each error is also set on its future)."""
        self._pusher.flush()

    def export_sparse(self, table, page_rows=65536):
        """Every row of sparse table ``table`` on every server, weights only:
        yields ``(keys uint64[n], weights float32[n, dim])`` pages of at most
        ``page_rows`` rows (server by server, keys ascending within a server),
        so a huge table streams in bounded messages. Pending pushes are flushed
        first; rows created or changed during the export may or may not appear.
        Blocks per page."""
        if isinstance(page_rows, bool) or not isinstance(page_rows, int) or page_rows < 1:
            raise ValueError(f"page_rows must be a positive integer, got {page_rows!r}")
        dim = self._sparse_dim(table)
        self.flush()
        ch = self._channel()
        for s in range(self.num_servers):
            after = None
            while True:
                call = self._send(ch, s, Op.EXPORT_SPARSE, table=self._ids[s][table],
                                  dim=dim, payload={"after": after, "limit": page_rows})
                ((h, frames),) = ch.wait([call])
                if len(frames) != 3 or h.dim != dim:
                    raise RemoteError(f"server {s} ({self.endpoints[s]}) sent a malformed "
                                      f"EXPORT_SPARSE reply")
                yield (P.keys_from(frames[0], h.count).copy(),
                       P.values_from(frames[1], h.count, dim).copy())
                after = P.parse_json(frames[2]).get("next")
                if after is None:
                    break

    # ----------------------------------------------------------- dense data

    def pull_dense(self, name):
        """The whole dense parameter ``name`` (float32, its shape), gathered from
        its blocks (one request per server holding some)."""
        return self.pull_dense_many([name])[name]

    def push_dense(self, name, grad, delta=False):
        """Send each block of ``grad`` (float32, the parameter's shape) to its
        server and wait until applied (``delta=True``: geo deltas, added)."""
        self.push_dense_many({name: grad}, delta=delta)

    def pull_dense_many(self, names):
        """``{name: value}`` of several dense parameters: one PULL_DENSE_MANY
        request per server carries every block it holds, all in flight at once,
        so the step pays one round trip. Blocks.

        A parameter held whole by one server is returned as a view of the reply
        message (no copy): the caller owns it (nothing else refers to that
        buffer) and may modify it; it keeps the reply's memory alive."""
        shapes, plan = self._dense_plan(names)
        ch = self._channel()
        calls = [self._send_dense_many(ch, s, Op.PULL_DENSE_MANY, blocks)
                 for s, blocks in plan.items()]
        return self._dense_gather(shapes, plan, ch.wait(calls))

    def push_dense_many(self, grads, delta=False):
        """Push every ``{name: grad}`` (as :meth:`push_dense`): one
        PUSH_DENSE_MANY request per server with every block it holds, all in
        flight at once; returns when every block is applied (or raises). The
        gradients are sent without a copy: do not modify them until it returns."""
        self._push_dense(grads, P.Flag.ADD_DELTA if delta else 0)

    def push_pull_dense_many(self, grads):
        """Push every ``{name: grad}`` and return ``{name: value}``, each
        parameter's value right after this push was applied (other workers'
        pushes may interleave): push and pull in one round trip per server
        (Flag.PULL_AFTER). Not in sync mode (values change at the barrier).
        Values are views of the replies as in :meth:`pull_dense_many`."""
        return self.push_pull_dense_many_async(grads).result()

    def push_pull_dense_many_async(self, grads):
        """:meth:`push_pull_dense_many` sent now; ``.result()`` waits for the
        values (and raises the push's error). The requests leave from this
        thread's sockets with no thread hand-off, and the replies wait in
        them meanwhile. The gradients must not be modified until
        ``.result()`` returned (large ones are sent without a copy)."""
        shapes, plan, ch, calls = self._send_dense_push(grads, P.Flag.PULL_AFTER)
        return ReplyFuture(ch, calls, lambda replies: self._dense_gather(shapes, plan, replies))

    def _push_dense(self, grads, flags):
        _, _, ch, calls = self._send_dense_push(grads, flags)
        ch.wait(calls)

    def _send_dense_push(self, grads, flags):
        shapes, plan = self._dense_plan(grads)
        flat = {name: _check_values(g, shapes[name], f"gradient of {name!r}").reshape(-1)
                for name, g in grads.items()}
        ch = self._channel()
        calls = [self._send_dense_many(ch, s, Op.PUSH_DENSE_MANY, blocks, flat, flags)
                 for s, blocks in plan.items()]
        return shapes, plan, ch, calls

    def _dense_plan(self, names):
        """``(shapes, plan)``: ``{name: shape}`` and, per server,
        ``[(name, start, end, table_id)]`` of the blocks it holds."""
        shapes, plan = {}, {}
        for name in names:
            shape, blocks = self._dense_blocks(name)
            shapes[name] = shape
            for start, end, s, tid in blocks:
                plan.setdefault(s, []).append((name, start, end, tid))
        return shapes, plan

    def _dense_gather(self, shapes, plan, replies):
        pieces = {}
        for (s, blocks), (h, frames) in zip(plan.items(), replies):
            if len(frames) != len(blocks):
                raise RemoteError(f"server {s} ({self.endpoints[s]}) answered {len(frames)} "
                                  f"dense blocks for {len(blocks)}")
            for (name, start, end, _), f in zip(blocks, frames):
                pieces.setdefault(name, []).append(
                    (start, end, P.values_from(f, end - start, 1).reshape(-1)))
        out = {}
        for name, shape in shapes.items():
            parts = pieces[name]
            if len(parts) == 1:
                out[name] = parts[0][2].reshape(shape)  # a view of the reply
                continue
            flat = np.empty(int(np.prod(shape)), dtype=np.float32)
            for start, end, v in parts:
                flat[start:end] = v
            out[name] = flat.reshape(shape)
        return out

    def dense_placement(self):
        """``[(name, start, end, server_index)]`` of every known dense block."""
        self._refresh_tables()
        return [(n, a, b, s) for n, (_, blocks) in sorted(self._dense.items())
                for a, b, s, _ in blocks]

    # -------------------------------------------------------------- control

    def create_tables(self, configs, placement=None):
        """Create tables on the servers (idempotent; every worker may call it).

        Sparse configs go to every server. A dense config goes to the servers
        its blocks name: ``placement`` is a list of ``(name, start, end,
        server_index)`` over the flattened parameter (as computed by
        ``pyfleet.config``); a dense parameter it does not mention is placed
        whole on server ``i % S`` for the ``i``-th dense config."""
        per_server = [[] for _ in self.endpoints]
        by_name = {}
        for name, start, end, s in (placement or []):
            by_name.setdefault(name, []).append((int(start), int(end), int(s)))
        n_dense = 0
        for cfg in configs:
            if cfg.get("kind") == "sparse":
                for lst in per_server:
                    lst.append(cfg)
            elif cfg.get("kind") == "dense":
                shape = cfg.get("shape")
                size = int(np.prod(shape if isinstance(shape, (list, tuple)) else [shape]))
                blocks = sorted(by_name.get(cfg.get("name"),
                                            [(0, size, n_dense % self.num_servers)]))
                n_dense += 1
                pos = 0
                for start, end, s in blocks:
                    if start != pos or end <= start or not 0 <= s < self.num_servers:
                        raise ValueError(f"placement of {cfg.get('name')!r} is not a list of "
                                         f"consecutive blocks on servers 0..{self.num_servers - 1}"
                                         f": {blocks}")
                    pos = end
                if pos != size:
                    raise ValueError(f"placement of {cfg.get('name')!r} covers {pos} of "
                                     f"{size} elements")
                for start, end, s in blocks:
                    per_server[s].append({**cfg, "start": start, "end": end})
            else:
                raise ValueError(f"table kind must be 'sparse' or 'dense', got {cfg!r}")
        ch = self._channel()
        calls = [self._send(ch, s, Op.CREATE_TABLES, payload={"tables": lst})
                 for s, lst in enumerate(per_server)]
        self._learn([P.parse_json(frames[0]) for _, frames in ch.wait(calls)])

    def barrier(self, kind="step", flush=True):
        """Flush pushes, then wait until every live worker reached the barrier on
        every server (sync mode: the step's averaged update is applied). Raises
        BarrierError naming a missing worker when the servers give up.

        ``kind="pass"`` (``fleet.barrier_worker``): this worker is done with
        its share; the others' step barriers go on without it, and this one
        returns once every live worker is at a pass barrier. ``flush=False``:
        the caller flushed (and took the errors of) the pushes itself."""
        if flush:
            self.flush()
        return self._control_all(Op.BARRIER, {"worker": self.worker_index, "kind": kind},
                                 timeout=self.barrier_timeout + self.timeout)

    def heartbeat(self):
        return self._control_all(Op.HEARTBEAT, {"worker": self.worker_index})

    def _silent_error(self, server, now):
        """A PeerTimeout when ``server`` has answered no heartbeat for longer
        than ``timeout`` (None otherwise, or without heartbeats)."""
        if self._hb_thread is None:
            return None
        silent = now - self._answered[server]
        if silent <= self.timeout + self.heartbeat_interval:
            return None
        return PeerTimeout(f"server {server} ({self.endpoints[server]}) answered no heartbeat "
                           f"for {silent:.1f} s (timeout {self.timeout:g} s); is it running?")

    def _heartbeat_loop(self):
        payload = {"worker": self.worker_index}
        timeout = max(self.heartbeat_interval, 0.5)
        while not self._hb_stop.wait(self.heartbeat_interval):
            ch = self._channel()
            calls = []
            for s in range(self.num_servers):  # each server on its own: one dead hides none
                try:
                    calls.append(self._send(ch, s, Op.HEARTBEAT, timeout, payload=payload))
                except PyfleetError as e:
                    log.debug("heartbeat failed: %s", e)
            for c in calls:
                try:
                    ch.wait([c])
                    self._answered[c.server] = time.monotonic()
                except PyfleetError as e:
                    log.debug("heartbeat failed: %s", e)
        ch = getattr(self._local, "channel", None)
        if ch is not None:
            ch.close()

    def stop_worker(self):
        """Flush pushes and tell every server this worker is done (a server
        exits once all its workers are). Stops the heartbeats."""
        self.flush()
        self._hb_stop.set()
        return self._control_all(Op.STOP_WORKER, {"worker": self.worker_index})

    def save(self, dirname, mode="full", timeout=None):
        """Every server saves its shards under ``<checkpoint_dir>/<dirname>``;
        returns each server's ``{"rows", "files", "file_info"}``. ``timeout``:
        seconds the save may take (default: 10 x the request timeout, since a
        big table takes long to write); a server that dies meanwhile still
        fails the call within the request timeout (it stops answering
        heartbeats)."""
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        self.flush()
        return self._control_all(Op.SAVE, {"dir": str(dirname), "mode": mode},
                                 timeout=10 * self.timeout if timeout is None else timeout)

    def load(self, dirname, timeout=None):
        """Every server loads its keys from ``<checkpoint_dir>/<dirname>``
        (written by any number of servers; a ``fleet.save_persistables``
        directory, or a list of them, is verified first, see
        ``Server.load_checkpoint``). ``timeout`` as for :meth:`save`."""
        self.flush()
        dirs = [str(d) for d in dirname] if isinstance(dirname, (list, tuple)) else str(dirname)
        return self._control_all(Op.LOAD, {"dir": dirs},
                                 timeout=10 * self.timeout if timeout is None else timeout)

    def shrink(self, max_unseen_passes=None, min_update_count=None, min_score=None,
               decay=None, tables=None):
        """End a pass on every sparse table (see ``SparseTable.shrink``); returns
        each server's ``{"dropped": {table: rows}}``."""
        self.flush()
        args = {"max_unseen_passes": max_unseen_passes, "min_update_count": min_update_count,
                "min_score": min_score, "decay": decay, "tables": tables}
        args = {k: v for k, v in args.items() if v is not None}
        return self._control_all(Op.SHRINK, args)

    def stats(self):
        """Each server's counters and table stats (a list, by server index)."""
        return self._control_all(Op.STATS, {})

    def close(self):
        """Flush nothing more, stop the threads, close the sockets. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hb_stop.set()
        self._pusher.close()
        if self._hb_thread is not None:
            self._hb_thread.join(self.heartbeat_interval + self.timeout)
        self._close_channels()

    def _close_channels(self):
        with self._channels_lock:
            for ch in self._channels:
                ch.close()
            self._channels = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Done:
    def __init__(self, value):
        self._value = value

    def done(self):
        return True

    def result(self):
        return self._value


def _expect(count, n):
    if count != n:
        raise RemoteError(f"a server answered {count} rows for {n} keys")
    return count


def unique_keys(keys):
    """``(unique, inverse)`` with ``unique[inverse] == keys``, unique keys in
    first-occurrence order; ``(keys, None)`` when there is no duplicate. One
    O(n) hash pass (``pyfleet._core.unique_inverse``)."""
    uniq, inverse = _core.unique_inverse(keys)
    if uniq.shape[0] == keys.shape[0]:
        return keys, None
    return uniq, inverse


def _check_keys(keys):
    if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
        got = (f"dtype {keys.dtype} shape {keys.shape}" if isinstance(keys, np.ndarray)
               else type(keys).__name__)
        raise ValueError(f"keys must be a 1-D numpy uint64 array, got {got}")
    return keys


def _check_values(values, shape, what):
    if not isinstance(values, np.ndarray) or values.dtype != np.float32:
        got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
        raise ValueError(f"{what} must be a float32 numpy array, got {got}")
    if values.shape != tuple(shape):
        raise ValueError(f"{what} must have shape {tuple(shape)}, got {values.shape}")
    return np.ascontiguousarray(values)


from pyfleet._service_geo import GeoClient

"""A client's sockets and calls: :class:`Connection`, :class:`Channel`, futures.

Sockets are never shared between threads. Each thread that makes requests
gets its own DEALER sockets, one per server (a :class:`Channel`), so a
trainer's synchronous pull goes straight from the calling thread to the wire.
A :class:`Connection` holds what the channels share (endpoints, ZeroMQ
context, CURVE keys, the request deadline), hands each thread its channel,
and runs the heartbeat thread, which pings every server every
``heartbeat_interval`` and remembers when each last answered: a long call (a
barrier, a save) to a server that stopped answering fails once the server has
been silent for ``timeout``, not at the call's own deadline.

Pushes go through one background :class:`pyfleet.service.pusher.Pusher`
thread (its own module).

Thread safety: a channel is guarded by its own lock, so a call (and a
:class:`ReplyFuture`) may be waited for from any thread.
"""

import itertools
import logging
import os
import secrets
import stat
import threading
import time

import numpy as np
import zmq

from pyfleet import _core
from pyfleet.endpoint import split_endpoint
from pyfleet.errors import BarrierError, PeerTimeout, PyfleetError, RemoteError
from pyfleet.service import protocol as P
from pyfleet.service import wire as Z
from pyfleet.service.auth import is_loopback_host
from pyfleet.service.protocol import Op, Status

__all__ = ["Channel", "Connection", "Done", "PullFuture", "ReplyFuture", "pull_rows"]

log = logging.getLogger("pyfleet.client")

# Request ids: a random 40-bit prefix per process, then a counter, so a
# server can tell a retried push (same id) from a new one of any client
# (pyfleet.service.dedup), even across worker restarts.
_RIDS = itertools.count((secrets.randbits(40) << 24) + 1)
_SLICE_MS = 50  # longest uninterrupted wait on a channel's sockets


class _Call:
    """One request to one server, waiting for its reply."""

    __slots__ = ("deadline", "done", "error", "frames", "op", "reply", "retries", "server",
                 "timeout")

    def __init__(self, server, op, timeout, frames=None, retries=0):
        self.server, self.op, self.timeout = server, op, timeout
        self.deadline = time.monotonic() + timeout
        self.reply = self.error = None
        self.done = False
        self.frames, self.retries = (frames, retries) if retries else (None, 0)


class Channel:
    """One thread's DEALER sockets to every server, and its calls in flight.

    Guarded by its own lock, so a call may be waited for from another thread."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.RLock()
        self.socks = [self._socket(i) for i in range(len(conn.endpoints))]
        self.pending = {}  # request id -> _Call

    def _socket(self, i):
        s = self.conn.ctx.socket(zmq.DEALER)
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
        path = self.conn.ipc_path(i)
        if path is not None:  # the server's socket on this machine: no TCP, no CURVE
            s.connect("ipc://" + path)
            return s
        keys = self.conn.curve
        if keys is not None:
            s.curve_serverkey = keys[0][i]
            s.curve_publickey, s.curve_secretkey = keys[1]
        s.connect("tcp://" + self.conn.endpoints[i])
        return s

    def reopen_near(self):
        """Replace each idle TCP socket to a server that now listens in the
        connection's ``ipc_dir`` by one on its Unix socket (a server that was
        still starting when this channel was made)."""
        with self.lock:
            busy = {c.server for c in self.pending.values()}
            for i, sock in enumerate(self.socks):
                if i not in busy and self.conn.ipc_path(i) is not None and \
                        sock.getsockopt(zmq.LAST_ENDPOINT).startswith(b"tcp://"):
                    sock.close(linger=0)
                    self.socks[i] = self._socket(i)

    def send(self, server, frames, op, timeout, rid, retries=0):
        """Send ``frames`` (request id ``rid``) to ``server``. ``retries``: how
        many times the same request (same id: a server applies a push once)
        is sent again on a new socket when ``timeout`` passes unanswered. A long
        call (a save, a barrier) that cannot be queued to a server silent for the
        client's ``timeout`` (no heartbeat answered) fails then, as :meth:`wait` does."""
        call = _Call(server, op, timeout, frames, retries)
        deadline = call.deadline
        watch = timeout > self.conn.timeout and op != Op.HEARTBEAT
        backoff = 0.001
        with self.lock:
            while True:
                try:
                    Z.send_frames(self.socks[server], frames, None, Z.NOBLOCK)
                    break
                except zmq.Again:
                    pass
                now = time.monotonic()
                if now + backoff > deadline:
                    raise self.conn.timeout_error(server, op, timeout, "could not connect")
                err = self.conn.silent_error(server, now) if watch else None
                if err is not None:
                    raise err
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
                    if not c.done and c.timeout > self.conn.timeout and \
                            c.op != Op.HEARTBEAT:
                        err = self.conn.silent_error(c.server, now)
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
        if call.timeout > self.conn.timeout:
            return
        with self.lock:
            while not call.done and len(self.pending) == 1:
                try:
                    msg = Z.recv_frames(self.socks[call.server])  # replaced on expiry
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
        ep = self.conn.endpoints[call.server]
        cls = BarrierError if h.status == Status.BARRIER_FAILED else RemoteError
        call.error = cls(f"server {call.server} ({ep}) refused {call.op.name}: {text}")

    def _expire(self, server):
        """Fail every expired call to ``server``, and every call sharing its socket,
        then replace that socket so late answers cannot be mistaken for new ones."""
        again = []
        for rid, c in list(self.pending.items()):
            if c.server == server:
                if c.retries > 0 and c.deadline <= time.monotonic():
                    again.append((rid, c))
                    continue
                del self.pending[rid]
                c.done = True
                c.error = self.conn.timeout_error(server, c.op, c.timeout, "no answer")
        self.socks[server].close(linger=0)
        self.socks[server] = self._socket(server)
        for rid, c in again:  # the same request again, on the new socket
            c.retries -= 1
            c.deadline = time.monotonic() + c.timeout
            log.warning("no answer to %s from server %d within %g s: sending it again "
                        "(request %d)", c.op.name, server, c.timeout, rid)
            backoff = 0.001
            while True:
                try:
                    Z.send_frames(self.socks[server], c.frames, None, Z.NOBLOCK)
                    break
                except zmq.Again:
                    pass
                if time.monotonic() + backoff > c.deadline:
                    self.pending.pop(rid, None)
                    c.done = True
                    c.error = self.conn.timeout_error(server, c.op, c.timeout,
                                                      "could not connect to retry")
                    break
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.1)

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
                         lambda replies: pull_rows(replies, parts, inverse, dim))


def pull_rows(replies, parts, inverse, dim):
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


class Done:
    """A future already resolved to ``value``."""

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


class Connection:
    """What a client's channels share, and the heartbeat thread.

    ``endpoints``: ``"host:port"`` of server ``i`` at index ``i``; requests
    carry ``worker_index``; ``timeout``: seconds one request may take;
    ``curve``: None, or ``(server public keys, (public, secret))`` Z85 bytes;
    ``ipc_dir``: where servers on this machine listen on Unix sockets too (see
    :func:`pyfleet.service.wire.bind_router`)."""

    def __init__(self, endpoints, worker_index, timeout, curve=None, context=None,
                 ipc_dir=None):
        self.endpoints = endpoints
        self.ipc_dir = ipc_dir
        self.num_servers = len(endpoints)
        self.worker_index = worker_index
        self.timeout = timeout
        self.curve = curve
        self.ctx = context or zmq.Context.instance()
        self.closed = False
        self._local = threading.local()
        self._channels = []
        self._channels_lock = threading.Lock()
        self.heartbeat_interval = 0.0
        self._hb_stop = threading.Event()
        self._hb_thread = None
        self._answered = []  # per server: when it last answered a heartbeat

    def ipc_path(self, server):
        """The Unix socket of ``server`` when it is on this machine (a loopback
        endpoint) and listens in :attr:`ipc_dir`, else None (TCP). Asked at each
        socket's creation: a server that has not bound it yet is reached over TCP."""
        if self.ipc_dir is None:
            return None
        host, port = split_endpoint(self.endpoints[server], "server endpoint")
        if not is_loopback_host(host):
            return None
        path = Z.ipc_path(self.ipc_dir, host, port)
        try:
            return path if stat.S_ISSOCK(os.stat(path).st_mode) else None
        except OSError:
            return None

    def channel(self):
        """This thread's channel (made on first use)."""
        ch = getattr(self._local, "channel", None)
        if ch is None:
            if self.closed:
                raise PyfleetError("the client is closed")
            ch = self._local.channel = Channel(self)
            with self._channels_lock:
                self._channels.append(ch)
        return ch

    def reopen_near(self):
        """:meth:`Channel.reopen_near` on every channel: called once the servers
        answered, so every server on this machine has bound its Unix socket."""
        if self.ipc_dir is None:
            return
        with self._channels_lock:
            channels = list(self._channels)
        for ch in channels:
            ch.reopen_near()

    def timeout_error(self, server, op, timeout, why):
        return PeerTimeout(f"server {server} ({self.endpoints[server]}) did not answer "
                           f"{op.name} within {timeout:g} s ({why}); is it running?")

    def send(self, ch, server, op, timeout=None, retries=0, **kw):
        """Send one request (``protocol.request`` fields in ``kw``) on ``ch``;
        ``retries``: see :meth:`Channel.send`."""
        rid = next(_RIDS)
        frames = P.request(op, rid, worker=self.worker_index, **kw)
        return ch.send(server, frames, op, self.timeout if timeout is None else timeout, rid,
                       retries)

    def send_dense_many(self, ch, server, op, blocks, grads=None, flags=0, retries=0):
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
        return ch.send(server, frames, op, self.timeout, rid, retries)

    def control_all(self, op, payload, timeout=None, servers=None):
        """Send a control request to ``servers`` (default all) and return each
        JSON reply, in order."""
        ch = self.channel()
        servers = range(self.num_servers) if servers is None else servers
        calls = [self.send(ch, s, op, timeout, payload=payload) for s in servers]
        return [P.parse_json(frames[0]) if frames else {}
                for _, frames in ch.wait(calls)]

    def start_heartbeats(self, interval):
        """Ping every server every ``interval`` seconds (0: never)."""
        self.heartbeat_interval = interval
        self._answered = [time.monotonic()] * self.num_servers
        if interval > 0:
            self._hb_thread = threading.Thread(target=self._heartbeat_loop,
                                               name="pyfleet-heartbeat", daemon=True)
            self._hb_thread.start()

    def stop_heartbeats(self):
        self._hb_stop.set()

    def silent_error(self, server, now):
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
            ch = self.channel()
            calls = []
            for s in range(self.num_servers):  # each server on its own: one dead hides none
                try:
                    calls.append(self.send(ch, s, Op.HEARTBEAT, timeout, payload=payload))
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

    def close(self):
        """Stop the heartbeats and close every channel. Idempotent."""
        self.closed = True
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(self.heartbeat_interval + self.timeout)
        self.close_channels()

    def close_channels(self):
        with self._channels_lock:
            for ch in self._channels:
                ch.close()
            self._channels = []

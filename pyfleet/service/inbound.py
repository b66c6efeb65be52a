"""What a server holds of its TCP peers' bytes, bounded: :class:`InboundRelay`.

libzmq hands a multipart message over only once all of its frames have arrived,
bounds frames, not messages (``ZMQ_MAXMSGSIZE``), and counts whole messages
(``ZMQ_RCVHWM``): left to itself, it reads a message that never ends as fast as it
arrives. So libzmq never reads a TCP peer: the server listens on TCP itself, and a
thread (the relay) joins each connection to a Unix socket of the ROUTER (in a
directory of its own, mode 0700), passing bytes both ways, at most :data:`CHUNK` at
once (ZMTP and CURVE stay between the peer and libzmq). It counts what it gave each
connection, less each message the server received from it (:meth:`InboundRelay.count`:
found by ``ZMQ_SRCFD``, its ZMTP and CURVE framing added exactly): what libzmq holds
for that peer (and its handshake, under :data:`HANDSHAKE_BYTES`). Before each read it
checks that what it reads fits:

- one connection holds at most ``max_message_bytes`` + :data:`FRAMING_SLACK`;
- all connections, with the requests the handler threads hold, at most
  ``max_buffer_bytes``; when that is full, the connection holding the most (its
  message the furthest along) reads on alone while the others fit.

A connection not read waits in TCP (its peer's sends block: nothing cut or lost). So
TCP peers make a server hold at most ``max_buffer_bytes + max_message_bytes +
FRAMING_SLACK`` (:meth:`InboundRelay.bound`) whatever the machine's load. A
connection holding a whole ``max_message_bytes``, or reading on while others wait,
that for :data:`STALL_SECONDS` (while the server's loop reads) neither sends more nor
has a message taken is cut (``shutdown``; logged with its peer's address, counted as
``cut_connections``); its bytes stay counted until libzmq lets go of them, then the
memory goes back to the system (``malloc_trim``). Unix-socket peers of ``ipc_dir``
reach the ROUTER directly, uncounted. Linux only (elsewhere, or with ``PYFLEET_INBOUND_RELAY=0``,
the ROUTER listens on TCP itself, without this bound, and the server logs so).
"""

import contextlib
import logging
import os
import select
import shutil
import socket
import sys
import tempfile
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from pyfleet.service import wire as Z
from pyfleet.service.limits import RELAY_VAR, inbound_relay_wanted
from pyfleet.service.loop import TRIM_BYTES

__all__ = ["CHUNK", "FRAMING_SLACK", "HANDSHAKE_BYTES", "STALL_SECONDS", "InboundRelay",
           "available", "figures", "serve", "wire_bytes"]

log = logging.getLogger("pyfleet.server")

# What the relay reads from a TCP connection at once (and at most holds for it).
CHUNK = 256 << 10
# Bytes of a connection that are not messages: the ZMTP greeting (64), the NULL
# READY or CURVE HELLO/WELCOME/INITIATE commands with their metadata (under 1 KiB).
HANDSHAKE_BYTES = 4096
# What a connection may hold past max_message_bytes: the framing of its frames, and
# a header frame of a message already at the limit.
FRAMING_SLACK = 1 << 20
# How long a connection holding bytes others wait for may make no progress.
STALL_SECONDS = 2.0

_SRCFD = int(zmq.SRCFD)
_POLLIN, _POLLOUT = select.EPOLLIN, select.EPOLLOUT
_CURVE_BOX = 33            # "\x07MESSAGE" + nonce (8) + MAC (16) + flags (1), per frame
_SHORT = 255               # frames of at most this many bytes have a one-byte size
_RELEASE_SECONDS = 5.0     # a cut connection's bytes stay counted at most this long
_TRIMS = (0.05, 0.5)       # after a large hold is let go: when to give memory back
_UNKNOWN = object()


def available():
    """Whether the relay runs here (Linux: Unix sockets with autobound names)."""
    return sys.platform.startswith("linux")


def wire_bytes(size, curve):
    """Bytes one frame of ``size`` bytes takes on a ZMTP 3 connection (CURVE: in its
    MESSAGE command box)."""
    if curve:
        size += _CURVE_BOX
    return size + (2 if size <= _SHORT else 9)


class _Pair:
    """A TCP connection and the Unix connection the relay joined it to."""

    __slots__ = ("fed", "got", "idents", "mark", "name", "out", "peer", "pending", "since",
                 "tcp", "unix")

    def __init__(self, tcp, unix, name, peer):
        self.tcp, self.unix, self.name, self.peer = tcp, unix, name, peer
        self.fed = 0          # bytes written into the Unix connection (relay thread)
        self.got = 0          # wire bytes of the messages the server took (server thread)
        self.pending = b""    # read from TCP, not yet taken by the Unix connection
        self.out = b""        # read from the Unix connection, not yet taken by TCP
        self.idents = []      # ROUTER identities seen of it
        self.mark, self.since = None, 0.0  # (fed, got) at the last progress, and when

    def held(self):
        return self.fed - self.got + len(self.pending)


class InboundRelay:
    """Relay the TCP connections accepted on ``listener`` to the ROUTER ``router``,
    which listens on the Unix socket ``path`` (in the 0700 directory ``directory``,
    removed by :meth:`stop`), within the bounds of the module's text.

    Make it on the thread that owns ``router`` before that thread serves (it starts
    the socket's monitor); :meth:`count` each message received from ``router`` on
    that thread, and set :attr:`reading` to whether that thread reads ``router``;
    :meth:`start` and :meth:`stop` the relay's thread. ``curve``: whether the TCP
    endpoint speaks CURVE; ``on_cut(peer, held, why)``: called (from the relay's
    thread) for each connection cut; ``trim``: gives freed memory back."""

    def __init__(self, listener, path, directory, router, max_message_bytes, max_buffer_bytes,
                 curve, on_cut=None, trim=None):
        self.listener, self.path, self.directory = listener, path, directory
        self.max_message_bytes, self.max_buffer_bytes = max_message_bytes, max_buffer_bytes
        self.curve, self.on_cut, self.trim = curve, on_cut, trim
        self.reading = True       # whether the server reads the ROUTER (set by its loop)
        self.passes = 0           # passes of the server's loop (each polls the ROUTER)
        self._seen = (0, 0.0)     # passes at the last look, and when they last changed
        self.also_held = None     # () -> bytes of peers' requests the server holds itself
        self.cut = 0
        self.peak = 0             # the most all connections held at once (bytes)
        self._pairs = {}          # autobound Unix name -> _Pair
        self._by_ident = {}       # ROUTER identity -> _Pair, or None (not relayed)
        self._fds = {}            # fd -> (_Pair, is_tcp)
        self._events = {}         # fd -> the poll events registered
        # name -> [bytes libzmq may still hold, deadline, loop pass when libzmq dropped it]
        self._closing = {}
        self._zfds = {}           # fd of the ROUTER's end -> Unix name
        self._trims = []          # when to give memory back
        self._favored = None
        self._waiting = False     # a connection waits for the budget: count() wakes us
        self._inbuf, self._outbuf = bytearray(CHUNK), bytearray(CHUNK)
        self._wake_r, self._wake_w = socket.socketpair()
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._stop, self._detach, self._detached = (threading.Event() for _ in range(3))
        self._drain_until = None   # stop(drain): when to stop passing the last replies
        self._events[self.listener.fileno()] = _POLLIN
        self._thread, self._router = None, router
        self._monitor = router.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)

    def count(self, msg):
        """Count a message received from the ROUTER (identity frame first) against
        its connection."""
        if len(msg) < 2:
            return
        pair = self._by_ident.get(msg[0].bytes, _UNKNOWN)
        if pair is _UNKNOWN:
            pair = self._resolve(msg)
        if pair is None:
            return
        curve = self.curve
        n = 0
        for f in msg[1:]:
            size = len(f)
            if curve:
                size += _CURVE_BOX
            n += size + (2 if size <= _SHORT else 9)
        pair.got += n
        if self._waiting:
            self._waiting = False
            self._wake()

    def _resolve(self, msg):
        """The relayed connection a message came through (None: a Unix-socket peer
        of ``ipc_dir``), found by the autobound name of its Unix socket's peer."""
        ident = msg[0].bytes
        try:
            with socket.socket(fileno=os.dup(msg[1].get(_SRCFD))) as probe:
                name = probe.getpeername()
        except (OSError, zmq.ZMQError):
            name = None
        pair = self._pairs.get(name) if isinstance(name, bytes) else None
        if len(self._by_ident) > 4096:   # identities of connections gone
            self._by_ident = {k: v for k, v in list(self._by_ident.items())   # (the relay
                              if v is not None and v.name in self._pairs}     # pops some)
        self._by_ident[ident] = pair
        if pair is not None:
            pair.idents.append(ident)
        return pair

    def start(self):
        self._thread = threading.Thread(target=self._run, name="pyfleet-inbound", daemon=True)
        self._thread.start()

    def detach(self):
        """Take the ROUTER's monitor off (from the thread that owns the ROUTER, before
        closing it: a monitor socket closed while still attached broke the handshakes
        of other sockets of the same context). The relay goes on relaying."""
        if self._monitor is None:
            return
        if self._thread is not None and self._thread.is_alive():
            self._detach.set()
            self._wake()
            self._detached.wait(5)
        with contextlib.suppress(zmq.ZMQError):
            self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._monitor = None

    def stop(self, drain=0.0):
        """Stop relaying and close every relayed connection and the listener
        (idempotent; also for a relay never started; :meth:`detach` first if not
        done). ``drain``: seconds to go on passing the ROUTER's last replies to their
        peers (after the ROUTER was closed with a linger), reading nothing more."""
        if drain and self._thread is not None:
            self._drain_until = time.monotonic() + drain
            self._wake()
            self._thread.join(drain + 1)
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._drain_until = None   # what is left is not waited for
        self.detach()
        for pair in list(self._pairs.values()):
            self._close(pair, None)
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _wake(self):
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def bound(self):
        """The most all relayed connections (and the requests the server holds) may
        hold: ``max_buffer_bytes + max_message_bytes + FRAMING_SLACK``."""
        return self.max_buffer_bytes + self.max_message_bytes + FRAMING_SLACK

    def held(self):
        """Bytes all relayed connections hold now (libzmq's and the relay's), those
        closed and not yet let go by libzmq included, and the requests the server
        holds itself (:attr:`also_held`)."""
        also = self.also_held
        return sum(p.held() for p in list(self._pairs.values())) + \
            sum(c[0] for c in list(self._closing.values())) + \
            (also() if also is not None else 0)

    # ------------------------------------------------------------ the relay's thread

    def _run(self):
        ep = self._poller = select.epoll()
        ep.register(self.listener.fileno(), _POLLIN)
        ep.register(self._wake_r.fileno(), _POLLIN)
        mon = self._monitor
        mon_fd = mon.getsockopt(zmq.FD)   # readable when the monitor may have events
        ep.register(mon_fd, _POLLIN)
        try:
            while not self._stop.is_set():
                if mon is not None and self._detach.is_set():
                    ep.unregister(mon_fd)
                    mon = None
                    self._detached.set()
                if self._drain_until is not None:
                    if not self._pairs or time.monotonic() >= self._drain_until:
                        break
                    self._watch(self.listener.fileno(), 0)  # nobody new
                busy = self._waiting or self._closing or self._trims or \
                    self._favored is not None or self._drain_until is not None
                events = ep.poll(0.05 if busy else 1.0)
                touched = [] if events else None   # None: a time-out, look at all
                try:   # keep relaying: a bug here must not leave every TCP peer hanging
                    for fd, _ in events:
                        entry = self._fds.get(fd)
                        if entry is not None:
                            self._io(*entry)
                            if touched is not None:
                                touched.append(entry[0])
                        elif fd == self._wake_r.fileno():
                            with contextlib.suppress(OSError):
                                self._wake_r.recv(4096)
                            touched = None
                        elif fd == self.listener.fileno():
                            self._accept()
                            touched = None
                    while mon is not None and mon.poll(0):
                        self._event(recv_monitor_message(mon))
                    self._arrange(touched)
                except zmq.ContextTerminated:
                    raise
                except Exception:
                    log.exception("inbound relay: a pass failed")
        except zmq.ContextTerminated:
            pass
        finally:
            self._detached.set()
            ep.close()

    def _accept(self):
        for _ in range(16):
            try:
                tcp, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, a connection reset before accept
                log.warning("inbound relay: accept failed: %s", e)
                return
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as libzmq does
                unix.bind("")                 # an autobound name: count() finds it by it
                unix.settimeout(5)
                unix.connect(self.path)
                tcp.setblocking(False)
                unix.setblocking(False)
            except OSError as e:
                log.warning("inbound relay: cannot join %s to the server's socket: %s",
                            addr, e)
                tcp.close()
                unix.close()
                continue
            name = unix.getsockname()
            pair = _Pair(tcp, unix, name, f"{addr[0]}:{addr[1]}")
            self._pairs[name] = pair
            self._fds[tcp.fileno()] = (pair, True)
            self._fds[unix.fileno()] = (pair, False)

    def _io(self, pair, is_tcp):
        try:
            if is_tcp:
                if pair.out:
                    self._send_out(pair)
                if pair.pending:
                    return
                total = self.held()
                allow = self._allow(pair, total)
                if allow <= 0:
                    return
                n = pair.tcp.recv_into(self._inbuf, allow)
                if n == 0:
                    self._close(pair, None)
                    return
                self.peak = max(self.peak, total + n)
                self._send_in(pair, memoryview(self._inbuf)[:n])
            else:
                if pair.pending:
                    self._send_in(pair, pair.pending)
                if pair.out:
                    return
                n = pair.unix.recv_into(self._outbuf)
                if n == 0:   # libzmq dropped the connection (a frame too large, a handshake,
                    self._close(pair, None)   # or the ROUTER closed)
                    return
                pair.out = memoryview(self._outbuf)[:n]
                self._send_out(pair)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(pair, None)

    def _send_in(self, pair, data):
        try:
            sent = pair.unix.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        pair.fed += sent
        pair.pending = bytes(data[sent:]) if sent < len(data) else b""

    def _send_out(self, pair):
        try:
            sent = pair.tcp.send(pair.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        # the reply buffer is reused by the next read: what TCP did not take is copied
        pair.out = bytes(pair.out[sent:]) if sent < len(pair.out) else b""

    def _allow(self, pair, total):
        """How many bytes the relay may read from ``pair``'s TCP connection now, all
        connections holding ``total``."""
        if self._drain_until is not None:
            return 0
        room = self.max_message_bytes + FRAMING_SLACK - pair.held()
        if room <= 0:
            self._waiting = True
            return 0
        free = self.max_buffer_bytes - total
        if free > 0:
            return min(CHUNK, room, free)
        if self._favored is None:
            self._favored = max(self._pairs.values(), key=_Pair.held)
        if self._favored is pair and total - pair.held() <= self.max_buffer_bytes:
            return min(CHUNK, room)   # the others within the budget: it reads on, alone
        self._waiting = True
        return 0

    def _arrange(self, touched=None):
        """Per connection (those ``touched`` alone while the budget is far from full),
        the events to wait for; the favored connection; cuts of stalled ones; releases
        and trims."""
        now = time.monotonic()
        f = self._favored
        if f is not None and (f.name not in self._pairs or f.held() <= HANDSHAKE_BYTES or
                              self.held() < self.max_buffer_bytes):
            self._favored = None   # its message taken, or nobody waits for the budget
        for name, (_, deadline, dropped) in list(self._closing.items()):
            # libzmq frees a dropped connection's frames as the ROUTER's thread handles
            # the pipe's end: two passes of the loop after it reported the drop
            if deadline <= now or (dropped is not None and self.passes >= dropped + 2):
                self._release(name)
        if self._trims and self._trims[0] <= now:
            self._trims = [t for t in self._trims if t > now]
            if self.trim is not None:
                self.trim()
        total = self.held()
        self.peak = max(self.peak, total)
        limit = self.max_message_bytes + FRAMING_SLACK
        if self.passes != self._seen[0]:
            self._seen = (self.passes, now)
        reading = self.reading and now - self._seen[1] < 0.5   # its loop passes, not stuck
        if touched is None or self._waiting or self._favored is not None or \
                2 * total >= self.max_buffer_bytes:
            self._waiting, touched = False, list(self._pairs.values())
        for pair in touched:
            if pair.name not in self._pairs:
                continue
            held = pair.held()
            allow = 0 if pair.pending else self._allow(pair, total)
            mark = (pair.fed, pair.got)
            # The clock runs while the relay would read the peer (or it holds a whole
            # message's worth) and the server reads: not while it waits for the budget.
            if mark != pair.mark or not reading or held <= HANDSHAKE_BYTES or \
                    pair.pending or (allow <= 0 and held < limit):
                pair.mark, pair.since = mark, now
            elif now - pair.since > STALL_SECONDS and (held >= limit or pair is self._favored):
                over = (f"more than max_message_bytes={self.max_message_bytes}"
                        if held >= limit else
                        f"what others wait for (max_buffer_bytes={self.max_buffer_bytes})")
                self._close(pair, f"it holds {over} in messages not whole or not taken, and "
                                  f"for {STALL_SECONDS:g} s sent nothing more")
                total = self.held()
                continue
            tcp = (_POLLOUT if pair.out else 0) | (_POLLIN if allow > 0 else 0)
            unix = _POLLOUT if pair.pending else (0 if pair.out else _POLLIN)
            if pair.pending and not pair.out:
                unix |= _POLLIN
            self._watch(pair.tcp.fileno(), tcp)
            self._watch(pair.unix.fileno(), unix)

    def _watch(self, fd, events):
        was = self._events.get(fd, 0)
        if was != events:
            self._events[fd] = events
            if not events:
                self._poller.unregister(fd)
            elif was:
                self._poller.modify(fd, events)
            else:
                self._poller.register(fd, events)

    def _close(self, pair, why):
        """Close both ends of ``pair``; ``why``: a cut (logged and counted), else a
        connection gone."""
        if self._pairs.pop(pair.name, None) is None:
            return
        held = pair.held() - len(pair.pending)
        if pair.out and self._drain_until is not None:   # the ROUTER's last reply
            with contextlib.suppress(OSError):
                pair.tcp.settimeout(1.0)
                pair.tcp.sendall(pair.out)
        for sock in (pair.tcp, pair.unix):
            fd = sock.fileno()
            self._fds.pop(fd, None)
            if self._events.pop(fd, 0) and self._thread is not None:
                with contextlib.suppress(OSError, KeyError):
                    self._poller.unregister(fd)
            if why is not None and sock is pair.tcp:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for ident in pair.idents:
            self._by_ident.pop(ident, None)
        if self._favored is pair:
            self._favored = None
        if held > HANDSHAKE_BYTES:
            self._closing[pair.name] = [held, time.monotonic() + _RELEASE_SECONDS, None]
        if why is not None:
            self.cut += 1
            if self.on_cut is not None:
                self.on_cut(pair.peer, held, why)

    def _release(self, name):
        """libzmq let go of what a closed connection held: stop counting it."""
        gone = self._closing.pop(name, None)
        if gone is not None and gone[0] >= TRIM_BYTES:
            if self.trim is not None:   # before anyone reads into the room it leaves
                self.trim()
            now = time.monotonic()
            self._trims = sorted(self._trims + [now + t for t in _TRIMS])

    def _event(self, ev):
        fd = int(ev["value"])
        if ev["event"] == zmq.EVENT_ACCEPTED:
            try:
                with socket.socket(fileno=os.dup(fd)) as probe:
                    name = probe.getpeername()
            except OSError:
                return
            if isinstance(name, bytes) and name:
                self._zfds[fd] = name
            return
        closing = self._closing.get(self._zfds.pop(fd, None))
        if closing is not None:   # (dropped by libzmq first: counted until the deadline)
            closing[2] = self.passes


def serve(router, host, port, max_message_bytes, limits, curve_secret_key, ipc_dir,
          listen_fd, on_cut, trim):
    """Bind ROUTER ``router`` as endpoint ``host:port`` (:func:`pyfleet.service.wire.bind_router`),
    TCP peers through an :class:`InboundRelay` if :func:`available` and not turned off
    (``PYFLEET_INBOUND_RELAY=0``). Returns ``(port, relay or None)``; raises ZMQError, OSError."""
    if not (inbound_relay_wanted() and available()):
        log.warning("%s: max_buffer_bytes does not bound what TCP peers make this server hold",
                    f"{RELAY_VAR}=0" if available() else "no relay on this platform")
        return Z.bind_router(router, host, port, max_message_bytes, curve_secret_key,
                             limits.max_queued_replies, ipc_dir, listen_fd), None
    listener = Z.listen(host, port, listen_fd)
    directory = tempfile.mkdtemp(prefix="pyfleet-in-")
    path = os.path.join(directory, "r")
    try:
        port = listener.getsockname()[1]
        Z.bind_router(router, host, port, max_message_bytes, curve_secret_key,
                      limits.max_queued_replies, ipc_dir, relay_path=path)
        return port, InboundRelay(listener, path, directory, router, max_message_bytes,
                                  limits.max_buffer_bytes, curve_secret_key is not None,
                                  on_cut, trim)
    except BaseException:
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise


def figures(relay):
    """What TCP peers make a server hold (``stats()``): now, at most so far, and the
    bound (None without a relay)."""
    if relay is None:
        return {"inbound_bytes": None, "peak_inbound_bytes": None, "inbound_bound_bytes": None}
    return {"inbound_bytes": relay.held(), "peak_inbound_bytes": relay.peak,
            "inbound_bound_bytes": relay.bound()}

"""What libzmq holds for a server's TCP peers, bounded: :class:`InboundGuard`.

libzmq hands a multipart message to the server only once all of its frames have
arrived, and bounds frames, not messages (``ZMQ_MAXMSGSIZE``): a peer that
sends frame after frame, each under the limit, makes the server's I/O thread
buffer them all before the server sees any. No framing of pyfleet's own can
change that: the peer, not pyfleet, chooses how many frames it sends. What the
server can see is the difference of two counts per connection:

- the bytes libzmq has read from the connection's TCP socket: the kernel's
  ``tcpi_bytes_received`` (``TCP_INFO``) less what still waits in the
  socket's receive queue (``SIOCINQ``);
- the bytes of the messages the server has received from it (counted by
  :meth:`InboundGuard.count`, which finds a message's connection by its
  ``ZMQ_SRCFD``), with the wire's framing (ZMTP frame headers, CURVE boxes)
  added exactly.

What is left (less :data:`HANDSHAKE_BYTES` for the greeting and handshake) is
what libzmq holds for that peer: a message still arriving, and messages
arrived but not yet read. A thread looks every :data:`INTERVAL` seconds and
cuts (``shutdown``) a connection that holds more than ``max_message_bytes``
(:data:`FRAMING_SLACK` more for framing: no protocol message is larger, so a
peer past it is sending something no pyfleet client sends), and, while all
connections together hold more than ``max_buffer_bytes``, the one that holds
the most (unless it is the only one holding anything: one message in
progress always gets through). libzmq then drops what it held for that peer
and the memory goes back to the system (``malloc_trim``, also once a
connection that held a large message closes). A cut is logged
with the peer's address and counted (``cut_connections``).

So what TCP peers make a server hold is bounded by
``max(max_buffer_bytes, max_message_bytes)`` plus what arrives in one
interval (on loopback, a few tens of MiB), whoever sends it, with or without
keys. Unix-socket peers (``ipc_dir``, a directory only this user may enter)
are not watched. Linux only (elsewhere the guard is off and says so).
"""

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import os
import socket
import struct
import sys
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from pyfleet.service.loop import TRIM_BYTES

__all__ = ["FRAMING_SLACK", "HANDSHAKE_BYTES", "INTERVAL", "InboundGuard", "available"]

log = logging.getLogger("pyfleet.server")

# How often the held bytes are looked at (seconds): a peer on loopback gets at most
# what it can send in this long past a limit before it is cut.
INTERVAL = 0.01
# Bytes of a connection that are not messages: the ZMTP greeting (64), the NULL
# READY or CURVE HELLO/WELCOME/INITIATE commands with their metadata (under 1 KiB).
HANDSHAKE_BYTES = 4096
# What a message may hold past max_message_bytes before its connection is cut: the
# framing of its frames, and a header frame of a message already at the limit.
FRAMING_SLACK = 1 << 20

_SRCFD = int(zmq.SRCFD)
_FORGET_SECONDS = 10.0  # how long a gone connection's counter is kept
_IDLE_SECONDS = 0.1     # the longest wait for the monitor while no TCP peer is watched
_TCP_INFO_RECEIVED = 128   # offset of tcpi_bytes_received (u64) in Linux's struct tcp_info
_TCP_INFO_SIZE = 256
_SIOCINQ = 0x541B          # FIONREAD: bytes in a TCP socket's receive queue
_CURVE_BOX = 33            # "\x07MESSAGE" + nonce (8) + MAC (16) + flags (1), per frame
_SHORT = 255               # frames of at most this many bytes have a one-byte size


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.getsockopt.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                ctypes.POINTER(ctypes.c_uint32)]
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    libc.shutdown.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_LIBC = _libc()


def available():
    """Whether this platform lets the guard see what libzmq read (Linux)."""
    return _LIBC is not None


def wire_bytes(size, curve):
    """Bytes one frame of ``size`` bytes takes on a ZMTP 3 connection (CURVE: in its
    MESSAGE command box)."""
    if curve:
        size += _CURVE_BOX
    return size + (2 if size <= _SHORT else 9)


class _Conn:
    __slots__ = ("cut", "fd", "held", "inode", "peer")

    def __init__(self, fd, inode, peer):
        self.fd, self.inode, self.peer, self.cut = fd, inode, peer, False
        self.held = 0  # at the last look


class InboundGuard:
    """Watch the TCP connections of ROUTER ``router`` (see the module's text).

    Make it on the thread that owns ``router`` before that thread serves
    (it starts the socket's monitor); :meth:`count` each message received from
    ``router`` on that thread; :meth:`start` and :meth:`stop` the watching
    thread. ``curve``: whether the TCP endpoint speaks CURVE; ``on_cut(peer,
    held, why)``: called (from the watching thread) for each connection cut;
    ``trim``: gives freed memory back to the system."""

    def __init__(self, router, max_message_bytes, max_buffer_bytes, curve, on_cut=None,
                 trim=None, interval=INTERVAL):
        self.max_message_bytes, self.max_buffer_bytes = max_message_bytes, max_buffer_bytes
        self.curve, self.on_cut, self.trim = curve, on_cut, trim
        self.interval = interval
        self._senders = {}    # identity -> [wire bytes of its messages, identity, inode, t]
        self._by_inode = {}   # socket inode -> the same list
        self._gone = []       # (when, inode) of connections gone: forgotten a while later
        self._conns = {}      # fd -> _Conn (TCP connections only)
        self._stop = threading.Event()
        self._thread = None
        self._trim_pending = False
        self.cut = 0
        self._monitor = None
        self._router = router
        if available():
            self._monitor = router.get_monitor_socket(
                zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)

    def count(self, msg):
        """Count a message received from the ROUTER (identity frame first) against
        its connection."""
        if len(msg) < 2:
            return
        sender = self._senders.get(msg[0].bytes)
        if sender is None:
            sender = self._sender(msg)
        curve = self.curve
        n = 0
        for f in msg[1:]:
            size = len(f)
            if curve:
                size += _CURVE_BOX
            n += size + (2 if size <= _SHORT else 9)
        sender[0] += n

    def _sender(self, msg):
        """The counter of a peer not seen before: ``[bytes, identity, socket inode,
        when made]``
        (an inode, unlike a descriptor's number, is not reused by a later connection)."""
        fd = msg[1].get(_SRCFD)
        try:
            inode = os.fstat(fd).st_ino if fd >= 0 else None
        except OSError:
            inode = None
        sender = [0, msg[0].bytes, inode, time.monotonic()]
        self._senders[sender[1]] = sender
        if inode is not None:
            self._by_inode[inode] = sender
        return sender

    def start(self):
        if self._monitor is None:
            log.info("inbound guard off: this platform does not report what a TCP socket "
                     "received (TCP_INFO)")
            return
        self._thread = threading.Thread(target=self._run, name="pyfleet-inbound", daemon=True)
        self._thread.start()

    def stop(self):
        """Stop watching (idempotent; also for a guard never started). Call it from the
        thread that owns the ROUTER, before closing it: the socket's monitor is taken
        off first (a monitor socket closed while still attached broke the handshakes
        of other sockets of the same context)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._router.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None

    def held(self):
        """``{fd: bytes libzmq holds}`` of every TCP connection watched now (not
        those cut already), less :data:`HANDSHAKE_BYTES`."""
        return {fd: max(0, n - HANDSHAKE_BYTES) for fd, n in self.unread().items()}

    def unread(self):
        """``{fd: bytes libzmq read from it that no received message accounts for}``
        of every TCP connection watched now: its handshake, and what libzmq holds."""
        out = {}
        for fd, c in list(self._conns.items()):
            if c.cut:  # libzmq is letting go of what it held for it
                if not self._same(c):
                    self._forget(c)
                continue
            n = self._unread(c)
            if n is None:
                self._forget(c)
            else:
                out[fd] = n
                c.held = n - HANDSHAKE_BYTES
        return out

    # ------------------------------------------------------------ the watching thread

    def _run(self):
        mon = self._monitor
        try:
            while not self._stop.is_set():
                # No TCP connection (none yet, or peers on Unix sockets only): sleep until
                # the monitor reports one, instead of waking every interval.
                wait = self.interval if self._conns or self._gone else _IDLE_SECONDS
                mon.poll(int(wait * 1000))
                while mon.poll(0):
                    self._event(recv_monitor_message(mon))
                if self._trim_pending:
                    self._trim_pending = False
                    if self.trim is not None:
                        self.trim()
                try:
                    if self._conns:
                        self._look()
                    self._expire()
                except Exception:  # keep watching: a bug here must not end the guard
                    log.exception("inbound guard: a look failed")
        except zmq.ContextTerminated:
            pass

    def _event(self, ev):
        fd = int(ev["value"])
        if ev["event"] == zmq.EVENT_ACCEPTED:
            try:
                inode = os.fstat(fd).st_ino
                probe = socket.socket(fileno=os.dup(fd))
            except OSError:
                return  # gone already
            try:
                if probe.family not in (socket.AF_INET, socket.AF_INET6):
                    return  # a Unix socket (ipc_dir): only this user can reach it
                try:
                    host, port = probe.getpeername()[:2]
                    peer = f"{host}:{port}"
                except OSError:
                    peer = "?"
            finally:
                probe.close()
            self._conns[fd] = _Conn(fd, inode, peer)
        else:
            c = self._conns.get(fd)
            if c is not None and not self._same(c):
                self._forget(c)

    def _forget(self, c):
        """Stop watching connection ``c``; its counter goes a while later (messages it
        sent before it went may still be read)."""
        if self._conns.get(c.fd) is c:
            del self._conns[c.fd]
        if c.cut or c.held >= TRIM_BYTES:
            self._trim_pending = True  # libzmq has let go of what it held for it
        self._gone.append((time.monotonic() + _FORGET_SECONDS, c.inode))

    def _expire(self):
        now = time.monotonic()
        while self._gone and self._gone[0][0] <= now:
            sender = self._by_inode.pop(self._gone.pop(0)[1], None)
            if sender is not None:
                self._senders.pop(sender[1], None)
        if len(self._senders) > 2 * len(self._conns) + 256:
            # peers never watched (Unix sockets): their counters go once they are old
            watched = {c.inode for c in self._conns.values()}
            for sender in list(self._senders.values()):
                if sender[2] not in watched and sender[3] + _FORGET_SECONDS < now:
                    self._senders.pop(sender[1], None)
                    self._by_inode.pop(sender[2], None)

    def _same(self, c):
        try:
            return os.fstat(c.fd).st_ino == c.inode
        except OSError:
            return False

    def _unread(self, c):
        """What :meth:`unread` says of connection ``c``; None when it is gone."""
        if not self._same(c):
            return None
        info = ctypes.create_string_buffer(_TCP_INFO_SIZE)
        size = ctypes.c_uint32(_TCP_INFO_SIZE)
        if _LIBC.getsockopt(c.fd, socket.IPPROTO_TCP, socket.TCP_INFO, info,
                            ctypes.byref(size)) != 0 or size.value < _TCP_INFO_RECEIVED + 8:
            return None
        received = struct.unpack_from("<Q", info.raw, _TCP_INFO_RECEIVED)[0]
        waiting = ctypes.c_int(0)
        if _LIBC.ioctl(c.fd, _SIOCINQ, ctypes.byref(waiting)) != 0:
            return None
        sender = self._by_inode.get(c.inode)
        return received - waiting.value - (0 if sender is None else sender[0])

    def _look(self):
        held = self.held()
        total = sum(held.values())
        limit = self.max_message_bytes + FRAMING_SLACK
        for fd, h in held.items():
            if h > limit:
                self._cut(fd, h, f"it holds more than max_message_bytes="
                                 f"{self.max_message_bytes} of unfinished or unread messages")
                total -= h
                held[fd] = 0
        while total > self.max_buffer_bytes:
            holding = [(h, fd) for fd, h in held.items() if h > 0]
            if len(holding) < 2:
                break
            h, fd = max(holding)
            self._cut(fd, h, f"this server's peers hold {total} bytes of unfinished or unread "
                             f"messages, over max_buffer_bytes={self.max_buffer_bytes}, and "
                             f"it holds the most")
            total -= h
            held[fd] = 0

    def _cut(self, fd, held, why):
        c = self._conns.get(fd)
        if c is None or not self._same(c):
            return
        if _LIBC.shutdown(fd, socket.SHUT_RDWR) != 0 and ctypes.get_errno() != errno.ENOTCONN:
            return
        self.cut += 1
        c.cut = True
        if self.on_cut is not None:
            self.on_cut(c.peer, held, why)

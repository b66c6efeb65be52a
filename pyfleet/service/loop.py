"""A server's socket loop: which thread answers which request (:class:`SocketLoop`).

The thread calling :meth:`SocketLoop.run` owns the ROUTER socket (the
endpoint). It answers the requests of a training step itself (at most
``inline_limit`` floats of keys x dim, and cheap control ops): they then cost
no thread hand-off. Larger requests, and save/load/shrink/create_tables/
export, go over inproc PUSH/PULL sockets to ``handler_threads`` Python threads
that call into the C++ tables (which release the GIL), so the big pulls and
pushes of different workers run in parallel; their replies come back the same
way and leave through the ROUTER. Every pass of the loop (at least every
100 ms) calls ``tick(router)``, where the server fails barriers and decides
to give up.

Replies leave through :meth:`reply`, which never blocks: a reply for a peer
whose outbound queue is full (``SNDHWM`` replies unread) waits in a backlog
of at most ``max_backlog_bytes`` for that peer (a burst of small replies
outruns the I/O thread's accounting); beyond it, or for a peer
that is gone, a reply is dropped and reported, so a client that never reads
its replies cannot grow the server.

One byte budget, ``max_buffer_bytes``, bounds what every peer together can
make the server hold: the large replies (frames of at least
``wire.COPY_LIMIT``, sent without a copy and tracked until libzmq lets go of
them) and the backlogs of all peers, and the requests handed to the handler
threads and not yet answered. A large reply that does not fit is dropped and
reported, unless its peer holds nothing yet (a client that reads its replies
always gets the next one); while the requests in the handlers exceed the
budget, the ROUTER is not read (libzmq keeps at most ``wire.RCVHWM`` requests
a peer, then stops reading that peer's connection). What libzmq itself holds
for the TCP peers (messages not yet whole, or not yet read) is bounded by the
same budget through ``guard`` (:class:`pyfleet.service.inbound.InboundRelay`),
to which every message read from the ROUTER is counted, together with the
requests in the handler threads.

Once a message of at least :data:`TRIM_BYTES` is let go (served or refused),
the loop asks the C library to give its free memory back to the system
(glibc's ``malloc_trim``): libzmq receives a frame under glibc's mmap
threshold (which rises up to 32 MiB as large blocks are freed) into a heap
that free() keeps, so a refused message of many 1 MiB frames stayed in the
server's RSS after its refusal.

Not thread-safe beyond that: :meth:`run` once, from one thread; the
``done`` event (set from anywhere) ends it.
"""

import ctypes
import ctypes.util
import struct
import threading
import time
from collections import deque

import numpy as np
import zmq

from pyfleet.service import protocol as P
from pyfleet.service import wire as Z
from pyfleet.service.protocol import Op

__all__ = ["INLINE_LIMIT", "TRIM_BYTES", "SocketLoop", "give_back_memory"]

# Requests of at most this many floats are answered by the ROUTER thread: a
# training step's requests (a client chunk of 32768 keys x dim 16, every dense
# block of a server) then cost no inproc hand-off (two thread wake-ups, and
# the zero-copy frames' garbage-collector wake-ups): ~10-20% less server CPU
# for the reference DNN. Bigger ones go to the handler threads in parallel.
INLINE_LIMIT = 1 << 19
# Messages read from one socket before the loop's tick runs again.
_DRAIN = 256
# How long run() waits at exit for a handler busy with (say) a save.
_HANDLER_JOIN_SECONDS = 30.0
_BACKLOG_FLUSH_SECONDS = 5.0   # at exit: how long replies parked for slow peers may wait
# op (u8 at 5), count (u64 at 24), dim (u32 at 32) of a header, read without decoding it all.
_PEEK = struct.Struct("<5xB18xQI")
# Ops whose header dim is a block count, not a row width: their size is count.
_DENSE_MANY_OPS = frozenset({int(Op.PULL_DENSE_MANY), int(Op.PUSH_DENSE_MANY)})
# Control ops that may take long: never answered by the ROUTER thread.
_HANDLER_OPS = frozenset({int(Op.SAVE), int(Op.LOAD), int(Op.SHRINK), int(Op.CREATE_TABLES),
                          int(Op.EXPORT_SPARSE)})


# A message of at least this many bytes, once let go, is followed by malloc_trim.
TRIM_BYTES = 32 << 20


def _malloc_trim():
    """glibc's ``malloc_trim(0)`` (a no-op elsewhere): free pages of every
    arena go back to the system (a walk of the free lists: cheap beside the
    message that freed them)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


give_back_memory = _malloc_trim()


def _nbytes(frames):
    return sum(f.nbytes if isinstance(f, np.ndarray) else len(f) for f in frames)


class SocketLoop:
    """Serve ``router`` (a bound ROUTER socket of context ``ctx``) with
    ``handle(msg) -> [reply frames, ...]`` until ``done`` is set.

    ``name``: a unique inproc address prefix. The inproc sockets are bound
    here; :meth:`close` closes them (after a failed start: :meth:`run`
    closes them itself)."""

    def __init__(self, ctx, router, name, handle, tick, handler_threads, inline_limit, done,
                 on_drop=None, max_backlog_bytes=64 << 20, max_buffer_bytes=256 << 20,
                 guard=None):
        self.ctx, self.router = ctx, router
        self.guard = guard  # an InboundRelay of the router's TCP peers, or None
        if guard is not None:  # requests in the handlers count against the relay's budget
            guard.also_held = lambda: self._busy
        self.on_drop = on_drop
        self.handle, self.tick = handle, tick
        self.handler_threads, self.inline_limit = handler_threads, inline_limit
        self.done = done
        self.max_backlog_bytes = max_backlog_bytes
        # identity -> [deque of (frames, copy, bytes), bytes]: replies its queue had no room for
        self._backlog = {}
        self.max_buffer_bytes = max_buffer_bytes
        self._sent = []           # (tracker, bytes, identity) of large replies libzmq holds
        self._held = {}           # identity -> bytes of its large replies libzmq holds
        self._held_bytes = 0      # all of them, and every peer's backlog
        self._busy = 0            # bytes of requests the handler threads hold
        self._busy_lock = threading.Lock()
        self._work_addr, self._reply_addr = name + "-work", name + "-reply"
        self._work = self._replies = None
        try:
            self._work = self._inproc(zmq.PUSH, self._work_addr)
            self._replies = self._inproc(zmq.PULL, self._reply_addr)
        except BaseException:
            self.close()
            raise

    def close(self):
        for sock in (self._work, self._replies):
            if sock is not None:
                sock.close(linger=0)

    def _inproc(self, kind, addr, bind=True):
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 1000)
        (sock.bind if bind else sock.connect)(addr)
        return sock

    def run(self, on_exit):
        """Serve until ``done`` is set. Then ``on_exit()`` runs once the
        handler threads have stopped (or ``_HANDLER_JOIN_SECONDS`` passed),
        the last replies are sent and the sockets closed. Returns whether
        every handler thread ended."""
        handlers = [threading.Thread(target=self._handler_loop, name=f"pyfleet-handler-{i}",
                                     daemon=True) for i in range(self.handler_threads)]
        for t in handlers:
            t.start()
        guard = self.guard
        count = guard.count if guard is not None else None
        if guard is not None:
            guard.start()
        front, replies = self.router, self._replies
        try:
            while not self.done.is_set():
                # Read what is waiting (up to _DRAIN messages a socket) before
                # tick judges anyone's liveness: after a stall, the heartbeats
                # queued meanwhile are heard first.
                if self._backlog:
                    self._flush_backlog()
                # Requests the handlers hold past the budget: answer those before reading more.
                reading = self._busy <= self.max_buffer_bytes
                if guard is not None:
                    guard.reading = reading   # a peer held back by a slow server is not stalled
                    guard.passes += 1
                socks = [front, replies] if reading else [replies]
                for sock in Z.readable(socks, 5 if self._backlog else 100):
                    for _ in range(_DRAIN):
                        try:
                            msg = Z.recv_frames(sock, Z.NOBLOCK)
                        except zmq.Again:
                            break
                        if sock is replies:
                            self.reply(msg, copy=False)
                            continue
                        if count is not None:
                            count(msg)
                        if self._inline(msg):
                            for out in self.handle(msg):
                                self.reply(out)
                            if _nbytes(msg) >= TRIM_BYTES:  # a forged header: count 1
                                del msg
                                give_back_memory()
                        else:
                            size = _nbytes(msg)
                            with self._busy_lock:
                                self._busy += size
                            Z.send_frames(self._work, msg, copy=False)
                            # The handler may be done with it first: whichever lets go last
                            # frees its frames, so both give the memory back.
                            del msg
                            if size >= TRIM_BYTES:
                                give_back_memory()
                            if self._busy > self.max_buffer_bytes:
                                break  # the handlers hold the budget: no more until they answer
                self.tick(front)
        finally:
            self.done.set()
            if guard is not None:
                guard.detach()   # its monitor off the ROUTER before the ROUTER closes
            for t in handlers:
                t.join(_HANDLER_JOIN_SECONDS)
            on_exit()
            while Z.readable([replies], 0):
                self.reply(Z.recv_frames(replies), copy=False)
            # Replies parked for a peer whose queue was full (an async worker reads
            # its acks late) go too: its last STOP_WORKER answer may be among them.
            deadline = time.monotonic() + _BACKLOG_FLUSH_SECONDS
            while self._backlog and time.monotonic() < deadline:
                self._flush_backlog()
                if self._backlog:
                    time.sleep(0.005)
            front.close(linger=int(_BACKLOG_FLUSH_SECONDS * 1000))   # the queued ones
            if guard is not None:   # which reach TCP peers through the relay
                guard.stop(drain=_BACKLOG_FLUSH_SECONDS + 1)
            self._work.close(linger=0)
            replies.close(linger=0)
        return not any(t.is_alive() for t in handlers)

    def reply(self, frames, copy=None):
        """Send one reply through the ROUTER without ever blocking. A reply
        the peer's queue has no room for (``SNDHWM`` with ``ROUTER_MANDATORY``)
        waits in that peer's backlog (sent by later passes of the loop, in
        order); one beyond a full backlog (a client that does not read its
        replies), or whose peer is gone, is dropped and reported to
        ``on_drop(reason, identity)``. So at most twice ``SNDHWM`` replies
        wait for one peer."""
        ident = bytes(frames[0])
        parked = self._backlog.get(ident)
        size = _nbytes(frames)
        if size >= Z.COPY_LIMIT and (self._held.get(ident) or parked) and \
                self._unsent() + size > self.max_buffer_bytes:
            self._drop(f"this server's buffer budget max_buffer_bytes={self.max_buffer_bytes} "
                       f"is full (replies its peers have not read)", ident)
            return
        if parked is None:
            if self._send(frames, copy, ident):
                return
            parked = self._backlog[ident] = [deque(), 0]
        if parked[1] + size > self.max_backlog_bytes:
            self._drop("its peer's reply queue is full (a client that does not read its "
                       "replies)", ident)
            if not parked[0]:
                del self._backlog[ident]
            return
        parked[0].append((frames, copy, size))
        parked[1] += size
        self._held_bytes += size

    def _unsent(self):
        """Bytes of large replies libzmq still holds and of every backlog (the
        trackers of replies that left are let go first)."""
        if self._sent and any(t.done for t, _, _ in self._sent):
            keep = []
            for t, n, ident in self._sent:
                if t.done:
                    self._held_bytes -= n
                    left = self._held[ident] - n
                    if left:
                        self._held[ident] = left
                    else:
                        del self._held[ident]
                else:
                    keep.append((t, n, ident))
            self._sent = keep
        return self._held_bytes

    def _send(self, frames, copy, ident):
        """Whether ``frames`` left (or were dropped: a peer gone); False when
        the peer's queue is full."""
        for attempt in range(2):
            try:
                tracked = []
                Z.send_frames(self.router, frames, copy, Z.NOBLOCK, tracked)
                for t, n in tracked:
                    if not t.done:
                        self._sent.append((t, n, ident))
                        self._held[ident] = self._held.get(ident, 0) + n
                        self._held_bytes += n
                return True
            except zmq.Again:
                # The I/O thread reports what it took from the queue as
                # commands the socket reads lazily: read them, then try again.
                if attempt == 0:
                    self.router.getsockopt(zmq.EVENTS)
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH:
                    raise
                self._drop("its peer is gone", ident)
                return True
        return False

    def _drop(self, why, ident):
        if self.on_drop is not None:
            self.on_drop(why, ident)

    def _flush_backlog(self):
        for ident, parked in list(self._backlog.items()):
            queue = parked[0]
            while queue and self._send(queue[0][0], queue[0][1], ident):
                size = queue.popleft()[2]
                parked[1] -= size
                self._held_bytes -= size
            if not queue:
                del self._backlog[ident]

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

    def _handler_loop(self):
        work = self._inproc(zmq.PULL, self._work_addr, bind=False)
        out = self._inproc(zmq.PUSH, self._reply_addr, bind=False)
        try:
            while not self.done.is_set():
                if Z.readable([work], 100):
                    msg = Z.recv_frames(work)
                    size = _nbytes(msg)
                    try:
                        for reply in self.handle(msg):
                            Z.send_frames(out, reply)
                    finally:
                        del msg  # the request's memory goes before the budget says so
                        if size >= TRIM_BYTES:
                            give_back_memory()
                        with self._busy_lock:
                            self._busy -= size
        finally:
            work.close(linger=0)
            out.close(linger=1000)

"""Thin, fast socket helpers for the service (client and server).

pyzmq's ``send_multipart``/``recv_multipart``/``Socket.poll`` build flag enums
on every call, which costs more than the message itself for a 1-key pull; these
helpers pass plain ints to the same calls. Same semantics: a message's frames
are sent and received atomically. Not thread-safe beyond the socket's own rules
(use a socket from one thread at a time).
"""

import zmq

__all__ = ["readable", "recv_frames", "send_frames"]

_SNDMORE = int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
NOBLOCK = int(zmq.NOBLOCK)


def send_frames(sock, frames, copy, flags=0):
    """Send one multipart message; raises ``zmq.Again`` (nothing sent) when
    ``flags`` has NOBLOCK and the message cannot be queued."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        sock.send(f, flags | _SNDMORE if i < last else flags, copy=copy)


def recv_frames(sock):
    """Receive one whole multipart message as ``zmq.Frame`` objects (no copy)."""
    f = sock.recv(0, copy=False)
    frames = [f]
    while f.more:
        f = sock.recv(0, copy=False)
        frames.append(f)
    return frames


def readable(socks, timeout_ms):
    """The sockets among ``socks`` with a message waiting (waits up to
    ``timeout_ms``; the GIL is released meanwhile)."""
    return [s for s, ev in zmq.zmq_poll([(s, _POLLIN) for s in socks], timeout_ms)
            if ev & _POLLIN]

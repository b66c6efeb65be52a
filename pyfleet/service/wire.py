"""Thin, fast socket helpers for the service (client and server).

pyzmq's ``send_multipart``/``recv_multipart``/``Socket.poll`` build flag enums
on every call, which costs more than the message itself for a 1-key pull; these
helpers pass plain ints to the same calls. Same semantics: a message's frames
are sent and received atomically. Not thread-safe beyond the socket's own rules
(use a socket from one thread at a time).
"""

import numpy as np
import zmq

__all__ = ["COPY_LIMIT", "bind_router", "readable", "recv_frames", "send_frames"]

_SNDMORE = int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
NOBLOCK = int(zmq.NOBLOCK)

# Frames below this size are copied when sent. A zero-copy send makes pyzmq
# track the buffer and release it from its garbage-collector thread, a thread
# wake-up per frame; copying 256 KiB costs about as much, less below.
COPY_LIMIT = 1 << 18


def send_frames(sock, frames, copy=None, flags=0):
    """Send one multipart message; raises ``zmq.Again`` (nothing sent) when
    ``flags`` has NOBLOCK and the message cannot be queued. ``copy``: True or
    False for every frame, or None to copy exactly the frames (numpy arrays,
    bytes) smaller than :data:`COPY_LIMIT`; a ``zmq.Frame`` is never copied.
    A frame sent without a copy must not be modified until it has left."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        c = copy
        if c is None:
            c = (f.nbytes if isinstance(f, np.ndarray) else len(f)) < COPY_LIMIT
        sock.send(f, flags | _SNDMORE if i < last else flags, copy=c)


def recv_frames(sock, flags=0):
    """Receive one whole multipart message as ``zmq.Frame`` objects (no copy).
    ``flags=NOBLOCK``: raise ``zmq.Again`` when none is waiting."""
    f = sock.recv(flags, copy=False)
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


def bind_router(sock, host, port, max_message_bytes, curve_secret_key=None,
                max_queued_replies=16):
    """Set up ROUTER ``sock`` as a server endpoint and bind it to ``host:port``
    (port 0: a free port); returns the port. ``max_message_bytes``: a peer
    sending a larger frame is disconnected; ``curve_secret_key``: the Z85
    secret key of an encrypted (CURVE) endpoint; ``max_queued_replies``:
    replies queued for one peer, beyond which a non-blocking send raises
    ``zmq.Again`` (``ROUTER_MANDATORY``: never a silent drop). Raises
    ``zmq.ZMQError``."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.SNDHWM, max_queued_replies)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.RCVHWM, 0)
    if curve_secret_key is not None:
        # Encrypted, and clients must know this server's public key.
        sock.curve_server = True
        sock.curve_secretkey = _z85(curve_secret_key)
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    sock.bind(f"tcp://{host}:{port}")
    return port


def _z85(key):
    key = key.encode() if isinstance(key, str) else bytes(key)
    if len(key) != 40:
        raise ValueError("a CURVE key must be 40 Z85 characters (zmq.curve_keypair())")
    return key

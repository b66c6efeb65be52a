"""Thin, fast socket helpers for the service (client and server).

pyzmq's ``send_multipart``/``recv_multipart``/``Socket.poll`` build flag enums
on every call, which costs more than the message itself for a 1-key pull; these
helpers pass plain ints to the same calls. Same semantics: a message's frames
are sent and received atomically. Not thread-safe beyond the socket's own rules
(use a socket from one thread at a time).
"""

import os
import socket
import stat
import time

import numpy as np
import zmq

__all__ = ["COPY_LIMIT", "IPC_PATH_MAX", "LISTEN_FD_VAR", "bind_router", "check_ipc_dir",
           "inherited_listener", "ipc_path", "listen", "readable", "recv_frames", "send_frames"]

_SNDMORE = int(zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
NOBLOCK = int(zmq.NOBLOCK)

# Frames below this size are copied when sent. A zero-copy send makes pyzmq
# track the buffer and release it from its garbage-collector thread, a thread
# wake-up per frame; copying 256 KiB costs about as much, less below.
COPY_LIMIT = 1 << 18
# Requests libzmq keeps for one peer before it stops reading that peer.
RCVHWM = 16


def send_frames(sock, frames, copy=None, flags=0, track=None):
    """Send one multipart message; raises ``zmq.Again`` (nothing sent) when
    ``flags`` has NOBLOCK and the message cannot be queued. ``copy``: True or
    False for every frame, or None to copy exactly the frames (numpy arrays,
    bytes) smaller than :data:`COPY_LIMIT`; a ``zmq.Frame`` is never copied.
    A frame sent without a copy must not be modified until it has left.
    ``track``: a list that gets ``(zmq.MessageTracker, bytes)`` of every
    frame sent without a copy (done once libzmq let go of it)."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        n = f.nbytes if isinstance(f, np.ndarray) else len(f)
        c = copy
        if c is None:
            c = n < COPY_LIMIT
        fl = flags | _SNDMORE if i < last else flags
        if track is None or c:
            sock.send(f, fl, copy=c)
            continue
        if isinstance(f, zmq.Frame):  # a received frame has no tracker: a tracked view
            f = zmq.Frame(f.buffer, track=True)
        track.append((sock.send(f, fl, copy=False, track=True), n))


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


# The longest path of a Unix socket (sockaddr_un's sun_path less its NUL).
IPC_PATH_MAX = 107


def ipc_path(ipc_dir, host, port):
    """The Unix socket a server bound to loopback ``host:port`` also listens
    on in ``ipc_dir`` (see :func:`bind_router`)."""
    return os.path.join(ipc_dir, f"{host.strip('[]')}-{int(port)}")


def check_ipc_dir(ipc_dir, what="PYFLEET_IPC_DIR"):
    """``ipc_dir`` if it is a directory of this user that nobody else may enter
    (what admits a peer to its sockets, instead of CURVE keys); else ValueError
    naming ``what``."""
    try:
        st = os.stat(ipc_dir)
    except OSError as e:
        raise ValueError(f"{what}: {ipc_dir!r}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what}: {ipc_dir!r} is not a directory")
    longest = ipc_path(ipc_dir, "255.255.255.255", 65535)
    if len(os.fsencode(longest)) > IPC_PATH_MAX:
        raise ValueError(f"{what}: {ipc_dir!r} is too long for a Unix socket's path "
                         f"({longest!r} would exceed {IPC_PATH_MAX} bytes)")
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ValueError(f"{what}: {ipc_dir!r} must belong to this user with no access for "
                         f"group or others (mode 0700; it is {stat.S_IMODE(st.st_mode):04o}): "
                         f"its sockets admit whoever can enter it, without CURVE keys")
    return ipc_dir


def bind_router(sock, host, port, max_message_bytes, curve_secret_key=None,
                max_queued_replies=16, ipc_dir=None, listen_fd=None, relay_path=None):
    """Set up ROUTER ``sock`` as a server endpoint and bind it to ``host:port``
    (port 0: a free port); returns the port. ``max_message_bytes``: a peer
    sending a larger frame is disconnected; ``curve_secret_key``: the Z85
    secret key of an encrypted (CURVE) endpoint; ``max_queued_replies``:
    replies queued for one peer, beyond which a non-blocking send raises
    ``zmq.Again`` (``ROUTER_MANDATORY``: never a silent drop); ``listen_fd``:
    a TCP socket already bound to ``host:port`` and listening (a launcher's,
    inherited), which the ROUTER accepts on instead of binding anew
    (``ZMQ_USE_FD``; the port stays held between a server's death and its
    restart). Raises ``zmq.ZMQError``.

    ``ipc_dir`` (checked by :func:`check_ipc_dir`) with a loopback ``host``:
    the socket also listens on :func:`ipc_path` in it, in the clear (the
    directory's permissions admit its peers; nothing leaves the machine):
    processes on one machine skip TCP and CURVE's encryption.

    ``relay_path``: the TCP endpoint is a relay's (:mod:`pyfleet.service.inbound`,
    which listens on ``host:port`` itself): the socket listens on this Unix socket
    path instead, with the TCP endpoint's CURVE settings."""
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.SNDHWM, max_queued_replies)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # Requests read but not yet taken by the server: at most this many a peer, then
    # libzmq stops reading that peer's connection (TCP pushes back on it).
    sock.setsockopt(zmq.RCVHWM, RCVHWM)
    if curve_secret_key is not None:
        # Encrypted, and clients must know this server's public key.
        sock.curve_server = True
        sock.curve_secretkey = _z85(curve_secret_key)
    if relay_path is not None:
        sock.bind("ipc://" + relay_path)
    elif listen_fd is not None:
        sock.setsockopt(zmq.USE_FD, listen_fd)
        sock.bind(f"tcp://{host}:{port}")
        sock.setsockopt(zmq.USE_FD, -1)  # an option of every later bind: not the ipc one
    elif port == 0:
        port = sock.bind_to_random_port(f"tcp://{host}")
    else:
        sock.bind(f"tcp://{host}:{port}")
    if ipc_dir is not None:
        # Options are taken by each bind: the TCP endpoint keeps CURVE.
        sock.curve_server = False
        sock.bind("ipc://" + ipc_path(ipc_dir, host, port))
    return port


def listen(host, port, fd=None):
    """A TCP socket listening on ``host:port`` (``*``: every IPv4 address; port 0: a
    free one) as libzmq would bind it, or on the listening socket ``fd`` (a
    launcher's), non-blocking. Raises OSError."""
    if fd is not None:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        return sock
    name = "0.0.0.0" if host == "*" else host.strip("[]")
    family, kind, proto, _, addr = socket.getaddrinfo(
        name, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq does
        sock.bind(addr)
        sock.listen(100)   # libzmq's ZMQ_BACKLOG default
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def wait_released(host, port, seconds=2.0):
    """Wait (at most ``seconds``) until nothing listens on ``host:port`` any more: a
    closed socket of a shared ZeroMQ context lets go of its port in the context's I/O
    thread, a moment after ``close()`` returns. Returns whether the port is free."""
    deadline = time.monotonic() + seconds
    while True:
        probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as libzmq binds
            probe.bind((host, port))
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        finally:
            probe.close()
        time.sleep(0.01)  # polling the kernel's socket table: no event says "unbound"


LISTEN_FD_VAR = "PYFLEET_LISTEN_FD"


def inherited_listener(port, env=None):
    """The file descriptor a launcher passed for this server's endpoint
    (``PYFLEET_LISTEN_FD``: a TCP socket bound and listening), when it is
    bound to ``port``; else None. Taken once: the variable is removed."""
    env = os.environ if env is None else env
    text = env.get(LISTEN_FD_VAR, "").strip()
    if not text or not port:
        return None
    try:
        fd = int(text)
        probe = socket.socket(fileno=os.dup(fd))
    except (ValueError, OSError):
        return None
    try:
        bound = probe.getsockname()[1] if probe.type == socket.SOCK_STREAM else None
    except OSError:
        bound = None
    finally:
        probe.close()
    if bound != port:
        return None
    env.pop(LISTEN_FD_VAR, None)
    return fd


def _z85(key):
    key = key.encode() if isinstance(key, str) else bytes(key)
    if len(key) != 40:
        raise ValueError("a CURVE key must be 40 Z85 characters (zmq.curve_keypair())")
    return key

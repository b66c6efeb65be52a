"""The environment contract every role gets (docs/fleet.md), and free ports for the servers."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence

from pyfleet.endpoint import split_endpoint

EXIT_TIMEOUT = 124


# Every variable the launcher owns; inherited values are dropped so a nested launch (or a
# shell with a stale export) cannot leak a role into the wrong process.
CONTRACT_VARS = (
    "PYFLEET_ROLE", "PYFLEET_SERVER_ENDPOINTS", "PYFLEET_WORKER_NUM", "PYFLEET_WORKER_INDEX",
    "PYFLEET_SERVER_INDEX", "TRAINING_ROLE", "PADDLE_TRAINING_ROLE",
    "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_PSERVERS", "PADDLE_PORT", "PADDLE_TRAINERS_NUM",
    "PADDLE_TRAINER_ID", "POD_IP", "PYFLEET_LISTEN_FD", "PYFLEET_JOB_TOKEN",
)
# Forwarded by mpirun to roles on other hosts besides PYFLEET_* (its ``-x NAME``).
FORWARD_VARS = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED",
                "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "HOME")
LISTEN_FD_VAR = "PYFLEET_LISTEN_FD"  # pyfleet.service.wire.inherited_listener reads it


def hold_endpoints(n: int, host: str, endpoints: Sequence[str] | None = None):
    """``(endpoints, {server index: listening socket})``: the launcher binds each
    server's port itself and keeps it for the whole job (every attempt), and
    each server process accepts on an inherited copy (``PYFLEET_LISTEN_FD``).
    So no other process can take a dead server's port before its restart, and
    ``endpoints=None`` (free ports on ``host``) has no window between choosing a
    port and binding it. A given endpoint this process cannot bind (an address
    of another host or namespace, a port taken already) is not held: its
    server binds it itself, as before. The caller closes the sockets."""
    held = {}
    try:
        if endpoints is None:
            out = []
            for i in range(n):
                held[i] = _listen(host, 0)
                out.append(f"{host}:{held[i].getsockname()[1]}")
            return tuple(out), held
        for i, ep in enumerate(endpoints):
            h, port = split_endpoint(ep, "server endpoint")
            with contextlib.suppress(OSError):
                held[i] = _listen(h, port)
        return tuple(endpoints), held
    except BaseException:
        for sock in held.values():
            sock.close()
        raise


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As libzmq binds: a restarted server's port must not wait out TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
    except BaseException:
        sock.close()
        raise
    return sock


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` a moment ago (held open until all are
    chosen, then released: another program could take one before a server binds it)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def role_env(role: str, index: int, server_endpoints: Sequence[str], worker_num: int,
             mode: str | None = None) -> dict[str, str]:
    """The environment contract for one role (``role`` is ``"server"`` or ``"worker"``)."""
    eps = ",".join(server_endpoints)
    env = {"PYFLEET_ROLE": role, "PYFLEET_SERVER_ENDPOINTS": eps,
           "PYFLEET_WORKER_NUM": str(worker_num),
           "TRAINING_ROLE": "PSERVER" if role == "server" else "TRAINER",
           "PADDLE_PSERVERS_IP_PORT_LIST": eps, "PADDLE_TRAINERS_NUM": str(worker_num)}
    if role == "server":
        host, port = split_endpoint(server_endpoints[index], "server endpoint")
        env.update(PYFLEET_SERVER_INDEX=str(index), POD_IP=host, PADDLE_PORT=str(port))
    elif role == "worker":
        env.update(PYFLEET_WORKER_INDEX=str(index), PADDLE_TRAINER_ID=str(index))
    else:
        raise ValueError(f"role must be 'server' or 'worker', got {role!r}")
    if mode is not None:
        env["PYFLEET_MODE"] = mode
    return env

"""The environment contract every role gets (docs/fleet.md), and free ports for the servers."""

from __future__ import annotations

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
    "PADDLE_TRAINER_ID", "POD_IP",
)


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

"""The resolved role of a process and the base of the role makers
(:mod:`pyfleet.distributed.role_maker` has the role makers themselves and their contract)."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

from pyfleet.errors import ConfigError, NoRoleError

__all__ = ["MPI_ENV_VARS", "NoRoleError", "Role", "RoleInfo", "RoleMakerBase"]

# Variables that an MPI launcher sets in each rank: OpenMPI, MPICH/Intel MPI (Hydra), PMIx.
MPI_ENV_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class Role(enum.IntEnum):
    """The role of a process; the values are Fluid's (``Role.WORKER == 1``)."""

    WORKER = 1
    SERVER = 2


@dataclass(frozen=True)
class RoleInfo:
    """A resolved role: immutable, so it can be shared between threads."""

    role: Role
    index: int
    worker_num: int
    server_endpoints: tuple[str, ...]
    current_endpoint: str | None
    collective: bool = False  # a collective (MPI all-reduce) rank: no servers
    worker_endpoints: tuple[str, ...] = ()

    def describe(self) -> str:
        name = "worker" if self.role == Role.WORKER else "server"
        return f"{name} {self.index}"


class RoleMakerBase:
    """Base of the role makers. Subclasses implement :meth:`_resolve`.

    The getters resolve the role on first use (see the module docstring); calling
    :meth:`generate_role` explicitly is only needed to surface configuration errors early or
    to run an MPI collective at a known point.
    """

    def __init__(self):
        self._info: RoleInfo | None = None
        self._lock = threading.Lock()

    def _resolve(self) -> RoleInfo:
        raise NotImplementedError("a role maker implements _resolve() -> RoleInfo")

    def generate_role(self) -> None:
        """Resolve, validate and freeze the role. Idempotent."""
        with self._lock:
            if self._info is None:
                info = self._resolve()
                _validate(info, type(self).__name__)
                self._info = info

    @property
    def info(self) -> RoleInfo:
        """The frozen :class:`RoleInfo` (resolving it first if needed)."""
        if self._info is None:
            self.generate_role()
        return self._info

    def is_worker(self) -> bool:
        return self.info.role == Role.WORKER

    def is_server(self) -> bool:
        return self.info.role == Role.SERVER

    def is_first_worker(self) -> bool:
        """True for worker 0, the one that saves the model in Fleet."""
        return self.info.role == Role.WORKER and self.info.index == 0

    def worker_index(self) -> int:
        """This worker's index in ``[0, worker_num())``. On a server, as in Fluid
        (whose role makers return their ``current_id``), the server's index."""
        return self.info.index

    def server_index(self) -> int:
        """This server's index in ``[0, server_num())``; ConfigError on a worker."""
        info = self.info
        if info.role != Role.SERVER:
            raise ConfigError(f"server_index() asked of a worker (this process is "
                              f"{info.describe()}); check is_server() first")
        return info.index

    def worker_num(self) -> int:
        return self.info.worker_num

    def server_num(self) -> int:
        return len(self.info.server_endpoints)

    def server_endpoints(self) -> list[str]:
        """Every server's ``host:port``, in server-index order (a new list)."""
        return list(self.info.server_endpoints)

    def worker_endpoints(self) -> list[str]:
        """``PYFLEET_WORKER_ENDPOINTS`` or Fluid's ``PADDLE_TRAINER_ENDPOINTS``, split
        at commas; ``[]`` when unset, as in Fluid (pyfleet's workers listen on no port)."""
        return list(self.info.worker_endpoints)

    def get_trainer_endpoints(self) -> list[str]:
        """Fluid's name for :meth:`worker_endpoints`."""
        return self.worker_endpoints()

    def get_pserver_endpoints(self) -> list[str]:
        """Fluid's name for :meth:`server_endpoints`."""
        return self.server_endpoints()

    def current_endpoint(self) -> str | None:
        """A server's own ``host:port`` (its entry in :meth:`server_endpoints`); None on a worker."""
        return self.info.current_endpoint

    def to_string(self) -> str:
        info = self.info
        return (f"role: {'worker' if info.role == Role.WORKER else 'server'}, "
                f"index: {info.index}, worker_num: {info.worker_num}, "
                f"server_endpoints: {list(info.server_endpoints)}")

    def __repr__(self):
        if self._info is None:
            return f"<{type(self).__name__} (role not generated yet)>"
        return f"<{type(self).__name__} {self.to_string()}>"


def _validate(info: RoleInfo, who: str) -> None:
    if not isinstance(info, RoleInfo):
        raise TypeError(f"{who}._resolve() must return a RoleInfo, got {info!r}")
    if info.worker_num < 1:
        raise ConfigError(f"{who}: worker_num must be >= 1, got {info.worker_num}")
    if not info.server_endpoints and not info.collective:
        raise ConfigError(f"{who}: at least one server endpoint is needed")
    limit = info.worker_num if info.role == Role.WORKER else len(info.server_endpoints)
    if not 0 <= info.index < limit:
        kind = "worker" if info.role == Role.WORKER else "server"
        raise ConfigError(f"{who}: {kind} index {info.index} is out of range: there are "
                          f"{limit} {kind}s (indices 0..{limit - 1})")
    if info.role == Role.SERVER and info.current_endpoint != info.server_endpoints[info.index]:
        raise ConfigError(f"{who}: server {info.index}'s endpoint {info.current_endpoint!r} "
                          f"is not entry {info.index} of {list(info.server_endpoints)}")


def _as_role(value, what: str) -> Role:
    if isinstance(value, str):
        key = value.strip().lower()
        if key in ("worker", "trainer"):
            return Role.WORKER
        if key in ("server", "pserver"):
            return Role.SERVER
    elif not isinstance(value, bool) and value in (Role.WORKER, Role.SERVER):
        return Role(value)
    raise ConfigError(f"{what} must be Role.WORKER or Role.SERVER, got {value!r}")


def _as_int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value}")
    return value

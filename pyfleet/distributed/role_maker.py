"""Role makers: which role (worker or server) this process plays, and who its peers are.

The classes and method names are Fluid 1.5's (``paddle.fluid.incubate.fleet.base.role_maker``):

- :class:`UserDefinedRoleMaker`: everything given as arguments.
- :class:`PaddleCloudRoleMaker`: read from environment variables (Kubernetes, PaddleCloud, the
  pyfleet launcher). pyfleet's own ``PYFLEET_*`` names and the PaddleCloud names are both
  understood; pyfleet's win when both are set. The table is in ``docs/fleet.md``.
- :class:`MPISymetricRoleMaker`: under ``mpirun`` through mpi4py; even ranks are servers,
  odd ranks workers (one of each per node), server ``i`` and worker ``i`` being ranks ``2i``
  and ``2i + 1``.
- :func:`default_role_maker`: what ``fleet.init()`` uses without an argument.

Contract shared by every role maker: the role is resolved once, by :meth:`generate_role`
(called by ``fleet.init``, or lazily by the first getter), validated, and frozen; later getters
never read the environment again. After that, every getter is thread-safe and non-blocking.
A missing or malformed setting raises :class:`~pyfleet.errors.ConfigError` (a ``ValueError``)
naming the argument or variable and what to set. ``MPISymetricRoleMaker.generate_role`` is an
MPI collective: every rank must call it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

import numpy as np

from pyfleet._extras import install_hint
from pyfleet.distributed.role_info import (
    MPI_ENV_VARS,
    NoRoleError,
    Role,
    RoleInfo,
    RoleMakerBase,
    _as_int,
    _as_role,
)
from pyfleet.endpoint import check_endpoint as _check_endpoint
from pyfleet.endpoint import parse_endpoints
from pyfleet.errors import ConfigError

__all__ = [
    "MPI_ENV_VARS",
    "MPISymetricRoleMaker",
    "PaddleCloudRoleMaker",
    "Role",
    "RoleInfo",
    "RoleMakerBase",
    "UserDefinedCollectiveRoleMaker",
    "UserDefinedRoleMaker",
    "default_role_maker",
    "parse_endpoints",
]

class UserDefinedRoleMaker(RoleMakerBase):
    """A role given by the caller, with Fluid's signature.

    ``current_id``: this worker's or server's index; ``role``: :class:`Role`;
    ``worker_num``: number of workers in the job (>= 1); ``server_endpoints``: list of
    ``"host:port"``, one per server, in server-index order. Validated here, at construction.
    """

    def __init__(self, current_id: int = 0, role: Role = Role.WORKER, worker_num: int = 0,
                 server_endpoints: Sequence[str] | None = None):
        super().__init__()
        current_id = _as_int(current_id, "current_id", 0)
        role = _as_role(role, "role")
        worker_num = _as_int(worker_num, "worker_num", 1)
        if server_endpoints is None:
            raise ConfigError("server_endpoints is required: a list of 'host:port', "
                              "one per server")
        if isinstance(server_endpoints, str):
            raise ConfigError("server_endpoints must be a list of 'host:port' strings, "
                              f"got the string {server_endpoints!r}")
        eps = parse_endpoints(server_endpoints, "server_endpoints")
        limit = worker_num if role == Role.WORKER else len(eps)
        if current_id >= limit:
            kind = ("worker_num" if role == Role.WORKER
                    else "len(server_endpoints)")
            raise ConfigError(f"current_id={current_id} is out of range for a "
                              f"{role.name.lower()}: it must be < {kind} = {limit}")
        self._given = RoleInfo(role, current_id, worker_num, eps,
                               eps[current_id] if role == Role.SERVER else None)

    def _resolve(self) -> RoleInfo:
        return self._given


class UserDefinedCollectiveRoleMaker(RoleMakerBase):
    """Fluid's collective role given by the caller: ``current_id`` (this worker's
    index) and ``worker_endpoints`` (one ``"host:port"`` per worker, no duplicate),
    validated here. pyfleet's collective mode all-reduces among MPI ranks
    (docs/collective.md): ``fleet.init(role)`` of the collective fleet checks that
    this process is MPI rank ``current_id`` of ``len(worker_endpoints)``."""

    def __init__(self, current_id: int = 0, worker_endpoints: Sequence[str] | None = None):
        super().__init__()
        if worker_endpoints is None or isinstance(worker_endpoints, str):
            raise ConfigError(f"worker_endpoints must be a list of 'host:port' strings, "
                              f"got {worker_endpoints!r}")
        eps = parse_endpoints(worker_endpoints, "worker_endpoints")
        current_id = _as_int(current_id, "current_id", 0)
        if current_id >= len(eps):
            raise ConfigError(f"current_id={current_id} is out of range: it must be < "
                              f"len(worker_endpoints) = {len(eps)}")
        self._given = RoleInfo(Role.WORKER, current_id, len(eps), (), None, collective=True,
                               worker_endpoints=eps)

    def _resolve(self) -> RoleInfo:
        return self._given


def _env_get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def _env_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env[name].strip()
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def _first_set(env: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        if _env_get(env, name) is not None:
            return name
    return None


class PaddleCloudRoleMaker(RoleMakerBase):
    """A role read from environment variables (see the table in ``docs/fleet.md``).

    +-----------------+-------------------------------+----------------------------------------+
    | what            | pyfleet's name (wins)         | PaddleCloud's name(s)                  |
    +=================+===============================+========================================+
    | role            | PYFLEET_ROLE=worker|server    | TRAINING_ROLE (or PADDLE_TRAINING_ROLE)|
    |                 |                               | =TRAINER|PSERVER                       |
    | servers         | PYFLEET_SERVER_ENDPOINTS      | PADDLE_PSERVERS_IP_PORT_LIST, or       |
    |                 |                               | PADDLE_PSERVERS (IPs) + PADDLE_PORT    |
    | worker count    | PYFLEET_WORKER_NUM            | PADDLE_TRAINERS_NUM                    |
    | worker index    | PYFLEET_WORKER_INDEX          | PADDLE_TRAINER_ID (else the MPI rank)  |
    | server index    | PYFLEET_SERVER_INDEX          | position of POD_IP:PADDLE_PORT in the  |
    |                 |                               | server list                            |
    +-----------------+-------------------------------+----------------------------------------+

    ``env`` (default ``os.environ``) is read once, by :meth:`generate_role`.
    ``is_collective=True`` (Fluid's collective mode): every process is a worker, its index
    and the worker count are its rank and size in MPI's ``COMM_WORLD`` (docs/collective.md).
    """

    def __init__(self, is_collective: bool = False, env: Mapping[str, str] | None = None):
        super().__init__()
        self._is_collective = bool(is_collective)
        self._env = env

    def _resolve(self) -> RoleInfo:
        env = dict(os.environ if self._env is None else self._env)
        if self._is_collective:
            return collective_role(env)
        role = self._read_role(env)
        eps = self._read_endpoints(env)
        worker_num = self._read_required_int(env, ("PYFLEET_WORKER_NUM", "PADDLE_TRAINERS_NUM"),
                                             1, "the number of workers in the job")
        if role == Role.WORKER:
            names = ("PYFLEET_WORKER_INDEX", "PADDLE_TRAINER_ID")
            if _first_set(env, names) is None and _first_set(env, MPI_ENV_VARS) is not None:
                index = _import_mpi().COMM_WORLD.Get_rank()  # hybrid workers: one MPI job
            else:
                index = self._read_required_int(env, names, 0, "this worker's index, 0..workers-1")
            if index >= worker_num:
                name = _first_set(env, names) or "the MPI rank"
                num_name = _first_set(env, ("PYFLEET_WORKER_NUM", "PADDLE_TRAINERS_NUM"))
                raise ConfigError(f"{name}={index} is out of range: {num_name}={worker_num} "
                                  f"(indices 0..{worker_num - 1})")
            return RoleInfo(role, index, worker_num, eps, None,
                            worker_endpoints=self._read_worker_endpoints(env))
        index = self._read_server_index(env, eps)
        return RoleInfo(role, index, worker_num, eps, eps[index],
                        worker_endpoints=self._read_worker_endpoints(env))

    @staticmethod
    def _read_worker_endpoints(env) -> tuple[str, ...]:
        name = _first_set(env, ("PYFLEET_WORKER_ENDPOINTS", "PADDLE_TRAINER_ENDPOINTS"))
        if name is None:
            return ()
        return tuple(e.strip() for e in env[name].split(",") if e.strip())

    @staticmethod
    def _read_role(env) -> Role:
        if _env_get(env, "PYFLEET_ROLE") is not None:
            raw = env["PYFLEET_ROLE"].strip().lower()
            if raw not in ("worker", "server"):
                raise ConfigError(f"PYFLEET_ROLE={env['PYFLEET_ROLE']!r}: set it to worker "
                                  "or server")
            return Role.WORKER if raw == "worker" else Role.SERVER
        name = _first_set(env, ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE"))
        if name is None:
            raise NoRoleError("no role in the environment: set PYFLEET_ROLE=worker|server "
                              "(or Paddle's TRAINING_ROLE=TRAINER|PSERVER)")
        raw = env[name].strip().upper()
        if raw not in ("TRAINER", "PSERVER"):
            raise ConfigError(f"{name}={env[name]!r}: set it to TRAINER or PSERVER")
        return Role.WORKER if raw == "TRAINER" else Role.SERVER

    @staticmethod
    def _read_endpoints(env) -> tuple[str, ...]:
        name = _first_set(env, ("PYFLEET_SERVER_ENDPOINTS", "PADDLE_PSERVERS_IP_PORT_LIST"))
        if name is not None:
            return parse_endpoints(env[name], name)
        if _env_get(env, "PADDLE_PSERVERS") is not None:
            ips = [ip.strip() for ip in env["PADDLE_PSERVERS"].split(",")]
            port = _env_get(env, "PADDLE_PORT")
            if port is None:
                raise ConfigError("PADDLE_PSERVERS is set without PADDLE_PORT: set PADDLE_PORT "
                                  "(one port, or one per server), or give full endpoints in "
                                  "PYFLEET_SERVER_ENDPOINTS=host:port,...")
            ports = [p.strip() for p in port.split(",")]
            if len(ports) == 1:
                ports = ports * len(ips)
            if len(ports) != len(ips):
                raise ConfigError(f"PADDLE_PORT has {len(ports)} ports for {len(ips)} servers "
                                  "in PADDLE_PSERVERS")
            return parse_endpoints([f"{ip}:{p}" for ip, p in zip(ips, ports)],
                                   "PADDLE_PSERVERS/PADDLE_PORT")
        raise ConfigError("no server endpoints in the environment: set "
                          "PYFLEET_SERVER_ENDPOINTS=host:port,host:port (or Paddle's "
                          "PADDLE_PSERVERS_IP_PORT_LIST)")

    @staticmethod
    def _read_required_int(env, names, minimum: int, meaning: str) -> int:
        name = _first_set(env, names)
        if name is None:
            raise ConfigError(f"{names[0]} is not set: set it to {meaning} "
                              f"(or Paddle's {names[1]})")
        return _env_int(env, name, minimum)

    @staticmethod
    def _read_server_index(env, eps: tuple[str, ...]) -> int:
        if _env_get(env, "PYFLEET_SERVER_INDEX") is not None:
            index = _env_int(env, "PYFLEET_SERVER_INDEX", 0)
            if index >= len(eps):
                raise ConfigError(f"PYFLEET_SERVER_INDEX={index} is out of range: there are "
                                  f"{len(eps)} server endpoints (indices 0..{len(eps) - 1})")
            return index
        pod_ip, port = _env_get(env, "POD_IP"), _env_get(env, "PADDLE_PORT")
        if pod_ip is None or port is None:
            raise ConfigError("a server needs its index: set PYFLEET_SERVER_INDEX, or POD_IP "
                              "and PADDLE_PORT (its own endpoint, which must be in the server "
                              "list)")
        own = _check_endpoint(f"{pod_ip}:{port}", "POD_IP:PADDLE_PORT")
        if own not in eps:
            raise ConfigError(f"this server's endpoint POD_IP:PADDLE_PORT = {own} is not in the "
                              f"server list {list(eps)}: fix the list, or set "
                              "PYFLEET_SERVER_INDEX")
        return eps.index(own)


def _import_mpi():
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")  # see pyfleet.distributed.mpi_group
    try:  # an optional dependency (the mpi extra): imported by the MPI role maker only
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(f"MPI roles and collective mode need mpi4py and an MPI library: "
                          f"{install_hint('mpi')}, and run under mpirun") from exc
    return MPI


COLLECTIVE_LAUNCH = ("start a collective job with `python -m pyfleet.launch --collective "
                     "--workers N script.py` or `mpirun -np N python script.py` (mpi4py and an "
                     f"MPI: {install_hint('mpi')}); see docs/collective.md")


def collective_role(env) -> RoleInfo:
    """A collective rank's role: worker ``rank`` of ``size`` in MPI's COMM_WORLD.
    Paddle's PADDLE_TRAINER_ID / PADDLE_TRAINERS_NUM, when set, must agree."""
    if _first_set(env, MPI_ENV_VARS) is None:
        raise ConfigError(f"collective mode runs under MPI and this process was not started "
                          f"by an MPI launcher (none of {', '.join(MPI_ENV_VARS)} is set): "
                          f"{COLLECTIVE_LAUNCH}")
    comm = _import_mpi().COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    for name, want in (("PADDLE_TRAINER_ID", rank), ("PADDLE_TRAINERS_NUM", size)):
        if _env_get(env, name) is not None and env[name].strip() != str(want):
            raise ConfigError(f"{name}={env[name]!r} disagrees with the MPI launch ({want}): "
                              f"unset it, or start the ranks so that they agree")
    return RoleInfo(Role.WORKER, rank, size, (), None, collective=True)


def _mpi_host(env) -> str:
    host = _env_get(env, "PYFLEET_MPI_HOST")
    if host is not None:
        return host
    return socket.gethostbyname(socket.gethostname())


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host.strip("[]"), 0))
        return s.getsockname()[1]


_EP_BYTES = 256


class MPISymetricRoleMaker(RoleMakerBase):
    """Roles from an MPI launch: one server and one worker per node (Fluid's spelling).

    Rank ``2i`` is server ``i``, rank ``2i + 1`` is worker ``i`` (so ``mpirun`` places a pair
    per node when it fills nodes in rank order); the world size must be even and >= 2.
    Each server picks its port (``$PYFLEET_MPI_BASE_PORT + i`` when set, else a free port on
    its address: ``$PYFLEET_MPI_HOST`` or the address its host name resolves to) and every rank
    learns every server endpoint through one ``Allgather`` of fixed-size byte buffers (no
    pickling). A free port is found by binding port 0 and closing it, so another program
    may take it before the server binds; set PYFLEET_MPI_BASE_PORT where that matters.

    :meth:`generate_role` is collective (every rank must call it); so are the barriers.
    """

    def __init__(self):
        super().__init__()
        self.MPI = _import_mpi()
        self._comm = self.MPI.COMM_WORLD
        self._node_type_comm = None

    def _resolve(self) -> RoleInfo:
        env = dict(os.environ)
        rank, size = self._comm.Get_rank(), self._comm.Get_size()
        if size < 2 or size % 2:
            raise ConfigError(f"MPISymetricRoleMaker needs an even number of MPI processes "
                              f"(a server and a worker per node), got {size}: use "
                              f"mpirun -np {max(2, size + size % 2)}")
        role = Role.SERVER if rank % 2 == 0 else Role.WORKER
        index = rank // 2
        mine = ""
        error = ""
        if role == Role.SERVER:
            try:
                host = _mpi_host(env)
                if _env_get(env, "PYFLEET_MPI_BASE_PORT") is not None:
                    base = _env_int(env, "PYFLEET_MPI_BASE_PORT", 1)
                    if base + size // 2 - 1 > 65535:
                        raise ConfigError(f"PYFLEET_MPI_BASE_PORT={base}: ports up to "
                                          f"{base + size // 2 - 1} are needed, past 65535")
                    port = base + index
                else:
                    port = _free_port(host)
                mine = _check_endpoint(f"{host}:{port}", "server endpoint")
            except (ConfigError, OSError) as exc:
                error = f"rank {rank}: {exc}"
        # Errors travel with the endpoints so every rank fails together instead of hanging.
        payload = ("E" + error if error else "P" + mine).encode("utf-8")[:_EP_BYTES]
        sendbuf = np.zeros(_EP_BYTES, dtype=np.uint8)
        sendbuf[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        recvbuf = np.zeros((size, _EP_BYTES), dtype=np.uint8)
        self._comm.Allgather(sendbuf, recvbuf)
        gathered = [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in recvbuf]
        errors = [g[1:] for g in gathered if g.startswith("E")]
        if errors:
            raise ConfigError("MPISymetricRoleMaker: a server could not pick its endpoint: "
                              + "; ".join(errors))
        eps = parse_endpoints([g[1:] for g in gathered[::2]], "gathered server endpoints")
        self._node_type_comm = self._comm.Split(0 if role == Role.SERVER else 1, rank)
        return RoleInfo(role, index, size // 2, eps, mine if role == Role.SERVER else None)

    def _get_rank(self) -> int:
        """This process's rank in ``MPI.COMM_WORLD`` (Fluid's name)."""
        return self._comm.Get_rank()

    def _get_size(self) -> int:
        """The number of MPI processes (Fluid's name)."""
        return self._comm.Get_size()

    def _barrier_all(self) -> None:
        """Block until every rank reaches this call."""
        self.generate_role()
        self._comm.barrier()

    def _barrier_worker(self) -> None:
        """Block until every worker reaches this call (no-op on servers, as in Fluid)."""
        self.generate_role()
        if self.is_worker():
            self._node_type_comm.barrier()

    def _barrier_server(self) -> None:
        """Block until every server reaches this call (no-op on workers, as in Fluid)."""
        self.generate_role()
        if self.is_server():
            self._node_type_comm.barrier()


def default_role_maker(env: Mapping[str, str] | None = None) -> RoleMakerBase:
    """The role maker ``fleet.init()`` uses when given none.

    In order: ``PYFLEET_ROLE`` set -> :class:`PaddleCloudRoleMaker` (an explicit pyfleet
    contract wins, so the pyfleet launcher works even when itself started by mpirun); an MPI
    launch (one of ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``, ``PMIX_RANK`` set) ->
    :class:`MPISymetricRoleMaker`; ``TRAINING_ROLE`` or ``PADDLE_TRAINING_ROLE`` set ->
    :class:`PaddleCloudRoleMaker`; otherwise ConfigError saying what to set.
    The returned role maker has not generated its role yet.
    """
    env = os.environ if env is None else env
    if _env_get(env, "PYFLEET_ROLE") is not None:
        return PaddleCloudRoleMaker(env=None if env is os.environ else env)
    if _first_set(env, MPI_ENV_VARS) is not None:
        return MPISymetricRoleMaker()
    if _first_set(env, ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE")) is not None:
        return PaddleCloudRoleMaker(env=None if env is os.environ else env)
    raise NoRoleError("fleet.init() got no role maker and found no role in the environment: "
                      "pass role_maker=UserDefinedRoleMaker(...), or set PYFLEET_ROLE, "
                      "PYFLEET_SERVER_ENDPOINTS, PYFLEET_WORKER_NUM and "
                      "PYFLEET_WORKER_INDEX/PYFLEET_SERVER_INDEX (see docs/fleet.md)")

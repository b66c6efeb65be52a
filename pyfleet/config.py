"""Distributed training configuration and dense-parameter placement.

This module mirrors Fluid 1.5's ``DistributeTranspilerConfig`` and its parameter-server
dispatchers, so a Fleet script keeps its configuration code with only the imports changed::

    from pyfleet.config import DistributeTranspilerConfig, RoundRobin, HashName
    config = DistributeTranspilerConfig()
    config.sync_mode = False          # async
    config.split_method = HashName
    config.slice_var_up = True

Dense placement (:func:`place_dense`) is a pure function of the parameter list, the number of
servers and the configuration: every worker and server computes the same blocks without talking
to each other. The slicing arithmetic is Fluid 1.5's ``slice_variable`` rule:

* ``split_count = min(server_num, numel // min_block_size)`` (at least 1);
* ``block_size = ceil(numel / split_count)``, rounded up to a whole number of rows
  (the product of ``shape[1:]``) for parameters of rank 2 or more;
* ``split_count = ceil(numel / block_size)`` blocks, the last one possibly shorter.

A parameter cut into more than one block names its blocks ``<name>.block<i>`` (Fluid's names);
an uncut parameter keeps its own name. Blocks are then dispatched to servers in the order given:
:class:`RoundRobin` counts over all blocks of all parameters; :class:`HashName` takes a stable
64-bit FNV-1a hash of the block's name modulo the number of servers (never Python's salted
``hash()``, so every process agrees).

Everything here is plain Python objects without shared state; a config object is not
thread-safe while it is being modified, and is read-only by convention once handed to
``fleet.distributed_optimizer``.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pyfleet._transpiler_flags import FLUID18_FLAGS, Fluid18Flags
from pyfleet.errors import ConfigError
from pyfleet.ps_dispatcher import HashName, PSDispatcher, RoundRobin, block_name, stable_hash

__all__ = [
    "JOB_MODES",
    "MODES",
    "DenseBlock",
    "DistributeTranspilerConfig",
    "HashName",
    "PSDispatcher",
    "RoundRobin",
    "RuntimeConfig",
    "block_name",
    "place_dense",
    "slice_variable",
    "stable_hash",
]

MODES = ("sync", "async", "geo")   # what a server runs (the sparse side of a hybrid job)
JOB_MODES = MODES + ("hybrid",)    # what a job's config may say

_SPLIT_METHODS = {"RoundRobin": RoundRobin, "HashName": HashName}


def _check_positive_number(what: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{what} must be a number of seconds, got {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{what} must be a positive, finite number of seconds, got {value!r}")
    return value


def _check_int(what: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _check_bool(what: str, value) -> bool:
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise ConfigError(f"{what} must be True or False, got {value!r}")
    return bool(value)


class RuntimeConfig:
    """Timeouts of the run-time (pyfleet's, not Fluid's), in seconds.

    ``request_timeout``: one pull/push/control request to a server before it is reported as a
    :class:`~pyfleet.errors.PeerTimeout` naming the endpoint; by default 60 s, or Fluid's
    ``FLAGS_rpc_deadline`` (milliseconds, the deadline of its RPCs) when that is set.
    ``connect_timeout``: how long a worker waits for the servers to come up at ``init_worker``.
    ``barrier_timeout``: how long a sync-mode barrier waits for the slowest worker before it
    fails with :class:`~pyfleet.errors.BarrierError`.
    ``heartbeat_timeout``: seconds without a heartbeat after which a server declares a worker
    dead (a sync barrier waiting for it then fails at once, naming it).
    """

    _FIELDS = ("request_timeout", "connect_timeout", "barrier_timeout", "heartbeat_timeout")

    def __init__(self, request_timeout: float | None = None, connect_timeout: float = 60.0,
                 barrier_timeout: float = 300.0, heartbeat_timeout: float = 10.0):
        self.request_timeout = _rpc_deadline() if request_timeout is None else request_timeout
        self.connect_timeout = connect_timeout
        self.barrier_timeout = barrier_timeout
        self.heartbeat_timeout = heartbeat_timeout

    def __setattr__(self, key, value):
        if key not in self._FIELDS:
            raise AttributeError(_unknown_attribute("RuntimeConfig", key, self._FIELDS))
        object.__setattr__(self, key, _check_positive_number(f"runtime.{key}", value))

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._FIELDS}

    @classmethod
    def from_dict(cls, d: dict) -> RuntimeConfig:
        unknown = set(d) - set(cls._FIELDS)
        if unknown:
            raise ConfigError(f"unknown runtime config keys: {sorted(unknown)}")
        return cls(**d)

    def __eq__(self, other):
        return isinstance(other, RuntimeConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return "RuntimeConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


def _rpc_deadline() -> float:
    """Seconds of Fluid's ``FLAGS_rpc_deadline`` (an int of milliseconds, read from the
    environment as Fluid reads it), else 60."""
    text = os.environ.get("FLAGS_rpc_deadline", "").strip()  # noqa: SIM112 (Fluid's name)
    if not text:
        return 60.0
    try:
        ms = int(text)
    except ValueError:
        ms = 0
    if ms <= 0:
        raise ConfigError(f"FLAGS_rpc_deadline must be a positive number of milliseconds "
                          f"(Fluid's RPC deadline, pyfleet's runtime.request_timeout), "
                          f"got {text!r}")
    return ms / 1000.0


def rpc_retry_times() -> int | None:
    """Fluid's ``FLAGS_rpc_retry_times`` (read from the environment as Fluid reads it):
    how many times a worker sends a request again after it failed, here a push left
    unanswered for ``request_timeout`` (the client's ``push_retries``; a server applies
    each request once). None when unset: pyfleet's default, no resend."""
    text = os.environ.get("FLAGS_rpc_retry_times", "").strip()  # noqa: SIM112 (Fluid's name)
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"FLAGS_rpc_retry_times must be a whole number >= 0 (how many times "
                          f"a worker resends a push its server did not answer), got {text!r}")
    return n


def _unknown_attribute(owner: str, key: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{owner} has no setting {key!r}{hint}"


class DistributeTranspilerConfig(Fluid18Flags):
    """Configuration of a parameter-server job, named as in Fluid 1.5.

    Fields (each validated when set; a bad value raises :class:`~pyfleet.errors.ConfigError`,
    a ``ValueError``, naming the field):

    - ``sync_mode`` (bool, default True): Fluid's switch between sync and async training.
    - ``mode`` (``"sync"`` | ``"async"`` | ``"geo"`` | ``"hybrid"``): pyfleet's name for the
      same choice plus geo-SGD and hybrid. Setting either keeps the other consistent:
      ``sync_mode`` is ``mode == "sync"``; ``sync_mode = False`` turns ``"sync"`` into
      ``"async"`` and leaves ``"geo"`` alone.
      The default is ``"sync"``, or ``$PYFLEET_MODE`` when set (the launcher's ``--mode``).
      Fluid's ``mode = "pserver"`` is accepted and changes nothing (it is the only kind of job
      pyfleet runs).
    - ``mode = "hybrid"`` (beyond Fluid, docs/collective.md): sparse tables on the servers,
      dense parameters replicated on the workers (one MPI job) and all-reduced every step; the
      servers hold no dense parameter. ``sparse_mode`` (``"sync"`` | ``"async"`` | ``"geo"``)
      is then what the servers run: setting ``mode = "hybrid"`` keeps the mode the config had
      as its sparse side (``"sync"`` by default), and in hybrid mode ``sync_mode`` and
      ``geo_sgd_mode`` read and set the sparse side (``sync_mode = False``: sparse async, as
      PERSIA). Outside hybrid, ``sparse_mode`` reads as ``mode`` (what the servers run).
    - ``geo_sgd_mode`` (bool): Fluid's spelling of ``mode == "geo"``.
    - ``geo_k_steps`` (int >= 1, default 100): in geo mode, local steps between two pushes of
      deltas; ``geo_sgd_need_push_nums`` is Fluid's name for it.
    - ``split_method``: :class:`RoundRobin` (default) or :class:`HashName` (the classes, as in
      Fluid; their names as strings are accepted too).
    - ``slice_var_up`` (bool, default True): cut dense parameters into blocks over servers.
    - ``min_block_size`` (int >= 1, default 8192): smallest number of elements worth a block.
      Fluid refuses values under 8192; pyfleet accepts them so small models can be spread.
    - ``runtime``: a :class:`RuntimeConfig` of timeouts.
    - Fluid knobs accepted for compatibility: ``wait_port`` (bool, default True: workers wait
      for the servers), ``print_log`` (bool), ``runtime_split_send_recv`` (bool, no effect:
      pyfleet always splits at run time), ``enable_dc_asgd`` (only False).
    - ``half_async``, ``completely_not_async``: Fluid 1.8's mode flags (_transpiler_flags.py).

    Setting any other attribute raises ``AttributeError`` (a misspelt setting must not be
    silently ignored).
    """

    _PUBLIC = ("sync_mode", "mode", "sparse_mode", "geo_sgd_mode", "geo_k_steps", "runtime",
               "geo_sgd_need_push_nums", "split_method", "slice_var_up", "min_block_size",
               "wait_port", "print_log", "runtime_split_send_recv", "enable_dc_asgd", *FLUID18_FLAGS)

    def __init__(self):
        self._set_defaults()
        env_mode = os.environ.get("PYFLEET_MODE")
        if env_mode:
            if env_mode.strip().lower() not in JOB_MODES:
                raise ConfigError(f"PYFLEET_MODE must be one of {', '.join(JOB_MODES)}, "
                                  f"got {env_mode!r}")
            self.mode = env_mode.strip().lower()

    @classmethod
    def _defaults(cls) -> DistributeTranspilerConfig:
        cfg = cls.__new__(cls)
        cfg._set_defaults()
        return cfg

    def _set_defaults(self):
        object.__setattr__(self, "_mode", "sync")
        object.__setattr__(self, "_sparse_mode", "sync")
        self._clear_fluid18()
        self.geo_k_steps = 100
        self.split_method = RoundRobin
        self.slice_var_up = True
        self.min_block_size = 8192
        self.runtime = RuntimeConfig()
        self.wait_port = True
        self.print_log = False
        self.runtime_split_send_recv = False
        self.enable_dc_asgd = False

    def __setattr__(self, key, value):
        if key not in self._PUBLIC:
            raise AttributeError(_unknown_attribute("DistributeTranspilerConfig", key,
                                                    self._PUBLIC))
        if isinstance(getattr(type(self), key, None), property):
            object.__setattr__(self, key, value)
        else:
            self._set_plain(key, value)

    def _set_plain(self, key, value):
        if key == "min_block_size":
            value = _check_int("min_block_size", value, 1)
        elif key in ("slice_var_up", "wait_port", "print_log", *FLUID18_FLAGS):
            value = _check_bool(key, value)
        elif key == "enable_dc_asgd":
            if _check_bool(key, value):
                raise ConfigError("enable_dc_asgd=True (DC-ASGD) is not supported by pyfleet")
            value = False
        elif key == "runtime" and not isinstance(value, RuntimeConfig):
            raise ConfigError(f"runtime must be a RuntimeConfig, got {value!r}")
        object.__setattr__(self, key, value)

    @property
    def mode(self) -> str:
        return self._mode if self._mode == "hybrid" else self._fluid18(self._mode)

    @mode.setter
    def mode(self, value):
        if value == "pserver":
            return
        if not isinstance(value, str) or value not in JOB_MODES:
            raise ConfigError(f"mode must be one of {', '.join(JOB_MODES)} (Fluid's 'pserver' "
                              f"is accepted and changes nothing), got {value!r}")
        if value == "hybrid" and self._mode != "hybrid":
            object.__setattr__(self, "_sparse_mode", self.mode)  # the sparse side it had
        self._clear_fluid18()
        object.__setattr__(self, "_mode", value)

    @property
    def sparse_mode(self) -> str:
        """The mode the servers run: the sparse side in hybrid, else ``mode`` itself."""
        return self._fluid18(self._sparse_mode) if self._mode == "hybrid" else self.mode

    @sparse_mode.setter
    def sparse_mode(self, value):
        if value not in MODES:
            raise ConfigError(f"sparse_mode must be one of {', '.join(MODES)}, got {value!r}")
        if self._mode != "hybrid":
            raise ConfigError("sparse_mode is the sparse side of a hybrid job: set "
                              "mode = 'hybrid' first (otherwise set mode itself)")
        object.__setattr__(self, "_sparse_mode", value)

    @property
    def hybrid(self) -> bool:
        """True when dense parameters are all-reduced among the workers."""
        return self._mode == "hybrid"

    def _side(self):  # the attribute sync_mode / geo_sgd_mode set
        return "_sparse_mode" if self._mode == "hybrid" else "_mode"

    @property
    def sync_mode(self) -> bool:
        return getattr(self, self._side()) == "sync"   # Fluid's flag (see half_async)

    @sync_mode.setter
    def sync_mode(self, value):
        if _check_bool("sync_mode", value):
            self._refuse_sync_with_split()
            object.__setattr__(self, self._side(), "sync")
            self._clear_fluid18()
        elif getattr(self, self._side()) == "sync":
            object.__setattr__(self, self._side(), "async")

    @property
    def geo_sgd_mode(self) -> bool:
        return self.sparse_mode == "geo"

    @geo_sgd_mode.setter
    def geo_sgd_mode(self, value):
        if _check_bool("geo_sgd_mode", value):
            object.__setattr__(self, self._side(), "geo")
        elif self.sparse_mode == "geo":
            object.__setattr__(self, self._side(), "async")

    def _k_steps(name):  # geo_k_steps and Fluid's geo_sgd_need_push_nums: one value
        return property(lambda self: self._geo_k_steps, lambda self, value: object.__setattr__(
            self, "_geo_k_steps", _check_int(name, value, 1)))

    geo_k_steps = _k_steps("geo_k_steps")
    geo_sgd_need_push_nums = _k_steps("geo_sgd_need_push_nums")
    del _k_steps

    @property
    def split_method(self) -> type:
        return self._split_method

    @split_method.setter
    def split_method(self, value):
        if value is None:
            value = RoundRobin
        elif isinstance(value, str):
            if value not in _SPLIT_METHODS:
                raise ConfigError(f"split_method must be RoundRobin or HashName, got {value!r}")
            value = _SPLIT_METHODS[value]
        elif isinstance(value, PSDispatcher):
            value = type(value)
        if value not in (RoundRobin, HashName):
            raise ConfigError("split_method must be pyfleet.config.RoundRobin or "
                              f"pyfleet.config.HashName, got {value!r}")
        object.__setattr__(self, "_split_method", value)

    def to_dict(self) -> dict:
        """A JSON-safe dict of every setting (what crosses a socket, never a pickle)."""
        d = {
            "mode": self.mode,
            "geo_k_steps": self.geo_k_steps,
            "split_method": self.split_method.__name__,
            "slice_var_up": self.slice_var_up,
            "min_block_size": self.min_block_size,
            "wait_port": self.wait_port,
            "print_log": self.print_log,
            "runtime_split_send_recv": self.runtime_split_send_recv,
            "runtime": self.runtime.to_dict(),
        }
        if self.hybrid:
            d["sparse_mode"] = self.sparse_mode
        return d

    @classmethod
    def from_dict(cls, d: dict) -> DistributeTranspilerConfig:
        """Rebuild a config from :meth:`to_dict`'s output, validating every field.

        ``$PYFLEET_MODE`` is not consulted: ``d["mode"]`` is authoritative when present.
        """
        if not isinstance(d, dict):
            raise ConfigError(f"a config dict is expected, got {type(d).__name__}")
        known = {*cls._defaults().to_dict(), "sparse_mode"}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown config keys: {sorted(unknown)}")
        cfg = cls._defaults()
        d = dict(d)
        sparse_mode = d.pop("sparse_mode", None)
        cfg._restore_split(d.pop("runtime_split_send_recv", None))   # before the mode
        for key, value in d.items():
            if key == "runtime":
                cfg.runtime = RuntimeConfig.from_dict(value)
            else:
                setattr(cfg, key, value)
        if sparse_mode is not None:
            cfg.sparse_mode = sparse_mode
        return cfg

    def __eq__(self, other):
        return isinstance(other, DistributeTranspilerConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        d = self.to_dict()
        d["sync_mode"] = self.sync_mode
        return "DistributeTranspilerConfig(" + ", ".join(f"{k}={v!r}" for k, v in d.items()) + ")"


class DenseBlock(NamedTuple):
    """One contiguous run of a dense parameter, flattened in C order, and its server.

    ``name`` is the parameter's name; elements ``[start, end)`` of the flattened parameter
    live on server ``server_index``; ``var_name`` is Fluid's name of the block
    (``name`` itself when the parameter is not cut, else ``name.block<i>``).
    """

    name: str
    start: int
    end: int
    server_index: int
    var_name: str

    @property
    def size(self) -> int:
        return self.end - self.start


def _numel(name: str, shape) -> tuple[int, tuple[int, ...]]:
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"parameter {name!r}: shape must be a tuple of ints, "
                         f"got {shape!r}") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d <= 0:
            raise ValueError(f"parameter {name!r}: every dimension must be a positive int, "
                             f"got shape {shape!r}")
    return math.prod(int(d) for d in dims), tuple(int(d) for d in dims)


def slice_variable(shape, slice_count: int, min_block_size: int = 8192) -> list[int]:
    """Return the sizes (in elements) of the blocks Fluid 1.5 cuts a parameter into.

    ``shape`` is the parameter's shape; ``slice_count`` the number of servers. The sizes add
    up to the number of elements; every block but the last is a whole number of rows.
    """
    slice_count = _check_int("slice_count", slice_count, 1)
    min_block_size = _check_int("min_block_size", min_block_size, 1)
    numel, dims = _numel("<shape>", shape)
    split_count = min(slice_count, max(1, numel // min_block_size))
    block_size = -(-numel // split_count)
    if len(dims) >= 2:
        row = math.prod(dims[1:])
        block_size = -(-block_size // row) * row
    split_count = -(-numel // block_size)
    return [min(block_size, numel - i * block_size) for i in range(split_count)]


def place_dense(params: Iterable[tuple[str, Sequence[int]]], server_num: int,
                config: DistributeTranspilerConfig | None = None) -> list[DenseBlock]:
    """Cut dense parameters into blocks and assign each block to a server.

    ``params`` is a list of ``(name, shape)`` in a fixed order (the same on every process:
    RoundRobin depends on it); ``server_num`` the number of servers; ``config`` a
    :class:`DistributeTranspilerConfig` (default one when None). Returns the blocks, parameter
    by parameter, in element order. Deterministic: the same on every process and run.

    Raises ``ValueError`` for an empty or duplicate name, a non-positive dimension, or a
    server count under 1.
    """
    server_num = _check_int("server_num", server_num, 1)
    if config is None:
        config = DistributeTranspilerConfig._defaults()
    elif not isinstance(config, DistributeTranspilerConfig):
        raise ValueError(f"config must be a DistributeTranspilerConfig, got {config!r}")
    dispatcher = config.split_method([str(i) for i in range(server_num)])
    seen = set()
    blocks: list[DenseBlock] = []
    for entry in params:
        try:
            name, shape = entry
        except (TypeError, ValueError):
            raise ValueError(f"params must be (name, shape) pairs, got {entry!r}") from None
        if not isinstance(name, str) or not name:
            raise ValueError(f"parameter name must be a non-empty str, got {name!r}")
        if name in seen:
            raise ValueError(f"parameter {name!r} is listed twice")
        seen.add(name)
        numel, dims = _numel(name, shape)
        if config.slice_var_up:
            sizes = slice_variable(dims, server_num, config.min_block_size)
        else:
            sizes = [numel]
        start = 0
        for i, size in enumerate(sizes):
            var_name = name if len(sizes) == 1 else block_name(name, i)
            blocks.append(DenseBlock(name, start, start + size, dispatcher.server_of(var_name),
                                var_name))
            start += size
    return blocks

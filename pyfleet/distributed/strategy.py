"""Fluid 1.8's ``distributed_strategy``: :class:`StrategyFactory` and its strategies,
accepted by ``fleet.distributed_optimizer(optimizer, strategy)`` beside a
:class:`~pyfleet.config.DistributeTranspilerConfig` (Fluid 1.5's form).

A strategy carries what Fluid 1.8's carries, with Fluid's defaults:

- ``get_program_config()``: the ``DistributeTranspilerConfig`` the job uses (the
  script may change it further). Fluid 1.8 spells its modes with flags, and so
  do these configs: sync is ``sync_mode = False, runtime_split_send_recv = True,
  half_async = True, completely_not_async = True`` (Fluid 1.8 trains sync
  through its communicator), async ``sync_mode = False,
  runtime_split_send_recv = True``, geo the same plus ``geo_sgd_mode = True``
  and ``geo_sgd_need_push_nums = update_frequency``. pyfleet's ``mode`` reads
  ``"sync"``, ``"async"``, ``"geo"`` from them.
- ``get_trainer_runtime_config()``: Fluid's communicator flags
  (``runtime_configs``, strings; defaults from ``CPU_NUM`` and the
  ``FLAGS_communicator_*`` variables, as Fluid reads them);
- ``get_server_runtime_config()``: a :class:`ServerRuntimeConfig` (Fluid's
  pserver RPC thread counts, ``FLAGS_rpc_*_thread_num``, default 12);
- ``get_execute_strategy()`` / ``get_build_strategy()``: a
  ``fluid.ExecutionStrategy`` (``num_threads = CPU_NUM``; sync:
  ``use_thread_barrier = True``) and a ``fluid.BuildStrategy``
  (``async_mode = True``; ``reduce_strategy = Reduce`` when ``CPU_NUM > 1``),
  which scripts hand to ``CompiledProgram.with_data_parallel`` (one CPU
  process: they schedule work and change no number, see
  :mod:`pyfleet.fluid.compiler`).

``create_half_async_strategy()`` is refused, naming it: Fluid's half-async
workers push through the communicator without waiting and the servers apply
the merged gradients at barriers; pyfleet's servers apply a push either on
arrival (async) or at the step barrier of every worker (sync), nothing in
between. Use ``create_async_strategy()`` or ``create_sync_strategy()``.

The communicator flags and the server's thread counts tune machinery pyfleet
does not have: reading them is fine, and a value changed from Fluid's default
(the default computed when the strategy was made) is refused by name when the
strategy reaches ``distributed_optimizer``, never silently ignored. As in
Fluid, sync mode takes ``communicator_max_merge_var_num`` and
``communicator_send_queue_size`` from ``CPU_NUM`` whatever they are set to,
and only the flags Fluid passes to the communicator of the strategy's mode
count (geo: the thread pool size and the send wait times). ``rpc_deadline``
and ``rpc_retry_times`` are read from the environment into the dict and used
from the environment, as in Fluid, whose RPCs read ``FLAGS_rpc_deadline`` and
``FLAGS_rpc_retry_times`` themselves: pyfleet's ``runtime.request_timeout``
and its client's push resends take them; a script's change of the dict's
entries is refused by name (it would change nothing). Any
``communicator_is_sgd_optimizer`` is accepted (PaddleRec sets it from the
optimizer): it tells Fluid's communicator whether merged gradients are summed
or averaged, and pyfleet's workers merge none (each step's push goes alone).
"""

import copy
import os

from pyfleet import config as _config
from pyfleet.errors import ConfigError

__all__ = ["AsyncStrategy", "DistributedMode", "DistributedStrategy", "GeoStrategy",
           "ServerRuntimeConfig", "StrategyFactory", "SyncStrategy", "TrainerRuntimeConfig",
           "job_config"]


class DistributedMode:
    """Fluid's numbering of the parameter-server modes."""

    SYNC = 0
    ASYNC = 1
    HALF_ASYNC = 2
    GEO = 3


_MODE_NUMBERS = {"sync": DistributedMode.SYNC, "async": DistributedMode.ASYNC,
                 "geo": DistributedMode.GEO}

# Fluid 1.8's communicator flags: (name, environment variable, default; None: CPU_NUM).
_COMMUNICATOR_FLAGS = (
    ("communicator_max_merge_var_num", None),
    ("communicator_send_queue_size", None),
    ("communicator_independent_recv_thread", "1"),
    ("communicator_min_send_grad_num_before_recv", None),
    ("communicator_thread_pool_size", "5"),
    ("communicator_send_wait_times", "5"),
    ("communicator_is_sgd_optimizer", "1"),
)
_UNUSED_FLAGS = (("rpc_deadline", "180000"), ("rpc_retry_times", "3"))  # unused in Fluid too
_SYNC_FORCED = ("communicator_max_merge_var_num", "communicator_send_queue_size")
_GEO_FLAGS = ("communicator_thread_pool_size", "communicator_send_wait_times")


def _cpu_num():
    return os.getenv("CPU_NUM", "1")


class TrainerRuntimeConfig:
    """Fluid's communicator flags (``runtime_configs``, a dict of strings) and the
    mode they are for (``mode``, a :class:`DistributedMode` number)."""

    def __init__(self):
        self.mode = None
        threads = _cpu_num()
        self._defaults = {k: (threads if d is None else d) for k, d in _COMMUNICATOR_FLAGS}
        self.runtime_configs = {k: os.getenv("FLAGS_" + k, d) for k, d in self._defaults.items()}
        for k, d in _UNUSED_FLAGS:
            self.runtime_configs[k] = os.getenv("FLAGS_" + k, d)
        self._rpc_read = {k: self.runtime_configs[k] for k, _ in _UNUSED_FLAGS}

    def _needed(self):
        if self.mode is None or self.mode == DistributedMode.ASYNC:
            return list(self.runtime_configs)
        if self.mode in (DistributedMode.SYNC, DistributedMode.HALF_ASYNC):
            return ["communicator_max_merge_var_num", "communicator_send_wait_times",
                    "communicator_thread_pool_size", "communicator_send_queue_size"]
        if self.mode == DistributedMode.GEO:
            return list(_GEO_FLAGS)
        raise ValueError(f"TrainerRuntimeConfig.mode {self.mode!r} is not a DistributedMode")

    def get_communicator_flags(self):
        """The flags Fluid passes to the communicator of this mode (strings); in
        sync mode the merge count and queue size are ``CPU_NUM``, as in Fluid."""
        flags = {k: str(self.runtime_configs[k]) for k in self._needed()}
        if self.mode in (DistributedMode.SYNC, DistributedMode.HALF_ASYNC):
            for k in _SYNC_FORCED:
                flags[k] = _cpu_num()
        return flags

    def check(self):
        """ConfigError naming every flag this mode uses that differs from Fluid's default,
        and an ``rpc_*`` entry changed in the dict (its environment variable counts)."""
        rpc = sorted(k for k, v in self._rpc_read.items() if str(self.runtime_configs[k]) != v)
        if rpc:
            raise ConfigError(f"trainer runtime config {rpc}: an RPC reads its FLAGS_ "
                              f"environment variable, not this dict (in Fluid too): set "
                              f"{', '.join('FLAGS_' + k for k in rpc)} in the environment "
                              f"before the strategy is made (FLAGS_rpc_deadline: the request "
                              f"timeout in ms; FLAGS_rpc_retry_times: resends of an "
                              f"unanswered push)")
        flags = self.get_communicator_flags()
        if self.mode in (DistributedMode.SYNC, DistributedMode.HALF_ASYNC):
            for k in _SYNC_FORCED:   # Fluid overrides them itself: not the script's change
                flags.pop(k)
        flags.pop("communicator_is_sgd_optimizer", None)   # see the module doc
        changed = sorted(k for k, v in flags.items()
                         if k in self._defaults and self._defaults[k] != str(v))
        if changed:
            raise ConfigError(f"trainer runtime config {changed}: Fluid's communicator "
                              f"flags tune a communicator pyfleet does not have (its "
                              f"async pushes and pulls travel in the background without "
                              f"queue or merge settings); leave them at Fluid's defaults "
                              f"(and unset their FLAGS_communicator_* variables)")

    def __repr__(self):
        rows = "".join(f"{k:<45s}{v:<5s}\n" for k, v in self.get_communicator_flags().items())
        return f"\nTrainerRuntimeConfig Overview (mode {self.mode})\n{rows}"


class ServerRuntimeConfig:
    """Fluid's pserver RPC thread counts (``FLAGS_rpc_send_thread_num``,
    ``FLAGS_rpc_get_thread_num``, ``FLAGS_rpc_prefetch_thread_num``; default
    12). A pyfleet server serves from its own fixed threads: a count changed
    from that default is refused by name when the strategy is used."""

    _FIELDS = ("_rpc_send_thread_num", "_rpc_get_thread_num", "_rpc_prefetch_thread_num")

    def __init__(self):
        for f in self._FIELDS:
            setattr(self, f, int(os.getenv("FLAGS" + f, "12")))

    def check(self):
        changed = sorted(f for f in self._FIELDS if getattr(self, f) != 12)
        if changed:
            raise ConfigError(f"server runtime config {changed}: Fluid's pserver RPC thread "
                              f"counts have no pyfleet equivalent (a server's request loop "
                              f"and table threads are fixed); leave them at 12 (and unset "
                              f"their FLAGS_rpc_* variables)")


def _set_fields(target, config, what):
    """Fluid's ``set_*`` of a dict: every key must be a field of ``target``."""
    for key, value in config.items():
        if not hasattr(target, key):
            raise ValueError(f"{what} doesn't have key: {key}")
        setattr(target, key, value)


class DistributedStrategy:
    """Base of the strategies (use :class:`StrategyFactory`)."""

    _mode = None

    def __init__(self):
        from pyfleet.fluid.compiler import BuildStrategy, ExecutionStrategy
        self._program_config = _config.DistributeTranspilerConfig()
        self._trainer_runtime_config = TrainerRuntimeConfig()
        self._server_runtime_config = ServerRuntimeConfig()
        threads = int(_cpu_num())
        self._execute_strategy = ExecutionStrategy()
        self._build_strategy = BuildStrategy()
        self._execute_strategy.num_threads = threads
        if threads > 1:
            self._build_strategy.reduce_strategy = BuildStrategy.ReduceStrategy.Reduce
        self.debug_opt = None
        self.check_program_config()
        self.check_trainer_runtime_config()
        self.check_server_runtime_config()
        self.check_build_strategy()
        self.check_execute_strategy()

    # Fluid's check_* re-apply what the strategy's mode fixes.
    def check_program_config(self):
        c = self._program_config
        c.sync_mode = False
        c.runtime_split_send_recv = True

    def check_trainer_runtime_config(self):
        self._trainer_runtime_config.mode = _MODE_NUMBERS[self._mode]

    def check_server_runtime_config(self):
        pass

    def check_execute_strategy(self):
        pass

    def check_build_strategy(self):
        self._build_strategy.async_mode = True

    def set_debug_opt(self, opt_info):
        self.debug_opt = opt_info

    def get_debug_opt(self):
        return dict(self.debug_opt) if isinstance(self.debug_opt, dict) else {}

    def get_program_config(self):
        return self._program_config

    def set_program_config(self, config):
        """A :class:`DistributeTranspilerConfig` (copied) or a dict of its fields;
        the strategy's mode flags are then applied again, as Fluid does."""
        if isinstance(config, _config.DistributeTranspilerConfig):
            self._program_config = copy.deepcopy(config)
        elif isinstance(config, dict):
            _set_fields(self._program_config, config, "DistributeTranspilerConfig")
        else:
            raise TypeError("program_config only accept input type: dict or "
                            "DistributeTranspilerConfig")
        self.check_program_config()

    def get_trainer_runtime_config(self):
        return self._trainer_runtime_config

    def set_trainer_runtime_config(self, config):
        if isinstance(config, TrainerRuntimeConfig):
            self._trainer_runtime_config = config
        elif isinstance(config, dict):
            for key, value in config.items():
                if key not in self._trainer_runtime_config.runtime_configs:
                    raise ValueError(f"TrainerRuntimeConfig doesn't have key: {key}")
                self._trainer_runtime_config.runtime_configs[key] = value
        else:
            raise TypeError("trainer_runtime_config only accept input type: dict or "
                            "TrainerRuntimeConfig")
        self.check_trainer_runtime_config()

    def get_server_runtime_config(self):
        return self._server_runtime_config

    def set_server_runtime_config(self, config):
        if isinstance(config, ServerRuntimeConfig):
            self._server_runtime_config = config
        elif isinstance(config, dict):
            _set_fields(self._server_runtime_config, config, "ServerRuntimeConfig")
        else:
            raise TypeError("server_runtime_config only accept input type: dict or "
                            "ServerRuntimeConfig")
        self.check_server_runtime_config()

    def get_execute_strategy(self):
        return self._execute_strategy

    def set_execute_strategy(self, config):
        from pyfleet.fluid.compiler import ExecutionStrategy
        if isinstance(config, ExecutionStrategy):
            self._execute_strategy = config
        elif isinstance(config, dict):
            _set_fields(self._execute_strategy, config, "ExecutionStrategy")
        else:
            raise TypeError("execute_strategy only accept input type: dict or "
                            "ExecutionStrategy")
        self.check_execute_strategy()

    def get_build_strategy(self):
        return self._build_strategy

    def set_build_strategy(self, config):
        from pyfleet.fluid.compiler import BuildStrategy
        if isinstance(config, BuildStrategy):
            self._build_strategy = config
        elif isinstance(config, dict):
            _set_fields(self._build_strategy, config, "BuildStrategy")
        else:
            raise TypeError("build_strategy only accept input type: dict or BuildStrategy")
        self.check_build_strategy()

    def program_config(self):
        """The config the job uses (what ``distributed_optimizer`` calls): refuses
        changed communicator flags and server thread counts by name."""
        self._trainer_runtime_config.check()
        self._server_runtime_config.check()
        return self._program_config


class SyncStrategy(DistributedStrategy):
    _mode = "sync"

    def check_program_config(self):
        super().check_program_config()
        self._program_config.half_async = True
        self._program_config.completely_not_async = True

    def check_execute_strategy(self):
        self._execute_strategy.use_thread_barrier = True


class AsyncStrategy(DistributedStrategy):
    _mode = "async"


class GeoStrategy(DistributedStrategy):
    _mode = "geo"

    def __init__(self, update_frequency=100):
        super().__init__()
        self._program_config.geo_sgd_need_push_nums = update_frequency

    def check_program_config(self):
        super().check_program_config()
        self._program_config.geo_sgd_mode = True


def job_config(strategy):
    """The :class:`DistributeTranspilerConfig` a job runs from
    ``distributed_optimizer``'s ``strategy``: a config, a strategy of
    :class:`StrategyFactory` (its program config), or None (a default one).
    ValueError for anything else; ConfigError for what pyfleet refuses."""
    if strategy is None:
        strategy = _config.DistributeTranspilerConfig()
    if isinstance(strategy, DistributedStrategy):
        strategy = strategy.program_config()
    if not isinstance(strategy, _config.DistributeTranspilerConfig):
        raise ValueError(f"strategy must be a DistributeTranspilerConfig or a "
                         f"StrategyFactory strategy, got {strategy!r}")
    strategy.check_supported()
    return strategy


class StrategyFactory:
    """Fluid's factory of strategies (static methods)."""

    @staticmethod
    def create_sync_strategy():
        return SyncStrategy()

    @staticmethod
    def create_async_strategy():
        return AsyncStrategy()

    @staticmethod
    def create_half_async_strategy():
        raise ConfigError("StrategyFactory.create_half_async_strategy(): Fluid's half-async "
                          "mode (pushes without waiting, merged gradients applied at "
                          "barriers) has no pyfleet equivalent; use create_async_strategy() "
                          "or create_sync_strategy()")

    @staticmethod
    def create_geo_strategy(update_frequency=100):
        return GeoStrategy(update_frequency)

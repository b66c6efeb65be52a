"""Fluid 1.6's ``distributed_strategy``: :class:`StrategyFactory` and its strategies,
accepted by ``fleet.distributed_optimizer(optimizer, strategy)`` beside a
:class:`~pyfleet.config.DistributeTranspilerConfig` (Fluid 1.5's form).

A strategy carries a program config (``get_program_config()``, a
``DistributeTranspilerConfig`` the script may change further; it is what the
job uses) and a trainer runtime config of Fluid's communicator flags:

- ``create_sync_strategy()``: ``mode = "sync"`` (Fluid: ``sync_mode = True``,
  ``runtime_split_send_recv = False``);
- ``create_async_strategy()``: ``mode = "async"`` (Fluid's communicator-based
  async; pyfleet's async backend sends in the background the same way);
- ``create_geo_strategy(update_frequency=100)``: ``mode = "geo"``,
  ``geo_k_steps = update_frequency`` (Fluid's ``geo_sgd_need_push_nums``);
- ``create_half_async_strategy()``: refused, naming it. Fluid's half-async
  workers push through the communicator without waiting, and the servers apply
  the merged gradients at barriers; pyfleet's servers apply a push either on
  arrival (async) or at the step barrier of every worker (sync), nothing in
  between. Use ``create_async_strategy()`` or ``create_sync_strategy()``.

The communicator flags (``get_trainer_runtime_config().runtime_configs``:
Fluid's queue sizes, merge counts, thread counts) tune a communicator pyfleet
does not have: reading them is fine, and a value changed from Fluid's default
is refused by name when the strategy reaches ``distributed_optimizer``, never
silently ignored.
"""

import copy

from pyfleet import config as _config
from pyfleet.errors import ConfigError

__all__ = ["AsyncStrategy", "DistributedStrategy", "GeoStrategy", "StrategyFactory",
           "SyncStrategy", "TrainerRuntimeConfig"]

# Fluid 1.6's communicator flags and their defaults (values as Fluid keeps them: strings).
_COMMUNICATOR_DEFAULTS = {
    "communicator_max_merge_var_num": "20",
    "communicator_send_queue_size": "20",
    "communicator_independent_recv_thread": "1",
    "communicator_min_send_grad_num_before_recv": "20",
    "communicator_thread_pool_size": "5",
    "communicator_send_wait_times": "5",
    "communicator_is_sgd_optimizer": "1",
}


class TrainerRuntimeConfig:
    """Fluid's communicator flags (``runtime_configs``, a dict of strings)."""

    def __init__(self):
        self.runtime_configs = dict(_COMMUNICATOR_DEFAULTS)

    def get_communicator_flags(self):
        return dict(self.runtime_configs)

    def check(self):
        """ConfigError naming every flag changed from Fluid's default."""
        changed = sorted(k for k, v in self.runtime_configs.items()
                         if _COMMUNICATOR_DEFAULTS.get(k) != str(v))
        if changed:
            raise ConfigError(f"trainer runtime config {changed}: Fluid's communicator "
                              f"flags tune a communicator pyfleet does not have (its "
                              f"async pushes and pulls travel in the background without "
                              f"queue or merge settings); leave them at Fluid's defaults")


class DistributedStrategy:
    """Base of the strategies: a program config and a trainer runtime config."""

    _mode = None

    def __init__(self):
        self._program_config = _config.DistributeTranspilerConfig()
        self._program_config.mode = self._mode
        self._trainer_runtime_config = TrainerRuntimeConfig()

    def get_program_config(self):
        return self._program_config

    def set_program_config(self, config):
        """A :class:`DistributeTranspilerConfig` (copied) or a dict of its fields;
        the strategy's mode stays its own."""
        if isinstance(config, _config.DistributeTranspilerConfig):
            new = copy.deepcopy(config)
        elif isinstance(config, dict):
            new = copy.deepcopy(self._program_config)
            for key, value in config.items():
                setattr(new, key, value)
        else:
            raise TypeError(f"program_config must be a DistributeTranspilerConfig or a "
                            f"dict, got {type(config).__name__}")
        if new.mode != self._mode:
            raise ConfigError(f"{type(self).__name__} trains in {self._mode} mode; the "
                              f"program config given asks for {new.mode!r}")
        self._program_config = new

    def get_trainer_runtime_config(self):
        return self._trainer_runtime_config

    def set_trainer_runtime_config(self, config):
        if isinstance(config, TrainerRuntimeConfig):
            self._trainer_runtime_config = config
        elif isinstance(config, dict):
            self._trainer_runtime_config.runtime_configs.update(config)
        else:
            raise TypeError(f"trainer runtime config must be a TrainerRuntimeConfig or a "
                            f"dict, got {type(config).__name__}")

    def program_config(self):
        """The config the job uses (what ``distributed_optimizer`` calls):
        refuses changed communicator flags by name."""
        self._trainer_runtime_config.check()
        return self._program_config


class SyncStrategy(DistributedStrategy):
    _mode = "sync"


class AsyncStrategy(DistributedStrategy):
    _mode = "async"


class GeoStrategy(DistributedStrategy):
    _mode = "geo"

    def __init__(self, update_frequency=100):
        super().__init__()
        self._program_config.geo_k_steps = update_frequency


class StrategyFactory:
    """Fluid 1.6's factory of strategies (static methods)."""

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

"""Fluid 1.6-1.8's ``paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy``:
re-exports of :mod:`pyfleet.distributed.strategy`."""

from pyfleet.distributed.strategy import (
    AsyncStrategy,
    DistributedStrategy,
    GeoStrategy,
    ServerRuntimeConfig,
    StrategyFactory,
    SyncStrategy,
    TrainerRuntimeConfig,
)

__all__ = ["AsyncStrategy", "DistributedStrategy", "GeoStrategy", "ServerRuntimeConfig",
           "StrategyFactory", "SyncStrategy", "TrainerRuntimeConfig"]


# Fluid 1.8 names pyfleet does not provide: refused by name when used.
from pyfleet.fluid import refusals as _refusals  # noqa: E402

_refusals.install(globals(), "paddle.fluid.incubate.fleet.parameter_server."
                             "distribute_transpiler.distributed_strategy")

"""Fluid 1.5's ``paddle.fluid.transpiler.distribute_transpiler``: the
:class:`DistributeTranspilerConfig` of :mod:`pyfleet.config` (with Fluid 1.8's
``ServerRuntimeConfig`` and ``DistributedMode``) (pyfleet has no
transpiler: placement is decided by ``fleet.distributed_optimizer().minimize``)."""

from pyfleet.config import DistributeTranspilerConfig, HashName, RoundRobin
from pyfleet.distributed.strategy import DistributedMode, ServerRuntimeConfig

__all__ = ["DistributeTranspilerConfig", "DistributedMode", "HashName", "RoundRobin",
           "ServerRuntimeConfig"]

"""Fluid 1.5's ``paddle.fluid.transpiler.distribute_transpiler``: the
:class:`DistributeTranspilerConfig` of :mod:`pyfleet.config` (pyfleet has no
transpiler: placement is decided by ``fleet.distributed_optimizer().minimize``)."""

from pyfleet.config import DistributeTranspilerConfig, HashName, RoundRobin

__all__ = ["DistributeTranspilerConfig", "HashName", "RoundRobin"]

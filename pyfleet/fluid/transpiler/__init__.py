"""Fluid 1.5's ``paddle.fluid.transpiler`` import path: re-exports of :mod:`pyfleet.config`."""

from pyfleet.config import DistributeTranspilerConfig, HashName, RoundRobin
from pyfleet.fluid.transpiler import distribute_transpiler

__all__ = ["DistributeTranspilerConfig", "HashName", "RoundRobin", "distribute_transpiler"]

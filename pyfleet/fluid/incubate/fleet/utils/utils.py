"""Fluid 1.8's ``incubate.fleet.utils.utils``: ProgramDesc debugging tools,
each refused by name when used (pyfleet builds no C++ program protobufs)."""

from pyfleet.fluid import refusals as _refusals

__all__ = []

_refusals.install(globals(), "paddle.fluid.incubate.fleet.utils.utils")

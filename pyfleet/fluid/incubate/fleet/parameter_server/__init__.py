"""Fluid 1.5's ``paddle.fluid.incubate.fleet.parameter_server`` import path."""

__all__ = []

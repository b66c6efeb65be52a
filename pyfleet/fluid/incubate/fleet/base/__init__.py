"""Fluid 1.5's ``paddle.fluid.incubate.fleet.base`` (re-exports of :mod:`pyfleet.distributed.role_maker`)."""

from pyfleet.fluid.incubate.fleet.base import role_maker

__all__ = ["role_maker"]

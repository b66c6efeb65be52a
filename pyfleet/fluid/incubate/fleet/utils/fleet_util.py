"""Fluid 1.8's ``incubate.fleet.utils.fleet_util``: ``FleetUtil`` refused by
name when used (its helpers drive PSLib and HDFS jobs)."""

from pyfleet.fluid import refusals as _refusals

__all__ = []

_refusals.install(globals(), "paddle.fluid.incubate.fleet.utils.fleet_util")

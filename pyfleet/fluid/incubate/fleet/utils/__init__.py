"""Fluid 1.8's ``incubate.fleet.utils``: ``hdfs.HDFSClient`` (the contrib
client), ``fleet_util.FleetUtil`` and ``utils``' program tools (refused by
name when used)."""

from pyfleet.fluid.incubate.fleet.utils import fleet_util, hdfs, utils

__all__ = ["fleet_util", "hdfs", "utils"]

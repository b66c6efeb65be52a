"""Fluid 1.8's ``incubate.fleet.utils.hdfs``: the ``HDFSClient`` of
``fluid.contrib.utils`` (:mod:`pyfleet.fluid.contrib.utils.hdfs_utils`)."""

from pyfleet.fluid.contrib.utils.hdfs_utils import HDFSClient

__all__ = ["HDFSClient"]

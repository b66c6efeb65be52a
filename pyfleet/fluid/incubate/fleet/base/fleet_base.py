"""Fluid 1.8's ``incubate.fleet.base.fleet_base``: ``Fleet`` and
``DistributedOptimizer`` (pyfleet's, :mod:`pyfleet.distributed.fleet`) and
``Mode``, the kind of a Fleet: ``TRANSPILER`` (parameter servers, what
pyfleet's ``fleet`` is), ``PSLIB``, ``COLLECTIVE``."""

from pyfleet.distributed.fleet import DistributedOptimizer, Fleet

__all__ = ["DistributedOptimizer", "Fleet", "Mode"]


class Mode:
    """Fluid's Fleet kinds (the numbers of ``fleet_base.Mode``)."""

    TRANSPILER = 1
    PSLIB = 2
    COLLECTIVE = 3

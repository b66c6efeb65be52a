"""Fluid 1.5/1.6's ``paddle.fluid.incubate.fleet.collective``: the collective
(all-reduce) Fleet over MPI, :mod:`pyfleet.distributed.collective`::

    from pyfleet.fluid.incubate.fleet.collective import fleet, DistributedStrategy

See docs/collective.md."""

from pyfleet.distributed.collective import (
    Collective,
    CollectiveOptimizer,
    DistributedStrategy,
    fleet,
)

__all__ = ["Collective", "CollectiveOptimizer", "DistributedStrategy", "fleet"]


# Fluid 1.8 names pyfleet does not provide: refused by name when used.
from pyfleet.fluid import refusals as _refusals  # noqa: E402

_refusals.install(globals(), "paddle.fluid.incubate.fleet.collective")

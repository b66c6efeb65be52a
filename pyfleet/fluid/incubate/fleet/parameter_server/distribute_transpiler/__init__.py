"""Fluid 1.5's ``paddle.fluid.incubate.fleet.parameter_server.distribute_transpiler``:
``fleet`` is pyfleet's Fleet singleton (:mod:`pyfleet.distributed.fleet`), so::

    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler import fleet

gives the same object as ``from pyfleet import fleet``."""

from pyfleet.config import DistributeTranspilerConfig
from pyfleet.distributed.fleet import DistributedOptimizer, Fleet, TranspilerOptimizer, fleet

__all__ = ["DistributeTranspilerConfig", "DistributedOptimizer", "DistributedTranspiler",
           "Fleet", "TranspilerOptimizer", "fleet"]

# Fluid 1.8's name of the class: fleet = DistributedTranspiler().
DistributedTranspiler = type(fleet)

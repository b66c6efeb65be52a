"""``fluid.core``: the few core names Fluid scripts touch."""

from pyfleet.fluid.tensor import CPUPlace, LoDTensor, Scope

__all__ = ["CPUPlace", "EOFException", "LoDTensor", "Scope"]


class EOFException(Exception):
    """Raised by ``Executor.run`` when a started non-iterable ``PyReader`` has
    no batch left; call ``reader.reset()`` and ``start()`` for the next pass."""

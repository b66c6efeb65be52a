"""``paddle.fluid.dygraph``: importable (Fleet-era test bases import it), and
every name of it is refused when used: pyfleet runs static-graph programs only.

``fluid.dygraph.guard()``, ``fluid.dygraph.Layer`` (subclassing included),
``to_variable``, ... raise :class:`~pyfleet.errors.UnsupportedError` naming
the name and the reason."""

from pyfleet.fluid import refusals as _refusals

__all__ = []

__getattr__ = _refusals.refused_module_getattr("paddle.fluid.dygraph", _refusals.DYGRAPH)

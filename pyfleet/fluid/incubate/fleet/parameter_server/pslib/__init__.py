"""Fluid 1.8's ``incubate.fleet.parameter_server.pslib``: importable, every
name refused when used. PSLib is Baidu's closed parameter server; pyfleet
implements the ``distribute_transpiler`` Fleet (same API: ``fleet.init``,
``distributed_optimizer``, ``init_server``/``run_server``, ...)."""

from pyfleet.fluid import refusals as _refusals

__all__ = []

_refusals.install(globals(), "paddle.fluid.incubate.fleet.parameter_server.pslib")
__getattr__ = _refusals.refused_module_getattr(
    "paddle.fluid.incubate.fleet.parameter_server.pslib", _refusals.PSLIB)

"""``paddle.fluid.profiler``: importable, every name refused when used.

Fluid's profiler times its C++ operator kernels and writes a timeline of
them; pyfleet's operators are numpy kernels of one Python step, so there is
no such timeline to record: profile a pyfleet job with ``python -m cProfile``
or ``py-spy``, and its throughput with the trainer's progress lines."""

from pyfleet.fluid import refusals as _refusals

__all__ = []

PROFILER = ("Fluid's profiler times C++ operator kernels pyfleet does not have: profile "
            "with python -m cProfile or py-spy")
__getattr__ = _refusals.refused_module_getattr("paddle.fluid.profiler", PROFILER)

"""Fluid's ``unique_name``: ``generate(key)`` and ``guard()`` (fresh counters)."""

from pyfleet.fluid.framework import unique_name as _gen

__all__ = ["generate", "guard"]


def generate(key):
    return _gen.generate(key)


def guard(new_generator=None):
    """A context in which layer names start again from ``_0``."""
    return _gen.guard(new_generator)

"""Fluid's ``unique_name``: ``generate(key)`` gives ``key_0``, ``key_1``, ...;
``guard()`` starts the counters again (e.g. to build a second network with
the same names)."""

import contextlib

__all__ = ["generate", "guard"]


class _UniqueName:
    """The counters of one naming context: ``generate("fc")`` gives ``fc_0``, ``fc_1``, ..."""

    def __init__(self):
        self.counters = {}

    def generate(self, key):
        n = self.counters.get(key, 0)
        self.counters[key] = n + 1
        return f"{key}_{n}"

    @contextlib.contextmanager
    def guard(self, new_generator=None):
        saved = self.counters
        self.counters = {}
        try:
            yield
        finally:
            self.counters = saved


# The process-wide generator every layer and program names its variables with.
_generator = _UniqueName()


def generate(key):
    return _generator.generate(key)


def guard(new_generator=None):
    """A context in which layer names start again from ``_0``."""
    return _generator.guard(new_generator)

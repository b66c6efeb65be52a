"""Initializers for table rows, named as ``paddle.fluid.initializer``.

A sparse row's initial value is a pure function of ``(seed, key, initializer)``:
element ``j`` of key ``k`` is drawn from a counter-based generator seeded by
``mix64(k ^ mix64(seed))`` and ``j`` (see ``include/pyfleet/initializer.h``), so
the same key starts from the same row on any server, in any order, in any
process, and a model does not depend on how many servers hold it.
"""

import numpy as np

from pyfleet import _core
from pyfleet._record import ConfigRecord
from pyfleet._record import from_config as _from_config

__all__ = [
    "MSRA",
    "Constant",
    "ConstantInitializer",
    "Initializer",
    "MSRAInitializer",
    "Normal",
    "NormalInitializer",
    "TruncatedNormal",
    "TruncatedNormalInitializer",
    "Uniform",
    "UniformInitializer",
    "Xavier",
    "XavierInitializer",
]


class Initializer(ConfigRecord):
    kind = None

    def _core_config(self, fan_in=None, fan_out=None):
        c = _core.InitializerConfig()
        c.kind = getattr(_core.InitializerKind, self.kind)
        c.a, c.b = self._ab(fan_in, fan_out)
        return c

    def generate(self, shape, seed=0, key=0):
        """A dense array of ``shape`` drawn by the same rule (element ``j`` of ``key``)."""
        shape = tuple(int(s) for s in np.atleast_1d(shape))
        fan_in = shape[0] if shape else 1
        fan_out = shape[1] if len(shape) > 1 else shape[0] if shape else 1
        size = int(np.prod(shape)) if shape else 1
        out = np.empty(size, dtype=np.float32)
        _core.initial_values(self._core_config(fan_in, fan_out), int(seed), int(key), out)
        return out.reshape(shape)


class Constant(Initializer):
    kind = "Constant"

    def __init__(self, value=0.0, force_cpu=False):
        self.value = float(value)   # force_cpu: Fluid's; every value lives on the CPU here

    def _ab(self, fan_in, fan_out):
        return self.value, 0.0


class Uniform(Initializer):
    kind = "Uniform"

    def __init__(self, low=-1.0, high=1.0, seed=0):
        if not float(low) <= float(high):
            raise ValueError(f"Uniform needs low <= high, got low={low!r} high={high!r}")
        self.low, self.high = float(low), float(high)

    def _ab(self, fan_in, fan_out):
        return self.low, self.high


class Normal(Initializer):
    kind = "Normal"

    def __init__(self, loc=0.0, scale=1.0, seed=0):
        if not float(scale) >= 0:
            raise ValueError(f"Normal needs scale >= 0, got {scale!r}")
        self.loc, self.scale = float(loc), float(scale)

    def _ab(self, fan_in, fan_out):
        return self.loc, self.scale


class TruncatedNormal(Normal):
    """Normal, redrawn until within two standard deviations of ``loc``."""

    kind = "TruncatedNormal"


class Xavier(Initializer):
    """Glorot: uniform in ``±sqrt(6 / (fan_in + fan_out))`` (or normal with
    ``std = sqrt(2 / (fan_in + fan_out))`` when ``uniform=False``)."""

    kind = "Uniform"

    def __init__(self, uniform=True, fan_in=None, fan_out=None, seed=0):
        self.uniform = bool(uniform)
        self.fan_in, self.fan_out = fan_in, fan_out

    def _core_config(self, fan_in=None, fan_out=None):
        fi = self.fan_in or fan_in or 1
        fo = self.fan_out or fan_out or 1
        if self.uniform:
            limit = float(np.sqrt(6.0 / (fi + fo)))
            return Uniform(-limit, limit)._core_config()
        return Normal(0.0, float(np.sqrt(2.0 / (fi + fo))))._core_config()


class MSRA(Initializer):
    """He/Kaiming: uniform in ``±sqrt(6 / fan_in)`` (or normal with ``std =
    sqrt(2 / fan_in)`` when ``uniform=False``); ``fan_in`` is the weight's
    first dimension unless given, as Fluid's MSRAInitializer."""

    kind = "Uniform"

    def __init__(self, uniform=True, fan_in=None, seed=0):
        self.uniform = bool(uniform)
        self.fan_in = fan_in

    def _core_config(self, fan_in=None, fan_out=None):
        fi = self.fan_in or fan_in or 1
        if self.uniform:
            limit = float(np.sqrt(6.0 / fi))
            return Uniform(-limit, limit)._core_config()
        return Normal(0.0, float(np.sqrt(2.0 / fi)))._core_config()


ConstantInitializer = Constant
MSRAInitializer = MSRA
UniformInitializer = Uniform
NormalInitializer = Normal
TruncatedNormalInitializer = TruncatedNormal
XavierInitializer = Xavier


def from_config(config):
    """Rebuild an initializer from :meth:`Initializer.to_config` output."""
    return _from_config(config, (Constant, Uniform, Normal, TruncatedNormal, Xavier, MSRA),
                        "initializer")

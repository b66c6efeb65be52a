"""The old import path of :mod:`pyfleet.fluid.inference` (prediction models)."""

from pyfleet.fluid.inference import *
from pyfleet.fluid.inference import __all__  # noqa: F401

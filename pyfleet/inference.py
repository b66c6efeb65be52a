"""The old import path of :mod:`pyfleet.fluid.inference` (prediction models). Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.fluid.inference import *
from pyfleet.fluid.inference import __all__  # noqa: F401

warnings.warn("pyfleet.inference is an old path: import pyfleet.fluid.inference", DeprecationWarning,
              stacklevel=2)

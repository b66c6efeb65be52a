"""The old import path of :mod:`pyfleet.data.prefetch`. Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.data.prefetch import *
from pyfleet.data.prefetch import __all__  # noqa: F401

warnings.warn("pyfleet._prefetch is an old path: import pyfleet.data.prefetch", DeprecationWarning,
              stacklevel=2)

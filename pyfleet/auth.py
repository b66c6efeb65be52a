"""Old path of :mod:`pyfleet.service.auth` (CURVE keys and client authentication),
kept for users' imports and ``pyfleet keygen``. Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.service.auth import *
from pyfleet.service.auth import __all__  # noqa: F401

warnings.warn("pyfleet.auth is an old path: import pyfleet.service.auth", DeprecationWarning,
              stacklevel=2)

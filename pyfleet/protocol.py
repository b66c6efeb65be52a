"""Old path of :mod:`pyfleet.service.protocol` (the wire protocol), kept for users' imports. Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.service.protocol import *
from pyfleet.service.protocol import __all__  # noqa: F401

warnings.warn("pyfleet.protocol is an old path: import pyfleet.service.protocol", DeprecationWarning,
              stacklevel=2)

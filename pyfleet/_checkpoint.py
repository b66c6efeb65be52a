"""Old path of :mod:`pyfleet.service.checkpoint` (checkpoint directories and their
manifest), kept until every importer uses the new one. Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.service.checkpoint import *
from pyfleet.service.checkpoint import __all__  # noqa: F401

warnings.warn("pyfleet._checkpoint is an old path: import pyfleet.service.checkpoint", DeprecationWarning,
              stacklevel=2)

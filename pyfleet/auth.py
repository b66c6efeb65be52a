"""Old path of :mod:`pyfleet.service.auth` (CURVE keys and client authentication),
kept for users' imports and ``pyfleet keygen``."""

from pyfleet.service.auth import *
from pyfleet.service.auth import __all__  # noqa: F401

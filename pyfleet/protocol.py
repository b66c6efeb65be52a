"""Old path of :mod:`pyfleet.service.protocol` (the wire protocol), kept for users' imports."""

from pyfleet.service.protocol import *
from pyfleet.service.protocol import __all__  # noqa: F401

"""The old import path of :mod:`pyfleet.data.prefetch`."""

from pyfleet.data.prefetch import *
from pyfleet.data.prefetch import __all__  # noqa: F401

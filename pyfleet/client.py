"""Old path of :mod:`pyfleet.service.client`: ``pyfleet.client.Client`` (and
:class:`~pyfleet.service.geo.GeoClient`) stay importable from here. Importing it warns
once with ``DeprecationWarning``."""

import warnings

from pyfleet.service.client import Client, PullFuture, unique_keys
from pyfleet.service.geo import GeoClient

__all__ = ["Client", "GeoClient", "PullFuture", "unique_keys"]

warnings.warn("pyfleet.client is an old path: import pyfleet.service.client", DeprecationWarning,
              stacklevel=2)

"""``paddle.reader``: Paddle 1.x's reader decorators (``import pyfleet as paddle``),
kept in :mod:`pyfleet.data.reader_decorators` (``map_readers``, ``shuffle``,
``chain``, ``compose``, ``buffered``, ``firstn``, ``xmap_readers``, ``cache``,
``multiprocess_reader``)."""

from pyfleet.data import reader_decorators as _home
from pyfleet.data.reader_decorators import *  # noqa: F403

__all__ = [n for n in _home.__all__ if n != "batch"]  # paddle.batch: pyfleet.batch

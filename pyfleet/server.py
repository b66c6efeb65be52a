"""Old path of :mod:`pyfleet.service.server`; ``python -m pyfleet.server`` still runs one
parameter server, as ``python -m pyfleet.service`` and ``pyfleet server`` do. Importing
it warns once with ``DeprecationWarning``."""

import sys
import warnings

from pyfleet.service.command import main
from pyfleet.service.server import Server, segment_sum

__all__ = ["Server", "main", "segment_sum"]

warnings.warn("pyfleet.server is an old path: import pyfleet.service.server, and start a "
              "server with `pyfleet server` or `python -m pyfleet.service`",
              DeprecationWarning, stacklevel=2)

if __name__ == "__main__":
    sys.exit(main())

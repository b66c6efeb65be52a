"""Old path of :mod:`pyfleet.service.server`; ``python -m pyfleet.server`` still
runs one parameter server (see that module for the options)."""

import sys

from pyfleet.service.server import Server, main, segment_sum

__all__ = ["Server", "main", "segment_sum"]

if __name__ == "__main__":
    sys.exit(main())

"""``python -m pyfleet.launch`` (also installed as ``fleetrun``)."""

import sys

from pyfleet.launch.command import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m pyfleet.cli`` (also installed as ``pyfleet``)."""

import sys

from pyfleet.cli import main

if __name__ == "__main__":
    sys.exit(main())

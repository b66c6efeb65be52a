"""``python -m pyfleet.service``: run one parameter server (:mod:`pyfleet.service.command`
has the options; ``pyfleet server`` is the same command)."""

import sys

from pyfleet.service.command import main

if __name__ == "__main__":
    sys.exit(main())

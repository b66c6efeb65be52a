"""Old path of :mod:`pyfleet.distributed.role_maker` (it moved beside the fleets that
use it); importing it warns once with ``DeprecationWarning``."""

import warnings

from pyfleet.distributed.role_maker import *  # noqa: F403
from pyfleet.distributed.role_maker import __all__  # noqa: F401

warnings.warn("pyfleet.role_maker moved to pyfleet.distributed.role_maker; import it from "
              "there (or from pyfleet.fluid.incubate.fleet.base.role_maker)",
              DeprecationWarning, stacklevel=2)

"""Old path of :mod:`pyfleet.service.checkpoint` (checkpoint directories and their
manifest), kept until every importer uses the new one."""

from pyfleet.service.checkpoint import *
from pyfleet.service.checkpoint import __all__  # noqa: F401

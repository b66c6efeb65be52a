"""pyfleet: a sparse parameter server for CTR training, with PaddlePaddle Fluid's Fleet API.

The table layer is imported here; ``fleet``, ``models`` and ``batch`` pull in
the Fluid layer, so they load on first use (PEP 562): a server process
imports ``pyfleet`` on its way to :mod:`pyfleet.service.server` without Fluid.
"""

import importlib

from pyfleet import entry, initializer, metrics, optimizer
from pyfleet._version import __version__
from pyfleet.errors import PyfleetError
from pyfleet.table import DenseTable, SparseTable, route

__all__ = [
    "DenseTable",
    "PyfleetError",
    "SparseTable",
    "__version__",
    "batch",
    "entry",
    "fleet",
    "initializer",
    "metrics",
    "models",
    "optimizer",
    "route",
]

# name -> (module, attribute or None for the module itself)
_LAZY = {
    "fleet": ("pyfleet.distributed.fleet", "fleet"),
    "models": ("pyfleet.models", None),
    "batch": ("pyfleet.fluid.reader", "batch"),
}


def __getattr__(name):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'pyfleet' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

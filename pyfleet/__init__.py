"""pyfleet: a sparse parameter server for CTR training, with PaddlePaddle Fluid's Fleet API.

The table layer is imported here; ``fleet``, ``models`` and ``batch`` pull in
the Fluid layer, so they load on first use (PEP 562): a server process
imports ``pyfleet`` on its way to :mod:`pyfleet.service.server` without Fluid.
"""

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
    "reader",
    "route",
]

def __getattr__(name):
    # The Fluid layer loads here, on first use of one of these names, never at
    # `import pyfleet` (names are fixed: nothing is imported by a computed name).
    if name == "fleet":
        from pyfleet.distributed.fleet import fleet as value
    elif name == "models":
        from pyfleet import models as value
    elif name == "batch":
        from pyfleet.fluid.reader import batch as value
    elif name == "reader":   # Paddle's paddle.reader decorators
        import pyfleet.reader as value
    else:
        raise AttributeError(f"module 'pyfleet' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

"""pyfleet: a sparse parameter server for CTR training, with PaddlePaddle Fluid's Fleet API.

The table layer is imported here; ``fleet`` and ``models`` pull in the Fluid
layer, so they (and ``batch``, ``reader``) load on first use (PEP 562): a server process
imports ``pyfleet`` on its way to :mod:`pyfleet.service.server` without Fluid.
"""


def _check_core():
    """Import the compiled core first, so that its absence is one clear error.

    After a plain ``pip install .``, running from the checkout's root puts the
    checkout's ``pyfleet/`` (no compiled modules) ahead of the installed
    package, and every later ``from pyfleet import _core`` fails as a
    "circular import"."""
    import os
    try:
        from pyfleet import _core  # noqa: F401
    except ImportError as exc:
        here = os.path.dirname(os.path.abspath(__file__))
        if os.path.exists(os.path.join(here, os.pardir, "pyproject.toml")):
            raise ImportError(
                f"pyfleet's compiled core (pyfleet._core) is not in {here}: the checkout's "
                f"pyfleet/ folder shadows the installed package: run from another directory "
                f"or use pip install -e .") from None
        raise ImportError(f"pyfleet's compiled core (pyfleet._core) cannot be imported: "
                          f"{exc}; reinstall with pip install . from the checkout") from exc


_check_core()

from pyfleet import entry, initializer, metrics, optimizer  # noqa: E402
from pyfleet._version import __version__  # noqa: E402
from pyfleet.errors import PyfleetError  # noqa: E402
from pyfleet.table import DenseTable, SparseTable, route  # noqa: E402

__all__ = [
    "DenseTable",
    "PyfleetError",
    "SparseTable",
    "__version__",
    "batch",
    "compat",
    "dataset",
    "entry",
    "fleet",
    "fluid",
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
    elif name == "fluid":    # `import pyfleet as paddle; paddle.fluid...` (Fluid's own habit)
        import pyfleet.fluid as value
    elif name == "models":
        import pyfleet.models as value
    elif name == "batch":
        from pyfleet.data.reader_decorators import batch as value
    elif name == "reader":   # Paddle's paddle.reader decorators
        import pyfleet.reader as value
    elif name == "dataset":  # Paddle's `import paddle` imports paddle.dataset too
        import pyfleet.dataset as value
    elif name == "norm":     # Paddle 2.0's paddle.norm (PaddleRec's rank/pnn calls it)
        from pyfleet.fluid.layers_math import paddle_norm as value
    elif name == "compat":   # and paddle.compat
        import pyfleet.compat as value
    else:
        raise AttributeError(f"module 'pyfleet' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

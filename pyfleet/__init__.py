"""pyfleet: a sparse parameter server for CTR training, with PaddlePaddle Fluid's Fleet API."""

__version__ = "0.1.0"


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

from pyfleet import entry, initializer, metrics, models, optimizer  # noqa: E402
from pyfleet.errors import PyfleetError  # noqa: E402
from pyfleet.table import DenseTable, SparseTable, route  # noqa: E402
from pyfleet.fluid.reader import batch  # noqa: E402
from pyfleet._fleet import fleet  # noqa: E402

__all__ = ["SparseTable", "DenseTable", "route", "optimizer", "initializer", "entry",
           "metrics", "models", "PyfleetError", "batch", "fleet", "__version__"]

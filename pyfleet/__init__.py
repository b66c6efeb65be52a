"""pyfleet: a sparse parameter server for CTR training, with PaddlePaddle Fluid's Fleet API."""

__version__ = "0.1.0"

from pyfleet import entry, initializer, metrics, models, optimizer  # noqa: E402
from pyfleet.errors import PyfleetError  # noqa: E402
from pyfleet.table import DenseTable, SparseTable, route  # noqa: E402
from pyfleet.fluid.reader import batch  # noqa: E402
from pyfleet._fleet import fleet  # noqa: E402

__all__ = ["SparseTable", "DenseTable", "route", "optimizer", "initializer", "entry",
           "metrics", "models", "PyfleetError", "batch", "fleet", "__version__"]

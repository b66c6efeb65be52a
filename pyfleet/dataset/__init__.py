"""``paddle.dataset`` (zero-edit mode: ``import paddle.dataset.common``).

``common`` works (its file helpers; ``download`` returns a cached file and
never reaches the network). The public-dataset downloaders (``mnist``,
``imikolov``, ``movielens``, ...) are refused by name when used: pyfleet
ships none.
"""

from pyfleet.dataset import common
from pyfleet.fluid import refusals as _refusals

__all__ = ["common"]

_refusals.install(globals(), "paddle.dataset")

"""The names Fluid 1.8's ``fluid.io`` re-exports beside saving and loading
(joined into :mod:`pyfleet.fluid.io`): the reader decorators of ``paddle.reader``
and ``batch`` (:mod:`pyfleet.data.reader_decorators`), ``default_collate_fn`` of
its DataLoader, and the program queries ``get_program_parameter`` /
``get_program_persistable_vars``."""

import numpy as np

from pyfleet.data.reader_decorators import (
    ComposeNotAligned,
    batch,
    buffered,
    cache,
    chain,
    compose,
    firstn,
    map_readers,
    multiprocess_reader,
    shuffle,
    xmap_readers,
)
from pyfleet.fluid.framework import Parameter

__all__ = ["ComposeNotAligned", "batch", "buffered", "cache", "chain", "compose",
           "default_collate_fn", "firstn", "get_program_parameter",
           "get_program_persistable_vars", "map_readers", "multiprocess_reader", "shuffle",
           "xmap_readers"]


def default_collate_fn(batch):
    """Fluid's DataLoader collation: a list of samples (tuples of fields) ->
    one array per field, the samples stacked."""
    if not batch:
        raise ValueError("default_collate_fn: the batch is empty")
    n = len(batch[0])
    for i, sample in enumerate(batch):
        if len(sample) != n:
            raise ValueError(f"default_collate_fn: sample {i} has {len(sample)} fields, "
                             f"sample 0 has {n}")
    return [np.stack([np.asarray(s[j]) for s in batch]) for j in range(n)]


def get_program_parameter(program):
    """The parameters of ``program`` (Fluid: its trainable persistables)."""
    return [v for v in program.list_vars() if isinstance(v, Parameter)]


def get_program_persistable_vars(program):
    """The persistable variables of ``program``: parameters and scope state."""
    return [v for v in program.list_vars() if getattr(v, "persistable", False)]

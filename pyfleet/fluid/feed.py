"""Feed conversion: one feed entry into the value the step computes with.

A ``lod_level=1`` variable takes a :class:`LoDTensor`, a ``(values,
offsets)`` tuple (a reader's CTR batch; slots sharing one offsets array
validate it once) or a list of sequences; any other variable an array-like
of its declared shape (``-1`` the batch) and dtype (ids are never rounded
from floats).
"""

import math

import numpy as np

from pyfleet.fluid.data_feeder import sequences_to_lod
from pyfleet.fluid.tensor import LoDTensor

__all__ = ["as_numpy", "feed_ids", "feed_value"]


def as_numpy(value):
    if isinstance(value, (list, tuple)):
        return [as_numpy(v) for v in value]
    if isinstance(value, LoDTensor):
        return value.data
    return np.asarray(value)



def feed_ids(value):
    """The flat integer ids of one feed entry as ``run`` will read them, or None."""
    if isinstance(value, LoDTensor):
        value = value.data
    elif isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        return None
    return value.reshape(-1)


def feed_value(var, value, checked=None):
    """Turn one feed entry into the engine's value for ``var``.

    ``checked`` (one feed's): ``id(offsets) -> (offsets, LoDTensor)`` of the
    offsets arrays validated so far, so slots that share one offsets array
    (a reader's CTR batch) validate it once."""
    if var.lod_level > 0:
        valid = False
        if isinstance(value, LoDTensor):
            t = value
        elif isinstance(value, tuple) and len(value) == 2 and checked is not None and \
                id(value[1]) in checked:
            data = np.asarray(value[0])
            data = data.reshape(-1, 1) if data.ndim == 1 else data
            off, seen = checked[id(value[1])]
            if off is not value[1] or data.ndim == 0 or seen.data.shape[0] != data.shape[0]:
                return feed_value(var, value)
            t, valid = seen._like(data), True
        elif isinstance(value, tuple) and len(value) == 2:
            data, offsets = np.asarray(value[0]), np.asarray(value[1])
            t = LoDTensor(data.reshape(-1, 1) if data.ndim == 1 else data, offsets)
        elif isinstance(value, list):
            t = sequences_to_lod(value, var.dtype)
        else:
            raise ValueError(f"feed for {var.name!r} (lod_level={var.lod_level}) must be a "
                             "LoDTensor, a (values, offsets) tuple or a list of sequences; "
                             f"got {type(value).__name__}")
        if not valid:
            t.validate(f"feed {var.name!r}")
            if checked is not None and isinstance(value, tuple) and \
                    isinstance(value[1], np.ndarray):
                checked[id(value[1])] = (value[1], t)
        data = t.data
        if data.dtype != var.dtype and not (var.dtype == np.int64 and data.dtype == np.uint64):
            if var.dtype.kind in "iu" and data.dtype.kind not in "iu":
                raise ValueError(f"feed {var.name!r}: ids must be integers, got {data.dtype}")
            t = LoDTensor(data.astype(var.dtype), t.offsets)
        return t
    if isinstance(value, LoDTensor):
        value = value.data
    try:
        a = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"feed {var.name!r}: not a rectangular array ({e}); a variable-"
                         f"length input needs lod_level=1") from None
    if a.dtype == object:
        raise ValueError(f"feed {var.name!r}: not a rectangular array of numbers; a "
                         f"variable-length input needs lod_level=1")
    if a.dtype != var.dtype:
        if var.dtype.kind in "iu" and a.dtype.kind not in "iub":
            # As Fluid: ids and labels are not rounded from floats (float32 cannot
            # even hold every id: 123456789 and 123456790 are one float32).
            raise ValueError(f"feed {var.name!r}: declared {var.dtype.name}, got {a.dtype} "
                             f"(convert with .astype(np.{var.dtype.name}))")
        a = a.astype(var.dtype)
    if var.shape is not None and len(var.shape) > 0:
        tail = var.shape[1:] if var.shape[0] == -1 else var.shape
        if all(d > 0 for d in tail):
            per = math.prod(tail)
            if var.shape[0] == -1:
                if a.ndim == 0 or a.size % per:
                    raise ValueError(f"feed {var.name!r}: shape {a.shape} does not fit "
                                     f"declared shape {list(var.shape)}")
                if a.shape[1:] != tuple(tail):
                    a = a.reshape((-1,) + tuple(tail))
            elif a.size != per:
                raise ValueError(f"feed {var.name!r}: shape {a.shape} does not fit declared "
                                 f"shape {list(var.shape)}")
            else:
                a = a.reshape(var.shape)
    return a

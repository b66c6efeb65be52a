"""Sequences of a LoD value: per-sequence pooling and per-segment sums.

Pure functions over :class:`~pyfleet.fluid.tensor.LoDTensor` values and
arrays, used by the ``sequence_pool`` op (:mod:`pyfleet.fluid.ops`) and by
the executor's embedding gradients (one row sum per unique id).
"""

import numpy as np

from pyfleet import _core

__all__ = ["is_unit", "segment_sum", "sequence_pool_backward", "sequence_pool_forward"]



def segment_sum(values, segment, num_segments):
    """``out[k] = sum of values[i] with segment[i] == k`` for 2-D ``values``.

    float32 (the engine's dtype): one pass of the core's ``sum_rows``, adding
    in input order. Any other dtype (float64 gradient checks): one float64
    ``bincount`` per column."""
    if values.dtype == np.float32:
        return _core.sum_rows(values, np.asarray(segment, dtype=np.int64), num_segments)
    out = np.empty((num_segments, values.shape[1]), dtype=values.dtype)
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(segment, weights=values[:, j], minlength=num_segments)
    return out


def _seq_info(x):
    off = x.offsets
    lens = np.diff(off)
    nonempty = lens > 0
    return off, lens, nonempty


def is_unit(x):
    """Whether LoDTensor ``x`` has exactly one row per sequence (pooling is the identity)."""
    return _is_unit(x)


def _is_unit(x):
    # Every sequence of length 1 (one id per slot): pooling is the identity.
    cached = getattr(x, "_unit", None)
    if cached is None:
        off = x.offsets
        cached = off.shape[0] - 1 == x.data.shape[0] and (
            off.shape[0] == 1 or int(np.diff(off).min()) >= 1)
        x._unit = cached
    return cached


def sequence_pool_forward(x, pool_type):
    """Pool each sequence of LoDTensor ``x``: returns ``(out, aux)``; an empty
    sequence pools to zeros."""
    data = x.data
    pool_type = pool_type.lower()
    if _is_unit(x):
        return data, None
    off, lens, nonempty = _seq_info(x)
    b = lens.shape[0]
    out = np.zeros((b,) + data.shape[1:], dtype=data.dtype)
    if not nonempty.any():
        return out, None
    starts = off[:-1][nonempty]
    aux = None
    if pool_type in ("sum", "average", "sqrt"):
        out[nonempty] = np.add.reduceat(data, starts, axis=0)
        if pool_type == "average":
            out[nonempty] /= lens[nonempty].astype(data.dtype).reshape(
                (-1,) + (1,) * (data.ndim - 1))
        elif pool_type == "sqrt":
            out[nonempty] /= np.sqrt(lens[nonempty].astype(data.dtype)).reshape(
                (-1,) + (1,) * (data.ndim - 1))
    elif pool_type == "max":
        out[nonempty] = np.maximum.reduceat(data, starts, axis=0)
        rows = np.arange(data.shape[0]).reshape((-1,) + (1,) * (data.ndim - 1))
        is_max = data == out[x.segment_ids()]
        first = np.where(is_max, rows, data.shape[0])
        aux = np.minimum.reduceat(first, starts, axis=0)   # row of the max, per column
    elif pool_type == "first":
        out[nonempty] = data[starts]
    elif pool_type == "last":
        out[nonempty] = data[off[1:][nonempty] - 1]
    else:
        raise ValueError(f"sequence_pool: unknown pool_type {pool_type!r}; expected sum, "
                         "average, sqrt, max, first or last")
    return out, aux


def sequence_pool_backward(x, pool_type, g, aux):
    data = x.data
    pool_type = pool_type.lower()
    if _is_unit(x):
        return g
    off, lens, nonempty = _seq_info(x)
    shape1 = (-1,) + (1,) * (data.ndim - 1)
    if pool_type == "sum":
        return g[x.segment_ids()]
    if pool_type == "average":
        return (g / np.maximum(lens, 1).astype(g.dtype).reshape(shape1))[x.segment_ids()]
    if pool_type == "sqrt":
        return (g / np.sqrt(np.maximum(lens, 1)).astype(g.dtype).reshape(shape1))[
            x.segment_ids()]
    gx = np.zeros(data.shape, dtype=g.dtype)
    if not nonempty.any():
        return gx
    if pool_type == "max":
        g2 = g[nonempty].reshape(aux.shape[0], -1)
        r = aux.reshape(aux.shape[0], -1)
        cols = np.broadcast_to(np.arange(r.shape[1]), r.shape)
        gx.reshape(data.shape[0], -1)[r, cols] = g2
    elif pool_type == "first":
        gx[off[:-1][nonempty]] = g[nonempty]
    elif pool_type == "last":
        gx[off[1:][nonempty] - 1] = g[nonempty]
    return gx

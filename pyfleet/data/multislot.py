"""Fluid's MultiSlot text format, parsed into columns of numpy arrays (the format
``fluid.DatasetFactory``'s datasets read, :mod:`pyfleet.fluid.dataset`, and
:mod:`pyfleet.fluid.incubate.data_generator` writes): per sample one line; per
variable in order the number of values, then the values.

``use_vars`` are the variables a dataset feeds (anything with ``name``,
``dtype``, ``shape`` and ``lod_level``): a ``lod_level=1`` variable's column is
``(values, offsets)``, another's an ``[n] + shape`` array. Parsing is
compiled (:mod:`pyfleet.data._parse`): no Python object per line or value.
"""

import numpy as np

from pyfleet.data import _parse

__all__ = ["concat_columns", "parse_multislot", "permute_columns", "slice_columns"]


def parse_multislot(data, use_vars):
    """Parse MultiSlot text into ``{name: value}``: ``(values, offsets)`` for
    ``lod_level=1`` variables, ``[n] + shape`` arrays for the others. One compiled
    pass per buffer whatever the lines' layouts (:func:`pyfleet.data._parse.
    parse_multislot_text`); a bad line is a ValueError naming it and the variable."""
    buf = np.frombuffer(memoryview(data), dtype=np.uint8)
    kinds = np.array([np.dtype(v.dtype).kind == "f" for v in use_vars], dtype=np.int8)
    try:
        n, lens, values = _parse.parse_multislot_text(buf, kinds)
    except ValueError as e:
        if len(e.args) != 4:
            raise
        raise ValueError(_multislot_error(use_vars, *e.args)) from None
    if n == 0:
        return {}, 0
    out = {}
    for j, v in enumerate(use_vars):
        out[v.name] = _shape_column(v, _as_dtype(values[j], np.dtype(v.dtype), v.name),
                                    lens[j], n)
    return out, n


def _multislot_error(use_vars, code, line, var, token):
    nv = len(use_vars)
    if code == 1:
        return f"line {line}: {nv} slots expected, found {var}"
    if code == 2:
        return f"line {line}: {token} values left after {nv} slots"
    what = "count" if code == 3 else "value"
    name = use_vars[var].name
    return (f"line {line}: slot {name!r}: {what} {token.decode(errors='replace')!r} is not "
            f"{'a whole number' if code == 3 else 'a number of ' + str(np.dtype(use_vars[var].dtype))}")


def _as_dtype(vals, dtype, name):
    """The parser's int64 or float64 values as the variable's dtype; integers out of a
    narrower dtype's range are refused by name (int64 keeps hashed ids up to 2^64 - 1
    as their bits)."""
    if vals.dtype == dtype:
        return vals
    if dtype.kind in "iu" and dtype.itemsize < 8 and vals.size:
        info = np.iinfo(dtype)
        lo, hi = int(vals.min()), int(vals.max())
        if lo < info.min or hi > info.max:
            raise ValueError(f"slot {name!r}: values {lo}..{hi} do not fit {dtype}")
    return vals.astype(dtype)


def _shape_column(var, vals, lens, n):
    if var.lod_level > 0:
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        return vals, offsets
    tail = list(var.shape[1:]) if var.shape and var.shape[0] == -1 else list(var.shape or [])
    per = int(np.prod(tail)) if tail else 1
    if not (lens == per).all():
        raise ValueError(f"slot {var.name!r} must have {per} values per sample "
                         f"(shape {tail}); found {int(lens.min())}..{int(lens.max())}")
    return vals.reshape([n] + tail)


def slice_columns(columns, use_vars, a, b):
    """The rows ``a:b`` of parsed ``columns`` as a feed."""
    feed = {}
    for v in use_vars:
        col = columns[v.name]
        if v.lod_level > 0:
            vals, off = col
            feed[v.name] = (vals[off[a]:off[b]], off[a:b + 1] - off[a])
        else:
            feed[v.name] = col[a:b]
    return feed


def concat_columns(parts, use_vars):
    """``(columns, n)`` of the ``(columns, n)`` ``parts`` one after another."""
    if not parts:
        return {}, 0
    if len(parts) == 1:
        return parts[0]
    n = sum(p[1] for p in parts)
    out = {}
    for v in use_vars:
        cols = [p[0][v.name] for p in parts]
        if v.lod_level > 0:
            vals = np.concatenate([c[0] for c in cols])
            lens = np.concatenate([np.diff(c[1]) for c in cols])
            off = np.zeros(n + 1, np.int64)
            np.cumsum(lens, out=off[1:])
            out[v.name] = (vals, off)
        else:
            out[v.name] = np.concatenate(cols)
    return out, n


def permute_columns(cols, use_vars, perm):
    """The rows of ``cols`` in the order ``perm``."""
    out = {}
    for v in use_vars:
        col = cols[v.name]
        if v.lod_level > 0:
            vals, off = col
            lens = np.diff(off)[perm]
            starts = off[:-1][perm]
            new_off = np.zeros(len(perm) + 1, np.int64)
            np.cumsum(lens, out=new_off[1:])
            # Row i of the result takes lens[i] values from starts[i]: one gather.
            idx = np.repeat(starts - new_off[:-1], lens) + np.arange(new_off[-1])
            out[v.name] = (vals[idx], new_off)
        else:
            out[v.name] = col[perm]
    return out

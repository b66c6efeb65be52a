"""Fluid's MultiSlot text format, parsed into columns of numpy arrays (the format
``fluid.DatasetFactory``'s datasets read, :mod:`pyfleet.fluid.dataset`, and
:mod:`pyfleet.fluid.incubate.data_generator` writes): per sample one line; per
variable in order the number of values, then the values.

``use_vars`` are the variables a dataset feeds (anything with ``name``,
``dtype``, ``shape`` and ``lod_level``): a ``lod_level=1`` variable's column is
``(values, offsets)``, another's an ``[n] + shape`` array. Parsing is
vectorized when every line has the same layout (one value per sparse slot, as
Criteo); otherwise it walks the lines.
"""

import numpy as np

__all__ = ["concat_columns", "parse_multislot", "permute_columns", "slice_columns"]


def _to_numbers(tokens, dtype, what):
    try:
        if dtype.kind == "i":
            try:
                return tokens.astype(dtype)
            except OverflowError:
                return tokens.astype(np.uint64).view(dtype)
        return tokens.astype(dtype)
    except ValueError as e:
        raise ValueError(f"{what}: cannot read values as {dtype}: {e}") from None


def parse_multislot(data, use_vars):
    """Parse MultiSlot text into ``{name: value}``: ``(values, offsets)`` for
    ``lod_level=1`` variables, ``[n] + shape`` arrays for the others."""
    lines = [ln for ln in data.split(b"\n") if ln.strip()]
    n = len(lines)
    if n == 0:
        return {}, 0
    first = lines[0].split()
    tokens = data.split()
    k = len(first)
    layout = []
    pos = 0
    for _v in use_vars:
        if pos >= k:
            layout = None
            break
        c = int(first[pos])
        layout.append((pos, c))
        pos += c + 1
    if layout is not None and pos == k and len(tokens) == n * k:
        mat = np.array(tokens, dtype=bytes).reshape(n, k)
        if all((mat[:, p] == first[p]).all() for p, _ in layout):
            out = {}
            for v, (p, c) in zip(use_vars, layout):
                vals = _to_numbers(mat[:, p + 1:p + 1 + c], v.dtype, f"slot {v.name!r}")
                out[v.name] = _shape_column(v, vals.reshape(-1), np.full(n, c, np.int64), n)
            return out, n
    values = [[] for _ in use_vars]
    lens = [np.empty(n, np.int64) for _ in use_vars]
    for i, line in enumerate(lines):
        t = line.split()
        pos = 0
        for j in range(len(use_vars)):
            if pos >= len(t):
                raise ValueError(f"line {i + 1}: {len(use_vars)} slots expected, found {j}")
            c = int(t[pos])
            values[j].extend(t[pos + 1:pos + 1 + c])
            lens[j][i] = c
            pos += c + 1
        if pos != len(t):
            raise ValueError(f"line {i + 1}: {len(t) - pos} values left after "
                             f"{len(use_vars)} slots")
    out = {}
    for j, v in enumerate(use_vars):
        vals = _to_numbers(np.array(values[j], dtype=bytes), v.dtype, f"slot {v.name!r}")
        out[v.name] = _shape_column(v, vals, lens[j], n)
    return out, n


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

"""``DataFeeder``: a list of samples -> the feed dict of :meth:`Executor.run`.

A sample is a tuple in ``feed_list`` order. For a ``lod_level=1`` input the
entry is a variable-length sequence of ids; the batch becomes a
:class:`LoDTensor` (``data[nnz, 1]`` and offsets). For a dense input the
entry is a scalar or a sequence of ``prod(shape)`` numbers.

This path walks samples in Python; readers that already hold CSR arrays feed
``(values, offsets)`` tuples directly and skip it.
"""

import itertools

import numpy as np

from pyfleet.fluid import framework
from pyfleet.fluid.framework import Variable
from pyfleet.fluid.tensor import LoDTensor

__all__ = ["DataFeeder", "sequences_to_lod"]


def sequences_to_lod(sequences, dtype=np.int64):
    """A LoDTensor from a list of sequences (each a list/array of ids)."""
    lens = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    try:
        values = np.fromiter(itertools.chain.from_iterable(sequences), dtype=dtype, count=total)
    except (TypeError, ValueError) as e:
        raise ValueError(f"lod input: every sequence must hold numbers of dtype "
                         f"{np.dtype(dtype)}: {e}") from None
    return LoDTensor(values.reshape(total, 1), offsets)


class DataFeeder:
    """Fluid's ``DataFeeder(feed_list, place)``; ``feed_list`` holds Variables
    (or their names together with ``program``)."""

    def __init__(self, feed_list, place=None, program=None):
        program = program or framework.default_main_program()
        self.feed_vars = []
        for v in feed_list:
            if isinstance(v, str):
                v = program.global_block().var(v)
            if not isinstance(v, Variable):
                raise ValueError(f"feed_list entries must be Variables or names, got {v!r}")
            self.feed_vars.append(v)
        self.place = place

    def feed(self, iterable):
        samples = list(iterable)
        n = len(self.feed_vars)
        for i, s in enumerate(samples):
            if len(s) != n:
                raise ValueError(f"sample {i} has {len(s)} fields, feed_list has {n} "
                                 f"({[v.name for v in self.feed_vars]})")
        out = {}
        for j, var in enumerate(self.feed_vars):
            col = [s[j] for s in samples]
            if var.lod_level > 0:
                col = [np.atleast_1d(np.asarray(c)).reshape(-1) if not isinstance(c, list)
                       else c for c in col]
                out[var.name] = sequences_to_lod(col, var.dtype)
            else:
                tail = list(var.shape[1:]) if var.shape and var.shape[0] == -1 \
                    else list(var.shape or [])
                try:
                    a = np.asarray(col, dtype=var.dtype)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"feed {var.name!r}: cannot make an array of "
                                     f"{var.dtype}: {e}") from None
                if any(d < 0 for d in tail):
                    # A dimension sized per batch (DIN's padded history, shape
                    # [None, -1]): every sample of this batch has the same size
                    # there, and the known dimensions must match.
                    if a.ndim != len(tail) + 1 or any(
                            d >= 0 and d != n for d, n in zip(tail, a.shape[1:])):
                        raise ValueError(f"feed {var.name!r}: samples must be arrays of "
                                         f"shape {tail} (-1: any size, equal within the "
                                         f"batch), got a batch of shape {a.shape}")
                    out[var.name] = a
                    continue
                per = int(np.prod(tail)) if tail else 1
                if a.size != per * len(samples):
                    raise ValueError(f"feed {var.name!r}: each sample must hold {per} "
                                     f"values (shape {tail}), got array of shape {a.shape}")
                out[var.name] = a.reshape([len(samples)] + tail)
        return out

    def decorate_reader(self, reader, multi_devices, num_places=None, drop_last=True):
        """Fluid's ``decorate_reader``: a reader of feed dicts from a reader of
        sample lists (``paddle.batch`` output). ``multi_devices=True`` yields
        a list of one feed dict per batch (one CPU place: ``exe.run`` and a
        ``CompiledProgram`` take it); ``num_places`` other than None or 1 is
        refused by name (pyfleet runs one place per process). With one place
        no batch is left over, so ``drop_last`` changes nothing."""
        if not callable(reader):
            raise TypeError(f"decorate_reader needs a reader (a callable returning an "
                             f"iterable of sample lists), got {reader!r}")
        if multi_devices and num_places not in (None, 1):
            raise ValueError(f"decorate_reader: num_places={num_places!r} is not supported: "
                             "pyfleet runs one CPU place per process (start more workers "
                             "to use more cores)")

        def feeds():
            for samples in reader():
                feed = self.feed(samples)
                yield [feed] if multi_devices else feed
        return feeds

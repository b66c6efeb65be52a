"""Parsed examples between the parser and a batch: a :class:`Chunk` (one block's
labels, dense values and per-slot ids, with CSR offsets or one id a row) that a
:class:`~pyfleet.data.readers.Dataset` shuffles and cuts into batches
(:meth:`Chunk.permute`, :meth:`Chunk.take`, :func:`concat_parts`), and the hash that
holds examples out for validation (:func:`holdout_mask`). ``pyfleet serve`` builds
chunks of request rows the same way."""

from __future__ import annotations

import numpy as np

__all__ = ["Chunk", "concat_parts", "holdout_mask"]


class Chunk:
    """Parsed examples of one block: per-slot id arrays, CSR offsets or one id per row."""

    __slots__ = ("dense", "labels", "offsets", "slot_ids")

    def __init__(self, labels, dense, slot_ids, offsets):
        self.labels = labels
        self.dense = dense
        self.slot_ids = slot_ids
        self.offsets = offsets  # int64[n + 1, n_slots], or None for one id per row

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, a: int, b: int):
        if self.offsets is None:
            off = np.arange(b - a + 1, dtype=np.int64)
            off.flags.writeable = False  # shared by every slot of the batch
            sparse = [(ids[a:b], off) for ids in self.slot_ids]
        else:
            o = self.offsets[a:b + 1]
            lo, hi = o[0], o[-1]
            rel = o - lo
            sparse = [(ids[lo[s]:hi[s]], np.ascontiguousarray(rel[:, s]))
                      for s, ids in enumerate(self.slot_ids)]
        return self.labels[a:b], self.dense[a:b], sparse

    def permute(self, perm: np.ndarray) -> Chunk:
        if self.offsets is None:
            return Chunk(self.labels[perm], self.dense[perm],
                          [ids[perm] for ids in self.slot_ids], None)
        n = perm.shape[0]  # perm may also select a subset
        new_off = np.zeros((n + 1, self.offsets.shape[1]), dtype=self.offsets.dtype)
        slot_ids = []
        for s, ids in enumerate(self.slot_ids):
            col = self.offsets[:, s]
            lens = (col[1:] - col[:-1])[perm]
            np.cumsum(lens, out=new_off[1:, s])
            src = np.repeat(col[:-1][perm] - new_off[:n, s], lens)
            src += np.arange(src.shape[0], dtype=np.int64)
            slot_ids.append(ids[src])
        return Chunk(self.labels[perm], self.dense[perm], slot_ids, new_off)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def holdout_mask(chunk: Chunk, fraction: float) -> np.ndarray:
    """True for the examples of ``chunk`` on the held-out side: a hash of each
    example's dense values and first id of every slot (splitmix64's mixer)
    below ``fraction`` of the hash range. Vectorized over the chunk."""
    n = len(chunk)
    h = np.zeros(n, dtype=np.uint64)
    cols = [chunk.dense.astype(np.float32).view(np.uint32).astype(np.uint64).T]
    for s, ids in enumerate(chunk.slot_ids):
        if chunk.offsets is None:
            cols.append([ids])
        else:
            o = chunk.offsets[:, s]
            first = np.zeros(n, dtype=np.uint64)
            has = o[1:] > o[:-1]
            first[has] = ids[o[:-1][has]]
            cols.append([first])
    with np.errstate(over="ignore"):
        for group in cols:
            for col in group:
                h = (h ^ np.asarray(col, dtype=np.uint64)) * _MIX
                h ^= h >> np.uint64(31)
        h ^= h >> np.uint64(30)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(27)
    return (h >> np.uint64(11)).astype(np.float64) < fraction * float(1 << 53)


def concat_parts(parts):
    """Join (labels, dense, sparse) pieces of consecutive examples into one batch."""
    if len(parts) == 1:
        return parts[0]
    labels = np.concatenate([p[0] for p in parts])
    dense = np.concatenate([p[1] for p in parts])
    sparse = []
    for s in range(len(parts[0][2])):
        ids = np.concatenate([p[2][s][0] for p in parts])
        offs, base = [np.zeros(1, dtype=np.int64)], 0
        for p in parts:
            o = p[2][s][1]
            offs.append(o[1:] + base)
            base += int(o[-1])
        sparse.append((ids, np.concatenate(offs)))
    return labels, dense, sparse

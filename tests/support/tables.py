"""A trained table and its sorted export, shared by the table tests."""

import numpy as np

import pyfleet
from pyfleet.optimizer import Adam


def trained_table(opt=None, dim=6, n=3000, seed=0, storage=None):
    """A table after three pull/push rounds on ``n`` random keys plus the two edge keys."""
    opt = opt or Adam(learning_rate=0.01)
    rng = np.random.default_rng(seed)
    kwargs = {} if storage is None else {"storage": storage}
    t = pyfleet.SparseTable(dim, opt, seed=seed, **kwargs)
    edge = np.array([0, 2**64 - 1], dtype=np.uint64)
    ks = np.concatenate([edge, rng.integers(0, 2**64, n, dtype=np.uint64)])
    for _ in range(3):
        t.pull(ks)
        t.push(ks, rng.normal(0, 1, (len(ks), dim)).astype(np.float32))
    return t, ks


def snapshot(t):
    """The table's export with state, rows sorted by key."""
    e = t.export(with_state=True)
    order = np.argsort(e["keys"])
    return {k: v[order] for k, v in e.items()}

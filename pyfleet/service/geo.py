"""Geo-SGD on the worker side: :class:`GeoClient`, over a :class:`pyfleet.service.client.Client`.

A worker in geo mode trains its sparse tables on a local copy and, every
``k_steps`` steps, sends the accumulated change of every row it touched
(``new - old``) to the servers, which add it to their rows; the next touch of a
row fetches the server's current value again.

How the local copy is kept: for each sparse table a local
:class:`pyfleet.table.SparseTable` ``L`` with the table's own optimizer and a zero
initializer accumulates the local updates (SGD, Adagrad and Adam steps do not
read the weight, so ``L``'s row is exactly the sum of the local steps and its
optimizer state persists across rounds). When a row is first touched in a
round, the server value ``S`` and the current ``L`` row (``snap``) are recorded;
the row the trainer sees is ``S + (L - snap)``, and the delta sent at the end of
the round is ``L - snap``. FTRL reads the weight in its step and is refused.

Dense parameters pass straight through to the :class:`Client` (gradients
applied on the servers on arrival). Not thread-safe: one trainer thread.
"""

import numpy as np

from pyfleet import optimizer as _opt
from pyfleet.initializer import Constant
from pyfleet.table import SparseTable

__all__ = ["GeoClient"]


class _LocalCopy:
    __slots__ = ("base", "keys", "snap", "table")

    def __init__(self, table, dim):
        self.table = table
        self.keys = np.empty(0, dtype=np.uint64)          # sorted
        self.base = np.empty((0, dim), dtype=np.float32)  # server value at first touch
        self.snap = np.empty((0, dim), dtype=np.float32)  # L at first touch


class GeoClient:
    """Geo-SGD training through a :class:`Client` to geo-mode servers.

    Args:
        client: a connected :class:`pyfleet.service.client.Client`.
        k_steps: local steps between two exchanges with the servers.

    Call :meth:`pull_sparse` / :meth:`push_sparse` as with a Client, then
    :meth:`step` once per training step; :meth:`sync` forces an exchange
    (also done by :meth:`stop_worker`).
    """

    def __init__(self, client, k_steps):
        if int(k_steps) < 1:
            raise ValueError(f"k_steps must be >= 1, got {k_steps!r}")
        self.client = client
        self.k_steps = int(k_steps)
        self.steps = 0
        self._copies = {}

    def _copy(self, table):
        c = self._copies.get(table)
        if c is None:
            dim = self.client._sparse_dim(table)
            cfg = self.client._sparse_configs()[table]
            opt = _opt.from_config(cfg["optimizer"])
            if isinstance(opt, _opt.FTRL):
                raise ValueError(f"geo mode cannot train table {table!r} with FTRL: its step "
                                 f"reads the weight (use SGD, Adagrad or Adam)")
            local = SparseTable(dim, opt, initializer=Constant(0.0), name=table)
            c = self._copies[table] = _LocalCopy(local, dim)
        return c

    @staticmethod
    def _find(c, uniq):
        """``(idx, hit)``: where sorted ``uniq`` would be in the copy's keys,
        and whether it is there."""
        idx = np.searchsorted(c.keys, uniq)
        hit = idx < c.keys.shape[0]
        hit[hit] = c.keys[idx[hit]] == uniq[hit]
        return idx, hit

    def _locate(self, c, uniq):
        """Indices of ``uniq`` in the copy, fetching rows not there yet."""
        idx, hit = self._find(c, uniq)
        if not hit.all():
            miss = uniq[~hit]
            server = self.client.pull_sparse(c.table.name, miss)
            snap = c.table.pull(miss)
            keys = np.concatenate([c.keys, miss])
            order = np.argsort(keys, kind="stable")
            c.keys = keys[order]
            c.base = np.concatenate([c.base, server])[order]
            c.snap = np.concatenate([c.snap, snap])[order]
            idx = np.searchsorted(c.keys, uniq)
        return idx

    def pull_sparse(self, table, keys, create=True):
        """Rows of ``keys`` as the local model has them (float32 ``[n, dim]``).
        ``create=False`` (evaluation): keys not in the local copy are read
        from the servers without making rows there, nor copies here."""
        c = self._copy(table)
        uniq, inverse = np.unique(keys, return_inverse=True)
        if not create:
            idx, hit = self._find(c, uniq)
            rows = np.empty((uniq.shape[0], c.table.dim), np.float32)
            if hit.any():
                h = idx[hit]
                rows[hit] = c.base[h] + (c.table.pull(uniq[hit]) - c.snap[h])
            if not hit.all():
                rows[~hit] = self.client.pull_sparse(table, uniq[~hit], unique=True,
                                                     create=False)
            return rows[inverse.reshape(-1)]
        idx = self._locate(c, uniq)
        rows = c.base[idx] + (c.table.pull(uniq) - c.snap[idx])
        return rows[inverse.reshape(-1)]

    def push_sparse(self, table, keys, grads):
        """Apply the optimizer locally (no traffic)."""
        c = self._copy(table)
        self._locate(c, np.unique(keys))
        c.table.push(keys, grads)

    def pull_dense(self, name):
        return self.client.pull_dense(name)

    def push_dense(self, name, grad):
        self.client.push_dense(name, grad)

    def step(self):
        """Count one training step; every ``k_steps`` exchange with the servers."""
        self.steps += 1
        if self.steps % self.k_steps == 0:
            self.sync()

    def sync(self):
        """Send every touched row's ``new - old`` and forget the local copies'
        server values (the next touch fetches the servers' sums)."""
        for table, c in self._copies.items():
            if c.keys.shape[0] == 0:
                continue
            delta = c.table.pull(c.keys) - c.snap
            moved = np.any(delta != 0, axis=1)
            if moved.any():
                self.client.push_sparse(table, c.keys[moved], np.ascontiguousarray(delta[moved]),
                                        delta=True)
            dim = c.base.shape[1]
            c.keys = np.empty(0, dtype=np.uint64)
            c.base = np.empty((0, dim), dtype=np.float32)
            c.snap = np.empty((0, dim), dtype=np.float32)

    def barrier(self):
        return self.client.barrier()

    def stop_worker(self):
        self.sync()
        return self.client.stop_worker()

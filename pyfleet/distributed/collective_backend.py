"""The executor's backend in collective mode: every rank holds the whole model.

:class:`CollectiveBackend` is a :class:`pyfleet.fluid.backend.LocalBackend`
(tables in this process) whose training step is exchanged with the other
ranks of an :class:`pyfleet.distributed.mpi_group.MPIGroup` at
:meth:`~CollectiveBackend.step_end`:

- dense: the step's gradients, fused into one float32 buffer (every dense
  parameter in name order, a zero block where this rank has no gradient, and
  one flag per parameter), go through **one** ``Allreduce`` and are averaged
  over the ranks; each rank applies the same average to its own copy. A
  parameter no rank has a gradient for is left alone (its optimizer does not
  step), as in single-process training.
- sparse: each rank keeps a full replica of every table. Every rank's count of
  ids per table rides in the same ``Allreduce`` (a block after the dense
  gradients where each rank fills its own slots, two float32 halves a count);
  then the step's (unique ids, gradient sums) of every table go out with two
  ``Iallgatherv`` (ids, gradients), waited for together after the dense average
  was applied. Every rank concatenates them in rank order, sums the rows of
  equal ids in that order (the core's ``unique_inverse`` and ``sum_rows``: no
  Python loop over keys), divides by the number of ranks and pushes the result
  into its replica. Every rank computes the same floats in the same order, so
  the replicas stay bit-identical.

So a step has two points where a rank waits for the others (the all-reduce,
the sparse gather), where it had four blocking collectives.

So ``N`` ranks with batch ``B`` each train as one process with batch ``N*B``
(the ranks' batches concatenated in rank order), up to float rounding: the
gradients are of each rank's mean loss, averaged.

At the first step every rank checks that all ranks have the same parameters
(names, shapes and dims), and raises ConfigError naming the first that differs.
"""

import hashlib
import threading

import numpy as np

from pyfleet import _core
from pyfleet.fluid.backend import LocalBackend
from pyfleet.service.registry import Entry, Registry

__all__ = ["CollectiveBackend", "FusedDense", "checkpoint_registry", "count_halves",
           "counts_of_halves"]

_HALF = 22  # a count travels as (count >> 22, count & (2**22 - 1)): float32-exact halves


def count_halves(counts, out):
    """Write int64 ``counts`` into float32 ``out[0]`` (high part) and ``out[1]`` (the
    low 22 bits): each half is exact in float32 for counts below 2**46, and stays
    exact when summed with the other ranks' zeros."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size and (counts.min() < 0 or counts.max() >= 1 << (24 + _HALF)):
        raise ValueError(f"sparse id counts must be in [0, 2**46), got {counts}")
    out[0] = counts >> _HALF
    out[1] = counts & ((1 << _HALF) - 1)


def counts_of_halves(halves):
    """The int64 counts that :func:`count_halves` wrote (``halves[0]``, ``halves[1]``)."""
    return (halves[0].astype(np.int64) << _HALF) + halves[1].astype(np.int64)


class FusedDense:
    """The dense half of a step over ``self.group``'s ranks (a mixin): the
    gradients in ``self._dense_grads`` are fused into one buffer, averaged with
    one ``Allreduce`` and applied to ``self.dense`` (the local tables).
    Subclasses define :meth:`signature` (checked on every rank at the first
    step). With ``broadcast_dense``, the first step also gives every rank rank
    0's dense values (a rank whose values differ takes them; equal values are
    left alone, so a loaded optimizer state survives)."""

    broadcast_dense = False

    def _tail_size(self):
        """Float32 slots after the dense block and its flags (a subclass's extra data
        carried by the same all-reduce)."""
        return 0

    def _fused_layout(self):
        sig = self.signature()
        if self._layout is None or self._layout[4] != sig:
            # The first step (or new parameters): every rank checks the others' first.
            self.group.agree(sig, "parameter")
            names = sorted(self.dense)
            shapes = [self.dense[n].shape for n in names]
            sizes = [int(np.prod(s)) for s in shapes]
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            # + one present-flag per parameter, + the tail
            total = int(offsets[-1]) + len(names) + self._tail_size()
            self._layout = (names, shapes, offsets, total, sig)
            self._buf = np.empty(total, dtype=np.float32)
            if self.broadcast_dense and names:
                self._take_rank0_values(names, offsets)
        return self._layout

    def _take_rank0_values(self, names, offsets):
        buf = self._buf[:int(offsets[-1])]
        for i, n in enumerate(names):
            buf[offsets[i]:offsets[i + 1]] = self.dense[n].pull().reshape(-1)
        mine = buf.copy()
        self.group.bcast(buf, "the broadcast of rank 0's dense parameters")
        for i, n in enumerate(names):
            view = buf[offsets[i]:offsets[i + 1]]
            if not np.array_equal(view, mine[offsets[i]:offsets[i + 1]]):
                self.dense[n].set(view.reshape(self.dense[n].shape))

    def _fill_dense(self, names, offsets):
        """Copy the step's dense gradients and their flags into the fused buffer."""
        buf = self._buf
        flags = buf[int(offsets[-1]):int(offsets[-1]) + len(names)]
        for i, n in enumerate(names):
            g = self._dense_grads.get(n)
            view = buf[offsets[i]:offsets[i + 1]]
            if g is None:
                view.fill(0.0)
                flags[i] = 0.0
            else:
                np.copyto(view, np.asarray(g, dtype=np.float32).reshape(-1))
                flags[i] = 1.0
        unknown = set(self._dense_grads) - set(names)
        if unknown:
            raise ValueError(f"gradients of unknown dense parameters {sorted(unknown)}")

    def _apply_dense(self, names, shapes, offsets):
        """Average the summed buffer over the ranks and apply it to every parameter
        some rank had a gradient for."""
        end = int(offsets[-1])
        dense, flags = self._buf[:end], self._buf[end:end + len(names)]
        if self.group.size > 1:
            dense *= np.float32(1.0 / self.group.size)
        for i, n in enumerate(names):
            if flags[i] > 0:
                self.dense[n].push(dense[offsets[i]:offsets[i + 1]].reshape(shapes[i]))

    def _dense_step(self, names, shapes, offsets, total):
        self._fill_dense(names, offsets)
        self.group.allreduce_sum(self._buf, "the dense all-reduce")
        self._apply_dense(names, shapes, offsets)

    def dense_checksum(self):
        """``{name: sha256 hex}`` of every dense parameter's values and optimizer state."""
        out = {}
        for n, t in sorted(self.dense.items()):
            state = np.asarray(t.state(), dtype=np.float32) if hasattr(t, "state") else \
                np.empty(0, np.float32)
            out[n] = hashlib.sha256(t.pull().tobytes() + state.tobytes()).hexdigest()
        return out


class CollectiveBackend(FusedDense, LocalBackend):
    """A :class:`LocalBackend` whose steps are averaged over ``group``'s ranks."""

    def __init__(self, group):
        super().__init__()
        self.group = group
        self._dense_grads = {}
        self._sparse_grads = {}
        self._layout = None  # (names, shapes, offsets, size, signature) of the fused buffer
        self._buf = None
        self.exchange_seconds = 0.0  # time spent in the dense all-reduce (benchmarks)

    def push_dense(self, name, grad):
        self._dense_grads[name] = grad

    def push_dense_many(self, grads):
        self._dense_grads.update(grads)

    def push_sparse(self, name, keys, grads):
        self._sparse_grads[name] = (keys, grads)

    def signature(self):
        """What every rank must agree on: each parameter's kind and shape or dim."""
        sig = {n: f"a dense parameter of shape {list(t.shape)}" for n, t in self.dense.items()}
        sig.update({n: f"a sparse table of dim {t.dim}" for n, t in self.sparse.items()})
        return sig

    def _tail_size(self):
        # every rank's count of ids of every table, as two float32 halves (exact below 2**46)
        return 2 * self.group.size * len(self.sparse)

    def step_end(self):
        names, shapes, offsets, total, _ = self._fused_layout()
        try:
            if names or self.sparse:
                self._step(names, shapes, offsets)
        finally:
            self._dense_grads, self._sparse_grads = {}, {}
            self.group.step += 1

    def _step(self, names, shapes, offsets):
        # One all-reduce carries the dense gradients and every rank's sparse counts;
        # then the sparse ids and gradients travel (two Iallgatherv, waited together)
        # while the dense average is applied.
        buf = self._buf
        tables = sorted(self.sparse)
        self._fill_dense(names, offsets)
        mine = [self._sparse_grads.get(t) for t in tables]
        counts = np.array([0 if m is None else m[0].shape[0] for m in mine], dtype=np.int64)
        tail = buf[int(offsets[-1]) + len(names):].reshape(2, self.group.size, len(tables))
        tail.fill(0.0)   # the other ranks' slots: their counts arrive by the sum
        count_halves(counts, tail[:, self.group.rank])
        self.group.allreduce_sum(buf, "the dense all-reduce")
        all_counts = counts_of_halves(tail)
        pending = self._start_sparse(tables, mine, all_counts) if all_counts.any() else None
        try:
            if names:
                self._apply_dense(names, shapes, offsets)
        finally:
            if pending is not None:
                self.group.wait(pending[0], "the sparse exchange")
        if pending is not None:
            self._apply_sparse(tables, all_counts, pending[1], pending[2])

    def _start_sparse(self, tables, mine, all_counts):
        """Start gathering every rank's (ids, gradients) of every table:
        ``(requests, all ids, all gradients, what is being sent)``."""
        dims = np.array([self.sparse[t].dim for t in tables], dtype=np.int64)
        keys = np.concatenate([np.empty(0, dtype=np.uint64)]
                              + [m[0] for m in mine if m is not None])
        grads = np.concatenate([np.empty(0, dtype=np.float32)]
                               + [np.asarray(m[1], dtype=np.float32).reshape(-1)
                                  for m in mine if m is not None])
        all_keys, rk = self.group.iallgatherv(keys, all_counts.sum(axis=1))
        all_grads, rg = self.group.iallgatherv(grads, (all_counts * dims).sum(axis=1))
        return [rk, rg], all_keys, all_grads, (keys, grads)  # MPI reads these until the wait

    def _apply_sparse(self, tables, all_counts, all_keys, all_grads):
        g = self.group
        dims = np.array([self.sparse[t].dim for t in tables], dtype=np.int64)
        # Where each rank's block starts, and each table's place inside it.
        kstart = np.concatenate([[0], np.cumsum(all_counts.sum(axis=1))])
        gstart = np.concatenate([[0], np.cumsum((all_counts * dims).sum(axis=1))])
        kin = np.concatenate([np.zeros((g.size, 1), np.int64), np.cumsum(all_counts, axis=1)],
                             axis=1)
        gin = np.concatenate([np.zeros((g.size, 1), np.int64),
                              np.cumsum(all_counts * dims, axis=1)], axis=1)
        scale = np.float32(1.0 / g.size)
        for t, name in enumerate(tables):
            if not all_counts[:, t].any():
                continue
            d = int(dims[t])
            k = np.concatenate([all_keys[kstart[r] + kin[r, t]:kstart[r] + kin[r, t + 1]]
                                for r in range(g.size)])
            v = np.concatenate([all_grads[gstart[r] + gin[r, t]:gstart[r] + gin[r, t + 1]]
                                for r in range(g.size)]).reshape(-1, d)
            uniq, inverse = _core.unique_inverse(k)
            summed = _core.sum_rows(v, inverse, uniq.shape[0])
            summed *= scale
            self.push_sparse_local(name, uniq, summed)

    def push_sparse_local(self, name, keys, grads):
        """Apply ``grads`` to this rank's replica only (what :meth:`step_end` does)."""
        LocalBackend.push_sparse(self, name, keys, grads)

    def checksum(self):
        """``{name: sha256 hex}`` of every parameter's values and optimizer state on
        this rank (sparse rows in key order): equal on every rank of a job."""
        out = {}
        for n, t in sorted(self.dense.items()):
            out[n] = hashlib.sha256(t.pull().tobytes()
                                    + np.asarray(t.state(), dtype=np.float32).tobytes()
                                    ).hexdigest()
        for n, t in sorted(self.sparse.items()):
            keys = np.sort(t.keys())
            rows = t.export(keys, with_state=True)
            h = hashlib.sha256(keys.tobytes())
            for field in ("weights", "state", "update_count"):
                h.update(np.ascontiguousarray(rows[field]).tobytes())
            out[n] = h.hexdigest()
        return out


def checkpoint_registry(backend, tables):
    """A one-server :class:`Registry` (server 0 of 1) over ``backend``'s own tables,
    for :func:`pyfleet.service.checkpoint.save_server` / ``load_server``: a
    collective job's checkpoint is a parameter-server checkpoint of one server.
    ``tables``: the program's table configs (``pyfleet.distributed.fleet.table_configs``)."""
    registry = Registry(0, 1, 1 << 62, threading.Lock())
    for i, cfg in enumerate(tables, start=1):
        e = Entry()
        e.id, e.kind, e.name, e.config = i, cfg["kind"], cfg["name"], cfg
        e.canonical, e.lock = None, threading.Lock()
        if e.kind == "sparse":
            e.key, e.table, e.dim = e.name, backend._sparse(e.name), int(cfg["dim"])
            e.start = e.end = e.shape = None
        else:
            e.shape = [int(s) for s in cfg["shape"]]
            e.start, e.end = 0, int(np.prod(e.shape))
            e.key, e.table, e.dim = f"{e.name}[0:{e.end}]", backend._dense(e.name), 1
        registry.entries[i] = e
        registry.by_key[e.key] = e
    return registry


"""The step machinery of the executor: what a step runs, and its state.

- :class:`Plan`: for one (program, fed names, fetched names, training) the
  ops to run forward, the dense parameters to pull and where, the ops to run
  backward; cached per program version.
- :class:`Step`: the values, gradients and embedding lookups of one run;
  the op kernels (:mod:`pyfleet.fluid.ops`) read and write through it.
  Every embedding sharing a parameter is looked up together
  (:class:`LookupGroup`): one ``pull_sparse`` of the unique ids of all its
  slots, deduplicated by the core's hashing kernel (:func:`unique_inverse`),
  and after backward one sum of the gradient rows per unique id.
- What :meth:`Executor.prefetch <pyfleet.fluid.executor.Executor.prefetch>`
  prepared (:func:`take_prepared`) is used by the step whose ids match.

Not thread-safe: a step belongs to one executor's ``run``.
"""

import numpy as np

from pyfleet import _core
from pyfleet.fluid import fused_fc
from pyfleet.fluid import ops as _ops
from pyfleet.fluid.framework import Parameter
from pyfleet.fluid.sequence import is_unit, segment_sum
from pyfleet.fluid.tensor import LoDTensor

__all__ = ["PREPARED_MAX", "LookupGroup", "Plan", "Step", "merge_keys", "table_keys",
           "take_prepared", "unique_inverse"]


class Plan:
    """What one (program, feed names, fetch names) step runs; cached."""

    def __init__(self, program, feed_names, fetch_vars, training):
        block = program.global_block()
        all_ops = block.ops
        targets = {v.name for v in fetch_vars}
        if training:
            targets.add(program._loss.name)
            sched = getattr(program._optimizer, "lr_schedule", None)
            if sched is not None:
                targets.add(sched.name)
        needed = self._closure(all_ops, targets)
        for op in all_ops:
            if op.type in _ops.STATEFUL and id(op) not in needed:
                extra = self._closure(all_ops, {v.name for v in op.output_vars()})
                datas = self._data_inputs(all_ops, extra)
                if datas <= feed_names:
                    needed |= extra
        # each fc layer's mul, bias and activation as one op (pyfleet.fluid.fused_fc)
        self.ops = fused_fc.fuse([op for op in all_ops if id(op) in needed], targets)
        produced = {v.name for op in self.ops for v in op.output_vars()}
        for op in self.ops:
            for v in op.input_vars():
                if v.name in produced or isinstance(v, Parameter):
                    continue
                if v.name not in feed_names and not v.persistable:
                    raise ValueError(f"variable {v.name!r} needed by op {op.type} is not in "
                                     f"the feed (fed: {sorted(feed_names)})")
        self.dense_params = []
        self.lookup_params = {}
        seen = set()
        for op in self.ops:
            if op.type == "lookup_table":
                w = op.input("W")[0]
                self.lookup_params.setdefault(w.name, []).append(op)
                if w.is_sparse_table:
                    continue
            for v in op.input_vars():
                if isinstance(v, Parameter) and not v.is_sparse_table and v.name not in seen:
                    seen.add(v.name)
                    self.dense_params.append(v.name)
        for v in fetch_vars:
            if isinstance(v, Parameter) and not v.is_sparse_table and v.name not in seen:
                seen.add(v.name)
                self.dense_params.append(v.name)
        self.training = training
        self.need = set()
        self.backward_ops = []
        if training:
            allowed = program._trainable
            for p in program.all_parameters():
                if p.trainable and (allowed is None or p.name in allowed):
                    self.need.add(p.name)
            for op in self.ops:
                if op.type in _ops.NO_GRAD or (op.type not in _ops.BACKWARD and \
                        op.type != "lookup_table"):
                    continue
                if any(v.name in self.need for v in op.input_vars()):
                    for v in op.output_vars():
                        if v.dtype.kind == "f" and not v.stop_gradient:
                            self.need.add(v.name)
            for op in self.ops:   # a fused layer run unfused needs its inner gradients
                if op.type == "fused_fc" and op.output("Out")[0].name in self.need:
                    self.need.update(fused_fc.inner_outputs(op))
            if program._loss.name not in self.need:
                raise ValueError(f"loss {program._loss.name!r} does not depend on any "
                                 "trainable parameter")
            self.backward_ops = [(op, [v.name for v in op.output_vars()])
                                 for op in reversed(self.ops)
                                 if any(v.name in self.need for v in op.output_vars())]
        self.trained_dense = [n for n in self.dense_params if n in self.need]
        # The first op reading a dense parameter (len(ops): none does).
        self.dense_at = len(self.ops)
        if self.dense_params:
            for i, op in enumerate(self.ops):
                if any(isinstance(v, Parameter) and not v.is_sparse_table
                       for v in op.input_vars()):
                    self.dense_at = i
                    break
        # Values someone reads: a stateful op's other outputs need not be computed.
        self.used = {v.name for v in fetch_vars} | {v.name for op in self.ops
                                                    for v in op.input_vars()}

    @staticmethod
    def _closure(all_ops, targets):
        wanted = set(targets)
        needed = set()
        for op in reversed(all_ops):
            if any(v.name in wanted for v in op.output_vars()):
                needed.add(id(op))
                wanted.update(v.name for v in op.input_vars())
        return needed

    @staticmethod
    def _data_inputs(all_ops, op_ids):
        out = set()
        for op in all_ops:
            if id(op) in op_ids:
                out.update(v.name for v in op.input_vars() if v.is_data)
        return out


class LookupGroup:
    """Embedding lookups sharing one parameter, deduplicated together.

    ``rows`` holds every lookup's rows, slot after slot; except when the group
    is *interleaved* (every lookup a LoD input of the same number of
    one-id sequences, as CTR slots are, and no padding): then ``rows`` is
    batch-major, ``rows3[b, i]`` the row of sequence ``b`` of lookup ``i``, so
    the lookups' outputs are adjacent column blocks (``concat`` of them is a
    reshape) and so are their gradients after ``concat``'s backward.
    ``inverse`` is in the order of ``rows``; ``slot_inverse`` slot after slot."""

    __slots__ = ("bounds", "grads", "index", "inverse", "keys", "ops", "pad_masks", "param",
                 "rows", "rows3", "slot_inverse", "urows")


class Step:
    """The state of one run: values, gradients, lookups. Kernels use its methods."""

    def __init__(self, program, plan, scope, backend, prepared=None):
        self.program = program
        self.prepared = prepared
        self.plan = plan
        self.scope = scope
        self.backend = backend
        self.env = {}
        self.grads = {}
        self._aux = {}
        self.groups = []
        self.group_of = {}
        self.cache = {}
        self._touched = None   # the last summed_lookup_grads's mask of ids with a gradient
        # id(array) -> (whole, index, array): the lookup outputs of interleaved
        # groups (whole = rows3, index = lookup) and the column blocks concat's
        # backward cut (whole = gradient, index = first column). The array is
        # kept, so an id is never reused while its entry lives.
        self.blocks = {}

    # column blocks (so concat and its gradient skip per-slot copies)
    def column_runs(self, xs):
        """``xs`` with every run of consecutive lookups of one interleaved group
        replaced by one ``[B, run * dim]`` view of their rows."""
        out, run = [], None   # run: [rows3, first lookup, end lookup]
        for x in xs:
            b = self.blocks.get(id(x))
            if b is not None and b[2] is x and b[0].ndim == 3:
                if run is not None and run[0] is b[0] and run[2] == b[1]:
                    run[2] += 1
                    continue
                if run is not None:
                    out.append(_run_view(run))
                run = [b[0], b[1], b[1] + 1]
                continue
            if run is not None:
                out.append(_run_view(run))
                run = None
            out.append(x)
        if run is not None:
            out.append(_run_view(run))
        return out

    def note_columns(self, part, whole, start):
        """``part`` is ``whole[:, start:start + part.shape[1]]``."""
        self.blocks[id(part)] = (whole, start, part)

    # kernel interface
    def value(self, var):
        try:
            return self.env[var.name]
        except KeyError:
            # A persistable variable no op of this step wrote (a global
            # variable, a step counter): its value in the scope.
            if var.persistable and var.name in self.scope.vars:
                return self.scope.vars[var.name]
            raise ValueError(f"variable {var.name!r} has no value in this step") from None

    def data(self, var):
        v = self.value(var)
        return v.data if isinstance(v, LoDTensor) else v

    def set(self, var, value):
        self.env[var.name] = value
        if var.persistable and var.name in self.scope.vars and not isinstance(var, Parameter):
            # a persistable variable an op writes (a counter): it keeps the value
            self.scope.vars[var.name] = np.array(value, copy=True)

    def grad(self, var):
        return self.grads.get(var.name)

    def needs_grad(self, var):
        return var.name in self.plan.need

    def add_grad(self, var, g):
        prev = self.grads.get(var.name)
        self.grads[var.name] = g if prev is None else prev + g

    def set_aux(self, op, aux):
        self._aux[id(op)] = aux

    def aux(self, op):
        return self._aux.get(id(op))

    # lookups
    def lookup(self, op):
        if id(op) not in self.group_of:
            self._pull_group(op)
        grp = self.group_of[id(op)]
        i = grp.index[id(op)]
        # A view into the group's gathered rows: kernels never write their inputs.
        if grp.rows3 is not None:
            rows = grp.rows3[:, i]
            self.blocks[id(rows)] = (grp.rows3, i, rows)
        else:
            rows = grp.rows[grp.bounds[i]:grp.bounds[i + 1]]
        pad = grp.pad_masks[i]
        if pad is not None:
            rows = rows.copy()
            rows[pad] = 0
        ids = self.value(op.input("Ids")[0])
        if isinstance(ids, LoDTensor):
            if op.attrs.get("keep_last_dim"):  # fluid.embedding: ids [N, 1] give [N, 1, dim]
                shape = ids.data.shape if ids.data.ndim >= 2 else ids.data.shape + tuple(
                    d for d in op.input("Ids")[0].shape[1:] if d == 1)
                rows = rows.reshape(tuple(shape) + (rows.shape[-1],))
            return ids._like(rows)
        v1_squeeze = ids.ndim >= 2 and ids.shape[-1] == 1 and not op.attrs.get("keep_last_dim")
        shape = ids.shape[:-1] if v1_squeeze else ids.shape
        return rows.reshape(tuple(shape) + (rows.shape[-1],))

    def _pull_group(self, first):
        w = first.input("W")[0]
        ops = [op for op in self.plan.lookup_params[w.name]
               if id(op) not in self.group_of and op.input("Ids")[0].name in self.env]
        if first not in ops:
            ops.append(first)
        flat = []
        unit = True
        for op in ops:
            ids = self.value(op.input("Ids")[0])
            if isinstance(ids, LoDTensor):
                unit = unit and is_unit(ids)
                ids = ids.data
            else:
                unit = False
            if ids.dtype.kind not in "iu":
                raise ValueError(f"embedding ids {op.input('Ids')[0].name!r} must be integers, "
                                 f"got dtype {ids.dtype}")
            flat.append(ids.reshape(-1))
        bounds = np.zeros(len(ops) + 1, dtype=np.int64)
        np.cumsum([f.shape[0] for f in flat], out=bounds[1:])
        flat = table_keys(flat, w.is_sparse_table)
        keys = flat[0] if len(flat) == 1 else np.concatenate(flat)
        if not w.is_sparse_table and keys.size:
            lo, hi = keys.min(), keys.max()
            if lo < 0 or hi >= w.shape[0]:
                raise ValueError(f"embedding {w.name!r}: id {lo if lo < 0 else hi} is out of "
                                 f"range [0, {w.shape[0]}); use is_distributed=True for a "
                                 "table keyed by raw ids")
        found = take_prepared(self.prepared, w.name, keys) if w.is_sparse_table else None
        uniq, inverse = found if found is not None else unique_inverse(keys)
        if w.is_sparse_table:
            # Evaluation (a program without optimizer) reads rows but makes none.
            urows = self.backend.pull_sparse(w.name, uniq) if self.plan.training else \
                self.backend.pull_sparse(w.name, uniq, create=False)
        else:
            urows = np.take(self.data(w), uniq, axis=0)
        pads = []
        for op, f in zip(ops, flat):
            pad = op.attrs.get("padding_idx")
            if pad is None:
                pads.append(None)
            else:
                m = f == (np.uint64(pad & 0xFFFFFFFFFFFFFFFF) if w.is_sparse_table else pad)
                pads.append(m if m.any() else None)
        grp = LookupGroup()
        grp.param, grp.ops, grp.bounds, grp.keys, grp.urows = w, ops, bounds, uniq, urows
        grp.index = {id(op): i for i, op in enumerate(ops)}
        grp.pad_masks, grp.grads = pads, {}
        grp.slot_inverse, grp.rows3 = inverse, None
        k, n = len(ops), keys.shape[0]
        if unit and k > 1 and n and n % k == 0 and urows.ndim == 2 and \
                np.all(np.diff(bounds) == n // k) and all(p is None for p in pads):
            inverse = np.ascontiguousarray(inverse.reshape(k, n // k).T).reshape(-1)
            grp.rows = np.take(urows, inverse, axis=0)
            grp.rows3 = grp.rows.reshape(n // k, k, urows.shape[1])
        else:
            grp.rows = np.take(urows, inverse, axis=0)
        grp.inverse = inverse
        for op in ops:
            self.group_of[id(op)] = grp
        self.groups.append(grp)

    def _columns_of(self, parts, width, dim):
        """The ``[width, len(parts) * dim]`` view of one gradient that ``parts``
        are consecutive column blocks of (as concat's backward cut them), or None."""
        first = self.blocks.get(id(parts[0]))
        if first is None or first[2] is not parts[0] or first[0].ndim != 2:
            return None
        whole, start = first[0], first[1]
        col = start
        for p in parts:
            b = self.blocks.get(id(p))
            if b is None or b[2] is not p or b[0] is not whole or b[1] != col or \
                    p.shape != (width, dim):
                return None
            col += dim
        return whole[:, start:col]

    def lookup_backward(self, op):
        g = self.grad(op.output("Out")[0])
        if g is not None:
            self.group_of[id(op)].grads[id(op)] = g

    def summed_lookup_grads(self, grp, with_rows=False):
        """``(keys, gradient rows summed per key)`` of one group, or None;
        ``with_rows``: ``(keys, gradients, the keys' pulled rows)``.

        Only ids whose lookups received a gradient are included (padding ids
        and lookups off the loss path are left out, so an optimizer with
        momentum does not move rows that did not take part)."""
        out = self._summed_lookup_grads(grp)
        if out is None or not with_rows:
            return out
        keys, g = out
        if keys is grp.keys:
            return keys, g, grp.urows
        return keys, g, grp.urows[self._touched]

    def _summed_lookup_grads(self, grp):
        dim = grp.rows.shape[1]
        n = grp.keys.shape[0]
        if grp.rows3 is not None and len(grp.grads) == len(grp.ops):
            width = grp.rows3.shape[0]
            parts = [grp.grads[id(op)] for op in grp.ops]
            wide = self._columns_of(parts, width, dim)
            occ = (np.ascontiguousarray(wide) if wide is not None else
                   np.stack([p.reshape(width, dim) for p in parts], axis=1)).reshape(-1, dim)
            return grp.keys, segment_sum(occ, grp.inverse, n)
        grads, invs = [], []
        complete = True
        for i, op in enumerate(grp.ops):
            a, b = int(grp.bounds[i]), int(grp.bounds[i + 1])
            g = grp.grads.get(id(op))
            if g is None:
                complete = False
                continue
            g = g.reshape(b - a, dim)
            inv = grp.slot_inverse[a:b]
            pad = grp.pad_masks[i]
            if pad is not None:
                g, inv = g[~pad], inv[~pad]
                complete = False
            grads.append(g)
            invs.append(inv)
        if not grads:
            return None
        occ = grads[0] if len(grads) == 1 else np.concatenate(grads)
        if complete:
            return grp.keys, segment_sum(occ, grp.slot_inverse, n)
        inv = np.concatenate(invs)
        touched = self._touched = np.bincount(inv, minlength=n) > 0
        return grp.keys[touched], segment_sum(occ, inv, n)[touched]


def _run_view(run):
    rows3, a, b = run
    return rows3[:, a] if b == a + 1 else rows3[:, a:b].reshape(rows3.shape[0], -1)


def table_keys(flat, sparse_table):
    """The 1-D id arrays of one lookup group as the table's key type: uint64
    (int64 ids reinterpreted, so negative hashes stay distinct) for a sparse
    table, int64 row indices for a dense one."""
    if sparse_table:
        return [f.view(np.uint64) if f.dtype == np.int64 else f.astype(np.uint64, copy=False)
                for f in flat]
    return [f.astype(np.int64, copy=False) for f in flat]


def unique_inverse(keys):
    """``(unique keys in first-occurrence order, index of each key's unique)``:
    one hashing pass of the core (``uniq[inverse] == keys``)."""
    kind = keys.dtype
    uniq, inverse = _core.unique_inverse(np.ascontiguousarray(keys).view(np.uint64))
    return uniq.view(kind), inverse


# Feeds prepared by Executor.prefetch and not yet run; more means a caller
# prefetching feeds it never runs, whose entries are dropped oldest first.
PREPARED_MAX = 4


def take_prepared(prepared, name, keys):
    """``(uniq, inverse)`` prepared for exactly these keys of table ``name``
    (removed from ``prepared`` with any older entry of the table), or None."""
    if not prepared:
        return None
    for i, (n, k, uniq, inverse) in enumerate(prepared):
        if n == name and k.shape == keys.shape and np.array_equal(k, keys):
            for j in range(i, -1, -1):
                if prepared[j][0] == name:
                    del prepared[j]
            return uniq, inverse
    return None


def merge_keys(keys_list, grads_list):
    keys = np.concatenate(keys_list)
    uniq, inverse = unique_inverse(keys)
    return uniq, segment_sum(np.concatenate(grads_list), inverse, uniq.shape[0])

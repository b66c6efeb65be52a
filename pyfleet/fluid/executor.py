"""The executor: runs a program's forward pass, backward pass and update.

``Executor.run(startup_program)`` creates every parameter in the program's
backend. ``Executor.run(main_program, feed, fetch_list)`` then runs one step:

1. the feed is turned into arrays (:class:`LoDTensor` for ``lod_level=1``);
2. the operators needed for the fetches (and the loss, when the program has
   an optimizer; and stateful ops such as ``auc`` whose inputs are fed) run
   forward. Dense parameters come from one ``pull_dense_many``, made just
   before the first op that reads one (so the lookups run meanwhile); every
   embedding sharing a sparse table is looked up with one ``pull_sparse`` of
   the unique ids of all its slots (deduplicated by the hashing kernel
   ``pyfleet._core.unique_inverse``: first-occurrence order, O(n));
3. when the program has an optimizer, gradients of the loss flow backward;
   one ``push_dense_many`` sends the dense parameters' gradients; embedding
   gradients are summed per unique id (``pyfleet._core.sum_rows`` for
   float32, no per-id Python) and pushed, one ``push_sparse`` per table; then
   ``step_end``.

:meth:`Executor.prefetch` (a pyfleet extension) does step 2's deduplication
for the next feed ahead of time and lets a remote backend start its pull, so
the round trip overlaps the current step.

An executor is not thread-safe; use one per thread (they may share a program
and a thread-safe backend).
"""

import collections
import math

import numpy as np

from pyfleet import _core
from pyfleet.fluid import framework
from pyfleet.fluid import ops as _ops
from pyfleet.fluid.framework import LoDTensor, Parameter, Program, Variable

__all__ = ["Executor", "as_numpy", "global_scope", "scope_guard"]

global_scope = framework.global_scope
scope_guard = framework.scope_guard

# Marks a program whose startup ran before optimizer.minimize: its tables
# were created without the optimizer and cannot be trained.
_NO_OPTIMIZER = object()


def as_numpy(value):
    if isinstance(value, (list, tuple)):
        return [as_numpy(v) for v in value]
    if isinstance(value, LoDTensor):
        return value.data
    return np.asarray(value)


class _Plan:
    """What one (program, feed names, fetch names) step runs; cached."""

    def __init__(self, program, feed_names, fetch_vars, training):
        block = program.global_block()
        all_ops = block.ops
        targets = {v.name for v in fetch_vars}
        if training:
            targets.add(program._loss.name)
        needed = self._closure(all_ops, targets)
        for op in all_ops:
            if op.type in _ops.STATEFUL and id(op) not in needed:
                extra = self._closure(all_ops, {v.name for v in op.output_vars()})
                datas = self._data_inputs(all_ops, extra)
                if datas <= feed_names:
                    needed |= extra
        self.ops = [op for op in all_ops if id(op) in needed]
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
                if op.type in _ops.NO_GRAD or op.type not in _ops.BACKWARD and \
                        op.type != "lookup_table":
                    continue
                if any(v.name in self.need for v in op.input_vars()):
                    for v in op.output_vars():
                        if v.dtype.kind == "f" and not v.stop_gradient:
                            self.need.add(v.name)
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


class _LookupGroup:
    """Embedding lookups sharing one parameter, deduplicated together.

    ``rows`` holds every lookup's rows, slot after slot; except when the group
    is *interleaved* (every lookup a LoD input of the same number of
    one-id sequences, as CTR slots are, and no padding): then ``rows`` is
    batch-major, ``rows3[b, i]`` the row of sequence ``b`` of lookup ``i``, so
    the lookups' outputs are adjacent column blocks (``concat`` of them is a
    reshape) and so are their gradients after ``concat``'s backward.
    ``inverse`` is in the order of ``rows``; ``slot_inverse`` slot after slot."""

    __slots__ = ("bounds", "grads", "index", "inverse", "keys", "ops", "pad_masks", "param",
                 "rows", "rows3", "slot_inverse")


class _Step:
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
            raise ValueError(f"variable {var.name!r} has no value in this step") from None

    def data(self, var):
        v = self.value(var)
        return v.data if isinstance(v, LoDTensor) else v

    def set(self, var, value):
        self.env[var.name] = value

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
                unit = unit and _ops.is_unit(ids)
                ids = ids.data
            else:
                unit = False
            if ids.dtype.kind not in "iu":
                raise ValueError(f"embedding ids {op.input('Ids')[0].name!r} must be integers, "
                                 f"got dtype {ids.dtype}")
            flat.append(ids.reshape(-1))
        bounds = np.zeros(len(ops) + 1, dtype=np.int64)
        np.cumsum([f.shape[0] for f in flat], out=bounds[1:])
        flat = _table_keys(flat, w.is_sparse_table)
        keys = flat[0] if len(flat) == 1 else np.concatenate(flat)
        if not w.is_sparse_table and keys.size:
            lo, hi = keys.min(), keys.max()
            if lo < 0 or hi >= w.shape[0]:
                raise ValueError(f"embedding {w.name!r}: id {lo if lo < 0 else hi} is out of "
                                 f"range [0, {w.shape[0]}); use is_distributed=True for a "
                                 "table keyed by raw ids")
        found = _take_prepared(self.prepared, w.name, keys) if w.is_sparse_table else None
        uniq, inverse = found if found is not None else _unique_inverse(keys)
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
        grp = _LookupGroup()
        grp.param, grp.ops, grp.bounds, grp.keys = w, ops, bounds, uniq
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

    def summed_lookup_grads(self, grp):
        """``(keys, gradient rows summed per key)`` of one group, or None.

        Only ids whose lookups received a gradient are included (padding ids
        and lookups off the loss path are left out, so an optimizer with
        momentum does not move rows that did not take part)."""
        dim = grp.rows.shape[1]
        n = grp.keys.shape[0]
        if grp.rows3 is not None and len(grp.grads) == len(grp.ops):
            width = grp.rows3.shape[0]
            parts = [grp.grads[id(op)] for op in grp.ops]
            wide = self._columns_of(parts, width, dim)
            occ = (np.ascontiguousarray(wide) if wide is not None else
                   np.stack([p.reshape(width, dim) for p in parts], axis=1)).reshape(-1, dim)
            return grp.keys, _ops.segment_sum(occ, grp.inverse, n)
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
            return grp.keys, _ops.segment_sum(occ, grp.slot_inverse, n)
        inv = np.concatenate(invs)
        touched = np.bincount(inv, minlength=n) > 0
        return grp.keys[touched], _ops.segment_sum(occ, inv, n)[touched]


def _run_view(run):
    rows3, a, b = run
    return rows3[:, a] if b == a + 1 else rows3[:, a:b].reshape(rows3.shape[0], -1)


def _table_keys(flat, sparse_table):
    """The 1-D id arrays of one lookup group as the table's key type: uint64
    (int64 ids reinterpreted, so negative hashes stay distinct) for a sparse
    table, int64 row indices for a dense one."""
    if sparse_table:
        return [f.view(np.uint64) if f.dtype == np.int64 else f.astype(np.uint64, copy=False)
                for f in flat]
    return [f.astype(np.int64, copy=False) for f in flat]


def _unique_inverse(keys):
    """``(unique keys in first-occurrence order, index of each key's unique)``:
    one hashing pass of the core (``uniq[inverse] == keys``)."""
    kind = keys.dtype
    uniq, inverse = _core.unique_inverse(np.ascontiguousarray(keys).view(np.uint64))
    return uniq.view(kind), inverse


# Feeds prepared by Executor.prefetch and not yet run; more means a caller
# prefetching feeds it never runs, whose entries are dropped oldest first.
_PREPARED_MAX = 4


def _take_prepared(prepared, name, keys):
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


def _merge_keys(keys_list, grads_list):
    keys = np.concatenate(keys_list)
    uniq, inverse = _unique_inverse(keys)
    return uniq, _ops.segment_sum(np.concatenate(grads_list), inverse, uniq.shape[0])


def _feed_ids(value):
    """The flat integer ids of one feed entry as ``run`` will read them, or None."""
    if isinstance(value, LoDTensor):
        value = value.data
    elif isinstance(value, tuple) and len(value) == 2:
        value = value[0]
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu":
        return None
    return value.reshape(-1)


def _feed_value(var, value, checked=None):
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
                return _feed_value(var, value)
            t, valid = seen._like(data), True
        elif isinstance(value, tuple) and len(value) == 2:
            data, offsets = np.asarray(value[0]), np.asarray(value[1])
            t = LoDTensor(data.reshape(-1, 1) if data.ndim == 1 else data, offsets)
        elif isinstance(value, list):
            from pyfleet.fluid.data_feeder import sequences_to_lod
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


class Executor:
    """Fluid's ``Executor(place)``: runs startup and main programs."""

    def __init__(self, place=None):
        self.place = place
        self._prepared = collections.deque()   # (table, keys, uniq, inverse), oldest first

    def close(self):
        """Nothing to release; kept for Fluid compatibility."""

    def run(self, program=None, feed=None, fetch_list=None, feed_var_name="feed",
            fetch_var_name="fetch", scope=None, return_numpy=True, use_program_cache=False):
        if program is None:
            program = framework.default_main_program()
        program = getattr(program, "_program", program)   # CompiledProgram
        if not isinstance(program, Program):
            raise ValueError(f"program must be a fluid.Program, got {program!r}")
        scope = scope or framework.global_scope()
        if isinstance(feed, (list, tuple)):
            # An iterable PyReader yields one feed dict per place; there is one place.
            if len(feed) != 1 or not isinstance(feed[0], dict):
                raise ValueError("a list feed must hold exactly one dict (one CPU place)")
            feed = feed[0]
        if not feed and program._py_readers and program.global_block().ops:
            feed = self._reader_feed(program)
        if feed is None:
            feed = {}
        if not isinstance(feed, dict):
            raise ValueError(f"feed must be a dict of variable name -> value, got "
                             f"{type(feed).__name__}")
        if program._init_params or program._init_states:
            self._run_startup(program, scope)
        fetch_vars = self._fetch_vars(program, fetch_list or [])
        if not program.global_block().ops and not fetch_vars:
            return []
        return self._run_step(program, feed, fetch_vars, scope, return_numpy)

    def prefetch(self, program, feed):
        """Prepare the sparse lookups of a later ``run(program, feed=feed)`` now
        (a pyfleet extension; call it for step k+1 before running step k).

        For every sparse table, the ids of ``feed``'s slots looked up in it are
        deduplicated here (that run then skips the work), and a backend with
        ``prefetch_sparse(name, unique_keys)`` (the remote backend in async
        mode) starts pulling their rows, so the round trip overlaps the steps
        between. The run uses what was prepared only if the ids it pulls are
        exactly these (compared by value), so a feed changed in between, or
        never run, costs nothing but this call. At most a few prepared feeds
        are kept (oldest dropped). Not thread-safe, as ``run``."""
        program = getattr(program, "_program", program)
        if not isinstance(program, Program):
            raise ValueError(f"program must be a fluid.Program, got {program!r}")
        if not isinstance(feed, dict):
            raise ValueError(f"feed must be a dict of variable name -> value, got "
                             f"{type(feed).__name__}")
        groups = {}
        for op in program.global_block().ops:
            if op.type != "lookup_table":
                continue
            w = op.input("W")[0]
            if not w.is_sparse_table:
                continue
            ids = _feed_ids(feed.get(op.input("Ids")[0].name))
            if ids is None:
                return  # a slot that is not fed as an id array: run dedups it itself
            groups.setdefault(w.name, []).append(ids)
        backend = program._get_backend() if groups else None
        pull_ahead = getattr(backend, "prefetch_sparse", None)
        for name, flat in groups.items():
            flat = _table_keys(flat, True)
            keys = flat[0] if len(flat) == 1 else np.concatenate(flat)
            uniq, inverse = _unique_inverse(keys)
            self._prepared.append((name, keys, uniq, inverse))
            while len(self._prepared) > _PREPARED_MAX:
                self._prepared.popleft()
            if pull_ahead is not None:
                pull_ahead(name, uniq)

    @staticmethod
    def _reader_feed(program):
        from pyfleet.fluid.core import EOFException
        started = [r for r in program._py_readers if r._iter is not None]
        if not started:
            return None
        feed = {}
        for r in started:
            f = r._next_feed()
            if f is None:
                raise EOFException("the PyReader feeding this program has no batch left")
            feed.update(f)
        return feed

    # --------------------------------------------------------------- datasets
    def train_from_dataset(self, program=None, dataset=None, scope=None, thread=0,
                           debug=False, fetch_list=None, fetch_info=None, print_period=100):
        """Run ``program`` on every batch of a :mod:`pyfleet.fluid.dataset`
        dataset; every ``print_period`` batches print the fetched values
        labelled by ``fetch_info`` (Fluid's output). Returns the last fetch."""
        return self._run_dataset(program, dataset, scope, fetch_list, fetch_info,
                                 print_period, for_test=False)

    def infer_from_dataset(self, program=None, dataset=None, scope=None, thread=0,
                           debug=False, fetch_list=None, fetch_info=None, print_period=100):
        """As :meth:`train_from_dataset` without updating parameters."""
        return self._run_dataset(program, dataset, scope, fetch_list, fetch_info,
                                 print_period, for_test=True)

    def _run_dataset(self, program, dataset, scope, fetch_list, fetch_info, print_period,
                     for_test):
        if dataset is None or not hasattr(dataset, "_feeds"):
            raise ValueError("dataset must come from fluid.DatasetFactory().create_dataset()")
        program = getattr(program or framework.default_main_program(), "_program",
                          program or framework.default_main_program())
        if for_test:
            program = program.clone(for_test=True)
        fetch_list = list(fetch_list or [])
        labels = list(fetch_info or [getattr(f, "name", f) for f in fetch_list])
        if len(labels) != len(fetch_list):
            raise ValueError(f"fetch_info has {len(labels)} labels for {len(fetch_list)} "
                             "fetches")
        out = None
        for i, feed in enumerate(dataset._feeds()):
            out = self.run(program, feed=feed, fetch_list=fetch_list, scope=scope)
            if fetch_list and print_period and (i + 1) % int(print_period) == 0:
                print(" ".join(f"{lab}: {np.asarray(v).reshape(-1)[:8]}"
                               for lab, v in zip(labels, out)), flush=True)
        return out

    # --------------------------------------------------------------- startup
    def _run_startup(self, startup, scope):
        for p in startup._init_params:
            main = p.block.program
            backend = startup._backend or main._get_backend()
            opt = p.optimizer
            if opt is None:
                from pyfleet.optimizer import SGD
                opt = SGD(1.0)   # a placeholder: this table is never pushed
                main._initialized_with = _NO_OPTIMIZER
            else:
                main._initialized_with = main._optimizer
            if p.is_sparse_table:
                backend.create_sparse(p.name, p.dim, opt, p.initializer, p.seed)
            else:
                backend.create_dense(p.name, p.initial_value(), opt)
        for name, value in startup._init_states:
            scope.vars[name] = np.array(value, copy=True)

    # --------------------------------------------------------------- step
    @staticmethod
    def _fetch_vars(program, fetch_list):
        block = program.global_block()
        out = []
        for f in fetch_list:
            if isinstance(f, Variable):
                if f.name not in block.vars:
                    raise ValueError(f"fetch {f.name!r} is not a variable of this program")
                out.append(block.vars[f.name])
            elif isinstance(f, str):
                out.append(block.var(f))
            else:
                raise ValueError(f"fetch_list entries must be Variables or names, got {f!r}")
        return out

    def _run_step(self, program, feed, fetch_vars, scope, return_numpy):
        block = program.global_block()
        training = program._optimizer is not None
        if training and program._initialized_with is _NO_OPTIMIZER:
            raise ValueError("the startup program ran before optimizer.minimize(loss): run "
                             "it again after minimize so parameters get their optimizer")
        fed = {}
        checked = {}
        for name, value in feed.items():
            if name not in block.vars:
                raise ValueError(f"feed {name!r} is not a variable of this program")
            fed[name] = _feed_value(block.vars[name], value, checked)
        key = (program._version, frozenset(fed), tuple(v.name for v in fetch_vars), training)
        plan = program._plan_cache.get(key)
        if plan is None:
            plan = _Plan(program, set(fed), fetch_vars, training)
            program._plan_cache[key] = plan
        backend = program._get_backend()
        s = _Step(program, plan, scope, backend, self._prepared)
        s.env.update(fed)
        for i, op in enumerate(plan.ops):
            if i == plan.dense_at:
                # As late as possible: a remote backend's dense values (the reply
                # to the previous step's push) travel while the lookups run.
                s.env.update(backend.pull_dense_many(plan.dense_params))
            if op.type == "lookup_table":
                s.set(op.output("Out")[0], s.lookup(op))
            elif op.type == "auc":
                _auc_forward(op, s)
            else:
                try:
                    kernel = _ops.FORWARD[op.type]
                except KeyError:
                    raise ValueError(f"no kernel for op type {op.type!r}") from None
                kernel(op, s)
        if plan.dense_at == len(plan.ops) and plan.dense_params:   # only fetched
            s.env.update(backend.pull_dense_many(plan.dense_params))
        if training:
            self._backward_and_update(program, plan, s, backend)
        results = []
        for v in fetch_vars:
            if v.name in s.env:
                val = s.env[v.name]
            elif v.persistable and v.name in scope.vars:
                val = scope.vars[v.name].copy()
            elif isinstance(v, Parameter) and v.is_sparse_table:
                raise ValueError(f"cannot fetch sparse table {v.name!r}: pull its rows "
                                 "through the backend")
            else:
                raise ValueError(f"fetch {v.name!r} was not computed in this step")
            if return_numpy and isinstance(val, LoDTensor):
                val = val.data
            results.append(val)
        return results

    @staticmethod
    def _backward_and_update(program, plan, s, backend):
        loss = program._loss
        lv = s.data(loss)
        s.grads[loss.name] = np.ones_like(lv)
        grads = s.grads
        for op, outs in plan.backward_ops:
            if op.type == "lookup_table":
                s.lookup_backward(op)
                continue
            for name in outs:
                if name in grads:
                    _ops.BACKWARD[op.type](op, s)
                    break
        groups = [grp for grp in s.groups if grp.param.name in plan.need]
        for grp in groups:   # embeddings of dense parameters: part of their gradient
            if not grp.param.is_sparse_table:
                summed = s.summed_lookup_grads(grp)
                if summed is not None:
                    keys, g = summed
                    gw = np.zeros(grp.param.shape, dtype=g.dtype)
                    gw[keys] = g
                    s.add_grad(grp.param, gw)
        dense = {}
        for name in plan.trained_dense:
            g = s.grads.get(name)
            if g is not None:
                dense[name] = np.ascontiguousarray(g, dtype=s.env[name].dtype)
        if dense:
            # Before the sparse sums: a remote backend's round trip starts sooner.
            backend.push_dense_many(dense)
        sparse = {}
        row_dtype = {}
        for grp in groups:
            if grp.param.is_sparse_table:
                summed = s.summed_lookup_grads(grp)
                if summed is not None:
                    sparse.setdefault(grp.param.name, []).append(summed)
                    row_dtype[grp.param.name] = grp.rows.dtype
        for name, parts in sparse.items():
            if len(parts) == 1:
                keys, g = parts[0]
            else:
                keys, g = _merge_keys([p[0] for p in parts], [p[1] for p in parts])
            backend.push_sparse(name, keys, np.ascontiguousarray(g, dtype=row_dtype[name]))
        backend.step_end()


def _auc_forward(op, s):
    """Fluid's auc op: bucket counts in scope state, AUC of the (window) sums."""
    from pyfleet import metrics
    pred = s.data(op.input("Predict")[0])
    label = s.data(op.input("Label")[0]).reshape(-1)
    if pred.ndim != 2 or pred.shape[0] != label.shape[0]:
        raise ValueError(f"auc: input must be [batch, 2] probabilities with one label per "
                         f"row, got input {pred.shape} and {label.shape[0]} labels")
    t = op.attrs["num_thresholds"]
    steps = op.attrs["slide_steps"]
    # The batch and the global auc ops of one layer see the same input.
    key = ("auc", op.input("Predict")[0].name, op.input("Label")[0].name, t)
    counts = s.cache.get(key)
    if counts is None:
        counts = s.cache[key] = _bucket_counts(pred[:, -1], label, t)
    pos, neg = counts
    pos_name, neg_name = op.output("StatPosOut")[0].name, op.output("StatNegOut")[0].name
    bucket = t + 1
    size = bucket if steps == 0 else (steps + 1) * bucket + 1
    sp = s.scope.vars.get(pos_name)
    sn = s.scope.vars.get(neg_name)
    if sp is None or sp.size != size:
        sp = np.zeros(size, dtype=np.int64)
    if sn is None or sn.size != size:
        sn = np.zeros(size, dtype=np.int64)
    shape_p, shape_n = sp.shape, sn.shape
    sp, sn = sp.reshape(-1).copy(), sn.reshape(-1).copy()
    if steps == 0:
        sp[:bucket] += pos
        sn[:bucket] += neg
        tot_p, tot_n = sp[:bucket], sn[:bucket]
    else:
        # Ring of `steps` batches, then their running sum, then the step counter.
        cur = int(sp[-1]) % steps
        cb, sb = cur * bucket, steps * bucket
        sp[sb:sb + bucket] += pos - sp[cb:cb + bucket]
        sn[sb:sb + bucket] += neg - sn[cb:cb + bucket]
        sp[cb:cb + bucket], sn[cb:cb + bucket] = pos, neg
        sp[-1] += 1
        sn[-1] += 1
        tot_p, tot_n = sp[sb:sb + bucket], sn[sb:sb + bucket]
    s.scope.vars[pos_name] = sp.reshape(shape_p)
    s.scope.vars[neg_name] = sn.reshape(shape_n)
    out = op.output("AUC")[0]
    if out.name in s.plan.used:   # else only the state had to move
        s.set(out, np.array([metrics.bucketed_auc(tot_p, tot_n)], dtype=np.float64))


def _bucket_counts(pred, label, num_thresholds):
    """``metrics.bucket_counts`` (Fluid's buckets ``int(float32(p) * t)``,
    positives where the label is non-zero) by one ``bincount``."""
    from pyfleet import metrics
    p = np.asarray(pred, dtype=np.float32)
    if p.size and not (p.min() >= 0 and p.max() <= 1):
        metrics.bucket_index(p, num_thresholds)   # raises, naming the bad value
    idx = (p * np.float32(num_thresholds)).astype(np.int64)
    idx *= 2
    idx += label != 0
    both = np.bincount(idx, minlength=2 * (num_thresholds + 1))
    return both[1::2].copy(), both[0::2].copy()

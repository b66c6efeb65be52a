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

The step machinery is :mod:`pyfleet.fluid.step`, feed conversion
:mod:`pyfleet.fluid.feed`, the op kernels :mod:`pyfleet.fluid.ops`.

An executor is not thread-safe; use one per thread (they may share a program
and a thread-safe backend).
"""

import collections
import logging

import numpy as np

from pyfleet.fluid import ops as _ops
from pyfleet.fluid.core import EOFException
from pyfleet.fluid.feed import as_numpy, feed_ids, feed_value
from pyfleet.fluid.fetch_handler import FetchHandler, FetchMonitor
from pyfleet.fluid.framework import Parameter, Program, Variable, default_main_program
from pyfleet.fluid.gradient_rules import GradEntry, apply_gradient_rules, has_gradient_rules
from pyfleet.fluid.nn_ops import STATISTICS
from pyfleet.fluid.step import (
    PREPARED_MAX,
    Plan,
    Step,
    merge_keys,
    table_keys,
    unique_inverse,
)
from pyfleet.fluid.tensor import LoDTensor, fetched, global_scope, scope_guard
from pyfleet.optimizer import SGD

__all__ = ["Executor", "FetchHandler", "as_numpy", "global_scope", "keeps_statistics", "scope_guard"]

def _row_sparse(plan, grp):
    """Whether a dense parameter's gradient is row-sparse in Fluid's sense:
    every use is a lookup with ``is_sparse=True``."""
    if not all(op.attrs.get("is_sparse") for op in grp.ops):
        return False
    name = grp.param.name
    return not any(op.type != "lookup_table" and any(v.name == name for v in op.input_vars())
                   for op in plan.ops)


# Marks a program whose startup ran before optimizer.minimize: its tables
# were created without the optimizer and cannot be trained.
_NO_OPTIMIZER = object()


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
            program = default_main_program()
        program = getattr(program, "_program", program)   # CompiledProgram
        if not isinstance(program, Program):
            raise ValueError(f"program must be a fluid.Program, got {program!r}")
        scope = scope or global_scope()
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
            ids = feed_ids(feed.get(op.input("Ids")[0].name))
            if ids is None:
                return  # a slot that is not fed as an id array: run dedups it itself
            groups.setdefault(w.name, []).append(ids)
        backend = program.backend if groups else None
        pull_ahead = getattr(backend, "prefetch_sparse", None)
        for name, flat in groups.items():
            flat = table_keys(flat, True)
            keys = flat[0] if len(flat) == 1 else np.concatenate(flat)
            uniq, inverse = unique_inverse(keys)
            self._prepared.append((name, keys, uniq, inverse))
            while len(self._prepared) > PREPARED_MAX:
                self._prepared.popleft()
            if pull_ahead is not None:
                pull_ahead(name, uniq)

    @staticmethod
    def _reader_feed(program):
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
                           debug=False, fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None):
        """Run ``program`` on every batch of a :mod:`pyfleet.fluid.dataset`
        dataset; every ``print_period`` batches print the fetched values
        labelled by ``fetch_info`` (Fluid's output). A ``fetch_handler``
        (:class:`FetchHandler`) gets its variables' latest values every
        ``period_secs``. Returns the last fetch.

        ``thread``: Fluid's number of Hogwild training threads in the process.
        pyfleet trains a dataset on one thread per worker process (start more
        workers for parallelism), so ``thread > 1`` logs a warning naming it and
        trains on one. ``debug=True`` (Fluid's per-op timing) is refused."""
        _check_dataset_options(thread, debug)
        return self._run_dataset(program, dataset, scope, fetch_list, fetch_info,
                                 print_period, False, fetch_handler)

    def infer_from_dataset(self, program=None, dataset=None, scope=None, thread=0,
                           debug=False, fetch_list=None, fetch_info=None, print_period=100,
                           fetch_handler=None):
        """As :meth:`train_from_dataset` without updating parameters."""
        _check_dataset_options(thread, debug)
        return self._run_dataset(program, dataset, scope, fetch_list, fetch_info,
                                 print_period, True, fetch_handler)

    def _run_dataset(self, program, dataset, scope, fetch_list, fetch_info, print_period,
                     for_test, fetch_handler=None):
        if dataset is None or not hasattr(dataset, "_feeds"):
            raise ValueError("dataset must come from fluid.DatasetFactory().create_dataset()")
        program = getattr(program or default_main_program(), "_program",
                          program or default_main_program())
        if for_test:
            program = program.clone(for_test=True)
        fetch_list = list(fetch_list or [])
        labels = list(fetch_info or [getattr(f, "name", f) for f in fetch_list])
        if len(labels) != len(fetch_list):
            raise ValueError(f"fetch_info has {len(labels)} labels for {len(fetch_list)} "
                             "fetches")
        handler = FetchMonitor(fetch_handler, program) if fetch_handler is not None else None
        extra = handler.fetch_vars if handler is not None else []
        out = None
        for i, feed in enumerate(dataset._feeds()):
            got = self.run(program, feed=feed, fetch_list=fetch_list + extra, scope=scope)
            out = got[:len(fetch_list)]
            if handler is not None:
                handler.step(got[len(fetch_list):])
            if fetch_list and print_period and (i + 1) % int(print_period) == 0:
                print(" ".join(f"{lab}: {np.asarray(v).reshape(-1)[:8]}"
                               for lab, v in zip(labels, out)), flush=True)
        return out

    # --------------------------------------------------------------- startup
    def _run_startup(self, startup, scope):
        for p in startup._init_params:
            main = p.block.program
            backend = startup._backend or main.backend
            opt = p.optimizer
            if opt is None:
                opt = SGD(1.0)   # a placeholder: this table is never pushed
                main._initialized_with = _NO_OPTIMIZER
            else:
                main._initialized_with = main._optimizer
            if getattr(p, "stat_rule", None) and not keeps_statistics(backend):
                raise ValueError(_statistics_refused(p, backend))
            if p.is_sparse_table:
                backend.create_sparse(p.name, p.dim, opt, p.initializer, p.seed)
            else:
                backend.create_dense(p.name, p.initial_value(), opt)
            scope._register_parameter(p.name, backend, p.is_sparse_table)
        for name, value in startup._init_states:
            scope.vars[name] = np.array(value, copy=True)
        # What must follow the initial values (a restarted Fleet worker's
        # saved auc counters: Fleet sets these).
        for hook in getattr(startup, "_after_run", ()):
            hook()

    @staticmethod
    def _apply_gradient_rules(program, s, backend, dense, merged, row_sparse):
        """Clip and regularize this step's gradients in place (``dense``:
        name -> gradient; ``merged``: table -> (keys, rows' gradients, rows))."""
        block = program.global_block()
        entries = [GradEntry(block.vars[n], g, s.env[n], row_sparse.get(n))
                   for n, g in dense.items()]
        entries += [GradEntry(block.vars[n], part[1], part[2]) for n, part in merged.items()]
        # The kinds of table ("sparse", "dense") whose decay the backend adds
        # itself (True: every kind); the worker adds the others'.
        done = getattr(backend, "applies_regularizers", False)
        if isinstance(done, bool):
            regularize = not done
        else:
            def regularize(p):
                return ("sparse" if p.is_sparse_table else "dense") not in done
        for e in apply_gradient_rules(entries, program._optimizer, regularize):
            name = e.param.name
            if name in dense:
                dense[name] = np.ascontiguousarray(e.grad, dtype=dense[name].dtype)
            else:
                keys, _, rows = merged[name]
                merged[name] = (keys, e.grad, rows)

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
            fed[name] = feed_value(block.vars[name], value, checked)
        key = (program._version, frozenset(fed), tuple(v.name for v in fetch_vars), training)
        plan = program._plan_cache.get(key)
        if plan is None:
            plan = Plan(program, set(fed), fetch_vars, training)
            program._plan_cache[key] = plan
        backend = program.backend
        s = Step(program, plan, scope, backend, self._prepared)
        s.env.update(fed)
        for i, op in enumerate(plan.ops):
            if i == plan.dense_at:
                # As late as possible: a remote backend's dense values (the reply
                # to the previous step's push) travel while the lookups run.
                s.env.update(backend.pull_dense_many(plan.dense_params))
            if op.type == "lookup_table":
                s.set(op.output("Out")[0], s.lookup(op))
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
        stats = s.cache.get(STATISTICS)
        if stats:   # batch_norm's moving statistics, data_norm's summaries
            block_vars = program.global_block().vars
            for name, value in stats.items():
                if not keeps_statistics(backend):
                    raise ValueError(_statistics_refused(block_vars[name], backend))
                backend.set_dense(name, np.asarray(value, dtype=s.env[name].dtype))
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
            elif not return_numpy and not isinstance(val, LoDTensor):
                val = LoDTensor(val)   # Fluid's return_numpy=False: every fetch a LoDTensor
            results.append(fetched(val) if return_numpy else val)
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
        rate = _lr_ratio(program, s)
        rules = has_gradient_rules(program)
        row_sparse = {}   # dense parameter -> rows its is_sparse lookups touched
        lazy_rows = {}    # the same, of lazy Adam's tables (see pyfleet.optimizer)
        lazy = getattr(program._optimizer, "lazy_mode", False)
        for grp in groups:   # embeddings of dense parameters: part of their gradient
            if not grp.param.is_sparse_table:
                summed = s.summed_lookup_grads(grp)
                if summed is not None:
                    keys, g = summed
                    gw = np.zeros(grp.param.shape, dtype=g.dtype)
                    gw[keys] = g
                    s.add_grad(grp.param, gw)
                    if (rules or lazy) and _row_sparse(plan, grp):
                        row_sparse[grp.param.name] = keys
                        if lazy:
                            lazy_rows.setdefault(grp.param.name, []).append(keys)
        dense = {}
        for name in plan.trained_dense:
            g = s.grads.get(name)
            if g is not None:
                dense[name] = np.ascontiguousarray(g if rate is None else g * rate,
                                                   dtype=s.env[name].dtype)
        if dense and not rules:
            # Before the sparse sums: a remote backend's round trip starts sooner.
            _mark_looked_up_rows(dense, lazy_rows)
            backend.push_dense_many(dense)
        sparse = {}
        row_dtype = {}
        for grp in groups:
            if grp.param.is_sparse_table:
                summed = s.summed_lookup_grads(grp, with_rows=rules)
                if summed is not None and rate is not None:
                    summed = (summed[0], summed[1] * rate) + tuple(summed[2:])
                if summed is not None:
                    sparse.setdefault(grp.param.name, []).append(summed)
                    row_dtype[grp.param.name] = grp.rows.dtype
        merged = {}
        for name, parts in sparse.items():
            if len(parts) == 1:
                merged[name] = parts[0]
                continue
            keys, g = merge_keys([p[0] for p in parts], [p[1] for p in parts])
            if rules:   # the pulled row of each merged key
                all_keys = np.concatenate([p[0] for p in parts])
                order = np.argsort(all_keys, kind="stable")
                at = order[np.searchsorted(all_keys[order], keys)]
                merged[name] = (keys, g, np.concatenate([p[2] for p in parts])[at])
            else:
                merged[name] = (keys, g)
        if rules:
            Executor._apply_gradient_rules(program, s, backend, dense, merged, row_sparse)
            if dense:
                _mark_looked_up_rows(dense, lazy_rows)
                backend.push_dense_many(dense)
        for name, part in merged.items():
            backend.push_sparse(name, part[0],
                                np.ascontiguousarray(part[1], dtype=row_dtype[name]))
        backend.step_end()


def _mark_looked_up_rows(dense, lazy_rows):
    """A lazy Adam table moves the rows whose gradient is not all +0.0: a row
    the step looked up whose gradient is all zero is written -0.0, so it takes
    its step (moments decay) as in Fluid's lazy adam over SelectedRows rows."""
    for name, parts in lazy_rows.items():
        g = dense.get(name)
        if g is None:
            continue
        rows = np.unique(np.concatenate(parts))
        zero = rows[~g[rows].any(axis=1)]
        if zero.size:
            g[zero] = -0.0


def _lr_ratio(program, s):
    """This step's learning rate over the rule's (the schedule's first), or
    None without a schedule (see ``lr_schedules.check_schedule``)."""
    sched = getattr(program._optimizer, "lr_schedule", None)
    if sched is None:
        return None
    return float(np.asarray(s.data(sched)).reshape(-1)[0]) / program._optimizer.learning_rate


def keeps_statistics(backend):
    """Whether ``backend``'s own class declares ``keeps_op_statistics = True``
    (see :mod:`pyfleet.fluid.nn_ops`): inherited declarations do not count."""
    return bool(type(backend).__dict__.get("keeps_op_statistics", False))


def _statistics_refused(param, backend):
    return (f"{param.stat_rule}: {param.name!r} is a statistic updated outside the gradient, "
            f"which {type(backend).__name__} cannot keep (under Fleet each worker would keep "
            f"its own copy, the servers none): {param.stat_rule} runs on the local backend "
            "only; train this network without Fleet, or drop the layer")


_warned_threads = set()


def _check_dataset_options(thread, debug):
    """``train_from_dataset``'s ``thread`` and ``debug``: neither silently ignored."""
    if debug:
        raise ValueError("train_from_dataset(debug=True): Fluid's per-op timing output is "
                         "not implemented by pyfleet; pass debug=False")
    if isinstance(thread, bool) or not isinstance(thread, int) or thread < 0:
        raise ValueError(f"train_from_dataset(thread=...) must be an int >= 0, got {thread!r}")
    if thread > 1 and thread not in _warned_threads:
        _warned_threads.add(thread)
        logging.getLogger("pyfleet.fluid").warning(
            "train_from_dataset(thread=%d): pyfleet trains on one thread per worker process; "
            "start more workers (fleetrun --worker_num) for parallelism", thread)

"""Fluid test helpers: a float64 recording backend, a finite-difference gradient check,
and a one-layer Fleet (:func:`fc_fleet`) for tests of a Fleet role's lifecycle.

:class:`RecordingBackend` keeps parameters as float64 numpy arrays, never
applies an update, and records the last gradients pushed, so a program's
gradients can be compared with central finite differences of its loss
(:func:`check_gradients`). Pure numpy; not thread-safe; for tests only.
"""

import numpy as np

from pyfleet.fluid.backend import Backend
from pyfleet.fluid.executor import Executor

__all__ = ["RecordingBackend", "check_gradients", "fc_fleet"]


class RecordingBackend(Backend):
    """Parameters in float64 dicts; pushes are recorded, not applied.

    Sparse rows are created on first pull from ``initializer.generate`` with
    the table's seed and the key, so they are deterministic.
    """

    keeps_op_statistics = True   # batch_norm/data_norm statistics via set_dense

    def __init__(self, dtype=np.float64):
        self.dtype = np.dtype(dtype)
        self.dense = {}
        self.sparse = {}           # name -> {key: row}
        self.sparse_meta = {}      # name -> (dim, initializer, seed)
        self.pushed_dense = {}
        self.pushed_sparse = {}
        self.calls = []

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        self.sparse[name] = {}
        self.sparse_meta[name] = (dim, initializer, seed)
        self.calls.append(("create_sparse", name))

    def create_dense(self, name, initial_value, optimizer):
        self.dense[name] = np.array(initial_value, dtype=self.dtype)
        self.calls.append(("create_dense", name))

    def pull_sparse(self, name, keys, create=True):
        self.calls.append(("pull_sparse", name, len(keys)))
        dim, init, seed = self.sparse_meta[name]
        table = self.sparse[name]
        out = np.empty((len(keys), dim), dtype=self.dtype)
        for i, k in enumerate(keys.tolist()):
            row = table.get(k)
            if row is None:
                row = np.asarray(init.generate((dim,), seed=seed, key=k), dtype=self.dtype)
                if create:
                    table[k] = row
            out[i] = row
        return out

    def push_sparse(self, name, keys, grads):
        self.calls.append(("push_sparse", name, len(keys)))
        self.pushed_sparse[name] = (keys.copy(), np.array(grads, copy=True))

    def pull_dense(self, name):
        return self.dense[name].copy()

    def pull_dense_many(self, names):
        self.calls.append(("pull_dense_many", tuple(names)))
        return {n: self.dense[n].copy() for n in names}

    def push_dense(self, name, grad):
        self.pushed_dense[name] = np.array(grad, copy=True)

    def push_dense_many(self, grads):
        self.calls.append(("push_dense_many", tuple(grads)))
        super().push_dense_many(grads)

    def set_dense(self, name, value):
        self.dense[name][...] = value

    def step_end(self):
        self.calls.append(("step_end",))


def check_gradients(main_program, startup_program, loss, feed, eps=1e-6, rtol=1e-4,
                    atol=1e-8, max_elements=12, seed=0, jitter=0.0, train_forward=False):
    """Compare the executor's gradients of ``loss`` with central differences.

    ``main_program`` must have an optimizer (``minimize(loss)``) and a float64
    network. Up to ``max_elements`` entries of each dense parameter and of
    each pulled sparse row are perturbed. ``jitter`` adds uniform noise of
    that size to every dense parameter after initialization, so that zero
    biases do not put relu inputs exactly on their kink. ``train_forward``:
    the differences evaluate the training program itself (batch statistics,
    dropout masks of a fixed seed) instead of its test clone. Statistics a
    run updates outside the gradient (batch_norm, data_norm) are put back
    after every run, and non-trainable parameters are not probed. Raises
    AssertionError listing mismatches; returns the number of entries checked.
    """
    be = RecordingBackend()
    main_program.set_backend(be)
    exe = Executor()
    exe.run(startup_program)
    rng = np.random.default_rng(seed)
    if jitter:
        for value in be.dense.values():
            value += rng.uniform(-jitter, jitter, value.shape)
    before = {n: v.copy() for n, v in be.dense.items()}
    exe.run(main_program, feed=feed, fetch_list=[loss])
    stats = {n: v for n, v in before.items() if not np.array_equal(v, be.dense[n])}
    for n, v in stats.items():
        be.dense[n][...] = v
    pushed_dense = {n: g.copy() for n, g in be.pushed_dense.items()}
    pushed_sparse = {n: (k.copy(), g.copy()) for n, (k, g) in be.pushed_sparse.items()}
    frozen = {p.name for p in main_program.all_parameters() if not p.trainable}
    test = main_program if train_forward else main_program.clone(for_test=True)

    def f():
        out = exe.run(test, feed=feed, fetch_list=[loss])[0]
        for n, v in stats.items():
            be.dense[n][...] = v
        return float(np.asarray(out).reshape(-1)[0])

    checked = 0
    problems = []

    def probe(array, index, analytic, label):
        nonlocal checked
        old = array[index]
        array[index] = old + eps
        up = f()
        array[index] = old - eps
        down = f()
        array[index] = old
        numeric = (up - down) / (2 * eps)
        checked += 1
        if not np.isclose(analytic, numeric, rtol=rtol, atol=atol):
            problems.append(f"{label}: analytic {analytic:.10g} numeric {numeric:.10g}")

    for name, value in be.dense.items():
        if name in frozen:
            continue
        grad = pushed_dense.get(name)
        if grad is None:
            grad = np.zeros_like(value)
        flat = value.reshape(-1)
        picks = rng.choice(flat.size, size=min(max_elements, flat.size), replace=False)
        for i in picks:
            probe(flat, i, grad.reshape(-1)[i], f"{name}[{i}]")
    for name, table in be.sparse.items():
        keys, grads = pushed_sparse.get(name, (np.zeros(0, np.uint64), None))
        pos = {int(k): i for i, k in enumerate(keys.tolist())}
        all_keys = list(table)
        picks = rng.choice(len(all_keys), size=min(max_elements, len(all_keys)), replace=False)
        for i in picks:
            k = all_keys[i]
            row = table[k]
            j = int(rng.integers(row.shape[0]))
            analytic = grads[pos[k], j] if k in pos else 0.0
            probe(row, j, analytic, f"{name}[key {k}][{j}]")
    if problems:
        raise AssertionError(f"{len(problems)} of {checked} gradient entries differ:\n"
                             + "\n".join(problems[:10]))
    return checked


def fc_fleet(role, ep, connect_timeout=30.0):
    """``(fleet, loss)``: a Fleet of one server at ``ep`` and one worker, in ``role``
    (a ``Role``), with an async strategy and a one-fc regression minimized by SGD."""
    from pyfleet import fluid
    from pyfleet.distributed.fleet import Fleet
    from pyfleet.distributed.role_maker import UserDefinedRoleMaker
    from pyfleet.fluid.incubate.fleet.parameter_server.distribute_transpiler.distributed_strategy import (  # noqa: E501
        StrategyFactory,
    )
    f = Fleet()
    f.init(UserDefinedRoleMaker(0, role, 1, [ep]))
    strategy = StrategyFactory.create_async_strategy()
    strategy.get_program_config().runtime.connect_timeout = connect_timeout
    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.unique_name.guard():
        x = fluid.layers.data(name="x", shape=[4], dtype="float32")
        y = fluid.layers.data(name="y", shape=[1], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(fluid.layers.fc(x, 1), y))
        f.distributed_optimizer(fluid.optimizer.SGD(0.1), strategy).minimize(loss)
    return f, loss

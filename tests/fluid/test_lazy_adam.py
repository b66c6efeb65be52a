"""Fluid's Adam ``lazy_mode=True`` on a dense embedding looked up with
``is_sparse=True``: only the rows a step looked up move (their moments and
weights, even where their gradient is zero), the parameter's one beta-power
pair advances every step. Checked against a plain numpy lazy Adam."""

import numpy as np
import pytest

import pyfleet
import pyfleet.fluid as fluid
from pyfleet import optimizer as opt

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8
VOCAB, DIM = 6, 3


def _numpy_lazy_adam(w, m, v, pows, rows, grads, lazy=True):
    """One step of Fluid's adam op on a row-sparse gradient (``rows`` unique)."""
    b1p, b2p = pows
    lr_t = LR * np.sqrt(1 - b2p) / (1 - b1p)
    full = np.zeros_like(w)
    full[rows] = grads
    touched = rows if lazy else np.arange(len(w))
    for r in touched:
        g = full[r]
        m[r] = B1 * m[r] + (1 - B1) * g
        v[r] = B2 * v[r] + (1 - B2) * g * g
        w[r] -= lr_t * (m[r] / (np.sqrt(v[r]) + EPS * np.sqrt(1 - b2p)))
    return b1p * B1, b2p * B2


def _build(lazy_mode, is_sparse=True):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = fluid.data("ids", [-1, 1], "int64")
        mask = fluid.data("mask", [-1, DIM], "float32")
        weight = fluid.data("weight", [-1, DIM], "float32")
        emb = fluid.layers.embedding(ids, [VOCAB, DIM], is_sparse=is_sparse)
        out = fluid.layers.elementwise_mul(fluid.layers.elementwise_mul(emb, mask), weight)
        loss = fluid.layers.reduce_sum(out)
        fluid.optimizer.Adam(LR, B1, B2, EPS, lazy_mode=lazy_mode).minimize(loss)
    return main, startup


# Step 1 looks up rows 1, 2, 3; step 2 rows 1 and 4, with row 1's gradient
# masked to zero (it still moves: its first moment is not zero).
STEPS = [
    (np.array([1, 2, 3, 2]), np.ones((4, DIM))),
    (np.array([1, 4, 1]), np.array([[0.0] * DIM, [1.0] * DIM, [0.0] * DIM])),
]


def _run(lazy_mode, is_sparse=True):
    main, startup = _build(lazy_mode, is_sparse)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    be = main._backend
    w0 = be.dense["embedding_0.w_0"].pull().astype(np.float64)
    rng = np.random.default_rng(0)
    seen = []
    for ids, mask in STEPS:
        weight = rng.normal(size=(len(ids), DIM))
        exe.run(main, feed={"ids": ids.reshape(-1, 1).astype(np.int64),
                            "mask": mask.astype(np.float32),
                            "weight": weight.astype(np.float32)})
        seen.append((ids, mask * weight))
    return w0, seen, be.dense["embedding_0.w_0"].pull().astype(np.float64)


def _reference(w0, seen, lazy):
    w, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    pows = (B1, B2)     # Fluid starts the powers at beta
    for ids, g_per_id in seen:
        rows = np.unique(ids)
        grads = np.stack([g_per_id[ids == r].sum(axis=0) for r in rows])
        pows = _numpy_lazy_adam(w, m, v, pows, rows, grads, lazy)
    return w


def test_lazy_adam_moves_only_looked_up_rows():
    w0, seen, w = _run(lazy_mode=True)
    np.testing.assert_allclose(w, _reference(w0, seen, lazy=True), rtol=1e-5, atol=1e-6)
    # rows 0 and 5 were never looked up; 2 and 3 not in step 2: they kept step 1's values
    np.testing.assert_array_equal(w[[0, 5]], w0[[0, 5]])
    after_one = _reference(w0, seen[:1], lazy=True)
    np.testing.assert_allclose(w[[2, 3]], after_one[[2, 3]], rtol=1e-6)
    # row 1 had a zero gradient in step 2 but was looked up: its momentum moved it
    assert not np.allclose(w[1], after_one[1], rtol=0, atol=1e-7)


def test_plain_adam_moves_every_row_of_the_dense_embedding():
    w0, seen, w = _run(lazy_mode=False)
    np.testing.assert_allclose(w, _reference(w0, seen, lazy=False), rtol=1e-5, atol=1e-6)
    after_one = _reference(w0, seen[:1], lazy=False)
    assert not np.allclose(w[[2, 3]], after_one[[2, 3]], rtol=0, atol=1e-7)


def test_lazy_mode_on_a_dense_gradient_is_plain_adam():
    # is_sparse=False: Fluid's gradient is dense, lazy_mode changes nothing
    w0, seen, w = _run(lazy_mode=True, is_sparse=False)
    np.testing.assert_allclose(w, _reference(w0, seen, lazy=False), rtol=1e-5, atol=1e-6)


def test_the_table_of_a_row_sparse_embedding_gets_the_row_width():
    main, _ = _build(lazy_mode=True)
    p = main.global_block().var("embedding_0.w_0")
    assert p.optimizer.lazy_row_width == DIM and p.optimizer.lazy_mode
    # the config servers build the table from keeps it; a plain Adam's is unchanged
    assert opt.from_config(p.optimizer.to_config()).lazy_row_width == DIM
    assert "lazy_row_width" not in opt.Adam().to_config()


def test_dense_table_lazy_rows_match_numpy():
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    t = pyfleet.DenseTable((VOCAB, DIM), opt.Adam(LR, B1, B2, EPS, lazy_row_width=DIM),
                           initial=w0)
    w, m, v, pows = w0.astype(np.float64), np.zeros((VOCAB, DIM)), np.zeros((VOCAB, DIM)), \
        (B1, B2)
    for rows in ([0, 2], [2, 5], [1]):
        g = np.zeros((VOCAB, DIM), np.float32)
        g[rows] = rng.normal(size=(len(rows), DIM))
        if rows == [1]:
            g[1] = -0.0                 # looked up, zero gradient: still a step
        t.push(g)
        pows = _numpy_lazy_adam(w, m, v, pows, np.array(rows), g[rows].astype(np.float64))
    np.testing.assert_allclose(t.pull(), w, rtol=1e-5, atol=1e-6)
    assert np.array_equal(t.pull()[[3, 4]], w0[[3, 4]])


def test_lazy_row_width_is_refused_where_it_cannot_apply():
    with pytest.raises(ValueError, match="not whole rows of 4"):
        pyfleet.DenseTable(10, opt.Adam(lazy_row_width=4))
    with pytest.raises(ValueError, match="lazy_row_width must be >= 0"):
        opt.Adam(lazy_row_width=-1)

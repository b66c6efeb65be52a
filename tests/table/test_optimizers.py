"""Every optimizer of the sparse and dense tables against the numpy reference."""

import numpy as np
import pytest
from support.reference import init_state, update

import pyfleet
from pyfleet.optimizer import FTRL, SGD, Adagrad, Adam, Momentum, RMSProp

OPTIMIZERS = [
    SGD(learning_rate=0.1),
    Adagrad(learning_rate=0.05, epsilon=1e-6, initial_accumulator_value=0.1),
    Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8),
    FTRL(learning_rate=0.05, l1=0.01, l2=0.1, lr_power=-0.5),
    FTRL(learning_rate=0.05, l1=0.0, l2=0.01, lr_power=-0.25),
    Momentum(learning_rate=0.05, momentum=0.9),
    Momentum(learning_rate=0.05, momentum=0.8, use_nesterov=True),
    RMSProp(learning_rate=0.01, rho=0.9, epsilon=1e-6, momentum=0.5),
    RMSProp(learning_rate=0.01, rho=0.95, epsilon=1e-4, momentum=0.0, centered=True),
]
EDGE_KEYS = np.array([0, 2**64 - 1, 1, 2**63], dtype=np.uint64)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
@pytest.mark.parametrize("dim", [1, 8, 19])
def test_sparse_matches_numpy_reference(opt, dim):
    rng = np.random.default_rng(dim)
    table = pyfleet.SparseTable(dim, opt, seed=7)
    pool = np.concatenate([EDGE_KEYS, rng.integers(0, 2**64, 60, dtype=np.uint64)])
    ref_w, ref_s = {}, {}
    for step in range(40):
        n = 0 if step % 9 == 4 else int(rng.integers(1, 50))
        keys = rng.choice(pool, size=n)  # duplicates on purpose
        pulled = table.pull(keys)
        for i, k in enumerate(keys.tolist()):
            if k not in ref_w:
                ref_w[k] = table.initial_values(np.array([k], dtype=np.uint64))[0].copy()
                ref_s[k] = init_state(opt, dim)
            np.testing.assert_allclose(pulled[i], ref_w[k], rtol=2e-5, atol=1e-6)
        grads = rng.normal(0, 1, (n, dim)).astype(np.float32)
        table.push(keys, grads)
        # Equal keys: gradients summed (in order of appearance), applied once.
        summed = {}
        for i, k in enumerate(keys.tolist()):
            summed[k] = grads[i].copy() if k not in summed else summed[k] + grads[i]
        for k, g in summed.items():
            update(opt, ref_w[k], ref_s[k], g)
    exported = table.export(with_state=True)
    assert len(exported["keys"]) == len(ref_w) == len(table)
    for i, k in enumerate(exported["keys"].tolist()):
        np.testing.assert_allclose(exported["weights"][i], ref_w[k], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(exported["state"][i], ref_s[k], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_dense_matches_numpy_reference(opt):
    rng = np.random.default_rng(3)
    init = rng.normal(0, 0.1, (5, 7)).astype(np.float32)
    table = pyfleet.DenseTable((5, 7), opt, initial=init)
    w = init.reshape(-1).copy()
    s = init_state(opt, w.size)
    for _ in range(30):
        g = rng.normal(0, 1, (5, 7)).astype(np.float32)
        table.push(g)
        update(opt, w, s, g.reshape(-1))
    np.testing.assert_allclose(table.pull().reshape(-1), w, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(table.state(), s, rtol=2e-5, atol=1e-6)


def test_adam_is_lazy_per_row():
    """A row not pushed keeps its beta powers: sparse Adam only touches pushed rows."""
    opt = Adam(learning_rate=0.1)
    table = pyfleet.SparseTable(2, opt)
    a, b = np.array([1], np.uint64), np.array([2], np.uint64)
    table.pull(np.array([1, 2], np.uint64))
    for _ in range(5):
        table.push(a, np.ones((1, 2), np.float32))
    table.push(b, np.ones((1, 2), np.float32))
    st = table.export(with_state=True)
    by_key = dict(zip(st["keys"].tolist(), st["state"]))
    np.testing.assert_allclose(by_key[1][4:], [0.9**6, 0.999**6], rtol=1e-5)
    np.testing.assert_allclose(by_key[2][4:], [0.9**2, 0.999**2], rtol=1e-5)


def test_optimizer_arguments_are_validated():
    with pytest.raises(ValueError, match="learning_rate"):
        Adam(learning_rate=-1)
    with pytest.raises(ValueError, match="beta1"):
        Adam(beta1=1.0)
    with pytest.raises(ValueError, match="lr_power"):
        FTRL(lr_power=0.5)
    assert Adam(learning_rate=0.5) == pyfleet.optimizer.from_config(Adam(0.5).to_config())


REGULARIZERS = [{"type": "L2Decay", "regularization_coeff": 0.1},
                {"type": "L1Decay", "regularization_coeff": 0.05}]
REGULARIZED = [SGD(learning_rate=0.1), Adagrad(learning_rate=0.05),
               Momentum(learning_rate=0.05, momentum=0.9), RMSProp(learning_rate=0.01)]


@pytest.mark.parametrize("reg", REGULARIZERS, ids=lambda r: r["type"])
@pytest.mark.parametrize("opt", REGULARIZED, ids=repr)
def test_sparse_regularizer_decays_each_pushed_row_once(opt, reg):
    """Fluid's regularizer on the servers: the decay of the row's value is
    added to its (summed) gradient once per push that touches it; rows a
    push does not touch are not decayed."""
    rng = np.random.default_rng(5)
    table = pyfleet.SparseTable(4, opt, seed=3, regularizer=reg)
    pool = rng.integers(0, 2**64, 12, dtype=np.uint64)
    ref_w = dict(zip(pool.tolist(), table.pull(pool).copy()))
    ref_s = {k: init_state(opt, 4) for k in ref_w}
    for _ in range(15):
        keys = rng.choice(pool, size=int(rng.integers(1, 10)))   # duplicates, untouched rows
        grads = rng.normal(0, 1, (len(keys), 4)).astype(np.float32)
        table.push(keys, grads)
        summed = {}
        for i, k in enumerate(keys.tolist()):
            summed[k] = grads[i].copy() if k not in summed else summed[k] + grads[i]
        for k, g in summed.items():
            update(opt, ref_w[k], ref_s[k], g, reg)
    got = table.pull(pool)
    for i, k in enumerate(pool.tolist()):
        np.testing.assert_allclose(got[i], ref_w[k], rtol=2e-5, atol=1e-6)
    assert table.config()["regularizer"] == reg
    assert pyfleet.SparseTable.from_config(table.config()).regularizer == reg


@pytest.mark.parametrize("reg", REGULARIZERS, ids=lambda r: r["type"])
def test_dense_regularizer(reg):
    opt = Momentum(learning_rate=0.05, momentum=0.9, use_nesterov=True)
    rng = np.random.default_rng(4)
    init = rng.normal(0, 0.5, (3, 5)).astype(np.float32)
    table = pyfleet.DenseTable((3, 5), opt, initial=init, regularizer=reg)
    w, s = init.reshape(-1).copy(), init_state(opt, 15)
    for _ in range(10):
        g = rng.normal(0, 1, (3, 5)).astype(np.float32)
        table.push(g)
        update(opt, w, s, g.reshape(-1), reg)
    np.testing.assert_allclose(table.pull().reshape(-1), w, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(table.state(), s, rtol=2e-5, atol=1e-6)


def test_bad_regularizer_is_refused_by_name():
    for bad in ({"type": "L3Decay", "regularization_coeff": 0.1}, {"type": "L2Decay"},
                {"type": "L2Decay", "regularization_coeff": float("nan")}, "L2"):
        with pytest.raises(ValueError, match="regularizer"):
            pyfleet.SparseTable(2, SGD(0.1), regularizer=bad)
        with pytest.raises(ValueError, match="regularizer"):
            pyfleet.DenseTable(2, SGD(0.1), regularizer=bad)


def test_momentum_and_rmsprop_arguments():
    with pytest.raises(ValueError, match="momentum"):
        Momentum(learning_rate=0.1, momentum=-0.5)
    with pytest.raises(ValueError, match="rho"):
        RMSProp(learning_rate=0.1, rho=1.0)
    with pytest.raises(ValueError, match="epsilon"):
        RMSProp(learning_rate=0.1, epsilon=0.0)
    for opt in (Momentum(0.1, 0.9, use_nesterov=True), RMSProp(0.1, centered=True)):
        assert pyfleet.optimizer.from_config(opt.to_config()) == opt
    assert pyfleet.SparseTable(3, Momentum(0.1, 0.9)).optimizer.state_dim(3) == 3
    assert RMSProp(0.1).state_dim(3) == 6
    assert RMSProp(0.1, centered=True).state_dim(3) == 9


def test_rmsprop_state_of_another_layout_is_refused(tmp_path):
    """A centered RMSProp table holds one more state column: a file of the
    uncentered rule does not load into it (nor the other way round)."""
    t = pyfleet.SparseTable(3, RMSProp(0.01))
    keys = np.arange(5, dtype=np.uint64)
    t.pull(keys)
    t.push(keys, np.ones((5, 3), np.float32))
    t.save(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="RMSProp"):
        pyfleet.SparseTable(3, RMSProp(0.01, centered=True)).load(tmp_path / "t.bin")
    d = pyfleet.DenseTable(4, Momentum(0.1, 0.9))
    d.push(np.ones(4, np.float32))
    d.save(tmp_path / "d.bin")
    with pytest.raises(ValueError, match="Momentum"):
        pyfleet.DenseTable(4, RMSProp(0.1)).load(tmp_path / "d.bin")
    u = pyfleet.DenseTable(4, Momentum(0.1, 0.9))
    u.load(tmp_path / "d.bin")
    np.testing.assert_array_equal(u.state(), d.state())
    np.testing.assert_array_equal(u.pull(), d.pull())


@pytest.mark.parametrize("opt", [Momentum(0.1, 0.9, use_nesterov=True),
                                 RMSProp(0.01, momentum=0.5, centered=True)], ids=repr)
def test_momentum_and_rmsprop_state_reshards(tmp_path, opt):
    """A file of one table loads into two shards (filter=(2, i)): every row
    lands on the shard route() names, with its weights and optimizer state."""
    rng = np.random.default_rng(2)
    t = pyfleet.SparseTable(4, opt, seed=1)
    keys = rng.integers(0, 2**64, 300, dtype=np.uint64)
    for _ in range(3):
        t.pull(keys)
        t.push(keys, rng.normal(0, 1, (300, 4)).astype(np.float32))
    t.save(tmp_path / "t.bin")
    want = t.export(with_state=True)
    order = np.argsort(want["keys"])
    got_keys, got_w, got_s = [], [], []
    for i in range(2):
        shard = pyfleet.SparseTable(4, opt, seed=1)
        shard.load(tmp_path / "t.bin", filter=(2, i))
        e = shard.export(with_state=True)
        assert np.all(pyfleet.route(e["keys"], 2) == i)
        got_keys.append(e["keys"])
        got_w.append(e["weights"])
        got_s.append(e["state"])
    k = np.concatenate(got_keys)
    o = np.argsort(k)
    np.testing.assert_array_equal(k[o], want["keys"][order])
    np.testing.assert_array_equal(np.concatenate(got_w)[o], want["weights"][order])
    np.testing.assert_array_equal(np.concatenate(got_s)[o], want["state"][order])

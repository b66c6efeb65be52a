"""Every optimizer of the sparse and dense tables against the numpy reference."""

import numpy as np
import pytest
from support.reference import init_state, update

import pyfleet
from pyfleet.optimizer import FTRL, SGD, Adagrad, Adam

OPTIMIZERS = [
    SGD(learning_rate=0.1),
    Adagrad(learning_rate=0.05, epsilon=1e-6, initial_accumulator_value=0.1),
    Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8),
    FTRL(learning_rate=0.05, l1=0.01, l2=0.1, lr_power=-0.5),
    FTRL(learning_rate=0.05, l1=0.0, l2=0.01, lr_power=-0.25),
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

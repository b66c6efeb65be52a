# ruff: noqa: UP031  (the era's % formatting is what is tested)
"""Fetched values keep the Fluid 1.x print idioms under numpy 2: a scalar
loss comes back with shape [1] (as in Fluid) and still converts to a float."""

import numpy as np
import pytest

from pyfleet import fluid
from pyfleet.fluid.tensor import FetchedArray
from pyfleet.optimizer import SGD

L = fluid.layers


def _run_once():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [3])
        label = L.data("label", [1], dtype="int64")
        prob = L.fc(x, 2, act="softmax")
        avg_cost = L.mean(L.cross_entropy(prob, label))
        auc_var, batch_auc, _ = L.auc(prob, label)
        SGD(0.1).minimize(avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(8, 3)).astype(np.float32),
            "label": np.array([[0], [1]] * 4, dtype=np.int64)}
    return exe.run(main, feed=feed, fetch_list=[avg_cost, auc_var, batch_auc, prob])


def test_fluid_print_idioms_work_under_this_numpy():
    cost, auc_v, batch_auc_v, _prob = _run_once()
    assert cost.shape == (1,) and auc_v.shape == (1,)       # Fluid's shapes
    expected = float(np.asarray(cost).reshape(-1)[0])
    # the seed's own line, and the other idioms of the era
    line = "Pass %d, cost = %f, auc = %f, batch_auc = %f" % (0, cost, auc_v, batch_auc_v)
    assert line.startswith(f"Pass 0, cost = {expected:f},")
    assert f"{cost[0]:f}" == f"{expected:f}"
    assert f"{cost:.6f}" == f"{expected:.6f}"
    assert float(cost) == expected
    assert f"{cost:.4f}" == f"{expected:.4f}"
    assert f"{auc_v:.3f}" == f"{float(np.asarray(auc_v)[0]):.3f}"
    assert str(cost) == str(np.asarray(cost))
    assert f"{np.mean(cost):f}" == f"{expected:f}"
    assert int(np.array([3.7]).view(FetchedArray)) == 3


def test_a_fetched_value_prints_as_numpys_array_repr():
    """Fluid fetched plain ndarrays: `print(exe.run(...))` and log scrapers read
    `[array([0.47], dtype=float32)]`."""
    cost, auc_v, _, prob = _run_once()
    assert repr(cost) == repr(np.asarray(cost).view(np.ndarray))
    assert repr(cost).startswith("array([") and "FetchedArray" not in repr([cost, auc_v])
    assert str([prob]) == str([np.asarray(prob).view(np.ndarray)])
    assert repr(cost * 2).startswith("array([")      # values derived from it too


def test_fetched_values_are_plain_ndarrays_otherwise():
    cost, _, _, prob = _run_once()
    assert isinstance(prob, np.ndarray) and prob.shape == (8, 2)
    assert type(np.array(prob)) is np.ndarray
    np.testing.assert_allclose(np.asarray(prob).sum(axis=1), 1.0, rtol=1e-6)
    with pytest.raises(TypeError, match="one element"):
        float(prob)
    with pytest.raises(TypeError, match="index"):
        [1, 2, 3][cost]
    assert (cost * 2).shape == (1,)

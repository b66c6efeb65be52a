"""fluid.layer_helper.LayerHelper as PaddleRec's metric classes use it (and the
precision_recall operator they append, against a numpy reference): a
persistable global counter set by the startup program and advanced by a raw
``elementwise_add`` appended to the main program keeps its value across runs
(checked against the running sum in numpy); what pyfleet cannot run is refused
by name."""

import numpy as np
import pytest

from pyfleet import fluid
from pyfleet.fluid.layer_helper import LayerHelper
from pyfleet.initializer import Constant, Uniform

L = fluid.layers


def test_a_persistable_counter_advanced_by_an_appended_op():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [3])
        helper = LayerHelper("my_metric", input=x)
        counter, created = helper.create_or_get_global_variable(
            name="seen", persistable=True, dtype="float32", shape=[1])
        again, created_again = helper.create_or_get_global_variable(
            name="seen", persistable=True, dtype="float32", shape=[1])
        assert created and not created_again and again is counter
        helper.set_variable_initializer(counter, Constant(value=2.0, force_cpu=True))
        batch = L.reduce_sum(x)
        helper.append_op(type="elementwise_add", inputs={"X": [counter], "Y": [batch]},
                         outputs={"Out": [counter]})
        ratio = counter / 4.0
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(3)
    want = 2.0
    for _ in range(3):
        xb = rng.normal(size=(5, 3)).astype(np.float32)
        want += float(xb.sum())
        got, r = exe.run(main, feed={"x": xb}, fetch_list=[counter, ratio])
        np.testing.assert_allclose(got, [want], rtol=1e-5)
        np.testing.assert_allclose(r, [want / 4.0], rtol=1e-5)
    exe.run(startup)                                     # the startup program resets it
    got = exe.run(main, feed={"x": np.ones((2, 3), np.float32)}, fetch_list=[counter])[0]
    np.testing.assert_allclose(got, [8.0])


def test_what_pyfleet_cannot_run_is_refused_by_name():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        helper = LayerHelper("m")
        v, _ = helper.create_or_get_global_variable(name="v", persistable=True,
                                                    dtype="float32", shape=[2])
        with pytest.raises(ValueError, match="'no_such_op' has no pyfleet kernel"):
            helper.append_op(type="no_such_op", inputs={"X": [v]}, outputs={"Out": [v]})
        with pytest.raises(ValueError, match="only a Constant initializer.*Uniform"):
            helper.set_variable_initializer(v, Uniform())
        assert helper.main_program is main and helper.startup_program is startup
        t = helper.create_variable_for_type_inference("float32")
        assert t.name.startswith("m") and t.dtype == "float32"


def _reference_states(idx, lab, w, c):
    """Fluid's precision_recall kernel, sample by sample."""
    s = np.zeros((c, 4))
    for i, j, wi in zip(idx, lab, w):
        s[:, 2] += wi
        s[i, 2] -= wi
        if i == j:
            s[i, 0] += wi
        else:
            s[j, 3] += wi
            s[i, 1] += wi
            s[j, 2] -= wi
    return s


def _reference_metrics(s):
    def ratio(a, b):
        return a / (a + b) if a > 0 or b > 0 else 1.0

    def f1(p, r):
        return 2 * p * r / (p + r) if p > 0 or r > 0 else 0.0
    ps = [ratio(t, f) for t, f in zip(s[:, 0], s[:, 1])]
    rs = [ratio(t, f) for t, f in zip(s[:, 0], s[:, 3])]
    mp, mr = np.mean(ps), np.mean(rs)
    up, ur = ratio(s[:, 0].sum(), s[:, 1].sum()), ratio(s[:, 0].sum(), s[:, 3].sum())
    return [mp, mr, f1(mp, mr), up, ur, f1(up, ur)]


def test_the_precision_recall_operator_against_a_numpy_reference():
    c = 4
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        probs = L.data("probs", [c])
        label = L.data("label", [1], dtype="int64")
        weight = L.data("weight", [1])
        max_probs, indices = L.topk(probs, k=1)
        helper = LayerHelper("pr")
        states, _ = helper.create_or_get_global_variable(name="states", persistable=True,
                                                         dtype="float32", shape=[c, 4])
        helper.set_variable_initializer(states, Constant(0.0))
        batch_m = helper.create_variable_for_type_inference("float32")
        accum_m = helper.create_variable_for_type_inference("float32")
        helper.append_op(type="precision_recall", attrs={"class_number": c},
                         inputs={"MaxProbs": [max_probs], "Indices": [indices],
                                 "Labels": [label], "Weights": [weight],
                                 "StatesInfo": [states]},
                         outputs={"BatchMetrics": [batch_m], "AccumMetrics": [accum_m],
                                  "AccumStatesInfo": [states]})
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    rng = np.random.default_rng(5)
    total = np.zeros((c, 4))
    for _ in range(3):
        p = rng.random((20, c)).astype(np.float32)
        y = rng.integers(0, c, (20, 1))
        w = rng.integers(1, 3, (20, 1)).astype(np.float32)
        got_b, got_a, got_s = exe.run(main, feed={"probs": p, "label": y, "weight": w},
                                      fetch_list=[batch_m, accum_m, states])
        batch = _reference_states(p.argmax(axis=1), y.reshape(-1), w.reshape(-1), c)
        total += batch
        np.testing.assert_allclose(got_s, total, rtol=1e-6)
        np.testing.assert_allclose(got_b, _reference_metrics(batch), rtol=1e-5)
        np.testing.assert_allclose(got_a, _reference_metrics(total), rtol=1e-5)

"""The fused fc layer (pyfleet.fluid.fused_fc) against the unfused numpy ops:
the core's elementwise kernels against numpy's arithmetic, which chains a plan
fuses, and training with and without fusion giving the same losses and
parameters."""

import numpy as np
import pytest

from pyfleet import _core, fluid, models
from pyfleet.fluid import fused_fc
from pyfleet.fluid.ops import FORWARD
from pyfleet.fluid.step import Plan, Step
from pyfleet.optimizer import Adam


@pytest.fixture
def fusion():
    """Sets fused_fc.ENABLED for a test and restores it."""
    saved = fused_fc.ENABLED
    yield lambda on: setattr(fused_fc, "ENABLED", on)
    fused_fc.ENABLED = saved


@pytest.mark.parametrize("rows,cols", [(512, 256), (7, 13), (1, 3), (0, 5)])
def test_kernels_reproduce_numpy_bit_for_bit(rows, cols):
    rng = np.random.default_rng(rows + cols)
    z = rng.standard_normal((rows, cols)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    g = rng.standard_normal((rows, cols)).astype(np.float32)
    if rows > 1 and cols > 2:
        z[0, 0], z[1, 1] = np.nan, -0.0
        g[0, 2], g[1, 0] = np.inf, np.nan
    for act in ("relu", "none"):
        y = z.copy()
        _core.fc_bias_act(y, b, act)
        ref = np.maximum(z + b, 0) if act == "relu" else z + b
        assert np.array_equal(y, ref, equal_nan=True)
        with np.errstate(invalid="ignore"):
            rz = g * (y > 0) if act == "relu" else g
            gz, gb = _core.fc_act_bias_grad(g, y, act)
            assert np.array_equal(gz, rz, equal_nan=True)
            assert np.array_equal(gb, rz.sum(axis=0), equal_nan=True)
        assert (gz is g) == (act == "none")


def test_kernels_refuse_bad_arguments_by_name():
    y = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="bias has 2 entries for 3 columns"):
        _core.fc_bias_act(y, np.zeros(2, np.float32), "relu")
    with pytest.raises(ValueError, match="y must have dtype float32"):
        _core.fc_bias_act(y.astype(np.float64), np.zeros(3, np.float32), "relu")
    with pytest.raises(ValueError, match="y must be a C-contiguous, writeable"):
        _core.fc_bias_act(np.zeros((3, 4), np.float32).T, np.zeros(3, np.float32), "relu")
    with pytest.raises(ValueError, match="act must be 'relu' or 'none', got 'tanh'"):
        _core.fc_bias_act(y, np.zeros(3, np.float32), "tanh")
    with pytest.raises(ValueError, match=r"g has shape \(4, 3\), y \(4, 2\)"):
        _core.fc_act_bias_grad(y, np.zeros((4, 2), np.float32), "relu")


def _dnn(dtype="float32", layers=(16, 8), act_last=None):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = 3
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.build("dnn", num_dense=3, num_slots=4, embedding_dim=4, layers=layers,
                         dtype=dtype)
        extra = None
        if act_last:   # one more layer whose activation is not fused
            extra = fluid.layers.fc(m.predict_2d, 3, act=act_last)
            loss = fluid.layers.mean(extra) + m.avg_cost
            m.avg_cost = loss
        Adam(learning_rate=0.01).minimize(m.avg_cost)
    return main, startup, m


def _feed(rng, b=32, dtype=np.float32):
    feed = {"dense_input": rng.normal(size=(b, 3)).astype(dtype),
            "label": rng.integers(0, 2, (b, 1))}
    for i in range(1, 5):
        feed[f"C{i}"] = (rng.integers(0, 50, b).astype(np.int64), np.arange(b + 1))
    return feed


def _plan(main, m, fetch):
    return Plan(main, set(_feed(np.random.default_rng(0))), fetch, True)


def test_plan_fuses_each_fc_layer_whose_values_nobody_else_reads(fusion):
    fusion(True)
    main, _, m = _dnn()
    fused = [op for op in _plan(main, m, [m.avg_cost]).ops if op.type == "fused_fc"]
    assert [op.act for op in fused] == ["relu", "relu", "none"]   # 2 hidden, the output layer
    assert [len(op.ops) for op in fused] == [3, 3, 2]
    assert not any(o.type in ("mul", "relu") for o in _plan(main, m, [m.avg_cost]).ops)
    # a fetched pre-activation: its layer's product and bias fused, the relu its own op
    first = fused[0].ops
    plan = _plan(main, m, [m.avg_cost, first[1].output("Out")[0]])
    types = [op.type for op in plan.ops]
    assert [op.act for op in plan.ops if op.type == "fused_fc"] == ["none", "relu", "none"]
    assert types.count("relu") == 1 and types.index("relu") == types.index("fused_fc") + 1
    # a fetched product: that layer's ops stay as they are
    plan = _plan(main, m, [m.avg_cost, first[0].output("Out")[0]])
    kept = [op.type for op in plan.ops if op.type in ("mul", "elementwise_add", "relu")]
    assert kept == ["mul", "elementwise_add", "relu"]
    assert sum(op.type == "fused_fc" for op in plan.ops) == 2
    fusion(False)
    assert not any(op.type == "fused_fc" for op in _plan(main, m, [m.avg_cost]).ops)


def _train(fused, fusion, dtype="float32", act_last=None, steps=6):
    fusion(fused)
    main, startup, m = _dnn(dtype, act_last=act_last)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(7)
    losses = []
    for _ in range(steps):
        loss, pred = exe.run(main, feed=_feed(rng, dtype=np.dtype(dtype)),
                             fetch_list=[m.avg_cost, m.predict], scope=scope)
        losses.append((float(loss.reshape(-1)[0]), pred.copy()))
    params = {p.name: np.array(scope.find_var(p.name).get_tensor())
              for p in main.all_parameters() if not p.is_sparse_table}
    ops = {op.type for plan in main._plan_cache.values() for op in plan.ops}
    return losses, params, ops


@pytest.mark.parametrize("dtype,act_last", [("float32", None), ("float32", "tanh"),
                                            ("float64", None)])
def test_training_with_fusion_equals_the_numpy_ops(fusion, dtype, act_last):
    ref_losses, ref_params, ref_ops = _train(False, fusion, dtype, act_last)
    losses, params, ops = _train(True, fusion, dtype, act_last)
    assert "fused_fc" in ops and "fused_fc" not in ref_ops
    for (a, pa), (b, pb) in zip(ref_losses, losses):
        assert a == b
        assert np.array_equal(pa, pb)
    assert ref_params.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(params[name], ref_params[name], err_msg=name)
    assert ref_losses[-1][0] < ref_losses[0][0] * 1.5   # it trained, not diverged


def test_a_layer_the_fused_kernels_cannot_take_runs_its_own_ops(fusion):
    """Values whose shapes the plan did not foresee (an input one column wider
    than the weight has rows, here) go through the layer's own kernels and
    their errors; shapes it takes run fused."""
    fusion(True)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [4], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.fc(x, 2, act="relu"))
        Adam(learning_rate=0.01).minimize(loss)
    exe, scope = fluid.Executor(), fluid.Scope()
    exe.run(startup, scope=scope)
    plan = Plan(main, {"x"}, [loss], True)
    (op,) = [op for op in plan.ops if op.type == "fused_fc"]
    step = Step(main, plan, scope, main.backend)
    step.env.update(main.backend.pull_dense_many(plan.dense_params))
    step.env["x"] = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError, match="has 5 features per row"):
        FORWARD["fused_fc"](op, step)
    (value,) = exe.run(main, feed={"x": np.ones((2, 4), np.float32)}, fetch_list=[loss],
                       scope=scope)
    assert np.isfinite(value).all()


@pytest.mark.parametrize(("value", "enabled"), [("0", False), ("1", True), ("false", None)])
def test_the_environment_switch_takes_0_or_1_and_refuses_anything_else(value, enabled):
    import os
    import subprocess
    import sys
    code = "from pyfleet.fluid import fused_fc; print(fused_fc.ENABLED)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYFLEET_FUSED_FC": value})
    if enabled is None:
        assert r.returncode != 0
        assert "PYFLEET_FUSED_FC must be 0" in r.stderr and "'false'" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(enabled)

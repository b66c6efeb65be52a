"""Paddle 2.0's ``paddle.norm`` (``import pyfleet as paddle``; PaddleRec's rank/pnn
calls it): forward against numpy, gradients against central differences."""

import numpy as np
import pytest
from support.fluid import check_gradients

import pyfleet as paddle
from pyfleet import fluid
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _x(shape, seed=0):
    # away from 0 and without ties of |x|, so every norm is differentiable
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return x + np.arange(x.size).reshape(shape) * 1e-3


def _forward(x, **kw):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", list(x.shape), dtype=F64, append_batch_size=False)
        out = paddle.norm(d, **kw)
    exe = fluid.Executor()
    exe.run(startup)
    got = np.asarray(exe.run(main, feed={"x": x}, fetch_list=[out])[0])
    assert tuple(got.shape) == tuple(out.shape), (got.shape, out.shape)
    return got


@pytest.mark.parametrize("kw, ref", [
    ({"p": 2, "axis": 1, "keepdim": True},
     lambda x: np.sqrt((x * x).sum(axis=1, keepdims=True))),          # pnn's call
    ({}, lambda x: np.array([np.sqrt((x * x).sum())])),              # 'fro', every element
    ({"p": "fro", "axis": [0, 2]}, lambda x: np.sqrt((x * x).sum(axis=(0, 2)))),
    ({"p": 1, "axis": -1}, lambda x: np.abs(x).sum(axis=-1)),
    ({"p": 3.5, "axis": (1,)}, lambda x: (np.abs(x) ** 3.5).sum(axis=1) ** (1 / 3.5)),
    ({"p": np.inf, "axis": 0, "keepdim": True}, lambda x: np.abs(x).max(axis=0, keepdims=True)),
    ({"p": -np.inf, "axis": 2}, lambda x: np.abs(x).min(axis=2)),
    ({"p": 0, "axis": 1}, lambda x: (x != 0).sum(axis=1).astype(float)),
    ({"p": 2, "axis": [1, 2], "keepdim": True},
     lambda x: np.sqrt((x * x).sum(axis=(1, 2), keepdims=True))),
    ({"p": 2}, lambda x: np.array([np.linalg.norm(x.reshape(-1))])),
])
def test_forward_matches_numpy(kw, ref):
    x = _x((3, 4, 2))
    x[0, 1, 0] = 0.0        # a zero for p=0 to count
    np.testing.assert_allclose(_forward(x, **kw), ref(x), rtol=1e-12)


@pytest.mark.parametrize("kw", [
    {"p": 2, "axis": 1, "keepdim": True}, {}, {"p": "fro", "axis": [0, 2]}, {"p": 1, "axis": -1},
    {"p": 3.5, "axis": 1}, {"p": np.inf, "axis": 0}, {"p": -np.inf, "axis": 2, "keepdim": True},
    {"p": 2, "axis": [1, 2]},
])
def test_gradient_matches_central_differences(kw):
    x = _x((3, 4, 2), seed=1)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", [3, 4, 2], dtype=F64, append_batch_size=False)
        w = L.create_parameter([3, 4, 2], F64, name="w",
                               default_initializer=fluid.initializer.Uniform(0.5, 1.5))
        out = paddle.norm(L.elementwise_mul(d, w), **kw)
        weight = L.data("loss_w", list(out.shape), dtype=F64, append_batch_size=False)
        loss = L.mean(L.elementwise_mul(out, weight))
        SGD(0.1).minimize(loss)
    feed = {"x": x, "loss_w": np.random.default_rng(2).normal(size=out.shape)}
    assert check_gradients(main, startup, loss, feed, max_elements=24) > 0


def test_zero_order_norm_passes_no_gradient():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        w = L.create_parameter([2, 3], F64, name="w")
        loss = L.mean(paddle.norm(w, p=0, axis=1))
        SGD(0.1).minimize(loss)
    exe = fluid.Executor()
    exe.run(startup)
    before = main._backend.dense["w"].pull().copy()
    exe.run(main, fetch_list=[loss])
    np.testing.assert_array_equal(main._backend.dense["w"].pull(), before)


def test_named_like_paddle():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", [3, 4], dtype=F64, append_batch_size=False)
        assert paddle.norm(d, p=2, axis=1).name == "p_norm_0.tmp_0"
        assert paddle.norm(d).name == "frobenius_norm_0.tmp_0"


@pytest.mark.parametrize("kw, what", [
    ({"p": "nuc"}, "p='nuc' is not supported"),
    ({"p": -1}, "p=-1 is not supported"),
    ({"p": True}, "p=True is not supported"),
    ({"axis": [0, 1, 1]}, r"axis=\[0, 1, 1\] is not supported"),
    ({"axis": [1, -1]}, r"axis=\[1, -1\] is not supported"),
])
def test_unsupported_signature_parts_refused_by_name(kw, what):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", [3, 4], dtype=F64, append_batch_size=False)
        with pytest.raises(ValueError, match=f"paddle.norm: {what}"):
            paddle.norm(d, **kw)

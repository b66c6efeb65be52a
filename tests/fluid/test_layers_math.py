"""The Fluid 1.8 layers PaddleRec's model zoo uses beyond the CTR basics:
each forward against a plain numpy reference, each gradient against central
finite differences (float64 networks, RecordingBackend)."""

import numpy as np
import pytest
from support.fluid import check_gradients

from pyfleet import fluid
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _program():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = 7
    return main, startup


def _check(build, feed, **kw):
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss = build()
        SGD(0.1).minimize(loss)
    assert check_gradients(main, startup, loss, feed, **kw) > 0


def _forward(build, feed):
    """Run ``build()``'s outputs (a list) once; returns their values."""
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = build()
    exe = fluid.Executor()
    exe.run(startup)
    return [np.asarray(v) for v in exe.run(main, feed=feed, fetch_list=outs)]


def _weighted(y, shape):
    w = L.data("loss_w", list(shape), dtype=F64, append_batch_size=False)
    return L.mean(L.elementwise_mul(y, w))


def _param(shape, name, scale=1.0):
    return L.create_parameter(shape, F64, name=name,
                              default_initializer=fluid.initializer.Uniform(-scale, scale))


def _w(shape, seed=3):
    return np.random.default_rng(seed).normal(size=shape)


def _x(shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def _data(name, shape, dtype=F64):
    return L.data(name, list(shape), dtype=dtype, append_batch_size=False)


# --------------------------------------------------------------------------- forward

def test_elementwise_max_min_pow_compare_forward():
    x, y = _x((3, 4)), _x((4,), seed=1)

    def build():
        a, b = _data("x", (3, 4)), _data("y", (4,))
        return [L.elementwise_max(a, b), L.elementwise_min(a, b), L.less_than(a, b),
                L.less_equal(a, b), L.greater_than(a, b), L.greater_equal(a, b),
                L.equal(a, a), L.not_equal(a, b),
                L.logical_and(L.less_than(a, b), L.greater_than(a, b)),
                L.logical_not(L.less_than(a, b)),
                L.elementwise_pow(L.abs(a), b)]
    got = _forward(build, {"x": x, "y": y})
    want = [np.maximum(x, y), np.minimum(x, y), x < y, x <= y, x > y, x >= y,
            np.ones((3, 4), bool), x != y, np.zeros((3, 4), bool), ~(x < y),
            np.abs(x) ** y]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)
    assert got[2].dtype == np.bool_


def test_activations_forward():
    x = _x((5, 3), scale=4.0)

    def build():
        a = _data("x", (5, 3))
        return [L.clip(a, -1.5, 2.0), L.relu6(a), L.softsign(a), L.softplus(a),
                L.leaky_relu(a, 0.1), L.elu(a, 0.5), L.abs(a), L.sqrt(L.abs(a)),
                L.pow(L.abs(a), 1.5), L.floor(a), L.ceil(a), L.sign(a), L.logsigmoid(a)]
    got = _forward(build, {"x": x})
    want = [np.clip(x, -1.5, 2.0), np.clip(x, 0, 6), x / (1 + np.abs(x)),
            np.log1p(np.exp(x)), np.where(x > 0, x, 0.1 * x),
            np.where(x > 0, x, 0.5 * (np.exp(x) - 1)), np.abs(x), np.sqrt(np.abs(x)),
            np.abs(x) ** 1.5, np.floor(x), np.ceil(x), np.sign(x),
            -np.log1p(np.exp(-x))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_cos_sim_l2_normalize_topk_mse_forward():
    x, y, y1 = _x((4, 6)), _x((4, 6), seed=1), _x((1, 6), seed=2)
    lab = _x((4, 6), seed=5)

    def build():
        a, b, c = _data("x", (4, 6)), _data("y", (4, 6)), _data("y1", (1, 6))
        v, i = L.topk(a, 2)
        return [L.cos_sim(a, b), L.cos_sim(a, c), L.l2_normalize(a, axis=1),
                L.l2_normalize(a, axis=0, epsilon=1e-3), v, i,
                L.mse_loss(a, _data("lab", (4, 6)))]
    got = _forward(build, {"x": x, "y": y, "y1": y1, "lab": lab})

    def cos(p, q):
        return ((p * q).sum(1) / np.linalg.norm(p, axis=1) / np.linalg.norm(q, axis=1))[:, None]
    np.testing.assert_allclose(got[0], cos(x, y))
    np.testing.assert_allclose(got[1], cos(x, np.repeat(y1, 4, axis=0)))
    np.testing.assert_allclose(got[2], x / np.sqrt((x * x).sum(1, keepdims=True) + 1e-12))
    np.testing.assert_allclose(got[3], x / np.sqrt((x * x).sum(0, keepdims=True) + 1e-3))
    order = np.argsort(-x, axis=1)[:, :2]
    np.testing.assert_array_equal(got[5], order)
    assert got[5].dtype == np.int64
    np.testing.assert_allclose(got[4], np.take_along_axis(x, order, 1))
    np.testing.assert_allclose(got[6], [np.mean((x - lab) ** 2)])


def test_shape_ops_forward():
    x = _x((2, 1, 3))

    def build():
        a = _data("x", (2, 1, 3))
        u = L.unsqueeze(a, axes=[0, 3])
        return [L.squeeze(a, axes=[1]), u, L.shape(u), L.flatten(a, axis=2),
                L.stack([a, a * 2.0], axis=1), L.expand(a, [1, 2, 2]),
                L.unstack(L.squeeze(a, [1]), axis=1)[2], L.reduce_max(a, dim=2),
                L.reduce_min(a), L.reduce_prod(a, dim=[0], keep_dim=True), L.sum([a, a])]
    got = _forward(build, {"x": x})
    np.testing.assert_array_equal(got[0], x.reshape(2, 3))
    assert got[1].shape == (1, 2, 1, 1, 3)
    np.testing.assert_array_equal(got[2], [1, 2, 1, 1, 3])
    assert got[2].dtype == np.int32
    np.testing.assert_array_equal(got[3], x.reshape(2, 3))
    np.testing.assert_array_equal(got[4], np.stack([x, 2 * x], axis=1))
    np.testing.assert_array_equal(got[5], np.tile(x, (1, 2, 2)))
    np.testing.assert_array_equal(got[6], x[:, 0, 2])
    np.testing.assert_array_equal(got[7], x.max(axis=2))
    np.testing.assert_array_equal(got[8], [x.min()])
    np.testing.assert_allclose(got[9], x.prod(axis=0, keepdims=True))
    np.testing.assert_array_equal(got[10], 2 * x)


def test_squeeze_refuses_a_dimension_not_of_size_one():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        with pytest.raises(ValueError, match="squeeze: axis 0"):
            L.squeeze(_data("x", (2, 1, 3)), axes=[0])


def test_fill_constant_batch_size_like_and_dynamic_shapes():
    x = _x((5, 3))

    def build():
        a = L.data("x", [3], dtype=F64)
        n = L.shape(a)[0]
        return [L.fill_constant_batch_size_like(a, [-1, 2], "float32", 1.5),
                L.fill_constant_batch_size_like(a, [4, -1], "int64", 7, input_dim_idx=1,
                                                output_dim_idx=1),
                L.fill_constant(shape=[n, 2], dtype="float32", value=0.5),
                L.zeros([2, 2], "float32"), L.ones([3], "int64"), L.zeros_like(a),
                L.ones_like(a), a[1], a[1:3, 2], n]
    got = _forward(build, {"x": x})
    np.testing.assert_array_equal(got[0], np.full((5, 2), 1.5, np.float32))
    np.testing.assert_array_equal(got[1], np.full((4, 3), 7, np.int64))
    np.testing.assert_array_equal(got[2], np.full((5, 2), 0.5, np.float32))
    np.testing.assert_array_equal(got[3], np.zeros((2, 2)))
    np.testing.assert_array_equal(got[4], np.ones(3))
    np.testing.assert_array_equal(got[5], np.zeros((5, 3)))
    np.testing.assert_array_equal(got[6], np.ones((5, 3)))
    np.testing.assert_array_equal(got[7], x[1])
    np.testing.assert_array_equal(got[8], x[1:3, 2])
    np.testing.assert_array_equal(got[9], [5])


def test_fill_constant_batch_size_like_counts_sequences_of_a_lod_input():
    def build():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        return [L.fill_constant_batch_size_like(ids, [-1, 1], "float32", 1.0)]
    got = _forward(build, {"ids": [[1, 2, 3], [4], [5, 6]]})
    np.testing.assert_array_equal(got[0], np.ones((3, 1), np.float32))


def test_global_var_assign_keeps_its_value_between_runs():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        a = L.data("x", [2], dtype="float32")
        total = L.create_global_var([1], 0.0, "float32", persistable=True, name="total")
        L.assign(L.elementwise_add(L.reduce_sum(a), total), total)
        counter = L.autoincreased_step_counter("steps", begin=1)
        arr = L.assign(np.arange(4).reshape(2, 2))
    exe = fluid.Executor()
    exe.run(startup)
    x = np.ones((3, 2), np.float32)
    for i in range(3):
        t, c, v = exe.run(main, feed={"x": x}, fetch_list=[total, counter, arr])
        np.testing.assert_array_equal(t, [6.0 * (i + 1)])
        np.testing.assert_array_equal(c, [i + 1])
    np.testing.assert_array_equal(v, np.arange(4).reshape(2, 2))
    np.testing.assert_array_equal(np.array(fluid.global_scope().find_var("total").get_tensor()),
                                  [18.0])


def test_accuracy_fills_correct_and_total():
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    lab = np.array([[0], [0], [0]], np.int64)

    def build():
        x = _data("p", (3, 2))
        y = _data("lab", (3, 1), "int64")
        correct, total = L.create_tensor("int64"), L.create_tensor("int64")
        return [L.accuracy(x, y, correct=correct, total=total), correct, total]
    acc, correct, total = _forward(build, {"p": p, "lab": lab})
    np.testing.assert_allclose(acc, [2 / 3], rtol=1e-6)
    assert correct.tolist() == [2] and total.tolist() == [3]


def test_variable_is_not_iterable():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        with pytest.raises(TypeError, match="not iterable"):
            list(_data("x", (2, 2)))


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("op", ["elementwise_max", "elementwise_min"])
def test_elementwise_max_min_gradients(op):
    def build():
        x = _param([3, 4], "x")
        y = _param([4], "y")
        return _weighted(getattr(L, op)(x, y), (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


def test_elementwise_pow_gradients():
    def build():
        x = L.scale(_param([3, 4], "x", 0.5), bias=1.5)   # a positive base
        y = _param([4], "y")
        return _weighted(L.elementwise_pow(x, y), (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


@pytest.mark.parametrize("name,args", [
    ("clip", (-0.5, 0.6)), ("relu6", (0.8,)), ("softsign", ()), ("softplus", ()),
    ("leaky_relu", (0.1,)), ("elu", (0.7,)), ("abs", ()), ("cos", ()), ("sin", ()),
    ("logsigmoid", ())])
def test_activation_gradients(name, args):
    def build():
        x = _param([4, 5], "x", scale=1.0)
        return _weighted(getattr(L, name)(x, *args), (4, 5))
    # jitter: no parameter sits exactly on a kink (0, a bound).
    _check(build, {"loss_w": _w((4, 5))}, jitter=1e-3)


@pytest.mark.parametrize("name", ["sqrt", "rsqrt", "reciprocal"])
def test_positive_domain_gradients(name):
    def build():
        x = L.scale(_param([3, 4], "x", 0.5), bias=2.0)
        return _weighted(getattr(L, name)(x), (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


def test_pow_gradients():
    def build():
        x = L.scale(_param([3, 4], "x", 0.5), bias=2.0)
        return _weighted(L.pow(x, 2.5), (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


@pytest.mark.parametrize("rows_y", [4, 1])
def test_cos_sim_gradients(rows_y):
    def build():
        x = _param([4, 5], "x")
        y = _param([rows_y, 5], "y")
        return _weighted(L.cos_sim(x, y), (4, 1))
    _check(build, {"loss_w": _w((4, 1))})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_l2_normalize_gradients(axis):
    def build():
        x = _param([3, 4], "x")
        return _weighted(L.l2_normalize(x, axis=axis), (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


def test_topk_gradients():
    def build():
        x = _param([3, 6], "x")
        v, _ = L.topk(x, 3)
        return _weighted(v, (3, 3))
    _check(build, {"loss_w": _w((3, 3))})


def test_mse_loss_gradients():
    def build():
        x = _param([3, 4], "x")
        y = _param([3, 4], "y")
        return L.mse_loss(x, y)
    _check(build, {})


@pytest.mark.parametrize("op", ["reduce_max", "reduce_min", "reduce_prod"])
def test_reduce_max_min_prod_gradients(op):
    def build():
        x = _param([3, 4], "x")
        return _weighted(getattr(L, op)(x, dim=1, keep_dim=True), (3, 1))
    _check(build, {"loss_w": _w((3, 1))})


def test_shape_op_gradients():
    def build():
        x = _param([2, 1, 3], "x")
        y = _param([2, 1, 3], "y")
        sq = L.squeeze(x, axes=[1])                        # [2, 3]
        un = L.unsqueeze(sq, axes=[2])                      # [2, 3, 1]
        fl = L.flatten(L.stack([x, y], axis=0), axis=2)    # [2*2, 3]
        ex = L.expand(un, [1, 1, 2])                        # [2, 3, 2]
        parts = L.unstack(y, axis=2)                        # 3 x [2, 1]
        return (_weighted(fl, (4, 3)) + L.mean(L.elementwise_mul(ex, ex))
                + L.mean(L.elementwise_mul(parts[1], parts[2])) + L.mean(x[1]))
    _check(build, {"loss_w": _w((4, 3))})


def test_assign_and_shuffle_batch_gradients():
    def build():
        x = _param([5, 3], "x")
        shuffled = fluid.contrib.layers.shuffle_batch(L.assign(x), seed=4)
        return _weighted(shuffled, (5, 3))
    _check(build, {"loss_w": _w((5, 3))}, train_forward=True)


def test_shuffle_batch_permutes_rows():
    x = _x((6, 2))

    def build():
        return [fluid.contrib.layers.shuffle_batch(_data("x", (6, 2)), seed=1)]
    got = _forward(build, {"x": x})[0]
    perm = np.random.default_rng(1).permutation(6)
    np.testing.assert_array_equal(got, x[perm])


# --------------------------------------------------------------------------- learning rates

def _lr_run(make, steps, ratio_of):
    """Train ``w`` (one weight, gradient 1 each step) with SGD(schedule): the
    weight's moves are the schedule's rates."""
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        w = L.create_parameter([1], "float32", name="w",
                               default_initializer=fluid.initializer.Constant(0.0))
        x = L.data("x", [1], dtype="float32")
        loss = L.mean(L.elementwise_mul(x, w))
        lr = make()
        SGD(learning_rate=lr).minimize(loss)
    exe = fluid.Executor()
    exe.run(startup)
    rates, prev = [], 0.0
    for _ in range(steps):
        got = exe.run(main, feed={"x": np.ones((2, 1), np.float32)}, fetch_list=[lr])[0]
        cur = float(np.array(fluid.global_scope().find_var("w").get_tensor()).reshape(-1)[0])
        rates.append((prev - cur, float(got[0])))
        prev = cur
    for i, (moved, fetched) in enumerate(rates):
        assert moved == pytest.approx(ratio_of(i), rel=1e-5), i
        assert fetched == pytest.approx(ratio_of(i), rel=1e-6), i


def test_exponential_decay_staircase_drives_sgd():
    _lr_run(lambda: L.exponential_decay(0.5, decay_steps=2, decay_rate=0.5, staircase=True),
            5, lambda i: 0.5 * 0.5 ** (i // 2))


@pytest.mark.parametrize("make,ref", [
    (lambda: L.exponential_decay(0.2, 3, 0.9), lambda i: 0.2 * 0.9 ** (i / 3)),
    (lambda: L.natural_exp_decay(0.2, 3, 0.5), lambda i: 0.2 * np.exp(-0.5 * i / 3)),
    (lambda: L.inverse_time_decay(0.2, 2, 0.5, staircase=True),
     lambda i: 0.2 / (1 + 0.5 * (i // 2))),
    (lambda: L.polynomial_decay(0.2, 3, 0.01, power=2.0),
     lambda i: (0.2 - 0.01) * (1 - min(i, 3) / 3) ** 2 + 0.01),
    (lambda: L.piecewise_decay([2, 3], [0.3, 0.2, 0.1]),
     lambda i: 0.3 if i < 2 else 0.2 if i < 3 else 0.1),
    (lambda: L.cosine_decay(0.2, 2, 3),
     lambda i: 0.2 * 0.5 * (np.cos((i // 2) * np.pi / 3) + 1)),
    (lambda: L.noam_decay(4, 2, 0.5),
     lambda i: 0.5 * 4 ** -0.5 * min((i + 1) ** -0.5, 2 ** -1.5 * (i + 1))),
])
def test_learning_rate_schedules_follow_fluids_formulas(make, ref):
    _lr_run(make, 5, ref)


def test_learning_rate_schedule_refused_with_other_rules():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        w = L.create_parameter([1], "float32", name="w")
        loss = L.mean(w)
        lr = L.exponential_decay(0.1, 10, 0.9)
        with pytest.raises(ValueError, match="learning-rate schedule with Adam"):
            fluid.optimizer.Adam(learning_rate=lr).minimize(loss)


# --------------------------------------------------------------------------- conv2d

def _conv_ref(x, w, stride, pad, dil):
    """Direct loops: out[n, f, i, j] = sum over c, a, b of padded x times w."""
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho = (h + 2 * pad[0] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    wo = (wd + 2 * pad[1] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    out = np.zeros((n, f, ho, wo))
    for i in range(ho):
        for j in range(wo):
            for a in range(kh):
                for b in range(kw):
                    patch = xp[:, :, i * stride[0] + a * dil[0], j * stride[1] + b * dil[1]]
                    out[:, :, i, j] += patch @ w[:, :, a, b].T
    return out


@pytest.mark.parametrize("size,stride,pad,dil", [
    ((1, 1), 1, 0, 1), ((3, 3), 1, 1, 1), ((3, 2), (2, 1), (1, 0), 1), ((2, 2), 1, 1, 2)])
def test_conv2d_forward_matches_direct_loops(size, stride, pad, dil):
    x = _x((2, 3, 6, 5))

    def build():
        d = _data("x", (2, 3, 6, 5))
        return [L.conv2d(d, 4, size, stride=stride, padding=pad, dilation=dil,
                         param_attr=fluid.ParamAttr(name="cw"), bias_attr=False)]
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out = build()
    exe = fluid.Executor()
    exe.run(startup)
    got = exe.run(main, feed={"x": x}, fetch_list=out)[0]
    w = np.array(fluid.global_scope().find_var("cw").get_tensor())
    def pair(v):
        return ((v, v) if isinstance(v, int) else v)
    np.testing.assert_allclose(got, _conv_ref(x, w, pair(stride), pair(pad), pair(dil)),
                               rtol=1e-10)
    assert got.shape == tuple(out[0].shape)      # the static shape the layer declared


@pytest.mark.parametrize("stride,pad,dil", [(1, 0, 1), (2, 1, 1), (1, 1, 2)])
def test_conv2d_gradients(stride, pad, dil):
    x = _x((2, 2, 5, 5))

    def build():
        d = _data("x", (2, 2, 5, 5))
        xs = L.elementwise_mul(d, _param([2, 5, 5], "xs"), axis=1)  # a gradient to x too
        y = L.conv2d(xs, 3, 3, stride=stride, padding=pad, dilation=dil, act="tanh")
        return _weighted(y, tuple(y.shape))
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss = build()
        shape = next(v for v in main.global_block().vars.values() if v.name == "loss_w").shape
        SGD(0.1).minimize(loss)
    assert check_gradients(main, startup, loss, {"x": x, "loss_w": _w(shape)}) > 0


def test_conv2d_refuses_what_it_does_not_do():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        d = _data("x", (2, 4, 5, 5))
        with pytest.raises(ValueError, match="groups=2"):
            L.conv2d(d, 4, 3, groups=2)
        with pytest.raises(ValueError, match="NHWC"):
            L.conv2d(d, 4, 3, data_format="NHWC")


# --------------------------------------------------------------------------- dynamic_gru

def _gru_ref(x, lens, w, b, h0, reverse, origin):
    d = w.shape[0]
    def sig(z):
        return (1 / (1 + np.exp(-z)))
    out = np.zeros((x.shape[0], d))
    start = 0
    for n, ln in enumerate(lens):
        h = h0[n].copy()
        order = range(start + ln - 1, start - 1, -1) if reverse else range(start, start + ln)
        for row in order:
            xt = x[row] + b[0]
            u = sig(xt[:d] + h @ w[:, :d])
            r = sig(xt[d:2 * d] + h @ w[:, d:2 * d])
            c = np.tanh(xt[2 * d:] + (r * h) @ w[:, 2 * d:])
            h = u * h + (1 - u) * c if origin else (1 - u) * h + u * c
            out[row] = h
        start += ln
    return out


@pytest.mark.parametrize("reverse,origin,with_h0", [(False, False, False), (True, False, True),
                                                    (False, True, True)])
def test_dynamic_gru_matches_numpy_and_its_gradients(reverse, origin, with_h0):
    d, lens = 3, [2, 4, 1, 3]
    seqs = [[int(i) for i in np.random.default_rng(n).integers(0, 9, ln)]
            for n, ln in enumerate(lens)]
    h0 = _x((4, d), seed=9) * 0.5

    def build():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        emb = L.embedding(ids, [9, 5], param_attr="gru_emb", dtype=F64)
        proj = L.fc(emb, 3 * d, param_attr="gru_proj")
        init = _data("h0", (4, d)) if with_h0 else None
        hid = L.dynamic_gru(proj, d, param_attr="gru_w", bias_attr="gru_b",
                            is_reverse=reverse, origin_mode=origin, h_0=init)
        return hid, proj
    feed = {"ids": seqs, "h0": h0} if with_h0 else {"ids": seqs}
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        hid, proj = build()
    exe = fluid.Executor()
    exe.run(startup)
    got, x = exe.run(main, feed=feed, fetch_list=[hid, proj])
    scope = fluid.global_scope()
    w = np.array(scope.find_var("gru_w").get_tensor())
    b = np.array(scope.find_var("gru_b").get_tensor())
    want = _gru_ref(np.asarray(x), lens, w, b, h0 if with_h0 else np.zeros((4, d)), reverse,
                    origin)
    # The local backend keeps parameters in float32: agreement to float32 precision.
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)

    def loss():
        hid, _ = build()
        pooled = L.sequence_pool(hid, "sum")
        return _weighted(pooled, (4, d))
    _check(loss, {**feed, "loss_w": _w((4, d))}, jitter=0.1)


# --------------------------------------------------------------------------- more activations

def _sigm(z):
    return 1 / (1 + np.exp(-z))


_SELU = (1.0507009873554804934193349852946, 1.6732632423543772848170429916717)
_MORE = [
    ("hard_sigmoid", (), lambda x: np.clip(0.2 * x + 0.5, 0, 1)),
    ("swish", (1.5,), lambda x: x * _sigm(1.5 * x)),
    ("selu", (), lambda x: _SELU[0] * np.where(x > 0, x, _SELU[1] * (np.exp(x) - 1))),
    ("brelu", (-0.5, 0.7), lambda x: np.clip(x, -0.5, 0.7)),
    ("soft_relu", (1.5,), lambda x: np.log(1 + np.exp(np.clip(x, -1.5, 1.5)))),
    ("stanh", (), lambda x: 1.7159 * np.tanh(0.67 * x)),
    ("tanh_shrink", (), lambda x: x - np.tanh(x)),
    ("thresholded_relu", (0.3,), lambda x: np.where(x > 0.3, x, 0)),
    ("hard_shrink", (0.4,), lambda x: np.where(np.abs(x) > 0.4, x, 0)),
    ("softshrink", (0.3,), lambda x: np.sign(x) * np.maximum(np.abs(x) - 0.3, 0)),
    ("hard_swish", (), lambda x: x * np.minimum(np.maximum(x + 3, 0), 6) / 6),
    ("log1p", (), lambda x: np.log(1 + np.abs(x))),
    ("acos", (), lambda x: np.arccos(np.tanh(x))),
    ("asin", (), lambda x: np.arcsin(np.tanh(x))),
    ("atan", (), lambda x: np.arctan(x)),
    ("erf", (), None),
    ("gelu", (), None),
]


def _erf_ref(x):
    import math
    return np.array([math.erf(v) for v in x.reshape(-1)]).reshape(x.shape)


def _domain(name, d):
    """Inputs inside the function's domain: log1p of |x|, acos/asin of tanh(x)."""
    if name == "log1p":
        return L.abs(d)
    if name in ("acos", "asin"):
        return L.scale(L.tanh(d), scale=0.9)
    return d


@pytest.mark.parametrize("name,args,ref", _MORE, ids=[m[0] for m in _MORE])
def test_more_activations_forward(name, args, ref):
    x = _x((6, 5), scale=2.0)
    got = _forward(lambda: [getattr(L, name)(_domain(name, _data("x", (6, 5))), *args)],
                   {"x": x})[0]
    if name == "erf":
        want = _erf_ref(x)
    elif name == "gelu":
        want = 0.5 * x * (1 + _erf_ref(x / np.sqrt(2)))
    elif name in ("acos", "asin"):
        want = getattr(np, "arc" + name[1:])(0.9 * np.tanh(x))
    else:
        want = ref(x)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,args,ref", _MORE, ids=[m[0] for m in _MORE])
def test_more_activation_gradients(name, args, ref):
    def build():
        x = _param([4, 5], "x", scale=1.5)
        return _weighted(getattr(L, name)(_domain(name, x), *args), (4, 5))
    _check(build, {"loss_w": _w((4, 5))}, jitter=1e-3)


# --------------------------------------------------------------------------- indexing, losses

def test_index_and_reduction_layers_forward():
    x = _x((4, 6))
    idx = np.array([2, 0, 2], np.int64)

    def build():
        a = _data("x", (4, 6))
        i = _data("i", (3,), "int64")
        parts = L.split(a, [2, -1, 1], dim=1)
        v, order = L.argsort(a, axis=1, descending=True)
        return [parts[0], parts[1], parts[2], *L.split(a, 2, dim=0), L.gather(a, i),
                L.argmax(a, axis=1), L.argmin(a, axis=0), v, order,
                L.cumsum(a, axis=1), L.cumsum(a, axis=0, exclusive=True, reverse=True),
                L.flip(a, [0, 1]), L.expand_as(L.slice(a, [0], [0], [2]), a),
                L.logsumexp(a, dim=1), L.reduce_all(L.greater_than(L.abs(a), L.scale(
                    L.abs(a), bias=-10.0)), dim=0), L.reduce_any(L.less_than(a, L.scale(
                        a, 0.0, -1.0))), L.isfinite(a), L.has_inf(L.log(L.abs(a))),
                L.has_nan(a), L.size(a), L.rank(a), L.t(a), L.log_softmax(a),
                L.mul(L.reshape(a, [4, 2, 3]), _data("w", (3, 2)), x_num_col_dims=2)]
    w = _x((3, 2), seed=4)
    got = _forward(build, {"x": x, "i": idx, "w": w})
    order = np.argsort(-x, axis=1, kind="stable")
    lsm = x - x.max(1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
    want = [x[:, :2], x[:, 2:5], x[:, 5:], x[:2], x[2:], x[idx], x.argmax(1), x.argmin(0),
            np.take_along_axis(x, order, 1), order, np.cumsum(x, 1),
            np.flip(np.cumsum(np.flip(x, 0), 0), 0) - x, x[::-1, ::-1], np.tile(x[:2], (2, 1)),
            np.log(np.exp(x).sum(1)), np.ones(6, bool), [np.any(x < -1.0)], [True], [False],
            [False], [24], [2], x.T, lsm, (x.reshape(4, 2, 3) @ w)]
    for k, (g, wnt) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, wnt, rtol=1e-10, err_msg=str(k))


def test_index_and_loss_gradients():
    idx = np.array([3, 0, 3, 1], np.int64)

    def build():
        a = _param([4, 6], "a")
        i = _data("i", (4,), "int64")
        p1, p2 = L.split(a, [2, 4], dim=1)
        v, _ = L.argsort(p2, axis=1)
        terms = [_weighted(L.gather(a, i), (4, 6)), L.mean(L.elementwise_mul(p1, p1)),
                 L.mean(L.elementwise_mul(v, L.cumsum(v, axis=1, exclusive=True))),
                 L.mean(L.flip(L.cumsum(a, axis=0, reverse=True), [1])),
                 L.mean(L.logsumexp(a, dim=[1])),
                 L.mean(L.elementwise_mul(L.expand_as(L.slice(a, [0], [0], [1]), a), a)),
                 L.mean(L.elementwise_mul(L.log_softmax(a), a))]
        return L.sums(terms)
    _check(build, {"i": idx, "loss_w": _w((4, 6))}, jitter=1e-3)


@pytest.mark.parametrize("soft", [False, True])
def test_softmax_with_cross_entropy_value_and_gradients(soft):
    z = _x((5, 4))
    lab = (np.abs(_x((5, 4), seed=8)) / np.abs(_x((5, 4), seed=8)).sum(1, keepdims=True)
           if soft else np.array([[0], [3], [-100], [1], [2]], np.int64))

    def build():
        logits = _data("z", (5, 4))
        label = _data("lab", (5, 4)) if soft else _data("lab", (5, 1), "int64")
        return [L.softmax_with_cross_entropy(logits, label, soft_label=soft)]
    got = _forward(build, {"z": z, "lab": lab})[0]
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    if soft:
        want = -(lab * logp).sum(1, keepdims=True)
    else:
        want = np.array([[-logp[i, max(int(c), 0)] if c != -100 else 0.0]
                         for i, c in enumerate(lab[:, 0])])
    np.testing.assert_allclose(got, want, rtol=1e-10)

    def loss():
        w = _param([4, 4], "w")
        logits = L.matmul(_data("z", (5, 4)), w)
        label = _data("lab", (5, 4)) if soft else _data("lab", (5, 1), "int64")
        return L.mean(L.softmax_with_cross_entropy(logits, label, soft_label=soft))
    _check(loss, {"z": z, "lab": lab})


def test_rank_losses_and_label_smooth():
    lab = np.array([[1.0], [0.0], [1.0]])
    left, right = _x((3, 1)), _x((3, 1), seed=5)

    def build():
        y, a, b = _data("y", (3, 1)), _data("l", (3, 1)), _data("r", (3, 1))
        oh = _data("oh", (3, 4))
        return [L.rank_loss(y, a, b), L.margin_rank_loss(y * 2.0 - 1.0, a, b, margin=0.2),
                L.label_smooth(oh, epsilon=0.2)]
    oh = np.eye(4)[[0, 2, 3]]
    got = _forward(build, {"y": lab, "l": left, "r": right, "oh": oh})
    o = left - right
    np.testing.assert_allclose(got[0], np.log1p(np.exp(o)) - lab * o, rtol=1e-10)
    np.testing.assert_allclose(got[1], np.maximum(0, -(2 * lab - 1) * o + 0.2), rtol=1e-10)
    np.testing.assert_allclose(got[2], 0.8 * oh + 0.05, rtol=1e-10)


# --------------------------------------------------------------------------- norms, losses, constants

def test_layer_norm_prelu_mish_huber_bpr_forward():
    x = _x((3, 2, 4))
    lab = np.array([[1], [3], [0]], np.int64)

    def build():
        a = _data("x", (3, 2, 4))
        f = L.reshape(a, [3, 8])
        return [L.layer_norm(a, begin_norm_axis=1), L.prelu(a, "all"), L.mish(a),
                L.huber_loss(f, L.scale(f, 0.3, 0.5), 0.4),
                L.bpr_loss(L.slice(f, [1], [0], [4]), _data("lab", (3, 1), "int64"))]
    got = _forward(build, {"x": x, "lab": lab})
    x2 = x.reshape(3, 8)
    ln = (x2 - x2.mean(1, keepdims=True)) / np.sqrt(x2.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got[0], ln.reshape(x.shape), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.where(x > 0, x, 0.25 * x))
    np.testing.assert_allclose(got[2], x * np.tanh(np.log1p(np.exp(x))), rtol=1e-10)
    r = (0.3 * x2 + 0.5) - x2
    np.testing.assert_allclose(got[3], np.where(np.abs(r) <= 0.4, 0.5 * r * r,
                                                0.4 * (np.abs(r) - 0.2)), rtol=1e-10)
    s = x2[:, :4]
    want = [np.mean([-np.log(1 / (1 + np.exp(-(s[i, c] - s[i, j])))) for j in range(4)
                     if j != c]) for i, c in enumerate(lab[:, 0])]
    np.testing.assert_allclose(got[4][:, 0], want, rtol=1e-10)


@pytest.mark.parametrize("mode", ["all", "channel", "element"])
def test_layer_norm_and_prelu_gradients(mode):
    def build():
        a = _param([3, 2, 4], "a")
        y = L.prelu(L.layer_norm(a, begin_norm_axis=1), mode)
        return _weighted(L.mish(y), (3, 2, 4))
    _check(build, {"loss_w": _w((3, 2, 4))}, jitter=0.1)


def test_huber_bpr_index_select_gradients():
    def build():
        a = _param([3, 5], "a")
        b = _param([3, 5], "b")
        i = _data("i", (4,), "int64")
        return (L.mean(L.huber_loss(a, b, 0.3))
                + L.mean(L.bpr_loss(a, _data("lab", (3, 1), "int64")))
                + _weighted(L.index_select(a, i, dim=1), (3, 4)))
    _check(build, {"lab": np.array([[4], [0], [2]], np.int64),
                   "i": np.array([1, 1, 4, 0], np.int64), "loss_w": _w((3, 4))}, jitter=0.1)


def test_constants_random_and_matrix_helpers():
    x = _x((2, 3, 3))

    def build():
        a = _data("x", (2, 3, 3))
        return [L.where(L.greater_than(a, L.scale(a, 0.0, 0.5))), L.dot(a, a), L.bmm(a, a),
                L.full([2, 2], 3.5), L.full_like(a, 2.0), L.eye(3, 2), L.arange(1, 7, 2),
                L.tril(a), L.triu(a, 1),
                L.uniform_random([400], min=2.0, max=3.0, seed=5),
                L.gaussian_random_batch_size_like(a, [-1, 300], mean=1.0, std=0.5, seed=3),
                L.uniform_random([4])]
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = build()
    exe = fluid.Executor()
    exe.run(startup)
    got = exe.run(main, feed={"x": x}, fetch_list=outs)
    again = exe.run(main, feed={"x": x}, fetch_list=outs)
    np.testing.assert_array_equal(got[0], np.argwhere(x > 0.5))
    np.testing.assert_allclose(got[1], (x * x).sum(-1, keepdims=True))
    np.testing.assert_allclose(got[2], x @ x)
    np.testing.assert_array_equal(got[3], np.full((2, 2), 3.5))
    np.testing.assert_array_equal(got[4], np.full(x.shape, 2.0))
    np.testing.assert_array_equal(got[5], np.eye(3, 2))
    np.testing.assert_array_equal(got[6], [1, 3, 5])
    np.testing.assert_array_equal(got[7], np.tril(x))
    np.testing.assert_array_equal(got[8], np.triu(x, 1))
    u, g = np.asarray(got[9]), np.asarray(got[10])
    assert u.min() >= 2.0 and u.max() < 3.0 and abs(u.mean() - 2.5) < 0.05
    assert g.shape == (2, 300) and abs(g.mean() - 1.0) < 0.1 and abs(g.std() - 0.5) < 0.1
    np.testing.assert_array_equal(again[9], u)              # a fixed seed: same every run
    assert not np.array_equal(again[11], got[11])          # seed 0: new values every run


def test_integer_ops_roll_unique_linspace_forward():
    ids = np.array([[1], [6], [12], [19]], np.int64)
    x = _x((3, 4))
    u = np.array([2, 3, 3, 1, 5, 3], np.int64)

    def build():
        i = _data("ids", (4, 1), "int64")
        a = _data("x", (3, 4))
        v = _data("u", (6,), "int64")
        out, index, count = L.unique_with_counts(v)
        return [L.shard_index(i, 20, 2, 0), L.shard_index(i, 20, 2, 1),
                L.elementwise_mod(i, L.fill_constant([1], "int64", 5)),
                L.elementwise_floordiv(i, L.fill_constant([1], "int64", 5)),
                L.elementwise_equal(i, L.fill_constant([1], "int64", 6)),
                L.nonzero(L.greater_than(a, L.scale(a, 0.0, 0.3))), L.roll(a, [1, -1], [0, 1]),
                L.roll(a, 2), out, index, count, L.linspace(0, 1, 5, "float32"),
                L.addmm(L.scale(L.matmul(a, L.t(a)), bias=1.0), a, L.t(a), alpha=0.5, beta=2.0)]
    got = _forward(build, {"ids": ids, "x": x, "u": u})
    np.testing.assert_array_equal(got[0], [[1], [6], [-1], [-1]])     # Fluid's doc example
    np.testing.assert_array_equal(got[1], [[-1], [-1], [2], [9]])
    np.testing.assert_array_equal(got[2], ids % 5)
    np.testing.assert_array_equal(got[3], ids // 5)
    np.testing.assert_array_equal(got[4], ids == 6)
    np.testing.assert_array_equal(got[5], np.argwhere(x > 0.3))
    np.testing.assert_array_equal(got[6], np.roll(x, (1, -1), (0, 1)))
    np.testing.assert_array_equal(got[7], np.roll(x.reshape(-1), 2).reshape(3, 4))
    np.testing.assert_array_equal(got[8], [2, 3, 1, 5])                # first-occurrence order
    np.testing.assert_array_equal(got[9], [0, 1, 1, 2, 3, 1])
    np.testing.assert_array_equal(got[10], [1, 3, 1, 1])
    np.testing.assert_allclose(got[11], np.linspace(0, 1, 5))
    np.testing.assert_allclose(got[12], 2.0 * (x @ x.T + 1) + 0.5 * (x @ x.T), rtol=1e-10)


def test_smooth_l1_roll_addcmul_values_and_gradients():
    x, y = _x((3, 4)), _x((3, 4), seed=6)
    iw, ow = np.abs(_x((3, 4), seed=7)), np.abs(_x((3, 4), seed=8))

    def build():
        return [L.smooth_l1(_data("x", (3, 4)), _data("y", (3, 4)), _data("iw", (3, 4)),
                            _data("ow", (3, 4)), sigma=1.5)]
    got = _forward(build, {"x": x, "y": y, "iw": iw, "ow": ow})[0]
    d = (x - y) * iw
    e = np.where(np.abs(d) < 1 / 2.25, 0.5 * 2.25 * d * d, np.abs(d) - 0.5 / 2.25) * ow
    np.testing.assert_allclose(got, e.sum(1, keepdims=True), rtol=1e-10)

    def loss():
        a, b = _param([3, 4], "a"), _param([3, 4], "b")
        return (L.mean(L.smooth_l1(a, b, sigma=2.0)) + _weighted(L.roll(a, [1], [1]), (3, 4))
                + L.mean(L.addcmul(a, b, a, value=0.7)))
    _check(loss, {"loss_w": _w((3, 4))}, jitter=0.1)

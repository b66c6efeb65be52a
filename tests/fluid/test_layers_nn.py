"""dropout, batch_norm, data_norm, continuous_value_model, one_hot, transpose:
forward against numpy, backward against central finite differences, and the
statistics kept outside the gradient (moving mean/variance, data_norm sums)."""

import numpy as np
import pytest
from support.fluid import RecordingBackend, check_gradients

from pyfleet import fluid
from pyfleet.fluid.backend import LocalBackend
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _programs():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = 7
    return main, startup


def _build(build, minimize=True):
    main, startup = _programs()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        out = build()
        if minimize:
            SGD(0.1).minimize(out[0] if isinstance(out, tuple) else out)
    return main, startup, out


def _check(build, feed, **kw):
    main, startup, loss = _build(build)
    assert check_gradients(main, startup, loss, feed, **kw) > 0
    return main


def _weighted(y, shape):
    w = L.data("loss_w", list(shape), dtype=F64, append_batch_size=False)
    return L.mean(L.elementwise_mul(y, w))


def _w(shape, seed=3):
    return np.random.default_rng(seed).normal(size=shape)


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


# --------------------------------------------------------------------------- dropout

@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
def test_dropout_train_and_test_forward(impl):
    x = _x((40, 5))
    p = 0.3

    def build():
        d = L.data("x", [5], dtype=F64)
        return L.dropout(d, p, seed=11, dropout_implementation=impl)
    main, startup, out = _build(build, minimize=False)
    exe = fluid.Executor()
    exe.run(startup)
    a = exe.run(main, feed={"x": x}, fetch_list=[out])[0]
    b = exe.run(main, feed={"x": x}, fetch_list=[out])[0]
    keep = np.random.default_rng(11).random(x.shape) >= p
    scale = 1.0 / (1.0 - p) if impl == "upscale_in_train" else 1.0
    np.testing.assert_allclose(a, x * keep * scale)
    np.testing.assert_array_equal(a, b)           # a fixed seed: one mask, as Fluid
    assert 0.15 < 1.0 - keep.mean() < 0.45
    t = exe.run(main.clone(for_test=True), feed={"x": x}, fetch_list=[out])[0]
    np.testing.assert_allclose(t, x if impl == "upscale_in_train" else x * (1 - p))


def test_dropout_is_test_attr_and_unseeded_masks():
    x = _x((30, 4))

    def build():
        d = L.data("x", [4], dtype=F64)
        return L.dropout(d, 0.5), L.dropout(d, 0.5, is_test=True)
    main, startup, (free, fixed) = _build(build, minimize=False)
    exe = fluid.Executor()
    exe.run(startup)
    a, t = exe.run(main, feed={"x": x}, fetch_list=[free, fixed])
    b = exe.run(main, feed={"x": x}, fetch_list=[free])[0]
    np.testing.assert_allclose(t, x * 0.5)
    assert not np.array_equal(a, b)             # no seed: a new mask per run
    # ... yet reproducible: a new program with the same random_seed draws the same.
    main2, startup2, (free2, _) = _build(build, minimize=False)
    exe.run(startup2)
    np.testing.assert_array_equal(exe.run(main2, feed={"x": x}, fetch_list=[free2])[0], a)


@pytest.mark.parametrize("impl", ["downgrade_in_infer", "upscale_in_train"])
def test_dropout_gradients(impl):
    x = _x((6, 4))

    def build():
        d = L.data("x", [4], dtype=F64)
        h = L.fc(d, 5, act="tanh")
        return _weighted(L.dropout(h, 0.4, seed=5, dropout_implementation=impl), (6, 5))
    _check(build, {"x": x, "loss_w": _w((6, 5))}, train_forward=True)


def test_dropout_refuses_bad_options():
    main, startup = _programs()
    with fluid.program_guard(main, startup):
        d = L.data("x", [4], dtype=F64)
        with pytest.raises(ValueError, match="dropout_prob"):
            L.dropout(d, 1.5)
        with pytest.raises(ValueError, match="dropout_implementation"):
            L.dropout(d, 0.5, dropout_implementation="scale")


def test_dropout_inference_model_runs_in_test_mode(tmp_path):
    x = _x((8, 3))

    def build():
        d = L.data("x", [3], dtype="float32")
        return L.mean(L.dropout(L.fc(d, 2), 0.25, seed=1))
    main, startup, loss = _build(build)
    exe = fluid.Executor()
    exe.run(startup)
    want = exe.run(main.clone(for_test=True), feed={"x": x}, fetch_list=[loss])[0]
    fluid.io.save_inference_model(str(tmp_path), ["x"], [loss], exe, main)
    prog, _feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe)
    got = exe.run(prog, feed={"x": x.astype(np.float32)}, fetch_list=fetches)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --------------------------------------------------------------------------- batch_norm

def _bn_ref(x, axis, scale, bias, mean, var, eps=1e-5):
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
            * scale.reshape(shape) + bias.reshape(shape))


@pytest.mark.parametrize("shape,layout,axis", [((16, 3), "NCHW", 1), ((4, 3, 2, 2), "NCHW", 1),
                                               ((4, 2, 2, 3), "NHWC", 3)])
def test_batch_norm_training_statistics_and_moving_update(shape, layout, axis):
    x = _x(shape) * 2 + 1
    red = tuple(i for i in range(len(shape)) if i != axis)

    def build():
        d = L.data("x", list(shape), dtype=F64, append_batch_size=False)
        y = L.batch_norm(d, data_layout=layout, momentum=0.8)
        return L.mean(y), y
    main, startup, (_loss, y) = _build(build)
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    assert sorted(be.dense) == ["batch_norm_0.b_0", "batch_norm_0.w_0", "batch_norm_0.w_1",
                                "batch_norm_0.w_2"]
    c = shape[axis]
    out = exe.run(main, feed={"x": x}, fetch_list=[y])[0]
    mean, var = x.mean(axis=red), x.var(axis=red)
    np.testing.assert_allclose(out, _bn_ref(x, axis, np.ones(c), np.zeros(c), mean, var))
    np.testing.assert_allclose(be.dense["batch_norm_0.w_1"], 0.2 * mean)
    np.testing.assert_allclose(be.dense["batch_norm_0.w_2"], 0.8 + 0.2 * var)
    x2 = _x(shape, seed=1)
    exe.run(main, feed={"x": x2}, fetch_list=[y])
    mm = 0.8 * 0.2 * mean + 0.2 * x2.mean(axis=red)
    mv = 0.8 * (0.8 + 0.2 * var) + 0.2 * x2.var(axis=red)
    np.testing.assert_allclose(be.dense["batch_norm_0.w_1"], mm)
    np.testing.assert_allclose(be.dense["batch_norm_0.w_2"], mv)
    # Test mode: the moving statistics normalize, and stay.
    t = exe.run(main.clone(for_test=True), feed={"x": x}, fetch_list=[y])[0]
    np.testing.assert_allclose(t, _bn_ref(x, axis, np.ones(c), np.zeros(c), mm, mv))
    np.testing.assert_allclose(be.dense["batch_norm_0.w_1"], mm)


@pytest.mark.parametrize("shape,layout", [((7, 3), "NCHW"), ((3, 2, 2, 2), "NCHW"),
                                          ((3, 2, 2, 2), "NHWC")])
def test_batch_norm_training_gradients(shape, layout):
    x = _x(shape)

    def build():
        d = L.data("x", list(shape), dtype=F64, append_batch_size=False)
        p = L.create_parameter(list(shape), F64, name="xp",
                               default_initializer=fluid.initializer.Constant(0.0))
        y = L.batch_norm(L.elementwise_add(d, p), data_layout=layout, act="tanh")
        return _weighted(y, shape)
    _check(build, {"x": x, "loss_w": _w(shape)}, train_forward=True, jitter=0.3)


@pytest.mark.parametrize("mode", ["is_test", "use_global_stats"])
def test_batch_norm_global_statistics_gradients(mode):
    x = _x((5, 3))

    def build():
        d = L.data("x", [3], dtype=F64)
        h = L.fc(d, 4)
        y = L.batch_norm(h, **{mode: True})
        return _weighted(y, (5, 4))
    _check(build, {"x": x, "loss_w": _w((5, 4))}, train_forward=True, jitter=0.3)


def test_batch_norm_names_and_refusals():
    main, startup = _programs()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", [3], dtype=F64)
        L.batch_norm(d, moving_mean_name="mm", moving_variance_name="mv", name="bn")
        names = sorted(p.name for p in main.all_parameters())
        assert names == ["bn.b_0", "bn.w_0", "mm", "mv"]
        assert [p.trainable for p in main.all_parameters() if p.name in ("mm", "mv")] == \
            [False, False]
        with pytest.raises(ValueError, match="fuse_with_relu"):
            L.batch_norm(d, fuse_with_relu=True)
        with pytest.raises(ValueError, match="data_layout"):
            L.batch_norm(d, data_layout="NDHWC")


class _ElsewhereBackend(LocalBackend):
    """A backend keeping parameters elsewhere: it does not declare
    keeps_op_statistics itself (as Fleet's RemoteBackend does not)."""


@pytest.mark.parametrize("layer", ["batch_norm", "data_norm"])
def test_statistics_refused_by_name_where_they_cannot_be_kept(layer):
    def build():
        d = L.data("x", [3], dtype="float32")
        return L.mean(getattr(L, layer)(d))
    main, startup, _loss = _build(build)
    main.set_backend(_ElsewhereBackend())
    with pytest.raises(ValueError, match=f"{layer}.*statistic.*_ElsewhereBackend"):
        fluid.Executor().run(startup)


# --------------------------------------------------------------------------- data_norm

def _dn_init():
    return {"batch_size": 20.0, "batch_sum": 6.0, "batch_square": 45.0}


def test_data_norm_forward_and_summary_update():
    x = _x((10, 3)) + 0.5
    eps = 1e-4

    def build():
        d = L.data("x", [3], dtype=F64)
        h = L.fc(d, 3, bias_attr=False)
        y = L.data_norm(h, param_attr=_dn_init(), epsilon=eps, name="dn",
                        summary_decay_rate=0.9)
        return L.mean(y), y, h
    main, startup, (loss, y, h) = _build(build)
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    assert {"dn.batch_size", "dn.batch_sum", "dn.batch_square_sum"} <= set(be.dense)
    test = main.clone(for_test=True)
    out, hv = exe.run(test, feed={"x": x}, fetch_list=[y, h])
    mean = 6.0 / 20.0
    np.testing.assert_allclose(out, (hv - mean) * np.sqrt(20.0 / 45.0))
    np.testing.assert_allclose(be.dense["dn.batch_size"], 20.0)   # test runs add nothing
    exe.run(main, feed={"x": x}, fetch_list=[loss])
    np.testing.assert_allclose(be.dense["dn.batch_size"], 20.0 * 0.9 + 10)
    np.testing.assert_allclose(be.dense["dn.batch_sum"], 6.0 * 0.9 + hv.sum(axis=0))
    np.testing.assert_allclose(be.dense["dn.batch_square_sum"],
                               45.0 * 0.9 + ((hv - mean) ** 2).sum(axis=0) + 10 * eps)


def test_data_norm_gradients_reach_the_layers_below():
    x = _x((6, 4))

    def build():
        d = L.data("x", [4], dtype=F64)
        h = L.fc(d, 3, act="tanh")
        return _weighted(L.fc(L.data_norm(h, param_attr=_dn_init()), 2), (6, 2))
    _check(build, {"x": x, "loss_w": _w((6, 2))}, jitter=0.1)


def test_data_norm_refuses_what_fluid_does_not_use():
    main, startup = _programs()
    with fluid.program_guard(main, startup):
        d = L.data("x", [3], dtype=F64)
        with pytest.raises(ValueError, match="param_attr"):
            L.data_norm(d, param_attr=fluid.ParamAttr(name="w"))
        with pytest.raises(ValueError, match="param_attr keys"):
            L.data_norm(d, param_attr={"batch_mean": 1.0})
        with pytest.raises(ValueError, match="2-D"):
            L.data_norm(L.data("img", [2, 3], dtype=F64))
        with pytest.raises(ValueError, match="epsilon"):
            L.data_norm(d, epsilon=0.1)


# --------------------------------------------------------------------------- cvm

def _cvm_ref(x, use_cvm):
    if not use_cvm:
        return x[:, 2:]
    y = x.copy()
    y[:, 0] = np.log(x[:, 0] + 1)
    y[:, 1] = np.log(x[:, 1] + 1) - y[:, 0]
    return y


@pytest.mark.parametrize("use_cvm", [True, False])
def test_cvm_forward_and_fluid_gradient(use_cvm):
    rng = np.random.default_rng(4)
    n, d = 5, 6
    show = rng.integers(1, 9, size=(n, 1)).astype(np.float64)
    click = np.minimum(show, rng.integers(0, 3, size=(n, 1)))
    cvm = np.hstack([show, click])
    width = d if use_cvm else d - 2

    def build():
        xp = L.create_parameter([n, d], F64, name="xp",
                                default_initializer=fluid.initializer.Uniform(0.1, 2.0))
        c = L.data("cvm", [2], dtype=F64)
        y = L.continuous_value_model(xp, c, use_cvm)
        return _weighted(y, (n, width)), y
    main, startup, (loss, y) = _build(build)
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    w = _w((n, width))
    feed = {"cvm": cvm, "loss_w": w}
    out = exe.run(main, feed=feed, fetch_list=[y])[0]
    xv = be.dense["xp"]
    np.testing.assert_allclose(out, _cvm_ref(xv, use_cvm))
    g = be.pushed_dense["xp"]
    # Fluid's cvm_grad: the show/click columns receive the show/click values.
    np.testing.assert_array_equal(g[:, :2], cvm)
    # The embedding columns: central differences of the loss.
    test = main.clone(for_test=True)
    eps = 1e-6
    for i, j in [(0, 2), (3, d - 1), (n - 1, 3)]:
        old = xv[i, j]
        xv[i, j] = old + eps
        up = float(exe.run(test, feed=feed, fetch_list=[loss])[0])
        xv[i, j] = old - eps
        down = float(exe.run(test, feed=feed, fetch_list=[loss])[0])
        xv[i, j] = old
        assert np.isclose(g[i, j], (up - down) / (2 * eps), rtol=1e-5, atol=1e-9)


def test_cvm_on_lod_embedding_rows_take_their_sequence_show_click():
    ids = [[1, 2], [3], [0, 4, 2]]
    cvm = np.array([[3.0, 1.0], [1.0, 0.0], [5.0, 2.0]])

    def build():
        s = L.data("ids", [1], dtype="int64", lod_level=1)
        c = L.data("cvm", [2], dtype=F64)
        e = L.embedding(s, [8, 4], dtype=F64, param_attr="emb")
        y = L.continuous_value_model(e, c, use_cvm=False)
        return L.reduce_sum(L.sequence_pool(y, "sum")), y, e
    main, startup, (_loss, y, e) = _build(build)
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    out, ev = exe.run(main, feed={"ids": ids, "cvm": cvm}, fetch_list=[y, e])
    np.testing.assert_allclose(out, ev[:, 2:])
    g = be.pushed_dense["emb"]
    # id 2 appears in sequences 0 and 2: its show/click gradient sums theirs.
    np.testing.assert_allclose(g[2, :2], cvm[0] + cvm[2])
    np.testing.assert_allclose(g[3, :2], cvm[1])
    np.testing.assert_allclose(g[2, 2:], 2.0)   # d(sum)/d(row) once per occurrence


# --------------------------------------------------------------------------- one_hot / transpose

def test_one_hot_forms_and_range():
    ids = np.array([[2], [0], [3]], dtype=np.int64)
    main, startup = _programs()
    with fluid.program_guard(main, startup):
        d = L.data("ids", [1], dtype="int64")
        oh = L.one_hot(d, 4)
        oh2 = fluid.one_hot(L.data("ids2", [2], dtype="int64"), 5)
        lenient = L.one_hot(d, 3, allow_out_of_range=True)
        with pytest.raises(ValueError, match="dimension of 1"):
            L.one_hot(L.data("bad", [2], dtype="int64"), 4)
        with pytest.raises(ValueError, match="integer"):
            L.one_hot(L.data("f", [1]), 4)
    assert oh.shape == (-1, 4) and oh2.shape == (-1, 2, 5)
    exe = fluid.Executor()
    exe.run(startup)
    ids2 = np.array([[1, 4], [0, 0]], dtype=np.int64)
    a, b, c = exe.run(main, feed={"ids": ids, "ids2": ids2}, fetch_list=[oh, oh2, lenient])
    np.testing.assert_array_equal(a, np.eye(4, dtype=np.float32)[ids[:, 0]])
    np.testing.assert_array_equal(b, np.eye(5, dtype=np.float32)[ids2])
    np.testing.assert_array_equal(c, [[0, 0, 1], [1, 0, 0], [0, 0, 0]])


def test_one_hot_out_of_range_is_an_error():
    main, startup = _programs()
    with fluid.program_guard(main, startup):
        d = L.data("ids", [1], dtype="int64")
        oh = L.one_hot(d, 3)
    exe = fluid.Executor()
    exe.run(startup)
    with pytest.raises(ValueError, match="id 3 of ids is outside \\[0, 3\\)"):
        exe.run(main, feed={"ids": np.array([[3]], dtype=np.int64)}, fetch_list=[oh])


def test_one_hot_label_trains_a_softmax_with_soft_labels():
    x = _x((6, 3))
    label = np.array([[0], [2], [1], [1], [0], [2]], dtype=np.int64)

    def build():
        d = L.data("x", [3], dtype=F64)
        lab = L.cast(L.one_hot(L.data("label", [1], dtype="int64"), 3), F64)
        return L.mean(L.cross_entropy(L.fc(d, 3, act="softmax"), lab, soft_label=True))
    _check(build, {"x": x, "label": label})


def test_transpose_forward_and_gradients():
    x = _x((2, 3, 4))

    def build():
        d = L.data("x", [2, 3, 4], dtype=F64, append_batch_size=False)
        p = L.create_parameter([2, 3, 4], F64, name="tp",
                               default_initializer=fluid.initializer.Uniform(-1, 1))
        y = L.transpose(L.elementwise_mul(d, p), [2, 0, 1])
        assert y.shape == (4, 2, 3)
        return _weighted(L.tanh(y), (4, 2, 3)), y
    main, startup, (loss, y) = _build(build)
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    out = exe.run(main, feed={"x": x, "loss_w": _w((4, 2, 3))}, fetch_list=[y])[0]
    np.testing.assert_allclose(out, np.transpose(x * be.dense["tp"], (2, 0, 1)))
    assert check_gradients(main, startup, loss, {"x": x, "loss_w": _w((4, 2, 3))}) > 0
    with fluid.program_guard(main, startup), pytest.raises(ValueError, match="permutation"):
        L.transpose(main.global_block().var("x"), [0, 0, 1])

"""Regularization and gradient clipping (fluid.regularizer, fluid.clip) and
the Fluid optimizer keywords, against a numpy reference of Fluid's rules:
clip first (by value / norm / global norm), then add the decay term; a
ParamAttr rule wins over the optimizer's; row-sparse gradients (sparse
tables, dense embeddings with is_sparse=True) are regularized on the rows
they touch only. Momentum and RMSProp are core rules: dense parameters and
sparse tables alike."""

import numpy as np
import pytest
from support.fluid import RecordingBackend

from pyfleet import fluid
from pyfleet.fluid import clip as fclip
from pyfleet.fluid import regularizer as freg
from pyfleet.fluid.backend import LocalBackend

L = fluid.layers


def _net(reg=None, clip=None, w_attr=None, emb_attr=None, demb_attr=None, set_clip=None,
         opt=None):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [3], dtype="float64")
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        dids = L.data("dids", [1], dtype="int64", lod_level=1)
        label = L.data("label", [1], dtype="int64")
        emb = L.sequence_pool(L.embedding(
            ids, [1000, 2], is_distributed=True, dtype="float64",
            param_attr=emb_attr or fluid.ParamAttr(name="emb")), "sum")
        demb = L.sequence_pool(L.embedding(
            dids, [20, 2], is_sparse=True, dtype="float64",
            param_attr=demb_attr or fluid.ParamAttr(name="demb")), "sum")
        h = L.concat([x, emb, demb], axis=1)
        prob = L.fc(h, 2, act="softmax", param_attr=w_attr or fluid.ParamAttr(name="fc_w"),
                    bias_attr=fluid.ParamAttr(name="fc_b"))
        avg = L.mean(L.cross_entropy(prob, label))
        if set_clip is not None:
            fluid.clip.set_gradient_clip(set_clip[0], param_list=set_clip[1])
        (opt or fluid.optimizer.SGD(0.5, regularization=reg, grad_clip=clip)).minimize(avg)
    return main, startup, avg


def _feed(seed=0, b=8):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(b, 3)) * 5,
            "ids": (rng.integers(0, 6, b).astype(np.int64), np.arange(b + 1)),
            "dids": (rng.integers(0, 5, b).astype(np.int64), np.arange(b + 1)),
            "label": rng.integers(0, 2, (b, 1)).astype(np.int64)}


def _pushed(main, startup, avg, feed):
    be = RecordingBackend()
    main.set_backend(be)
    exe = fluid.Executor()
    exe.run(startup)
    be.dense["fc_b"] += 0.3   # a nonzero bias, so its decay shows
    exe.run(main, feed=feed, fetch_list=[avg])
    return be


def _raw():
    """Gradients and values with no rule: the reference's input."""
    main, startup, avg = _net()
    return _pushed(main, startup, avg, _feed())


def _sparse_rows(be, name="emb"):
    keys, g = be.pushed_sparse[name]
    w = np.stack([be.sparse[name][int(k)] for k in keys])
    return keys, g, w


def test_l1_l2_decay_param_attr_wins_and_sparse_rows_only():
    raw = _raw()
    main, startup, avg = _net(
        reg=fluid.regularizer.L2Decay(0.01),
        w_attr=fluid.ParamAttr(name="fc_w", regularizer=fluid.regularizer.L1Decay(0.1)),
        demb_attr=fluid.ParamAttr(name="demb",
                                  regularizer=fluid.regularizer.L2DecayRegularizer(0.2)))
    be = _pushed(main, startup, avg, _feed())
    # fc_w: its own L1 rule, not the optimizer's L2
    np.testing.assert_allclose(be.pushed_dense["fc_w"], raw.pushed_dense["fc_w"] +
                               0.1 * np.sign(raw.dense["fc_w"]), rtol=1e-12)
    np.testing.assert_allclose(be.pushed_dense["fc_b"], raw.pushed_dense["fc_b"] +
                               0.01 * raw.dense["fc_b"], rtol=1e-12)
    # the dense embedding looked up with is_sparse=True: touched rows only
    touched = np.unique(_feed()["dids"][0])
    want = raw.pushed_dense["demb"].copy()
    want[touched] += 0.2 * raw.dense["demb"][touched]
    np.testing.assert_allclose(be.pushed_dense["demb"], want, rtol=1e-12)
    untouched = np.setdiff1d(np.arange(20), touched)
    assert np.all(be.pushed_dense["demb"][untouched] == 0)
    # the sparse table: the pushed rows, with their pulled values
    keys, g, w = _sparse_rows(be)
    rkeys, rg, _ = _sparse_rows(raw)
    np.testing.assert_array_equal(keys, rkeys)
    np.testing.assert_allclose(g, rg + 0.01 * w, rtol=1e-12)


def _clip_by_norm(g, c):
    n = np.sqrt(np.sum(g * g))
    return g * (c / n) if n > c else g


def test_clip_by_value_norm_and_global_norm_then_regularize():
    raw = _raw()
    clip_v = fluid.clip.GradientClipByValue(0.02)
    main, startup, avg = _net(
        reg=fluid.regularizer.L2Decay(0.05),
        w_attr=fluid.ParamAttr(name="fc_w", gradient_clip=clip_v),
        set_clip=(fluid.clip.GradientClipByGlobalNorm(0.01), ["emb", "fc_b"]))
    be = _pushed(main, startup, avg, _feed())
    # fc_w: clipped by value, then L2
    want_w = np.clip(raw.pushed_dense["fc_w"], -0.02, 0.02) + 0.05 * raw.dense["fc_w"]
    assert np.abs(raw.pushed_dense["fc_w"]).max() > 0.02   # the clip really bites
    np.testing.assert_allclose(be.pushed_dense["fc_w"], want_w, rtol=1e-12)
    # emb rows and fc_b share one global norm
    _rkeys, rg, w = _sparse_rows(raw)
    gb = raw.pushed_dense["fc_b"]
    norm = np.sqrt(np.sum(rg * rg) + np.sum(gb * gb))
    assert norm > 0.01
    scale = 0.01 / norm
    _keys, g, _ = _sparse_rows(be)
    np.testing.assert_allclose(g, rg * scale + 0.05 * w, rtol=1e-12)
    np.testing.assert_allclose(be.pushed_dense["fc_b"], gb * scale + 0.05 * raw.dense["fc_b"],
                               rtol=1e-12)
    # demb: no clip of its own, only the decay on its touched rows
    touched = np.unique(_feed()["dids"][0])
    want = raw.pushed_dense["demb"].copy()
    want[touched] += 0.05 * raw.dense["demb"][touched]
    np.testing.assert_allclose(be.pushed_dense["demb"], want, rtol=1e-12)


def test_optimizer_grad_clip_wins_and_need_clip_limits_it():
    raw = _raw()
    rule = fluid.clip.GradientClipByNorm(0.003, need_clip=lambda p: p.name != "fc_b")
    main, startup, avg = _net(
        clip=rule, w_attr=fluid.ParamAttr(name="fc_w",
                                          gradient_clip=fluid.clip.GradientClipByValue(1e-9)))
    be = _pushed(main, startup, avg, _feed())
    np.testing.assert_allclose(be.pushed_dense["fc_w"],
                               _clip_by_norm(raw.pushed_dense["fc_w"], 0.003), rtol=1e-12)
    np.testing.assert_allclose(be.pushed_dense["fc_b"], raw.pushed_dense["fc_b"], rtol=1e-12)
    _, g, _ = _sparse_rows(be)
    _, rg, _ = _sparse_rows(raw)
    np.testing.assert_allclose(g, _clip_by_norm(rg, 0.003), rtol=1e-12)


def test_global_norm_group_needs_one_clip_norm():
    main, startup, avg = _net(
        w_attr=fluid.ParamAttr(name="fc_w",
                               gradient_clip=fluid.clip.GradientClipByGlobalNorm(1.0)),
        set_clip=(fluid.clip.GradientClipByGlobalNorm(2.0), ["fc_b"]))
    with pytest.raises(ValueError, match="same clip_norm"):
        _pushed(main, startup, avg, _feed())


def test_local_sgd_update_equals_reference_with_regularization():
    main, startup, avg = _net(reg=fluid.regularizer.L2Decay(0.1))
    raw = _raw()
    main.set_backend(LocalBackend())
    exe = fluid.Executor()
    exe.run(startup)
    be = main.backend
    before = be.pull_dense("fc_b").astype(np.float64)
    be.set_dense("fc_b", before + 0.3)
    exe.run(main, feed=_feed(), fetch_list=[avg])
    want = (before + 0.3) - 0.5 * (raw.pushed_dense["fc_b"] + 0.1 * (before + 0.3))
    np.testing.assert_allclose(be.pull_dense("fc_b"), want, rtol=1e-5, atol=1e-6)


def _np_momentum(w, v, g, lr, mu, nesterov):
    v = mu * v + g
    return (w - lr * (g + mu * v) if nesterov else w - lr * v), v


def _np_rmsprop(w, st, g, lr, rho, eps, mom, centered):
    ms, mg, m = st
    ms = rho * ms + (1 - rho) * g * g
    if centered:
        mg = rho * mg + (1 - rho) * g
        m = mom * m + lr * g / np.sqrt(ms - mg * mg + eps)
    else:
        m = mom * m + lr * g / np.sqrt(ms + eps)
    return w - m, (ms, mg, m)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_dense_numpy_rule(nesterov):
    opt = fluid.optimizer.Momentum(0.1, 0.9, use_nesterov=nesterov)
    w0 = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    be = LocalBackend()
    be.create_dense("w", w0, opt)
    w, v = w0.astype(np.float64), np.zeros((2, 3))
    rng = np.random.default_rng(3)
    for _ in range(4):
        g = rng.normal(size=(2, 3)).astype(np.float32)
        be.push_dense("w", g)
        w, v = _np_momentum(w, v, g.astype(np.float64), 0.1, 0.9, nesterov)
    np.testing.assert_allclose(be.pull_dense("w"), w, rtol=1e-5)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_dense_numpy_rule(centered):
    opt = fluid.optimizer.RMSPropOptimizer(0.01, rho=0.9, epsilon=1e-6, momentum=0.5,
                                           centered=centered)
    w0 = np.ones(5, dtype=np.float32)
    be = LocalBackend()
    be.create_dense("w", w0, opt)
    w, st = w0.astype(np.float64), (np.zeros(5), np.zeros(5), np.zeros(5))
    rng = np.random.default_rng(4)
    for _ in range(4):
        g = rng.normal(size=5).astype(np.float32)
        be.push_dense("w", g)
        w, st = _np_rmsprop(w, st, g.astype(np.float64), 0.01, 0.9, 1e-6, 0.5, centered)
    np.testing.assert_allclose(be.pull_dense("w"), w, rtol=1e-5)


@pytest.mark.parametrize("rule", [fluid.optimizer.Momentum(0.1, 0.9),
                                  fluid.optimizer.RMSProp(0.05, momentum=0.5, centered=True)],
                         ids=repr)
def test_momentum_and_rmsprop_train_a_network_with_sparse_tables(rule):
    main, startup, avg = _net(opt=rule)
    main.set_backend(LocalBackend())
    exe = fluid.Executor()
    exe.run(startup)
    feed = {"x": np.eye(3)[[0, 1, 2, 0]] * 3,
            "ids": fluid.create_lod_tensor(np.array([[1], [2], [3], [1]]), [[1, 1, 1, 1]],
                                           fluid.CPUPlace()),
            "dids": fluid.create_lod_tensor(np.array([[4], [5], [6], [4]]), [[1, 1, 1, 1]],
                                            fluid.CPUPlace()),
            "label": np.array([[0], [1], [1], [0]])}
    losses = [float(exe.run(main, feed=feed, fetch_list=[avg])[0]) for _ in range(30)]
    assert losses[-1] < 0.5 * losses[0]
    emb = main.backend.sparse["emb"]
    assert emb.optimizer == rule
    state = emb.export(np.array([1, 2, 3, 999], np.uint64), with_state=True)["state"]
    assert state.shape == (3, rule.state_dim(2)) and np.all(np.abs(state).sum(axis=1) > 0)


def test_fluid_optimizer_keywords_and_bad_rules_refused():
    adam = fluid.optimizer.Adam(0.01, regularization=fluid.regularizer.L2Decay(1e-4),
                                name="adam", lazy_mode=True)
    assert adam.name == "adam" and adam.lazy_mode and adam.to_config()["type"] == "Adam"
    assert "regularization" not in adam.to_config()
    main, _, _ = _net(opt=adam)   # the lazy rows of the dense 'demb' (tests/fluid/test_lazy_adam.py)
    blk = main.global_block()
    assert blk.var("demb").optimizer.lazy_row_width == 2
    assert blk.var("fc_w").optimizer.to_config() == adam.to_config()   # a dense gradient
    with pytest.raises(ValueError, match="ParamAttr regularizer"):
        fluid.ParamAttr(regularizer=0.1)
    with pytest.raises(ValueError, match="ParamAttr gradient_clip"):
        fluid.ParamAttr(gradient_clip="norm")
    with pytest.raises(ValueError, match="do_model_average"):
        fluid.ParamAttr(do_model_average="yes")
    with pytest.raises(ValueError, match="optimizer's regularization"):
        _net(opt=fluid.optimizer.SGD(0.1, regularization="l2"))
    with pytest.raises(ValueError, match="min 1.0 is above max"):
        fluid.clip.GradientClipByValue(0.5, 1.0)
    assert fclip.GradientClipByValue(2.0).min == -2.0
    assert str(freg.L1Decay(0.5)) == "L1Decay, regularization_coeff=0.500000"

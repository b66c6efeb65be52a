"""Every fluid layer: forward against a numpy reference, backward against
central finite differences (float64 networks, RecordingBackend)."""

import numpy as np
import pytest
from support.fluid import RecordingBackend, check_gradients

from pyfleet import fluid
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _program():
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = 7
    return main, startup


def _check(build, feed, **kw):
    """Build ``loss = build()`` in fresh programs, minimize, check gradients."""
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        loss = build()
        SGD(0.1).minimize(loss)
    n = check_gradients(main, startup, loss, feed, **kw)
    assert n > 0
    return main, startup, loss


def _weighted_loss(y, shape):
    """mean(y * W) for a fixed random W fed as data: every output entry matters."""
    w = L.data("loss_w", list(shape), dtype=F64, append_batch_size=False)
    return L.mean(L.elementwise_mul(y, w))


def _param(shape, name, scale=1.0):
    return L.create_parameter(shape, F64, name=name,
                              default_initializer=fluid.initializer.Uniform(-scale, scale))


def _w(shape, seed=3):
    return np.random.default_rng(seed).normal(size=shape)


def _run_forward(main, startup, feed, fetch):
    main._backend = RecordingBackend()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    return exe.run(main.clone(for_test=True), feed=feed, fetch_list=fetch), main._backend


@pytest.mark.parametrize("act", [None, "relu", "sigmoid", "tanh", "softmax"])
def test_fc_gradients(act):
    x = np.random.default_rng(0).normal(size=(5, 4))

    def build():
        d = L.data("x", [4], dtype=F64)
        y = L.fc(d, 3, act=act)
        return _weighted_loss(y, (5, 3))
    _check(build, {"x": x, "loss_w": _w((5, 3))})


def test_fc_list_input_sums_one_weight_per_input():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))

    def build():
        da, db = L.data("a", [3], dtype=F64), L.data("b", [2], dtype=F64)
        return _weighted_loss(L.fc([da, db], 2, act="tanh"), (4, 2))
    main, _startup, loss = _check(build, {"a": a, "b": b, "loss_w": _w((4, 2))})
    names = sorted(p.name for p in main.all_parameters())
    assert names == ["fc_0.b_0", "fc_0.w_0", "fc_0.w_1"]
    # forward equals the numpy formula
    be = main._backend
    w0, w1, bias = be.dense["fc_0.w_0"], be.dense["fc_0.w_1"], be.dense["fc_0.b_0"]
    out = fluid.Executor().run(main.clone(for_test=True), feed={"a": a, "b": b,
                               "loss_w": _w((4, 2))}, fetch_list=[loss])[0]
    ref = np.mean(np.tanh(a @ w0 + b @ w1 + bias) * _w((4, 2)))
    np.testing.assert_allclose(out[0], ref, rtol=1e-12)


def test_fc_num_flatten_dims_2_gradients():
    def build():
        x = _param([3, 2, 4], "x")
        y = L.fc(x, 5, num_flatten_dims=2, act="tanh")     # [3, 2, 5], bias on the last axis
        assert y.shape == (3, 2, 5)
        return _weighted_loss(L.reshape(y, [0, 10]), (3, 10))
    _check(build, {"loss_w": _w((3, 10))})


def test_fc_forward_matches_numpy_and_default_init():
    x = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32)
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        d = L.data("x", [5])
        y = L.fc(d, 4, act="relu")
    (out,), be = _run_forward(main, startup, {"x": x}, [y])
    w, b = be.dense["fc_0.w_0"], be.dense["fc_0.b_0"]
    np.testing.assert_array_equal(b, 0.0)                       # Constant(0) bias
    limit = np.sqrt(6.0 / (5 + 4))                              # Xavier weight
    assert np.all(np.abs(w) <= limit) and w.std() > 0
    np.testing.assert_allclose(out, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)


def _lod_feed(seqs):
    values = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs]) if seqs else \
        np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])])
    return values, offsets


@pytest.mark.parametrize("pool", ["sum", "average", "sqrt", "max", "first", "last"])
def test_sequence_pool_over_embedding_gradients(pool):
    seqs = [[3, 5, 3], [7], [], [1, 2, 9, 9, 4], [11]]

    def build():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        emb = L.embedding(ids, [20, 4], param_attr=fluid.ParamAttr(
            name="emb", initializer=fluid.initializer.Uniform(-1, 1)), dtype=F64)
        return _weighted_loss(L.sequence_pool(emb, pool), (5, 4))
    _check(build, {"ids": _lod_feed(seqs), "loss_w": _w((5, 4))}, max_elements=40)


@pytest.mark.parametrize("pool", ["sum", "average", "sqrt", "max", "first", "last"])
def test_sequence_pool_forward_matches_numpy(pool):
    seqs = [[3, 5, 3], [7], [], [1, 2, 9, 9, 4]]
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        emb = L.embedding(ids, [20, 3], param_attr="emb", dtype=F64)
        out = L.sequence_pool(emb, pool)
    (got,), be = _run_forward(main, startup, {"ids": _lod_feed(seqs)}, [out])
    table = be.dense["emb"]
    ref = []
    for s in seqs:
        rows = table[s] if s else np.zeros((0, 3))
        if not s:
            ref.append(np.zeros(3))
        elif pool == "sum":
            ref.append(rows.sum(0))
        elif pool == "average":
            ref.append(rows.mean(0))
        elif pool == "sqrt":
            ref.append(rows.sum(0) / np.sqrt(len(s)))
        elif pool == "max":
            ref.append(rows.max(0))
        elif pool == "first":
            ref.append(rows[0])
        else:
            ref.append(rows[-1])
    np.testing.assert_allclose(got, np.array(ref), rtol=1e-12)


def test_sparse_table_shared_by_slots_one_pull_one_push_unique_ids():
    s1 = [[10**12, 5], [5], [2**63 + 7]]
    s2 = [[5, 5, 5], [], [10**12]]

    def build():
        a = L.data("a", [1], dtype="int64", lod_level=1)
        b = L.data("b", [1], dtype="int64", lod_level=1)
        attr = fluid.ParamAttr(name="SparseFeatFactors",
                               initializer=fluid.initializer.Uniform(-1, 1))
        ea = L.sequence_pool(L.embedding(a, [10, 3], is_distributed=True, param_attr=attr,
                                         dtype=F64), "sum")
        eb = L.sequence_pool(L.embedding(b, [10, 3], is_distributed=True, param_attr=attr,
                                         dtype=F64), "average")
        return _weighted_loss(L.concat([ea, eb], axis=1), (3, 6))
    a_vals, a_off = _lod_feed([[int(np.uint64(x).astype(np.int64)) if x >= 2**63 else x
                                for x in s] for s in s1])
    feed = {"a": (a_vals, a_off), "b": _lod_feed(s2), "loss_w": _w((3, 6))}
    main, _startup, _loss = _check(build, feed)
    be = main._backend
    params = main.all_parameters()
    assert [p.name for p in params if p.is_sparse_table] == ["SparseFeatFactors"]
    pulls = [c for c in be.calls if c[0] == "pull_sparse"]
    pushes = [c for c in be.calls if c[0] == "push_sparse"]
    assert pulls[0] == ("pull_sparse", "SparseFeatFactors", 3)   # unique ids of both slots
    assert pushes == [("push_sparse", "SparseFeatFactors", 3)]
    keys, _grads = be.pushed_sparse["SparseFeatFactors"]
    # each id once, in the order of its first occurrence over the slots
    np.testing.assert_array_equal(keys, np.array([10**12, 5, 2**63 + 7], np.uint64))


def test_embedding_dense_vocab_range_checked_and_padding_idx():
    def build():
        ids = L.data("ids", [1], dtype="int64")
        emb = L.embedding(ids, [6, 2], padding_idx=-1, dtype=F64,
                          param_attr=fluid.ParamAttr(
                              name="e", initializer=fluid.initializer.Uniform(-1, 1)))
        return _weighted_loss(emb, (4, 2))
    feed = {"ids": np.array([[1], [5], [1], [0]]), "loss_w": _w((4, 2))}
    main, _startup, loss = _check(build, feed)
    g = main._backend.pushed_dense["e"]
    np.testing.assert_array_equal(g[5], 0.0)        # padding row gets no gradient
    out = fluid.Executor().run(main.clone(for_test=True), feed=feed, fetch_list=[
        main.global_block().ops[0].output("Out")[0]])[0]
    np.testing.assert_array_equal(out[1], 0.0)      # and looks up zeros
    with pytest.raises(ValueError, match="out of range"):
        fluid.Executor().run(main, feed={"ids": np.array([[1], [6], [0], [0]]),
                                         "loss_w": _w((4, 2))},
                             fetch_list=[loss])


def test_huge_vocab_becomes_sparse_table_unbounded_ids():
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        emb = L.embedding(ids, [fluid.framework.SPARSE_TABLE_MIN_VOCAB, 4], is_sparse=True)
        out = L.sequence_pool(emb, "sum")
    (got,), _be = _run_forward(main, startup, {"ids": _lod_feed([[10**15], [3]])}, [out])
    p = main.all_parameters()[0]
    assert p.is_sparse_table and p.dim == 4
    assert got.shape == (2, 4) and np.all(np.abs(got) <= 0.01) and np.any(got != 0)


@pytest.mark.parametrize("op", ["elementwise_add", "elementwise_sub", "elementwise_mul",
                                "elementwise_div"])
def test_elementwise_broadcast_gradients(op):
    def build():
        x = _param([3, 4], "x")
        y = _param([4], "y", scale=0.5)
        y = L.scale(y, scale=1.0, bias=2.0)    # keep divisors away from zero
        z = _param([3], "z")
        out = getattr(L, op)(x, y)                     # trailing broadcast
        out = getattr(L, op)(out, L.scale(z, bias=3.0), axis=0)   # Fluid axis broadcast
        return _weighted_loss(out, (3, 4))
    _check(build, {"loss_w": _w((3, 4))})


@pytest.mark.parametrize("name", ["sigmoid", "relu", "tanh", "softmax", "square", "exp"])
def test_activation_gradients(name):
    def build():
        x = _param([4, 5], "x", scale=2.0)
        return _weighted_loss(getattr(L, name)(x), (4, 5))
    _check(build, {"loss_w": _w((4, 5))})


def test_log_scale_sums_reshape_slice_matmul_gradients():
    def build():
        a = _param([3, 4], "a")
        b = _param([4, 2], "b")
        c = _param([3, 2], "c")
        m = L.matmul(a, b)
        mt = L.matmul(b, a, transpose_x=True, transpose_y=True, alpha=0.5)   # [2, 3]
        s = L.sums([m, c, L.reshape(mt, [3, 2])])
        pos = L.log(L.scale(L.square(s), bias=1.0))
        sl = L.slice(pos, axes=[1], starts=[1], ends=[2])
        red = L.reduce_mean(L.reduce_sum(L.reshape(a, [3, 2, 2]), dim=[1, 2], keep_dim=True))
        return L.elementwise_add(L.mean(sl), L.mean(L.elementwise_mul(pos, L.data(
            "loss_w", [3, 2], dtype=F64, append_batch_size=False)))) + red * 0.3
    _check(build, {"loss_w": _w((3, 2))})


def test_reduce_sum_mean_dims_forward():
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    main, startup = _program()
    with fluid.program_guard(main, startup):
        d = L.data("x", [2, 3, 4], dtype=F64, append_batch_size=False)
        outs = [L.reduce_sum(d), L.reduce_sum(d, dim=1), L.reduce_sum(d, dim=[0, 2], keep_dim=True),
                L.reduce_mean(d, dim=-1), L.mean(d)]
    got, _ = _run_forward(main, startup, {"x": x}, outs)
    np.testing.assert_allclose(got[0], [x.sum()])
    np.testing.assert_allclose(got[1], x.sum(1))
    np.testing.assert_allclose(got[2], x.sum((0, 2), keepdims=True))
    np.testing.assert_allclose(got[3], x.mean(-1))
    np.testing.assert_allclose(got[4], [x.mean()])
    assert [o.shape for o in outs] == [(1,), (2, 4), (1, 3, 1), (2, 3), (1,)]


def test_sigmoid_cross_entropy_gradients_and_value():
    x = np.random.default_rng(4).normal(size=(6, 1)) * 5
    y = np.array([[1], [0], [1], [1], [0], [0]], dtype=np.float64)

    def build():
        d = L.data("x", [1], dtype=F64)
        lab = L.data("y", [1], dtype=F64)
        logit = L.fc(d, 1)
        return L.mean(L.sigmoid_cross_entropy_with_logits(logit, lab))
    main, _startup, loss = _check(build, {"x": x, "y": y})
    be = main._backend
    z = x @ be.dense["fc_0.w_0"] + be.dense["fc_0.b_0"]
    ref = np.mean(np.log1p(np.exp(-z)) * y + np.log1p(np.exp(z)) * (1 - y))
    got = fluid.Executor().run(main.clone(for_test=True), feed={"x": x, "y": y},
                               fetch_list=[loss])[0]
    np.testing.assert_allclose(got[0], ref, rtol=1e-10)


def test_sigmoid_cross_entropy_is_stable_for_large_logits():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [1])
        y = L.data("y", [1])
        loss = L.sigmoid_cross_entropy_with_logits(x, y)
    got, _ = _run_forward(main, startup, {"x": np.array([[1000.], [-1000.]], np.float32),
                                          "y": np.array([[0.], [0.]], np.float32)}, [loss])
    np.testing.assert_allclose(got[0].ravel(), [1000.0, 0.0])


def test_cross_entropy_softmax_gradients_int64_label():
    x = np.random.default_rng(5).normal(size=(5, 3))
    lab = np.array([[0], [2], [1], [1], [0]], dtype=np.int64)

    def build():
        d = L.data("x", [3], dtype=F64)
        label = L.data("label", [1], dtype="int64")
        prob = L.fc(d, 4, act="softmax")
        return L.mean(L.cross_entropy(prob, label))
    main, _startup, loss = _check(build, {"x": x, "label": lab})
    be = main._backend
    z = x @ be.dense["fc_0.w_0"] + be.dense["fc_0.b_0"]
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    ref = -np.mean(np.log(p[np.arange(5), lab.ravel()]))
    got = fluid.Executor().run(main.clone(for_test=True), feed={"x": x, "label": lab},
                               fetch_list=[loss])[0]
    np.testing.assert_allclose(got[0], ref, rtol=1e-10)


def test_log_loss_and_square_error_cost_gradients():
    x = np.random.default_rng(6).normal(size=(4, 2))
    y = np.array([[1.], [0.], [0.], [1.]])

    def build():
        d = L.data("x", [2], dtype=F64)
        lab = L.data("y", [1], dtype=F64)
        p = L.fc(d, 1, act="sigmoid")
        return L.mean(L.log_loss(p, lab)) + L.mean(L.square_error_cost(p, lab))
    _check(build, {"x": x, "y": y})


def test_cast_passes_gradient():
    x = np.random.default_rng(8).normal(size=(3, 2))

    def build():
        d = L.data("x", [2], dtype=F64)
        h = L.cast(L.fc(d, 2), "float32")
        return L.cast(L.mean(L.square(h)), F64)
    _check(build, {"x": x}, eps=1e-3, rtol=2e-3, atol=1e-5)


def test_variable_arithmetic_operators():
    def build():
        a = _param([2, 3], "a")
        b = _param([2, 3], "b")
        out = (a + b) * 2.0 - b / 4.0 + 1.0 - (-a) * b + 3.0 / (a * a + 1.0) - (2.0 - b)
        return _weighted_loss(out, (2, 3))
    _check(build, {"loss_w": _w((2, 3))})


def test_concat_rejects_mismatched_rows_with_clear_error():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        a = L.data("a", [2])
        b = L.data("b", [3])
        c = L.concat([a, b], axis=1)
    with pytest.raises(ValueError, match="concat"):
        _run_forward(main, startup, {"a": np.zeros((2, 2)), "b": np.zeros((3, 3))}, [c])


def test_missing_feed_is_named():
    main, startup = _program()
    with fluid.program_guard(main, startup):
        a = L.data("a", [2])
        y = L.fc(a, 1)
    with pytest.raises(ValueError, match="'a'"):
        _run_forward(main, startup, {}, [y])


def test_sparse_padding_and_off_path_lookups_push_no_rows():
    """Ids whose lookups get no gradient (padding, or an embedding feeding only
    a fetched non-loss output) are not pushed: momentum must not move them."""
    def build():
        a = L.data("a", [1], dtype="int64", lod_level=1)
        b = L.data("b", [1], dtype="int64", lod_level=1)
        attr = fluid.ParamAttr(name="t", initializer=fluid.initializer.Uniform(-1, 1))
        ea = L.sequence_pool(L.embedding(a, [10, 2], is_distributed=True, padding_idx=0,
                                         param_attr=attr, dtype=F64), "sum")
        off_path.append(L.sequence_pool(L.embedding(b, [10, 2], is_distributed=True,
                                                    param_attr=attr, dtype=F64), "sum"))
        return _weighted_loss(ea, (2, 2))
    off_path = []
    feed = {"a": _lod_feed([[0, 3], [4, 0]]), "b": _lod_feed([[7], [3]]),
            "loss_w": _w((2, 2))}
    main, _startup, loss = _check(build, feed)
    fluid.Executor().run(main, feed=feed, fetch_list=[loss, off_path[0]])
    assert ("pull_sparse", "t", 4) in main._backend.calls      # ids 0, 3, 4, 7 pulled once
    keys, grads = main._backend.pushed_sparse["t"]
    np.testing.assert_array_equal(keys, np.array([3, 4], np.uint64))
    assert np.all(grads != 0)


def test_fluid_embedding_v2_keeps_field_axis_deepfm_style_gradients():
    """PaddleRec's DeepFM idiom: fluid.embedding over [B, F] ids, scaled by
    [B, F, 1] values, reduced over fields."""
    idx = np.array([[1, 4, 2], [0, 4, 4]], dtype=np.int64)
    val = np.random.default_rng(9).normal(size=(2, 3, 1))

    def build():
        ids = L.data("idx", [3], dtype="int64")
        v = L.data("val", [3, 1], dtype=F64)
        emb = fluid.embedding(ids, [6, 4], padding_idx=0, dtype=F64, param_attr=fluid.ParamAttr(
            name="feat", initializer=fluid.initializer.Uniform(-1, 1)))
        assert emb.shape == (-1, 3, 4)
        return _weighted_loss(L.reduce_sum(emb * v, dim=1), (2, 4))
    _check(build, {"idx": idx, "val": val, "loss_w": _w((2, 4))})


def test_fluid_embedding_over_sequences_keeps_the_ids_unit_axis():
    """PaddleRec's fastText idiom: fluid.embedding over lod_level=1 ids of shape
    [N, 1] gives [N, 1, dim] (Fluid's lookup_table_v2: the ids' shape plus dim),
    sequence_pool keeps it ([B, 1, dim]), squeeze(axes=[1]) makes [B, dim]."""
    seqs = [[3, 5, 3], [7], [1, 2, 9, 9, 4]]
    main, startup = _program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = fluid.data("ids", [None, 1], dtype="int64", lod_level=1)
        emb = fluid.embedding(ids, [20, 3], param_attr="emb", dtype=F64)
        pooled = L.sequence_pool(emb, "average")
        out = L.squeeze(pooled, axes=[1])
    assert emb.shape == (-1, 1, 3) and out.shape == (-1, 3)
    (e, p, o), be = _run_forward(main, startup, {"ids": _lod_feed(seqs)}, [emb, pooled, out])
    table = be.dense["emb"]
    flat = [i for s in seqs for i in s]
    assert np.asarray(e).shape == (len(flat), 1, 3) and np.asarray(p).shape == (3, 1, 3)
    np.testing.assert_allclose(np.asarray(e)[:, 0], table[flat], rtol=1e-12)
    np.testing.assert_allclose(o, np.stack([table[s].mean(0) for s in seqs]), rtol=1e-12)

    def build():
        ids = fluid.data("ids", [None, 1], dtype="int64", lod_level=1)
        emb = fluid.embedding(ids, [20, 4], dtype=F64, param_attr=fluid.ParamAttr(
            name="emb", initializer=fluid.initializer.Uniform(-1, 1)))
        pooled = L.squeeze(L.sequence_pool(emb, "average"), axes=[1])
        return _weighted_loss(pooled, (3, 4))
    _check(build, {"ids": _lod_feed(seqs), "loss_w": _w((3, 4))}, max_elements=40)


def test_soft_label_cross_entropy_and_ignore_index_normalize_gradients():
    x = np.random.default_rng(10).normal(size=(4, 3))
    soft = np.random.default_rng(11).dirichlet(np.ones(3), size=4)
    y = np.array([[1.0], [-100.0], [0.0], [1.0]])      # row 1 ignored

    def build():
        d = L.data("x", [3], dtype=F64)
        s = L.data("soft", [3], dtype=F64)
        lab = L.data("y", [1], dtype=F64)
        prob = L.fc(d, 3, act="softmax")
        ce = L.mean(L.cross_entropy(prob, s, soft_label=True))
        sce = L.reduce_sum(L.sigmoid_cross_entropy_with_logits(L.fc(d, 1), lab,
                                                               normalize=True))
        return L.elementwise_add(ce, sce)
    _check(build, {"x": x, "soft": soft, "y": y})


def test_sigmoid_cross_entropy_ignore_index_and_normalize_values():
    z = np.array([[0.5], [2.0], [-1.0]])
    y = np.array([[1.0], [-100.0], [0.0]])
    main, startup = _program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [1], dtype=F64)
        lab = L.data("y", [1], dtype=F64)
        plain = L.sigmoid_cross_entropy_with_logits(x, lab)
        norm = L.sigmoid_cross_entropy_with_logits(x, lab, normalize=True)
    (a, b), _ = _run_forward(main, startup, {"x": z, "y": y}, [plain, norm])
    ref = np.array([np.log1p(np.exp(-0.5)), 0.0, np.log1p(np.exp(-1.0))])
    np.testing.assert_allclose(a.ravel(), ref, rtol=1e-12)
    np.testing.assert_allclose(b.ravel(), ref / 2, rtol=1e-12)   # 2 rows not ignored

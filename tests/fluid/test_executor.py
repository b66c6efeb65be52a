"""Executor, startup, backend call pattern, DataFeeder/LoD feeds, auc layer,
and a real training run of the reference DNN on Criteo rows."""

import csv

import numpy as np
import pytest
from support import DATA
from support.fluid import RecordingBackend

import pyfleet
from pyfleet import fluid, metrics
from pyfleet.fluid.backend import LocalBackend
from pyfleet.optimizer import SGD, Adam

L = fluid.layers

TINY = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"


def _small_net(num_slots=2, dim=3, table="emb", sparse=True):
    dense = L.data("dense", [2])
    slots = [L.data(f"s{i}", [1], dtype="int64", lod_level=1) for i in range(num_slots)]
    label = L.data("label", [1], dtype="int64")
    embs = [L.sequence_pool(L.embedding(s, [50, dim], is_distributed=sparse,
                                        param_attr=fluid.ParamAttr(name=table)), "sum")
            for s in slots]
    h = L.fc(L.concat(embs + [dense], axis=1), 4, act="relu")
    prob = L.fc(h, 2, act="softmax")
    avg = L.mean(L.cross_entropy(prob, label))
    return dense, slots, label, prob, avg


def _feed(rng, b=6, num_slots=2):
    feed = {"dense": rng.normal(size=(b, 2)).astype(np.float32),
            "label": rng.integers(0, 2, (b, 1))}
    for i in range(num_slots):
        lens = rng.integers(0, 4, b)
        feed[f"s{i}"] = (rng.integers(0, 40, lens.sum()).astype(np.int64),
                         np.concatenate([[0], np.cumsum(lens)]))
    return feed


def _build(opt=None, seed=0, **kw):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = seed
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        net = _small_net(**kw)
        result = (opt or SGD(0.1)).minimize(net[-1])
    return main, startup, net, result


def test_minimize_returns_params_grads_and_exposes_parameters():
    main, _startup, _net, (ops, params_grads) = _build(Adam(0.01))
    assert ops == []
    names = {p.name for p, g in params_grads}
    assert names == {"emb", "fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0"}
    assert all(g.name == p.name + "@GRAD" for p, g in params_grads)
    params = {p.name: p for p in main.global_block().all_parameters()}
    emb = params["emb"]
    assert emb.is_sparse_table and emb.dim == 3 and emb.optimizer == Adam(0.01)
    assert isinstance(emb.initializer, pyfleet.initializer.Uniform)
    w = params["fc_0.w_0"]
    assert not w.is_sparse_table and w.shape == (8, 4)
    assert isinstance(w.initializer, pyfleet.initializer.Xavier)
    assert params["fc_0.b_0"].initializer == pyfleet.initializer.Constant(0.0)
    assert w.initial_value().shape == (8, 4)


def test_param_attr_learning_rate_scales_the_optimizer():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [3])
        y = L.fc(x, 1, param_attr=fluid.ParamAttr(name="w", learning_rate=0.5))
        Adam(0.01).minimize(L.mean(y))
    p = main.global_block().var("w")
    assert p.optimizer == Adam(0.005)


def test_startup_initialization_is_deterministic_per_seed():
    vals = []
    for seed in (1, 1, 2):
        main, startup, _net, _ = _build(seed=seed)
        be = RecordingBackend()
        main._backend = be
        fluid.Executor().run(startup)
        vals.append(be.dense["fc_0.w_0"])
    np.testing.assert_array_equal(vals[0], vals[1])
    assert not np.array_equal(vals[0], vals[2])


def test_backend_call_pattern_one_round_trip_each():
    main, startup, net, _ = _build()
    be = RecordingBackend(np.float32)
    main._backend = be
    exe = fluid.Executor()
    exe.run(startup)
    assert sorted(c for c in be.calls) == sorted(
        [("create_sparse", "emb")] + [("create_dense", n) for n in
                                      ("fc_0.w_0", "fc_0.b_0", "fc_1.w_0", "fc_1.b_0")])
    be.calls.clear()
    feed = _feed(np.random.default_rng(0))
    exe.run(main, feed=feed, fetch_list=[net[-1]])
    kinds = [c[0] for c in be.calls]
    # dense values pulled once the lookups ran, dense gradients pushed first
    assert kinds == ["pull_sparse", "pull_dense_many", "push_dense_many", "push_sparse",
                     "step_end"]
    ids = np.concatenate([feed["s0"][0], feed["s1"][0]])
    assert be.calls[0][2] == len(np.unique(ids))
    assert be.pushed_sparse["emb"][1].dtype == np.float32


def test_unique_inverse_and_segment_sum_match_numpy():
    """The executor's dedup (first-occurrence order) and per-id gradient sums
    against plain numpy, with duplicates, negative int64 hashes and both dtypes."""
    from pyfleet.fluid.ops import segment_sum
    from pyfleet.fluid.step import unique_inverse as _unique_inverse
    rng = np.random.default_rng(7)
    ids = rng.integers(-50, 50, 3000).astype(np.int64) * (1 << 40)
    for keys in (ids, ids.view(np.uint64), np.array([], np.uint64), ids[:1]):
        uniq, inverse = _unique_inverse(keys)
        assert uniq.dtype == keys.dtype
        np.testing.assert_array_equal(uniq[inverse], keys)
        ref, first = np.unique(keys, return_index=True)
        np.testing.assert_array_equal(uniq, keys[np.sort(first)])
        assert len(uniq) == len(ref)
    uniq, inverse = _unique_inverse(ids)
    for dtype, tol in ((np.float32, 1e-5), (np.float64, 1e-12)):
        g = rng.normal(size=(ids.shape[0], 5)).astype(dtype)
        want = np.zeros((uniq.shape[0], 5), np.float64)
        np.add.at(want, inverse, g.astype(np.float64))
        got = segment_sum(g, inverse, uniq.shape[0])
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        # a strided view (as the concat gradient's columns) sums the same
        wide = np.zeros((ids.shape[0], 9), dtype)
        wide[:, 2:7] = g
        np.testing.assert_array_equal(segment_sum(wide[:, 2:7], inverse, uniq.shape[0]), got)


class _PrefetchingBackend(RecordingBackend):
    def __init__(self):
        super().__init__(np.float32)
        self.prefetched = []

    def prefetch_sparse(self, name, keys):
        self.prefetched.append((name, keys.copy()))

    def pull_sparse(self, name, keys):
        self.pulled = keys.copy()
        return super().pull_sparse(name, keys)


def test_prefetch_dedups_ahead_and_run_uses_it_only_for_the_same_ids():
    rng = np.random.default_rng(5)
    feeds = [_feed(rng, b=9) for _ in range(3)]
    main, startup, net, _ = _build()
    be = _PrefetchingBackend()
    main._backend = be
    exe = fluid.Executor()
    exe.run(startup)
    ref_main, ref_startup, ref_net, _ = _build()
    ref_main._backend = RecordingBackend(np.float32)
    ref = fluid.Executor()
    ref.run(ref_startup)

    exe.prefetch(main, feeds[0])
    exe.prefetch(main, feeds[1])
    assert [n for n, _ in be.prefetched] == ["emb", "emb"]
    for i, f in enumerate(feeds[:2]):
        got = exe.run(main, feed=f, fetch_list=[net[-1], net[3]])
        want = ref.run(ref_main, feed=f, fetch_list=[ref_net[-1], ref_net[3]])
        np.testing.assert_array_equal(be.pulled, be.prefetched[i][1])  # the keys prefetched
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        keys, grads = be.pushed_sparse["emb"]
        rkeys, rgrads = ref_main._backend.pushed_sparse["emb"]
        np.testing.assert_array_equal(keys, rkeys)
        np.testing.assert_array_equal(grads, rgrads)
    assert not exe._prepared                       # both consumed
    # A feed whose ids changed after its prefetch is deduplicated afresh.
    exe.prefetch(main, feeds[2])
    changed = dict(feeds[2])
    changed["s0"] = (changed["s0"][0] + 1, changed["s0"][1])
    exe.run(main, feed=changed, fetch_list=[net[-1]])
    ids = np.concatenate([changed["s0"][0], changed["s1"][0]]).view(np.uint64)
    np.testing.assert_array_equal(np.sort(be.pulled), np.unique(ids))
    with pytest.raises(ValueError, match="feed must be a dict"):
        exe.prefetch(main, [feeds[0]])


def test_auc_bucket_counts_match_metrics():
    from pyfleet.metrics import count_buckets as _bucket_counts
    rng = np.random.default_rng(11)
    p = np.concatenate([[0.0, 1.0, 0.5], rng.random(997)]).astype(np.float32)
    y = rng.integers(0, 3, p.shape[0])        # any non-zero label is a positive
    for t in (1, 7, 4095):
        got = _bucket_counts(p, y, t)
        want = metrics.bucket_counts(p, y, t)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="probabilities"):
        _bucket_counts(np.array([0.5, np.nan], np.float32), np.array([0, 1]), 7)
    with pytest.raises(ValueError, match="probabilities"):
        _bucket_counts(np.array([1.5], np.float32), np.array([0]), 7)


def test_slots_sharing_one_offsets_array_are_each_checked():
    rng = np.random.default_rng(2)
    main, startup, net, _ = _build()
    main._backend = RecordingBackend(np.float32)
    exe = fluid.Executor()
    exe.run(startup)
    feed = _feed(rng, b=5)
    off = np.arange(6, dtype=np.int64)
    shared = dict(feed, s0=(np.arange(5, dtype=np.int64), off),
                  s1=(np.arange(5, 10, dtype=np.int64), off))
    separate = dict(shared, s1=(shared["s1"][0], off.copy()))
    a = exe.run(main.clone(for_test=True), feed=shared, fetch_list=[net[3]])[0]
    b = exe.run(main.clone(for_test=True), feed=separate, fetch_list=[net[3]])[0]
    np.testing.assert_array_equal(a, b)
    bad = dict(shared, s1=(np.arange(4, dtype=np.int64), off))   # 4 ids, offsets end at 5
    with pytest.raises(ValueError, match="lod offsets"):
        exe.run(main, feed=bad, fetch_list=[net[-1]])


def test_local_backend_sgd_step_equals_recorded_gradient():
    rng = np.random.default_rng(3)
    feed = _feed(rng)
    main, startup, net, _ = _build(SGD(0.1))
    rec = RecordingBackend(np.float32)
    main._backend = rec
    exe = fluid.Executor()
    exe.run(startup)
    exe.run(main, feed=feed, fetch_list=[net[-1]])

    main2, startup2, net2, _ = _build(SGD(0.1))
    local = LocalBackend()
    main2._backend = local
    exe.run(startup2)
    before = {n: local.pull_dense(n) for n in rec.dense}
    keys = rec.pushed_sparse["emb"][0]
    rows_before = local.pull_sparse("emb", keys)
    exe.run(main2, feed=feed, fetch_list=[net2[-1]])
    for n, g in rec.pushed_dense.items():
        np.testing.assert_allclose(local.pull_dense(n), before[n] - 0.1 * g, rtol=1e-5,
                                   atol=1e-7)
    np.testing.assert_allclose(local.pull_sparse("emb", keys),
                               rows_before - 0.1 * rec.pushed_sparse["emb"][1],
                               rtol=1e-5, atol=1e-7)


def test_clone_for_test_computes_without_updating():
    main, startup, net, _ = _build()
    exe = fluid.Executor()
    exe.run(startup)
    test = main.clone(for_test=True)
    feed = _feed(np.random.default_rng(4))
    a = exe.run(test, feed=feed, fetch_list=[net[-1]])[0]
    b = exe.run(test, feed=feed, fetch_list=[net[-1]])[0]
    assert a == b
    exe.run(main, feed=feed, fetch_list=[net[-1]])
    c = exe.run(test, feed=feed, fetch_list=[net[-1]])[0]
    assert c < a                          # one SGD step on this batch lowers its loss


def test_float_ids_or_labels_and_ragged_feeds_are_refused_by_name():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        ids = L.data("ids", [1], dtype="int64")
        L.data("x", [3], dtype="float32")
        emb = L.embedding(ids, [10**9, 2], is_distributed=True)
    exe = fluid.Executor()
    exe.run(startup)
    # float32 cannot hold every id: 123456789 and 123456790 are one float32,
    # so rounding would read one row for both
    with pytest.raises(ValueError, match=r"feed 'ids': declared int64, got float32"):
        exe.run(main, feed={"ids": np.array([[123456789], [123456790]], np.float32)},
                fetch_list=[emb])
    (rows,) = exe.run(main, feed={"ids": np.array([[123456789], [123456790]])}, fetch_list=[emb])
    assert not np.array_equal(rows[0], rows[1])
    with pytest.raises(ValueError, match=r"feed 'x': not a rectangular array"):
        exe.run(main, feed={"ids": np.array([[1], [2]]), "x": [[1, 2, 3], [1, 2]]},
                fetch_list=[emb])


def test_evaluation_reads_rows_without_making_them():
    main, startup, net, _ = _build()
    exe = fluid.Executor()
    exe.run(startup)
    test = main.clone(for_test=True)
    table = main._get_backend().sparse["emb"]
    rng = np.random.default_rng(6)
    train_feed = _feed(rng)
    exe.run(main, feed=train_feed, fetch_list=[net[-1]])
    seen = table.keys()
    test_feed = _feed(rng, b=20)
    ids = np.concatenate([test_feed["s0"][0], test_feed["s1"][0]]).astype(np.uint64)
    assert not np.isin(ids, seen).all()   # the test batch has ids never trained
    (pred,) = exe.run(test, feed=test_feed, fetch_list=[net[3]])
    np.testing.assert_array_equal(np.sort(table.keys()), np.sort(seen))  # no row made
    # the same predictions as a test run on a table holding those rows at
    # their initial values (what creating them would have given)
    table.pull(ids)                       # now create them, at their initial rows
    (again,) = exe.run(test, feed=test_feed, fetch_list=[net[3]])
    np.testing.assert_array_equal(pred, again)
    exe.run(main, feed=test_feed, fetch_list=[net[-1]])
    assert np.isin(ids, table.keys()).all()   # training does make them


def test_startup_before_minimize_is_refused_for_training():
    main, startup = fluid.Program(), fluid.Program()
    exe = fluid.Executor()
    with fluid.program_guard(main, startup):
        net = _small_net()
    exe.run(startup)
    with fluid.program_guard(main, startup):
        SGD(0.1).minimize(net[-1])
    with pytest.raises(ValueError, match="startup program ran before"):
        exe.run(main, feed=_feed(np.random.default_rng(0)), fetch_list=[net[-1]])
    exe.run(startup)
    exe.run(main, feed=_feed(np.random.default_rng(0)), fetch_list=[net[-1]])


def test_main_before_startup_names_the_missing_parameter():
    main, _startup, net, _ = _build()
    with pytest.raises(ValueError, match="startup"):
        fluid.Executor().run(main, feed=_feed(np.random.default_rng(0)), fetch_list=[net[-1]])


def test_lod_feed_forms_and_data_feeder_agree():
    main, startup, net, _ = _build()
    exe = fluid.Executor()
    exe.run(startup)
    test = main.clone(for_test=True)
    dense, slots, label = net[0], net[1], net[2]
    samples = [([0.5, -1.0], [3, 7, 3], [], 1), ([0.0, 2.0], [9], [1, 2], 0),
               ([1.0, 1.0], [], [4], 1)]
    feeder = fluid.DataFeeder(feed_list=[dense, slots[0], slots[1], label],
                              place=fluid.CPUPlace())
    fd = feeder.feed(samples)
    assert isinstance(fd["s0"], fluid.LoDTensor)
    assert fd["s0"].recursive_sequence_lengths() == [[3, 1, 0]]
    np.testing.assert_array_equal(fd["s0"].data.ravel(), [3, 7, 3, 9])
    assert fd["dense"].shape == (3, 2) and fd["label"].shape == (3, 1)
    base = exe.run(test, feed=fd, fetch_list=[net[-1]])[0]
    as_tuples = dict(fd, s0=(np.array([3, 7, 3, 9]), np.array([0, 3, 4, 4])),
                     s1=(np.array([1, 2, 4], np.uint64), np.array([0, 0, 2, 3])))
    as_lists = dict(fd, s0=[[3, 7, 3], [9], []], s1=[[], [1, 2], [4]])
    t = fluid.create_lod_tensor(np.array([[1], [2], [4]]), [[0, 2, 1]], fluid.CPUPlace())
    as_lod = dict(fd, s1=t)
    for f in (as_tuples, as_lists, as_lod):
        np.testing.assert_allclose(exe.run(test, feed=f, fetch_list=[net[-1]])[0], base,
                                   rtol=1e-6)


def test_bad_feeds_raise_value_errors():
    main, startup, net, _ = _build()
    exe = fluid.Executor()
    exe.run(startup)
    good = _feed(np.random.default_rng(0))
    with pytest.raises(ValueError, match="offsets"):
        exe.run(main, feed=dict(good, s0=(np.array([1, 2]), np.array([0, 3]))),
                fetch_list=[net[-1]])
    with pytest.raises(ValueError, match="integers"):
        exe.run(main, feed=dict(good, s0=(np.array([1.5]), np.array([0, 1]))),
                fetch_list=[net[-1]])
    with pytest.raises(ValueError, match="lod_level"):
        exe.run(main, feed=dict(good, s0=np.array([[1], [2]])), fetch_list=[net[-1]])
    with pytest.raises(ValueError, match="not a variable"):
        exe.run(main, feed=dict(good, nope=np.zeros(1)), fetch_list=[net[-1]])
    with pytest.raises(ValueError, match="fields"):
        fluid.DataFeeder([net[0], net[2]]).feed([([1.0, 2.0],)])


def test_batch_reader():
    def reader():
        yield from range(7)
    assert list(fluid.batch(reader, 3)()) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(fluid.batch(reader, 3, drop_last=True)()) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError):
        fluid.batch(reader, 0)


def _fluid_auc_reference(batches, num_thresholds, slide_steps):
    """A plain re-implementation of Fluid's auc kernel, loop for loop."""
    n = num_thresholds + 1
    glob_pos, glob_neg = [0] * n, [0] * n
    window = []

    def calc(pos, neg):
        auc = tot_pos = tot_neg = 0.0
        for idx in range(num_thresholds, -1, -1):
            prev_pos, prev_neg = tot_pos, tot_neg
            tot_pos += pos[idx]
            tot_neg += neg[idx]
            auc += abs(tot_neg - prev_neg) * (tot_pos + prev_pos) / 2.0
        return auc / tot_pos / tot_neg if tot_pos > 0 and tot_neg > 0 else auc

    out = []
    for pred, label in batches:
        pos, neg = [0] * n, [0] * n
        for p, y in zip(pred[:, 1], label.ravel()):
            b = int(np.float32(p) * np.float32(num_thresholds))
            if y:
                pos[b] += 1
            else:
                neg[b] += 1
        for i in range(n):
            glob_pos[i] += pos[i]
            glob_neg[i] += neg[i]
        window = (window + [(pos, neg)])[-slide_steps:]
        wp = [sum(w[0][i] for w in window) for i in range(n)]
        wn = [sum(w[1][i] for w in window) for i in range(n)]
        out.append((calc(glob_pos, glob_neg), calc(wp, wn)))
    return out


@pytest.mark.parametrize("num_thresholds,slide_steps", [(2 ** 12 - 1, 1), (200, 3), (10, 2)])
def test_auc_layer_matches_fluid_rule_and_exact_auc(num_thresholds, slide_steps):
    rng = np.random.default_rng(11)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        p = L.data("p", [2])
        y = L.data("y", [1], dtype="int64")
        auc, batch_auc, states = L.auc(p, y, num_thresholds=num_thresholds,
                                       slide_steps=slide_steps)
    exe = fluid.Executor()
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    batches = []
    for _ in range(5):
        click = rng.random(50).astype(np.float32)
        click[:5] = [0.0, 1.0, 0.5, 0.5, 0.25]
        label = (rng.random(50) < click).astype(np.int64).reshape(-1, 1)
        batches.append((np.stack([1 - click, click], axis=1), label))
    ref = _fluid_auc_reference(batches, num_thresholds, slide_steps)
    for (pred, label), (g_ref, b_ref) in zip(batches, ref):
        g, b = exe.run(main, feed={"p": pred, "y": label}, fetch_list=[auc, batch_auc],
                       scope=scope)
        assert g.dtype == np.float64 and g.shape == (1,)
        np.testing.assert_allclose(g[0], g_ref, rtol=1e-12)
        np.testing.assert_allclose(b[0], b_ref, rtol=1e-12)
    all_pred = np.concatenate([b[0][:, 1] for b in batches])
    all_label = np.concatenate([b[1].ravel() for b in batches])
    exact = metrics.exact_auc(all_pred, all_label)
    assert abs(g[0] - exact) < (0.02 if num_thresholds < 100 else 2e-3)
    # the global state holds every prediction; resetting it (as Fluid users do) clears it
    stat_pos = np.array(scope.find_var(states[2].name).get_tensor())
    assert stat_pos.sum() == all_label.sum()
    for v in states:
        t = scope.find_var(v.name).get_tensor()
        t.set(np.zeros_like(np.array(t)), fluid.CPUPlace())
    g, _ = exe.run(main, feed={"p": batches[0][0], "y": batches[0][1]},
                   fetch_list=[auc, batch_auc], scope=scope)
    np.testing.assert_allclose(g[0], ref[0][0], rtol=1e-12)


def test_auc_layer_rejects_non_probabilities():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        p = L.data("p", [2])
        y = L.data("y", [1], dtype="int64")
        auc, _, _ = L.auc(p, y)
    with pytest.raises(ValueError, match="probabilities"):
        fluid.Executor().run(main, feed={"p": np.array([[0.0, 1.5]]), "y": np.array([[1]])},
                             fetch_list=[auc], scope=fluid.Scope())


def _read_criteo(path, limit=None):
    """label int64 [n,1], dense float32 [n,13] (log1p of clipped ints), and per
    slot (values, offsets) with one id per present value (missing -> empty)."""
    labels, dense, cats = [], [], []
    with open(path, newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit and i >= limit:
                break
            labels.append(int(row["Label"]))
            dense.append([np.log1p(max(float(row[f"I{j}"]), 0.0)) if row[f"I{j}"] else 0.0
                          for j in range(1, 14)])
            cats.append([row[f"C{j}"] for j in range(1, 27)])
    slots = []
    for j in range(26):
        vals = [(j << 32) | int(c[j], 16) for c in cats if c[j]]
        lens = [1 if c[j] else 0 for c in cats]
        slots.append((np.array(vals, dtype=np.int64), np.concatenate([[0], np.cumsum(lens)])))
    return (np.array(labels, dtype=np.int64).reshape(-1, 1),
            np.array(dense, dtype=np.float32), slots)


def _slice_batch(label, dense, slots, a, b):
    feed = {"dense_input": dense[a:b], "label": label[a:b]}
    for j, (vals, off) in enumerate(slots):
        feed[f"C{j + 1}"] = (vals[off[a]:off[b]], off[a:b + 1] - off[a])
    return feed


@pytest.mark.skipif(not TINY.exists(), reason="shared Criteo sample not available")
def test_dnn_trains_on_criteo_tiny_loss_goes_down():
    from pyfleet import models
    label, dense, slots = _read_criteo(TINY)
    n = label.shape[0]
    assert n == 1999 and sum(len(v) for v, _ in slots) > 26 * n * 0.8
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.DNN()
        Adam(learning_rate=0.001).minimize(m.avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    test = main.clone(for_test=True)
    full = _slice_batch(label, dense, slots, 0, n)

    def full_loss():
        return float(exe.run(test, feed=full, fetch_list=[m.avg_cost], scope=scope)[0][0])

    before = full_loss()
    batch_losses = []
    for _ in range(3):
        for a in range(0, n, 128):
            loss, = exe.run(main, feed=_slice_batch(label, dense, slots, a, min(a + 128, n)),
                            fetch_list=[m.avg_cost], scope=scope)
            batch_losses.append(float(loss[0]))
    after = full_loss()
    assert np.all(np.isfinite(batch_losses))
    print("criteo-tiny full loss", before, after)
    assert after < before - 0.05, (before, after)
    assert np.mean(batch_losses[-16:]) < np.mean(batch_losses[:16])
    pred = exe.run(test, feed=full, fetch_list=[m.predict], scope=scope)[0]
    assert metrics.exact_auc(pred, label) > 0.75      # on the training rows it has seen


@pytest.mark.skipif(not TINY.exists(), reason="shared Criteo sample not available")
def test_fluid_ctr_example_script_runs_with_only_imports_changed():
    """Fluid 1.5's CTR DNN example, as users wrote it: default programs, a
    sample reader, paddle.batch, DataFeeder, embedding outputs concatenated
    directly (one id per slot), reduce_sum loss, accuracy and auc."""
    import math
    import zlib

    hash_dim = 1000001

    def reader():
        with open(TINY, newline="") as f:
            for row in csv.DictReader(f):
                dense = [np.log1p(max(float(row[f"I{j}"]), 0.0)) if row[f"I{j}"] else 0.0
                         for j in range(1, 14)]
                sparse = [[zlib.crc32(f"{j}{row[f'C{j}']}".encode()) % hash_dim]
                          for j in range(1, 27)]
                yield [dense] + sparse + [[int(row["Label"])]]

    def ctr_dnn_model(embedding_size, sparse_feature_dim):
        dense_input = fluid.layers.data(name="dense_input", shape=[13], dtype="float32")
        sparse_input_ids = [fluid.layers.data(name="C" + str(i), shape=[1], lod_level=1,
                                              dtype="int64") for i in range(1, 27)]
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")

        def embedding_layer(input):
            return fluid.layers.embedding(
                input=input, is_sparse=True, size=[sparse_feature_dim, embedding_size],
                param_attr=fluid.ParamAttr(name="SparseFeatFactors",
                                           initializer=fluid.initializer.Uniform()))

        sparse_embed_seq = list(map(embedding_layer, sparse_input_ids))
        concated = fluid.layers.concat(sparse_embed_seq + [dense_input], axis=1)
        fc1 = fluid.layers.fc(input=concated, size=64, act="relu",
                              param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                                  scale=1 / math.sqrt(concated.shape[1]))))
        fc2 = fluid.layers.fc(input=fc1, size=32, act="relu",
                              param_attr=fluid.ParamAttr(initializer=fluid.initializer.Normal(
                                  scale=1 / math.sqrt(fc1.shape[1]))))
        predict = fluid.layers.fc(input=fc2, size=2, act="softmax",
                                  param_attr=fluid.ParamAttr(
                                      initializer=fluid.initializer.Normal(
                                          scale=1 / math.sqrt(fc2.shape[1]))))
        cost = fluid.layers.cross_entropy(input=predict, label=label)
        avg_cost = fluid.layers.reduce_sum(cost)
        accuracy = fluid.layers.accuracy(input=predict, label=label)
        auc_var, batch_auc_var, _auc_states = fluid.layers.auc(
            input=predict, label=label, num_thresholds=2 ** 12, slide_steps=20)
        data_list = [dense_input] + sparse_input_ids + [label]
        return avg_cost, auc_var, batch_auc_var, accuracy, data_list

    with fluid.program_guard(fluid.Program(), fluid.Program()), fluid.scope_guard(
            fluid.Scope()), fluid.unique_name.guard():
        loss, auc_var, batch_auc_var, accuracy, data_list = ctr_dnn_model(8, hash_dim)
        optimizer = fluid.optimizer.Adam(learning_rate=1e-3)
        optimizer.minimize(loss)
        place = fluid.CPUPlace()
        exe = fluid.Executor(place)
        feeder = fluid.DataFeeder(feed_list=data_list, place=place)
        exe.run(fluid.default_startup_program())
        train_reader = fluid.batch(reader, batch_size=200)
        results = []
        for pass_id in range(2):
            for batch_id, data in enumerate(train_reader()):
                loss_val, auc_val, batch_auc_val, acc = exe.run(
                    fluid.default_main_program(), feed=feeder.feed(data),
                    fetch_list=[loss, auc_var, batch_auc_var, accuracy])
                results.append((pass_id, batch_id, float(loss_val[0]), float(auc_val[0])))
                assert 0.0 <= batch_auc_val[0] <= 1.0 and 0.0 <= acc[0] <= 1.0
        table = fluid.default_main_program().global_block().var("SparseFeatFactors")
        assert table.is_sparse_table and table.dim == 8
    assert len(results) == 20
    first_pass = np.mean([r[2] for r in results if r[0] == 0])
    second_pass = np.mean([r[2] for r in results if r[0] == 1])
    assert second_pass < first_pass
    assert 0.5 < results[-1][3] <= 1.0         # the global AUC over both passes


def _samples(rng, n):
    out = []
    for _ in range(n):
        out.append((rng.normal(size=2).tolist(), rng.integers(0, 40, rng.integers(0, 4)).tolist(),
                    rng.integers(0, 40, rng.integers(1, 3)).tolist(), [int(rng.integers(0, 2))]))
    return out


@pytest.mark.parametrize("double_buffer", [False, True])
def test_non_iterable_py_reader_feeds_until_eof(double_buffer):
    samples = _samples(np.random.default_rng(12), 23)
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        net = _small_net()
        reader = fluid.layers.create_py_reader_by_data(
            capacity=4, feed_list=[net[0], net[1][0], net[1][1], net[2]],
            use_double_buffer=double_buffer)
    test = main.clone(for_test=True)
    exe = fluid.Executor()
    exe.run(startup)
    reader.decorate_paddle_reader(fluid.batch(lambda: iter(samples), 5))
    feeder = fluid.DataFeeder([net[0], net[1][0], net[1][1], net[2]], program=main)
    for _ in range(2):                                   # two passes
        reader.start()
        losses = []
        try:
            while True:
                losses.append(exe.run(test, fetch_list=[net[-1]])[0][0])
        except fluid.core.EOFException:
            reader.reset()
        expect = [exe.run(test, feed=feeder.feed(samples[a:a + 5]), fetch_list=[net[-1]])[0][0]
                  for a in range(0, 23, 5)]
        np.testing.assert_allclose(losses, expect, rtol=1e-6)


def test_py_reader_iterable_batch_generator_and_errors():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        net = _small_net()
    exe = fluid.Executor()
    exe.run(startup)
    feeds = [_feed(np.random.default_rng(i)) for i in range(3)]
    names = ["dense", "s0", "s1", "label"]
    reader = fluid.io.PyReader(feed_list=[net[0], net[1][0], net[1][1], net[2]], capacity=2)
    reader.decorate_batch_generator(lambda: iter([tuple(f[n] for n in names) for f in feeds]))
    got = [exe.run(main.clone(for_test=True), feed=data, fetch_list=[net[-1]])[0][0]
           for data in reader()]
    want = [exe.run(main.clone(for_test=True), feed=f, fetch_list=[net[-1]])[0][0]
            for f in feeds]
    np.testing.assert_allclose(got, want, rtol=1e-6)

    def broken():
        yield feeds[0]
        raise RuntimeError("disk gone")
    bad = fluid.io.PyReader(feed_list=[net[0]], capacity=2)
    bad.decorate_batch_generator(broken)
    with pytest.raises(RuntimeError, match="disk gone"):
        list(bad())
    with pytest.raises(ValueError, match="not iterable"):
        next(fluid.layers.create_py_reader_by_data(2, [net[0]])())

"""The Fluid 1.8 modules beside the layers: fluid.metrics' accumulators,
fluid.nets' glu and attention, fluid.io's readers and program queries,
MSRA, ctr_metric_bundle, paddle.reader.multiprocess_reader: each against a
plain numpy (or Python) reference."""

import numpy as np
import pytest

from pyfleet import fluid
from pyfleet.initializer import MSRA
from pyfleet.reader import multiprocess_reader

L = fluid.layers


def _roc_auc(p, y):
    """The probability that a random positive outscores a random negative (ties 1/2)."""
    pos, neg = p[y == 1], p[y == 0]
    gt = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return gt / (len(pos) * len(neg))


def test_metrics_auc_precision_recall_accuracy():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    p = np.clip(0.35 * y + rng.random(400) * 0.65, 0, 1)
    # Bucketed like Fluid: probabilities on the 4095-bucket grid make the ROC exact.
    p = np.floor(p * 4095) / 4095
    auc = fluid.metrics.Auc("auc")
    for a, b in ((0, 150), (150, 400)):
        auc.update(np.stack([1 - p[a:b], p[a:b]], 1), y[a:b].reshape(-1, 1))
    assert auc.eval() == pytest.approx(_roc_auc(p, y), rel=1e-9)
    auc.reset()
    assert auc.eval() == 0.0
    pred = (p > 0.5).astype(float)
    prec, rec = fluid.metrics.Precision(), fluid.metrics.Recall()
    prec.update(pred, y)
    rec.update(pred, y)
    tp = np.sum((pred == 1) & (y == 1))
    assert prec.eval() == pytest.approx(tp / np.sum(pred == 1))
    assert rec.eval() == pytest.approx(tp / np.sum(y == 1))
    acc = fluid.metrics.Accuracy()
    acc.update(0.5, 10)
    acc.update(1.0, 30)
    assert acc.eval() == pytest.approx(0.875)
    comp = fluid.metrics.CompositeMetric()
    comp.add_metric(fluid.metrics.Precision())
    comp.add_metric(fluid.metrics.Recall())
    comp.update(pred, y)
    assert comp.eval() == pytest.approx([prec.eval(), rec.eval()])
    with pytest.raises(ValueError, match="numpy ndarray"):
        prec.update([1, 0], y[:2])
    prec.reset()
    assert prec.tp == 0 and prec.eval() == 0.0


def test_metrics_chunk_and_edit_distance_counters():
    c = fluid.metrics.ChunkEvaluator()
    c.update(10, 8, 6)
    c.update(np.int64(5), 7, 4)
    precision, recall, f1 = c.eval()
    assert (precision, recall) == pytest.approx((10 / 15, 10 / 15))
    assert f1 == pytest.approx(10 / 15)
    e = fluid.metrics.EditDistance("ed")
    e.update(np.array([0.0, 2.0, 1.0]), 3)
    assert e.eval() == pytest.approx((1.0, 2 / 3))


def _run(build, feed):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        outs = build()
    exe = fluid.Executor()
    exe.run(startup)
    return exe, main, outs, [np.asarray(v) for v in exe.run(main, feed=feed, fetch_list=outs)]


def test_nets_glu_and_multi_head_attention_match_numpy():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4, 8))
    q, k, v = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 6))

    def build():
        d = L.data("x", [3, 4, 8], dtype="float64", append_batch_size=False)
        dq = L.data("q", [2, 3, 8], dtype="float64", append_batch_size=False)
        dk = L.data("k", [2, 5, 8], dtype="float64", append_batch_size=False)
        dv = L.data("v", [2, 5, 6], dtype="float64", append_batch_size=False)
        return [fluid.nets.glu(d, dim=-1),
                fluid.nets.scaled_dot_product_attention(dq, dk, dv, num_heads=2)]
    _, _, _, (g, att) = _run(build, {"x": x, "q": q, "k": k, "v": v})
    np.testing.assert_allclose(g, x[..., :4] / (1 + np.exp(-x[..., 4:])))

    def heads(t):
        return t.reshape(t.shape[0], t.shape[1], 2, -1).transpose(0, 2, 1, 3)
    s = heads(q) @ heads(k).transpose(0, 1, 3, 2) / np.sqrt(4)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    want = (w @ heads(v)).transpose(0, 2, 1, 3).reshape(2, 3, 6)
    np.testing.assert_allclose(att, want, rtol=1e-10)


def test_ctr_metric_bundle_accumulates_over_runs():
    rng = np.random.default_rng(2)
    batches = [(rng.random((4, 1)), rng.integers(0, 2, (4, 1)).astype(float)) for _ in range(3)]

    def build():
        p = L.data("p", [1], dtype="float32")
        y = L.data("y", [1], dtype="float32")
        return list(fluid.contrib.layers.ctr_metric_bundle(p, y))
    exe, main, outs, _ = _run(build, {"p": batches[0][0].astype(np.float32),
                                      "y": batches[0][1].astype(np.float32)})
    for p, y in batches[1:]:
        got = exe.run(main, feed={"p": p.astype(np.float32), "y": y.astype(np.float32)},
                      fetch_list=outs)
    p = np.concatenate([b[0] for b in batches]).astype(np.float32)
    y = np.concatenate([b[1] for b in batches]).astype(np.float32)
    want = [np.sum((p - y) ** 2), np.sum(np.abs(p - y)), p.sum(),
            np.sum(1 / (1 + np.exp(-p))), y.sum(), len(p)]
    np.testing.assert_allclose([float(np.asarray(g).reshape(-1)[0]) for g in got], want,
                               rtol=1e-5)


def test_io_readers_and_program_queries():
    assert fluid.io.shuffle is not None and fluid.io.buffered is not None
    batches = list(fluid.io.batch(lambda: iter(range(5)), 2)())
    assert batches == [[0, 1], [2, 3], [4]]
    cols = fluid.io.default_collate_fn([(np.ones(2), 1), (np.zeros(2), 2)])
    np.testing.assert_array_equal(cols[0], [[1, 1], [0, 0]])
    np.testing.assert_array_equal(cols[1], [1, 2])
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [3])
        L.fc(x, 2)
        L.create_global_var([1], 0.0, "float32", persistable=True, name="g")
    params = {p.name for p in fluid.io.get_program_parameter(main)}
    assert len(params) == 2
    persist = {v.name for v in fluid.io.get_program_persistable_vars(main)}
    assert persist == params | {"g"}


def test_multiprocess_reader_reads_every_reader_and_reraises():
    got = list(multiprocess_reader([lambda: iter(range(50)), lambda: iter(range(100, 120))],
                                   queue_size=4)())
    assert sorted(got) == list(range(50)) + list(range(100, 120))

    def bad():
        yield 1
        raise OSError("disk gone")
    with pytest.raises(OSError, match="disk gone"):
        list(multiprocess_reader([bad, lambda: iter(range(3))])())


def test_msra_initializer_bounds_follow_fan_in():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        x = L.data("x", [50])
        L.fc(x, 40, param_attr=fluid.ParamAttr(name="w", initializer=MSRA()))
        L.fc(x, 40, param_attr=fluid.ParamAttr(
            name="wn", initializer=fluid.initializer.MSRAInitializer(uniform=False)))
    exe = fluid.Executor()
    exe.run(startup)
    w = np.array(fluid.global_scope().find_var("w").get_tensor())
    limit = np.sqrt(6.0 / 50)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.9 * limit
    wn = np.array(fluid.global_scope().find_var("wn").get_tensor())
    assert wn.std() == pytest.approx(np.sqrt(2.0 / 50), rel=0.1)


def test_install_check_trains_and_says_so(capsys):
    fluid.install_check.run_check()
    assert "installed successfully" in capsys.readouterr().out

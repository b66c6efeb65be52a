"""Metrics against plain references: pairwise AUC, Fluid's bucket rule, logloss,
and aggregation across workers equal to the metric on the concatenated data."""

import json

import numpy as np
import pytest

from pyfleet import metrics


def _pairwise_auc(pred, label):
    pos = [p for p, y in zip(pred, label) if y]
    neg = [p for p, y in zip(pred, label) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_exact_auc_equals_pairwise_reference_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    pred = rng.integers(0, 5, n) / 4.0 if seed % 2 else rng.random(n)   # many ties when odd
    label = rng.integers(0, 2, n)
    label[0], label[1] = 0, 1
    assert metrics.exact_auc(pred, label) == pytest.approx(_pairwise_auc(pred, label),
                                                           abs=1e-12)


def test_exact_auc_shapes_and_degenerate_cases():
    pred2 = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    assert metrics.exact_auc(pred2, np.array([[0], [1], [0]])) == 1.0
    assert np.isnan(metrics.exact_auc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError, match="entries"):
        metrics.exact_auc([0.1, 0.2], [1])


def _fluid_calc(pos, neg):
    auc = tot_pos = tot_neg = 0.0
    for idx in range(len(pos) - 1, -1, -1):
        prev_pos, prev_neg = tot_pos, tot_neg
        tot_pos += pos[idx]
        tot_neg += neg[idx]
        auc += abs(tot_neg - prev_neg) * (tot_pos + prev_pos) / 2.0
    return auc / tot_pos / tot_neg if tot_pos > 0 and tot_neg > 0 else auc


def test_bucketed_auc_matches_fluid_loop_and_approaches_exact():
    rng = np.random.default_rng(1)
    pred = rng.random(3000).astype(np.float32)
    label = (rng.random(3000) < pred).astype(np.int64)
    for t in (1, 7, 4095):
        pos, neg = metrics.bucket_counts(pred, label, t)
        idx = [int(np.float32(p) * np.float32(t)) for p in pred]
        ref_pos = np.bincount([i for i, y in zip(idx, label) if y], minlength=t + 1)
        ref_neg = np.bincount([i for i, y in zip(idx, label) if not y], minlength=t + 1)
        np.testing.assert_array_equal(pos, ref_pos)
        np.testing.assert_array_equal(neg, ref_neg)
        assert metrics.bucketed_auc(pos, neg) == pytest.approx(_fluid_calc(pos, neg),
                                                               rel=1e-12)
    assert abs(metrics.bucketed_auc(pos, neg) - metrics.exact_auc(pred, label)) < 1e-3
    assert metrics.bucketed_auc([3, 0], [0, 0]) == 0.0      # Fluid: no negatives -> 0
    with pytest.raises(ValueError, match="probabilities"):
        metrics.bucket_counts([1.5], [1])


def test_logloss_matches_formula_and_clips():
    p = np.array([0.9, 0.2, 0.5, 0.0, 1.0])
    y = np.array([1, 0, 1, 0, 1])
    ref = -np.mean([np.log(0.9), np.log(0.8), np.log(0.5), np.log(1 - 1e-15),
                    np.log(1 - 1e-15)])
    assert metrics.logloss(p, y) == pytest.approx(ref, rel=1e-12)
    assert np.isfinite(metrics.logloss([0.0], [1]))


def test_sliding_auc_covers_last_batches():
    rng = np.random.default_rng(2)
    s = metrics.SlidingAuc(num_thresholds=100, slide_steps=2)
    batches = [(rng.random(40), rng.integers(0, 2, 40)) for _ in range(4)]
    for i, (p, y) in enumerate(batches):
        got = s.update(p, y)
        win = batches[max(0, i - 1):i + 1]
        pos, neg = metrics.bucket_counts(np.concatenate([b[0] for b in win]),
                                         np.concatenate([b[1] for b in win]), 100)
        assert got == pytest.approx(metrics.bucketed_auc(pos, neg), rel=1e-12)


def test_stats_aggregated_across_workers_equal_concatenated_data():
    rng = np.random.default_rng(3)
    workers = []
    preds, labels = [], []
    for w in range(3):
        n = 100 + 50 * w
        p = rng.random(n)
        y = (rng.random(n) < p * (w + 1) / 3).astype(np.int64)   # different per worker
        st = metrics.MetricStats(num_thresholds=1000)
        st.update(p[: n // 2], y[: n // 2]).update(p[n // 2:], y[n // 2:])
        workers.append(st)
        preds.append(p)
        labels.append(y)
    allp, ally = np.concatenate(preds), np.concatenate(labels)
    whole = metrics.MetricStats(num_thresholds=1000).update(allp, ally)
    pos, neg = metrics.bucket_counts(allp, ally, 1000)
    via_sum = metrics.MetricStats.sum(workers)
    via_arrays = metrics.MetricStats.from_array(
        metrics.MetricStats.sum_arrays([w.to_array() for w in workers]))
    via_json = metrics.MetricStats.sum([metrics.MetricStats.from_json(w.to_json())
                                        for w in workers])
    via_add = workers[0] + workers[1] + workers[2]
    for agg in (via_sum, via_arrays, via_json, via_add):
        np.testing.assert_array_equal(agg.pos, pos)
        np.testing.assert_array_equal(agg.neg, neg)
        assert agg.count == len(allp)
        assert agg.auc() == pytest.approx(metrics.bucketed_auc(pos, neg), rel=1e-12)
        assert agg.logloss() == pytest.approx(metrics.logloss(allp, ally), rel=1e-9)
        assert agg.ctr() == pytest.approx(ally.mean())
        assert agg.predicted_ctr() == pytest.approx(allp.mean())
    assert whole.auc() == via_sum.auc()
    assert via_sum.auc() != pytest.approx(workers[0].auc(), abs=1e-6)   # not worker 0 alone
    assert json.loads(workers[0].to_json())["num_thresholds"] == 1000
    with pytest.raises(ValueError, match="thresholds"):
        workers[0].merge(metrics.MetricStats(num_thresholds=10))
    with pytest.raises(ValueError):
        metrics.MetricStats.from_array(np.zeros(5))


def test_stats_from_auc_layer_buckets():
    pos = np.array([0, 2, 5], dtype=np.int64)
    neg = np.array([4, 1, 0], dtype=np.int64)
    st = metrics.MetricStats.from_buckets(pos, neg)
    assert st.num_thresholds == 2 and st.count == 12
    assert st.auc() == pytest.approx(_fluid_calc(pos, neg))

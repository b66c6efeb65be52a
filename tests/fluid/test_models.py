"""The model zoo: whole-model gradients against finite differences, and a few
training steps of each model lowering its loss."""

import numpy as np
import pytest
from support.fluid import check_gradients

from pyfleet import fluid, models
from pyfleet.optimizer import SGD, Adam

SMALL = {"num_dense": 3, "num_slots": 3, "embedding_dim": 4, "layers": (5, 3)}


def _feed(rng, b, num_dense, num_slots, max_len=3, vocab=30):
    feed = {"dense_input": rng.normal(size=(b, num_dense)),
            "label": rng.integers(0, 2, (b, 1))}
    for i in range(1, num_slots + 1):
        lens = rng.integers(0, max_len + 1, b)
        feed[f"C{i}"] = (rng.integers(0, vocab, lens.sum()).astype(np.int64),
                         np.concatenate([[0], np.cumsum(lens)]))
    return feed


@pytest.mark.parametrize("name", ["lr", "dnn", "wide_deep", "deepfm"])
def test_model_gradients_match_finite_differences(name):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = 5
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.build(name, dtype="float64", **SMALL)
        SGD(0.1).minimize(m.avg_cost)
    feed = _feed(np.random.default_rng(1), 7, 3, 3)
    feed["dense_input"] = feed["dense_input"].astype(np.float64)
    n = check_gradients(main, startup, m.avg_cost, feed, max_elements=8, jitter=0.05)
    assert n >= 8 * len(main.all_parameters()) // 2
    tables = sorted(p.name for p in main.all_parameters() if p.is_sparse_table)
    expected = {"lr": ["SparseFeatFactors_first_order"],
                "dnn": ["SparseFeatFactors"]}.get(
        name, ["SparseFeatFactors", "SparseFeatFactors_first_order"])
    assert tables == expected


@pytest.mark.parametrize("name", ["lr", "dnn", "wide_deep", "deepfm"])
def test_model_interface_and_training_lowers_loss(name):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        m = models.build(name)                   # reference sizes: 13 dense, 26 slots, dim 16
        Adam(learning_rate=0.01).minimize(m.avg_cost)
    assert m.feed_names == ["dense_input"] + [f"C{i}" for i in range(1, 27)] + ["label"]
    avg_cost, auc, batch_auc = m                 # Fluid scripts unpack three values
    assert avg_cost is m.avg_cost and auc is m.auc and batch_auc is m.batch_auc
    assert len(m.auc_states) == 4
    exe = fluid.Executor()
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    rng = np.random.default_rng(2)
    feed = _feed(rng, 64, 13, 26, vocab=1000)
    # learnable signal: the label is a function of one slot's first id
    feed["label"] = (np.add.reduceat(feed["C1"][0] % 2, feed["C1"][1][:-1])[:, None] > 0
                     ).astype(np.int64) if feed["C1"][0].size else feed["label"]
    feed["dense_input"] = feed["dense_input"].astype(np.float32)
    test = main.clone(for_test=True)
    before = exe.run(test, feed=feed, fetch_list=[m.avg_cost], scope=scope)[0][0]
    for _ in range(15):
        _loss, a, ba, pred = exe.run(main, feed=feed, fetch_list=[m.avg_cost, m.auc,
                                                               m.batch_auc, m.predict],
                                    scope=scope)
    after = exe.run(test, feed=feed, fetch_list=[m.avg_cost], scope=scope)[0][0]
    assert after < before
    assert pred.shape == (64, 1) and np.all((pred >= 0) & (pred <= 1))
    assert 0.0 <= a[0] <= 1.0 and 0.0 <= ba[0] <= 1.0


def test_unknown_model_name_is_a_value_error():
    with pytest.raises(ValueError, match="unknown model"):
        models.build("transformer")


@pytest.fixture(scope="module")
def small_generated(tmp_path_factory):
    from pyfleet.data import synthetic
    return synthetic.generate(str(tmp_path_factory.mktemp("small") / "data"), rows=6000, seed=0)


@pytest.mark.parametrize("name", ["dnn", "wide_deep", "deepfm"])
def test_narrow_networks_do_not_start_from_extreme_predictions(small_generated, name):
    # A narrow network (layers 8, dim 4) on 5,400 rows: 11 Adam steps at 0.001,
    # too few to undo a bad start. With Fluid's Xavier default on the output
    # layer over the dense log counts, one seed in four started at logits of
    # several units and trained at a logloss of 1.1-1.9 (the click rate alone
    # gives 0.56); the zoo's init (output layer at zero) keeps every seed near ln 2.
    from pyfleet.trainer import train_local
    losses = []
    for seed in range(4):
        s = train_local({"train": small_generated["train"], "test": small_generated["test"],
                         "model": name, "layers": [8], "embedding_dim": 4, "seed": seed})
        losses.append((s["train_logloss"], s["test_logloss"]))
    assert max(t for t, _ in losses) < 0.72, losses
    assert max(t for _, t in losses) < 0.72, losses

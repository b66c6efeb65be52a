"""Fluid's scope API as infer scripts use it: resetting the auc layer's
states through ``global_scope()`` really resets what the auc op accumulates;
dense parameters of a local backend are reachable too, sparse tables refused."""

import numpy as np
import pytest

from pyfleet import fluid, metrics
from pyfleet.optimizer import SGD

L = fluid.layers
NT = 63


def _net(scope):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [3])
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        label = L.data("label", [1], dtype="int64")
        emb = L.sequence_pool(L.embedding(ids, [1000, 2], is_distributed=True,
                                          param_attr=fluid.ParamAttr(name="emb")), "sum")
        prob = L.fc(L.concat([x, emb], axis=1), 2, act="softmax",
                    param_attr=fluid.ParamAttr(name="fc_w"))
        avg = L.mean(L.cross_entropy(prob, label))
        auc_var, _batch_auc, states = L.auc(prob, label, num_thresholds=NT)
        SGD(0.1).minimize(avg)
    exe = fluid.Executor(fluid.CPUPlace())
    with fluid.scope_guard(scope):
        exe.run(startup)
    return main, exe, prob, auc_var, states


def _feed(rng, b=16):
    np.ones(b, dtype=np.int64)
    return {"x": rng.normal(size=(b, 3)).astype(np.float32),
            "ids": (rng.integers(0, 50, b).astype(np.int64), np.arange(b + 1)),
            "label": rng.integers(0, 2, (b, 1)).astype(np.int64)}


def _exact_bucketed(prob, label):
    pos, neg = metrics.count_buckets(prob[:, 1], label.reshape(-1), NT)
    return metrics.bucketed_auc(pos, neg)


def test_resetting_auc_states_through_the_scope_restarts_the_global_auc():
    scope = fluid.Scope()
    main, exe, prob, auc_var, states = _net(scope)
    test = main.clone(for_test=True)
    rng = np.random.default_rng(1)
    with fluid.scope_guard(scope):
        for _ in range(3):
            exe.run(main, feed=_feed(rng), fetch_list=[auc_var])
        names = [v.name for v in states]
        assert names == [f"_generated_var_{i}" for i in range(4)]   # Fluid's names
        assert np.array(fluid.global_scope().find_var(names[2]).get_tensor()).sum() + \
            np.array(fluid.global_scope().find_var(names[3]).get_tensor()).sum() == 48

        # the infer scripts' idiom
        place = fluid.CPUPlace()
        for name in names:
            param = fluid.global_scope().var(name).get_tensor()
            param_array = np.zeros(param._get_dims()).astype("int64")
            param.set(param_array, place)
        feed = _feed(rng)
        p, a = exe.run(test, feed=feed, fetch_list=[prob, auc_var])
    assert float(a) == pytest.approx(_exact_bucketed(np.asarray(p), feed["label"]))
    with fluid.scope_guard(scope):
        tensor = fluid.global_scope().find_var(names[2]).get_tensor()
        assert tensor._get_dims() == [1, NT + 1] and tensor.lod() == []
        assert np.array(tensor).sum() == int(feed["label"].sum())
    assert scope.find_var("no_such_var") is None


def test_dense_parameters_are_reachable_and_sparse_tables_refused():
    scope = fluid.Scope()
    main, _exe, _prob, _, _ = _net(scope)
    w = np.array(scope.find_var("fc_w").get_tensor())
    assert w.shape == (5, 2)
    np.testing.assert_array_equal(w, main.backend.pull_dense("fc_w"))
    scope.find_var("fc_w").get_tensor().set(np.full((5, 2), 0.5, np.float32), fluid.CPUPlace())
    np.testing.assert_array_equal(main.backend.pull_dense("fc_w"), np.full((5, 2), 0.5))
    with pytest.raises(ValueError, match="fc_w"):
        scope.find_var("fc_w").get_tensor().set(np.zeros(3), fluid.CPUPlace())
    with pytest.raises(ValueError, match="'emb' is a sparse table"):
        np.array(scope.find_var("emb").get_tensor())

"""save_inference_model(target_vars=[loss, auc_var]) writes a model that
load_inference_model loads and runs: the auc op is kept for an auc target and
counts from zero in the loading scope (as a fresh Fluid scope would)."""

import numpy as np
import pytest

from pyfleet import fluid, metrics

L = fluid.layers


def test_loss_and_auc_targets_round_trip(tmp_path):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [3])
        label = L.data("label", [1], dtype="int64")
        prob = L.fc(x, 2, act="softmax")
        avg = L.mean(L.cross_entropy(prob, label))
        auc_var, _, _ = L.auc(prob, label, num_thresholds=63)
        fluid.optimizer.SGD(0.1).minimize(avg)
    exe = fluid.Executor()
    exe.run(startup)
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(32, 3)).astype(np.float32),
            "label": rng.integers(0, 2, (32, 1))}
    for _ in range(3):
        exe.run(main, feed=feed, fetch_list=[avg])
    fluid.io.save_inference_model(str(tmp_path), ["x", "label"], [avg, auc_var], exe, main)
    test = main.clone(for_test=True)
    p, want_loss = exe.run(test, feed=feed, fetch_list=[prob, avg])
    pos, neg = metrics.count_buckets(np.asarray(p)[:, 1], feed["label"].reshape(-1), 63)
    with fluid.scope_guard(fluid.Scope()):
        prog, feeds, fetches = fluid.io.load_inference_model(str(tmp_path), exe)
        assert feeds == ["x", "label"] and len(fetches) == 2
        loss_val, auc_val = exe.run(prog, feed=feed, fetch_list=fetches)
    assert float(loss_val) == pytest.approx(float(want_loss), rel=1e-6)
    assert float(auc_val) == pytest.approx(metrics.bucketed_auc(pos, neg))
    # an auc target without its label fed is refused by name
    with pytest.raises(ValueError, match="'label'"):
        fluid.io.save_inference_model(str(tmp_path / "b"), ["x"], [auc_var], exe, main)

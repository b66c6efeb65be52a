"""What PaddleRec's runner asks of the executor and of fluid.io: fetches with
``return_numpy=False`` are LoDTensors (it asserts so, then reads them with
``np.array``), and an inference program (no optimizer) loads a checkpoint
trained with Adam: the weights, whatever rule's state the tables carry."""

import numpy as np

from pyfleet import fluid
from pyfleet.optimizer import Adam

L = fluid.layers


def _net(with_optimizer):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        ids = L.data("ids", [1], dtype="int64", lod_level=1)
        x = L.data("x", [3])
        label = L.data("label", [1], dtype="int64")
        emb = L.embedding(ids, size=[1000, 4], is_sparse=True,
                          param_attr=fluid.ParamAttr(name="emb"))
        h = L.concat([L.sequence_pool(emb, "sum"), x], axis=1)
        prob = L.fc(L.fc(h, 8, act="relu"), 2, act="softmax")
        cost = L.mean(L.cross_entropy(prob, label))
        if with_optimizer:
            Adam(0.05).minimize(cost)
    return main, startup, prob, cost


def _feed(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, 24).astype(np.int64)
    return {"ids": (ids, np.arange(0, 25, 3)), "x": rng.normal(size=(8, 3)).astype(np.float32),
            "label": rng.integers(0, 2, (8, 1)).astype(np.int64)}


def test_return_numpy_false_fetches_lodtensors():
    main, startup, prob, cost = _net(True)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    got = exe.run(main, feed=_feed(0), fetch_list=[cost, prob], return_numpy=False)
    assert all(isinstance(t, fluid.LoDTensor) and t._is_initialized() for t in got)
    assert np.array(got[0]).shape == (1,) and np.array(got[1]).shape == (8, 2)
    np.testing.assert_allclose(np.array(got[1]).sum(axis=1), 1.0, rtol=1e-6)
    assert got[1].lod() == []
    assert not fluid.LoDTensor()._is_initialized()


def test_an_inference_program_loads_a_checkpoint_trained_with_adam(tmp_path):
    main, startup, prob, _ = _net(True)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    for step in range(5):
        exe.run(main, feed=_feed(step))
    test = main.clone(for_test=True)
    want = exe.run(test, feed=_feed(9), fetch_list=[prob])[0]
    fluid.io.save_persistables(exe, str(tmp_path / "ckpt"), main)

    infer, infer_startup, infer_prob, _ = _net(False)     # PaddleRec's infer phase
    exe.run(infer_startup)
    before = exe.run(infer, feed=_feed(9), fetch_list=[infer_prob])[0]
    assert not np.allclose(before, want)
    fluid.io.load_persistables(exe, str(tmp_path / "ckpt"), infer)
    np.testing.assert_array_equal(exe.run(infer, feed=_feed(9), fetch_list=[infer_prob])[0],
                                  want)

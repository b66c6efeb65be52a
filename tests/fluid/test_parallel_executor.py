"""fluid.ParallelExecutor on CPU: the same steps as an Executor running the program
(one CPU place per process); GPU, NCCL trainers and per-device feeds refused by name."""

import numpy as np
import pytest

from pyfleet import fluid
from pyfleet.errors import UnsupportedError
from pyfleet.fluid import layers as L


def _build(seed=3):
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = seed
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [4])
        y = L.data("y", [1])
        loss = L.mean(L.square_error_cost(L.fc(L.fc(x, 8, act="relu"), 1), y))
        fluid.optimizer.SGD(0.05).minimize(loss)
    return main, startup, loss


def _feeds(n=4):
    """The same batch ``n`` times: the loss falls as the model fits it."""
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(6, 4)).astype("float32"),
             "y": rng.normal(size=(6, 1)).astype("float32")}
    return [batch] * n


def test_parallel_executor_steps_equal_an_executors():
    main, startup, loss = _build()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    pe = fluid.ParallelExecutor(use_cuda=False, loss_name=loss.name, main_program=main)
    assert pe.device_count == 1
    got = [float(np.asarray(pe.run([loss.name], feed=f)[0]).ravel()[0]) for f in _feeds()[:2]]
    got += [float(np.asarray(pe.run([loss], feed_dict=f)[0]).ravel()[0]) for f in _feeds()[2:]]
    pe.drop_local_exe_scopes()

    main2, startup2, loss2 = _build()
    exe2 = fluid.Executor(fluid.CPUPlace())
    exe2.run(startup2)
    want = [float(np.asarray(exe2.run(main2, feed=f, fetch_list=[loss2])[0]).ravel()[0])
            for f in _feeds()]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[-1] < got[0]                                  # it trains
    shared = fluid.ParallelExecutor(False, loss.name, main, share_vars_from=pe)
    (again,) = shared.run([loss], feed=[_feeds()[0]])         # a one-device feed list
    assert np.isfinite(np.asarray(again)).all()


@pytest.mark.parametrize("kwargs,match", [
    ({"use_cuda": True}, "use_cuda=True"),
    ({"use_cuda": False, "num_trainers": 2}, "num_trainers=2"),
])
def test_gpu_and_nccl_trainers_are_refused_by_name(kwargs, match):
    _build()
    with pytest.raises(UnsupportedError, match=match):
        fluid.ParallelExecutor(**kwargs)


def test_a_feed_per_device_and_a_foreign_share_vars_from_are_refused():
    main, startup, loss = _build()
    fluid.Executor(fluid.CPUPlace()).run(startup)
    pe = fluid.ParallelExecutor(False, loss.name, main)
    with pytest.raises(UnsupportedError, match="a feed per device"):
        pe.run([loss], feed=_feeds()[:2])
    with pytest.raises(TypeError, match="share_vars_from must be a ParallelExecutor"):
        fluid.ParallelExecutor(False, loss.name, main, share_vars_from="pe")

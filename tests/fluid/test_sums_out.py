"""``fluid.layers.sums(input, out=)`` writes the sum into ``out`` (Fluid's), and the
gradient flows through it to every input. Forward against numpy, gradients against
central differences."""

import numpy as np
from support.fluid import check_gradients

from pyfleet import fluid
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _net():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        init = fluid.initializer.Uniform(-1.0, 1.0)
        a = L.create_parameter([2, 3], F64, name="a", default_initializer=init)
        b = L.create_parameter([2, 3], F64, name="b", default_initializer=init)
        total = L.create_tensor(F64, "total")
        got = L.sums([L.tanh(a), b], out=total)
        weight = L.data("loss_w", [2, 3], dtype=F64, append_batch_size=False)
        loss = L.mean(L.elementwise_mul(total, weight))
        SGD(0.1).minimize(loss)
    return main, startup, loss, total, got


def test_sums_writes_into_out_and_returns_it():
    main, startup, _, total, got = _net()
    assert got is total
    exe = fluid.Executor()
    exe.run(startup)
    a = main._backend.dense["a"].pull().astype(np.float64)
    b = main._backend.dense["b"].pull().astype(np.float64)
    value, = exe.run(main, feed={"loss_w": np.ones((2, 3))}, fetch_list=[total])
    np.testing.assert_allclose(np.asarray(value), np.tanh(a) + b, rtol=1e-5, atol=1e-6)


def test_sums_into_out_passes_gradients_to_every_input():
    main, startup, loss, _, _ = _net()
    feed = {"loss_w": np.random.default_rng(0).normal(size=(2, 3))}
    assert check_gradients(main, startup, loss, feed) == 12

"""``fluid.layers.assign`` of a Variable passes the gradient through, into a new
variable or into one of ``create_tensor`` (as Fluid: it does not stop gradients);
a constant (numpy) assign has none. Forward against numpy, gradients against
central differences."""

import numpy as np
import pytest
from support.fluid import check_gradients

from pyfleet import fluid
from pyfleet.optimizer import SGD

L = fluid.layers
F64 = "float64"


def _net(into):
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        w = L.create_parameter([3, 4], F64, name="w",
                               default_initializer=fluid.initializer.Uniform(-1.0, 1.0))
        h = L.tanh(w)
        if into == "new":
            out = L.assign(h)
        else:
            out = L.create_tensor(F64, "copied")
            L.assign(h, out)
        weight = L.data("loss_w", [3, 4], dtype=F64, append_batch_size=False)
        loss = L.mean(L.elementwise_mul(out, weight))
        SGD(0.1).minimize(loss)
    return main, startup, loss, out


@pytest.mark.parametrize("into", ["new", "create_tensor"])
def test_assign_gradient_matches_central_differences(into):
    main, startup, loss, _ = _net(into)
    feed = {"loss_w": np.random.default_rng(0).normal(size=(3, 4))}
    assert check_gradients(main, startup, loss, feed) == 12


@pytest.mark.parametrize("into", ["new", "create_tensor"])
def test_assign_forward_and_sgd_step_match_numpy(into):
    main, startup, loss, out = _net(into)
    exe = fluid.Executor()
    exe.run(startup)
    w0 = main._backend.dense["w"].pull().astype(np.float64)
    weight = np.random.default_rng(1).normal(size=(3, 4))
    got, = exe.run(main, feed={"loss_w": weight}, fetch_list=[out])
    np.testing.assert_allclose(np.asarray(got), np.tanh(w0), rtol=1e-6)
    # d mean(tanh(w) * weight) / dw = weight * (1 - tanh(w)^2) / 12, one SGD(0.1) step
    want = w0 - 0.1 * weight * (1 - np.tanh(w0) ** 2) / 12
    np.testing.assert_allclose(main._backend.dense["w"].pull(), want, rtol=1e-5, atol=1e-7)


def test_constant_assign_has_no_gradient():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        w = L.create_parameter([2], F64, name="w")
        c = L.assign(np.array([1.0, 2.0]))
        assert c.stop_gradient
        loss = L.mean(L.elementwise_mul(w, L.cast(c, F64)))
        SGD(0.1).minimize(loss)
    assert check_gradients(main, startup, loss, {}) == 2    # w's, none for the constant

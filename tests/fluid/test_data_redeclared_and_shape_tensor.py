"""Two Fluid behaviours PaddleRec's metric tests rely on: ``fluid.data`` declared
again in the same form is the same input (another form: an error naming both,
as Fluid), and ``fill_constant`` takes its shape as one int tensor
(``fill_constant(shape=fluid.layers.shape(label), ...)``), read when the step runs."""

import numpy as np
import pytest

from pyfleet import fluid

L = fluid.layers


def test_data_declared_again():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        a = fluid.data(name="label", shape=[-1, 1], dtype="int64")
        assert fluid.data(name="label", shape=[-1, 1], dtype="int64") is a
        assert L.data(name="label", shape=[1], dtype="int64") is a   # the same form
        with pytest.raises(ValueError, match=r"'label' is declared already with shape "
                                             r"\(-1, 1\).*\(-1, 10\)"):
            fluid.data(name="label", shape=[-1, 10], dtype="int64")


def test_fill_constant_with_a_shape_tensor():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.data(name="x", shape=[-1, 3], dtype="float32")
        ones = L.fill_constant(shape=L.shape(x), dtype="float32", value=1.5)
        total = L.reduce_sum(ones)
        with pytest.raises(ValueError, match="must be 1-D of a known length"):
            L.fill_constant(shape=x, dtype="float32", value=1.0)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    for rows in (4, 7):
        xb = np.zeros((rows, 3), np.float32)
        got, s = exe.run(main, feed={"x": xb}, fetch_list=[ones, total])
        np.testing.assert_array_equal(got, np.full((rows, 3), 1.5, np.float32))
        np.testing.assert_allclose(s, [rows * 3 * 1.5])

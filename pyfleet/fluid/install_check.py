"""``fluid.install_check.run_check()``: train a two-layer network for a few
steps on the CPU and say that pyfleet works (Fluid's post-install check)."""

import numpy as np

__all__ = ["run_check"]


def run_check():
    """Raise if a small network does not train; print a line if it does."""
    from pyfleet.fluid import layers as L
    from pyfleet.fluid import unique_name
    from pyfleet.fluid.executor import Executor
    from pyfleet.fluid.framework import Program, program_guard
    from pyfleet.fluid.tensor import CPUPlace, Scope, scope_guard
    from pyfleet.optimizer import SGD
    main, startup = Program(), Program()
    with program_guard(main, startup), unique_name.guard():
        x = L.data("x", [2], dtype="float32")
        y = L.data("y", [1], dtype="float32")
        loss = L.mean(L.square_error_cost(L.fc(L.fc(x, 4, act="relu"), 1), y))
        SGD(0.1).minimize(loss)
    exe = Executor(CPUPlace())
    with scope_guard(Scope()):
        exe.run(startup)
        feed = {"x": np.ones((4, 2), np.float32), "y": np.ones((4, 1), np.float32)}
        first = float(exe.run(main, feed=feed, fetch_list=[loss])[0][0])
        for _ in range(20):
            last = float(exe.run(main, feed=feed, fetch_list=[loss])[0][0])
    if not last < first:
        raise RuntimeError(f"install check: the loss did not fall ({first} -> {last})")
    print("Your pyfleet (Fluid API) works well on SINGLE CPU.")
    print("Your pyfleet (Fluid API) is installed successfully!")

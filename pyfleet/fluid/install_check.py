"""``fluid.install_check.run_check()``: train a two-layer network for a few
steps on the CPU and say that pyfleet works (Fluid's post-install check)."""

import numpy as np

__all__ = ["run_check"]


def run_check():
    """Raise if a small network does not train; print a line if it does."""
    from pyfleet import fluid
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = fluid.layers.data("x", [2], dtype="float32")
        y = fluid.layers.data("y", [1], dtype="float32")
        loss = fluid.layers.mean(fluid.layers.square_error_cost(
            fluid.layers.fc(fluid.layers.fc(x, 4, act="relu"), 1), y))
        fluid.optimizer.SGD(0.1).minimize(loss)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    with fluid.scope_guard(scope):
        exe.run(startup)
        feed = {"x": np.ones((4, 2), np.float32), "y": np.ones((4, 1), np.float32)}
        first = float(exe.run(main, feed=feed, fetch_list=[loss])[0][0])
        for _ in range(20):
            last = float(exe.run(main, feed=feed, fetch_list=[loss])[0][0])
    if not last < first:
        raise RuntimeError(f"install check: the loss did not fall ({first} -> {last})")
    print("Your pyfleet (Fluid API) works well on SINGLE CPU.")
    print("Your pyfleet (Fluid API) is installed successfully!")

"""Running the ``pyfleet`` command line as a user would, from the CLI tests."""

import subprocess
import sys


def pyfleet(*args, cwd, env=None, timeout=300):
    """``python -m pyfleet.cli ARGS`` in ``cwd``: the finished process, its output
    captured as text (a bounded run: ``timeout`` seconds)."""
    return subprocess.run([sys.executable, "-m", "pyfleet.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def save_small_model(where, data, format="criteo", batch_size=50, passes=1):
    """Train a small DNN (embedding dim 4, one layer of 8) in one process on
    ``data`` for ``passes`` passes and save it as an inference model at
    ``where`` (what ``pyfleet predict`` reads); returns ``where``."""
    from pyfleet import fluid, models
    from pyfleet.data import Dataset
    from pyfleet.fluid import inference
    from pyfleet.trainer import feed_of
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup):
        m = models.build("dnn", num_dense=13, num_slots=26, embedding_dim=4, layers=(8,))
        fluid.optimizer.Adam(learning_rate=0.01).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    for _ in range(passes):
        for b in Dataset(str(data), format=format, batch_size=batch_size):
            exe.run(main, feed=feed_of(b, m), fetch_list=[m.avg_cost])
    inference.save(where, main, [v.name for v in m.inputs if v is not m.label], [m.predict],
                   inference.LocalSource(main.backend))
    return where

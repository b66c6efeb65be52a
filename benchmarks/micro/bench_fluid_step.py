"""Time one training step of the reference DNN against its matmuls alone.

``python benchmarks/micro/bench_fluid_step.py [--batch 512] [--steps 40]`` builds the
reference network (26 slots sharing one sparse table, dim 16, sum-pooled,
13 dense features, fc 256-128-64 relu, fc 2 softmax, Adam, LocalBackend),
runs ``Executor.run`` steps on Zipf-distributed ids, and prints the step time
beside the time of the same 12 float32 matmuls in plain numpy (measured in
the same run), so the engine's overhead reads as a ratio on any machine.
Not part of the test suite.
"""

import argparse
import time

import numpy as np

from pyfleet import fluid, models
from pyfleet.optimizer import Adam


def _clock(fn, n):
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - w0) / n * 1e3, (time.process_time() - c0) / n * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    b = args.batch
    main_p, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main_p, startup), fluid.unique_name.guard():
        m = models.DNN()
        Adam(0.001).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    rng = np.random.default_rng(0)

    def batch():
        f = {"dense_input": rng.random((b, 13), dtype=np.float32),
             "label": rng.integers(0, 2, (b, 1))}
        for i in range(1, 27):
            ids = (rng.zipf(1.2, b) % 100000 + (i << 32)).astype(np.int64)
            f[f"C{i}"] = (ids, np.arange(b + 1))
        return f

    feeds = [batch() for _ in range(8)]
    fetch = [m.avg_cost, m.auc, m.batch_auc]
    for f in feeds[:3]:
        exe.run(main_p, feed=f, fetch_list=fetch)
    step = _clock(lambda i: exe.run(main_p, feed=feeds[i % 8], fetch_list=fetch), args.steps)
    x = rng.random((b, 26 * 16 + 13), dtype=np.float32)
    ws = [rng.random(s, dtype=np.float32)
          for s in [(429, 256), (256, 128), (128, 64), (64, 2)]]

    def matmuls(_):
        h, acts = x, []
        for w in ws:
            acts.append(h)
            h = h @ w
        g = np.ones_like(h)
        for w, a in zip(reversed(ws), reversed(acts)):
            a.T @ g
            g = g @ w.T

    base = _clock(matmuls, args.steps)
    print(f"{'':34s}{'wall ms':>10s}{'cpu ms':>10s}")
    print(f"{'DNN step (fwd+bwd+Adam), batch ' + str(b):34s}{step[0]:10.2f}{step[1]:10.2f}")
    print(f"{'its 12 matmuls alone (numpy)':34s}{base[0]:10.2f}{base[1]:10.2f}")
    print(f"ratio step / matmuls (cpu): {step[1] / base[1]:.2f}")


if __name__ == "__main__":
    main()

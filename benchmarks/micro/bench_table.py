"""SparseTable pull/push throughput against numpy baselines measured in the same run.

    python benchmarks/micro/bench_table.py [--rows 10000000] [--batch 1000000] [--dims 16 64]

For each dim and key distribution (uniform, Zipf 1.1) over a table of --rows
rows, batches of --batch keys:
- pull keys/s vs ``np.take(dense, idx, axis=0, out=...)`` on a float32 array of
  the same shape (target: pull >= 1.2x np.take);
- push with Adam keys/s vs a numpy lazy-Adam reference (take rows and states,
  update, scatter back) (target: >= 3x numpy);
- 1 and 2 threads (the total must not fall below 1 thread);
- bytes per row for dim 16 with Adam after inserting --rows keys (RSS delta),
  against the payload key + weights + m + v + beta powers (target <= 1.25x).
"""

import argparse
import gc
import threading
import time

import numpy as np

import pyfleet
from pyfleet.optimizer import Adam


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def best_of(fn, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def zipf_indices(rng, n, rows, a=1.1):
    # Zipf ranks folded into the table, then scattered by a fixed permutation
    # so popular keys are not neighbours in memory.
    ranks = (rng.zipf(a, n) - 1) % rows
    return ((ranks * 2654435761) % rows).astype(np.int64)


def in_threads(fns):
    ts = [threading.Thread(target=fn) for fn in fns]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def numpy_lazy_adam(w, m, v, b1p, b2p, idx, g, lr=0.001, b1=0.9, b2=0.999, eps=1e-8):
    uniq, inv = np.unique(idx, return_inverse=True)
    gs = np.zeros((len(uniq), w.shape[1]), np.float32)
    np.add.at(gs, inv, g) if len(uniq) != len(idx) else gs.__setitem__(inv, g)
    mw, vw = m[uniq], v[uniq]
    p1, p2 = b1p[uniq], b2p[uniq]
    mw = b1 * mw + (1 - b1) * gs
    vw = b2 * vw + (1 - b2) * gs * gs
    lr_t = (lr * np.sqrt(1 - p2) / (1 - p1))[:, None]
    w[uniq] -= lr_t * mw / (np.sqrt(vw) + (eps * np.sqrt(1 - p2))[:, None])
    m[uniq], v[uniq] = mw, vw
    b1p[uniq], b2p[uniq] = p1 * b1, p2 * b2


def bench_dim(dim, rows, batch, rng, report):
    keys_all = np.arange(rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    gc.collect()
    rss0 = rss_bytes()
    table = pyfleet.SparseTable(dim, Adam(learning_rate=0.001))
    step = 1 << 20
    for s in range(0, rows, step):
        table.pull(keys_all[s:s + step])
    rss1 = rss_bytes()
    payload = 8 + 3 * dim * 4 + 8
    report["memory"].append((dim, (rss1 - rss0) / rows, payload))

    dense = np.random.default_rng(0).random((rows, dim), dtype=np.float32)
    out = np.empty((batch, dim), np.float32)
    grads = rng.normal(0, 1, (batch, dim)).astype(np.float32)
    m = np.zeros_like(dense)
    v = np.zeros_like(dense)
    b1p = np.full(rows, 0.9, np.float32)
    b2p = np.full(rows, 0.999, np.float32)
    for dist in ("uniform", "zipf1.1"):
        idx = rng.integers(0, rows, batch) if dist == "uniform" else zipf_indices(rng, batch, rows)
        ks = keys_all[idx]
        # Each closure binds this iteration's arrays (default arguments), and the
        # arrays are dropped after the loop to measure the next dim's RSS.
        t_take = best_of(lambda d=dense, i=idx: np.take(d, i, axis=0, out=out))
        t_pull = best_of(lambda t=table, k=ks: t.pull(k, out=out))
        t_np_adam = best_of(lambda d=dense, mm=m, vv=v, i=idx:
                            numpy_lazy_adam(d, mm, vv, b1p, b2p, i, grads), 2)
        t_push = best_of(lambda t=table, k=ks: t.push(k, grads))
        outs = [np.empty((batch, dim), np.float32) for _ in range(2)]
        t_pull2 = min(in_threads([lambda o=o, t=table, k=ks: t.pull(k, out=o) for o in outs])
                      for _ in range(3))
        t_push2 = min(in_threads([lambda t=table, k=ks: t.push(k, grads)] * 2)
                      for _ in range(3))
        report["rows"].append({
            "dim": dim, "dist": dist,
            "take": batch / t_take, "pull": batch / t_pull, "pull2": 2 * batch / t_pull2,
            "np_adam": batch / t_np_adam, "push": batch / t_push, "push2": 2 * batch / t_push2})
    del table, dense, m, v
    gc.collect()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1_000_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 64])
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    report = {"rows": [], "memory": []}
    for dim in args.dims:
        bench_dim(dim, args.rows, args.batch, rng, report)

    print(f"table rows {args.rows:,}, batch {args.batch:,} keys; Mkeys/s (best of 3)")
    hdr = (f"{'dim':>4} {'keys':>8} | {'np.take':>8} {'pull':>8} {'ratio':>6} {'pull 2T':>8}"
           f" | {'np Adam':>8} {'push':>8} {'ratio':>6} {'push 2T':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in report["rows"]:
        print(f"{r['dim']:>4} {r['dist']:>8} | {r['take'] / 1e6:8.2f} {r['pull'] / 1e6:8.2f} "
              f"{r['pull'] / r['take']:6.2f} {r['pull2'] / 1e6:8.2f} | {r['np_adam'] / 1e6:8.2f} "
              f"{r['push'] / 1e6:8.2f} {r['push'] / r['np_adam']:6.2f} {r['push2'] / 1e6:8.2f}")
    print("targets: pull/np.take >= 1.2, push/numpy-Adam >= 3, 2 threads >= 1 thread")
    print()
    print(f"{'dim':>4} {'bytes/row (RSS)':>16} {'payload':>8} {'ratio':>6}   (target <= 1.25)")
    for dim, per_row, payload in report["memory"]:
        print(f"{dim:>4} {per_row:16.1f} {payload:8d} {per_row / payload:6.2f}")


if __name__ == "__main__":
    main()

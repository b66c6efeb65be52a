"""Compact rows: bytes per row and pull/push throughput of fp16, bf16 and 8-bit
state (fp16_q8, bf16_q8) tables against the fp32 table, measured in one run.

    python benchmarks/micro/bench_storage.py [--rows 3000000] [--batch 200000] [--dim 16]
                                       [--reps 30] [--clock wall|cpu]

A table of --dim with Adam is built for each storage type (fp32, fp16, bf16,
fp16_q8, bf16_q8) and filled with --rows keys (RSS delta of the process = bytes
per row, index and metadata included); all five stay alive. Then --reps times,
the tables in turn (the first one rotating), a batch of --batch uniform keys
(1 thread) is pulled into a preallocated out and pushed, each timed once.
Each storage's speed is the median over the reps, and its ratio the median of
each rep's ratio to the fp32 table's in the same rep, with the 10th-90th
percentiles of both.

Why interleaved: the machine's speed drifts by tens of percent within minutes
(other jobs, other tenants of the L3), and an earlier form of this benchmark
that built and measured one table after another (best of 5, a few rounds) saw
the same storage pull 35-57 M keys/s from one round to the next; ratios of
tables measured minutes apart moved 0.78-1.05 for the same build. Pulls
alternated table by table put the same drift on every table.

Targets: fp16/bf16 rows (with 8-bit state) <= 112 bytes of RSS per row at dim 16
with Adam; pull and push keys/s >= 0.9x fp32.
"""

import argparse
import gc
import time

import numpy as np

import pyfleet
from pyfleet.optimizer import Adam

STORAGES = ("fp32", "fp16", "bf16", "fp16_q8", "bf16_q8")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def build(storage, dim, rows, keys_all):
    gc.collect()
    rss0 = rss_bytes()
    table = pyfleet.SparseTable(dim, Adam(learning_rate=0.001), seed=1, storage=storage)
    step = 1 << 20
    for s in range(0, rows, step):
        table.pull(keys_all[s:s + step])
    return table, (rss_bytes() - rss0) / rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3_000_000)
    ap.add_argument("--batch", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--reps", type=int, default=30,
                    help="times each table's pull and push are timed, tables alternated")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: this process's CPU time (time.process_time), steadier than "
                         "wall time on a machine shared with other jobs (1 thread either way)")
    args = ap.parse_args()
    if args.reps < 1 or args.rows < 1 or args.batch < 1 or args.dim < 1:
        ap.error("--rows, --batch, --dim and --reps must be positive")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(1)
    keys_all = np.arange(args.rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    key_sets = [keys_all[rng.integers(0, args.rows, args.batch)] for _ in range(2)]
    grads = rng.normal(0, 1, (args.batch, args.dim)).astype(np.float32)
    out = np.empty((args.batch, args.dim), np.float32)

    tables, per_row = {}, {}
    for s in STORAGES:
        tables[s], per_row[s] = build(s, args.dim, args.rows, keys_all)
    for t in tables.values():  # every key set's rows pushed once before timing
        for ks in key_sets:
            t.push(ks, grads)
            t.pull(ks, out=out)

    speed = {s: {"pull": [], "push": []} for s in STORAGES}
    for rep in range(args.reps):
        ks = key_sets[rep % 2]
        first = rep % len(STORAGES)
        for s in STORAGES[first:] + STORAGES[:first]:
            t = tables[s]
            t0 = clock()
            t.pull(ks, out=out)
            t1 = clock()
            t.push(ks, grads)
            t2 = clock()
            speed[s]["pull"].append(args.batch / (t1 - t0))
            speed[s]["push"].append(args.batch / (t2 - t1))

    print(f"dim {args.dim}, Adam, {args.rows:,} rows, batches of {args.batch:,} uniform keys, "
          f"1 thread, {args.clock} clock, {args.reps} reps alternating the tables")
    print("M keys/s: median [p10-p90] over the reps; ratio: median [p10-p90] of each "
          "rep's ratio to fp32's")
    hdr = (f"{'storage':>7} | {'B/row':>5} {'ratio':>5} | {'pull Mk/s':>19} {'ratio':>16} | "
           f"{'push Mk/s':>19} {'ratio':>16}")
    print(hdr)
    print("-" * len(hdr))
    base = {k: np.array(speed["fp32"][k]) for k in ("pull", "push")}
    for s in STORAGES:
        cells = []
        for k in ("pull", "push"):
            v = np.array(speed[s][k])
            q = np.percentile(v, [50, 10, 90]) / 1e6
            r = np.percentile(v / base[k], [50, 10, 90])
            cells.append(f"{q[0]:6.2f} [{q[1]:5.2f}-{q[2]:5.2f}] "
                         f"{r[0]:4.2f} [{r[1]:4.2f}-{r[2]:4.2f}]")
        print(f"{s:>7} | {per_row[s]:5.0f} {per_row[s] / per_row['fp32']:5.2f} | "
              f"{cells[0]} | {cells[1]}")
    print("targets: 16-bit rows <= 112 B/row (dim 16, Adam); pull and push ratio >= 0.90")


if __name__ == "__main__":
    main()

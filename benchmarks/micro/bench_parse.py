"""Criteo TSV parsing speed: the Cython parser against a plain-Python baseline.

Generates realistic lines with the synthetic generator, then measures on one
core, in the same run:

- ``cython parse``: ``pyfleet.data.parse_criteo_bytes`` on one in-memory buffer
  (labels, log-transformed dense, 26 hashed ids per line);
- ``python split``: the usual pure-Python reader on the same lines (split on
  tab, ``int()`` and ``log1p`` of the dense fields, Python ``hash`` of
  ``(slot, value)`` for the categorical ones, rows appended to lists, then
  numpy arrays);
- ``reader plain`` / ``reader gzip``: ``pyfleet.data.Dataset`` end to end, file
  on disk to batches of 512.

Prints a table of lines/s and the ratio to the Python baseline. Targets:
the Cython parser >= 1,000,000 lines/s and >= 50x the baseline.

    python benchmarks/micro/bench_parse.py [--rows 200000] [--baseline-rows 50000] [--repeat 5]
"""

import argparse
import gzip
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyfleet.data import Dataset, parse_criteo_bytes, synthetic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from harness import load_note  # noqa: E402


def python_baseline(buf: bytes):
    labels, dense, ids = [], [], []
    for line in buf.split(b"\n"):
        if not line:
            continue
        f = line.split(b"\t")
        labels.append(int(f[0]))
        dense.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in f[1:14]])
        ids.append([hash((j, x)) & 0xFFFFFFFFFFFFFFFF for j, x in enumerate(f[14:40])])
    return (np.array(labels, dtype=np.float32), np.array(dense, dtype=np.float32),
            np.array(ids, dtype=np.uint64))


def best_of(repeat, fn):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--baseline-rows", type=int, default=50_000,
                    help="lines given to the slow Python baseline (a prefix of the same data)")
    ap.add_argument("--repeat", type=int, default=5, help="best of this many runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="pyfleet-bench-parse-")
    try:
        t0 = time.perf_counter()
        info = synthetic.generate(tmp, args.rows, seed=args.seed, test_fraction=0.0)
        gen_s = time.perf_counter() - t0
        with open(info["train"], "rb") as f:
            buf = f.read()
        n = buf.count(b"\n")
        cut = 0
        for _ in range(min(args.baseline_rows, n)):
            cut = buf.index(b"\n", cut) + 1
        small = buf[:cut]
        n_small = small.count(b"\n")
        gz = os.path.join(tmp, "train.tsv.gz")
        with gzip.open(gz, "wb", compresslevel=1) as f:
            f.write(buf)

        rows = []
        t_py, (py_labels, _, _) = best_of(args.repeat, lambda: python_baseline(small))
        assert py_labels.shape[0] == n_small
        rows.append(("python split", n_small, t_py))
        t_cy, r = best_of(args.repeat, lambda: parse_criteo_bytes(buf))
        assert r["examples"] == n and r["malformed"] == 0
        rows.append(("cython parse", n, t_cy))

        def read_all(path):
            ds = Dataset(path, format="criteo", batch_size=512)
            got = sum(len(b) for b in ds)
            assert got == n, (got, n)
            return got

        rows.append(("reader plain", n, best_of(args.repeat, lambda: read_all(info["train"]))[0]))
        rows.append(("reader gzip", n, best_of(args.repeat, lambda: read_all(gz))[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    base = n_small / t_py
    print(f"Criteo TSV, {n} synthetic lines ({len(buf) / n:.0f} bytes/line, generated in "
          f"{gen_s:.1f} s), one core, best of {args.repeat} runs each; baseline on the first "
          f"{n_small} lines")
    print(f"{'method':<14} {'lines':>9} {'seconds':>9} {'lines/s':>12} {'vs python':>10}")
    for name, lines, sec in rows:
        rate = lines / sec
        print(f"{name:<14} {lines:>9} {sec:>9.3f} {rate:>12,.0f} {rate / base:>9.1f}x")
    cy = n / t_cy
    print(f"{load_note()} (1 min, during the run) on {os.cpu_count()} cores")
    print(f"target: cython parse >= 1,000,000 lines/s: {'met' if cy >= 1e6 else 'NOT met'} "
          f"({cy:,.0f}); >= 50x python: {'met' if cy / base >= 50 else 'NOT met'} "
          f"({cy / base:.0f}x)")


if __name__ == "__main__":
    main()

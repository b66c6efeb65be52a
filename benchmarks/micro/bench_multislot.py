"""Fluid's MultiSlot text (what ``fluid.DatasetFactory``'s datasets and PaddleRec's
readers feed): the compiled parser against a plain-Python reading of the same lines.

Lines shaped like a CTR sample: 13 dense floats, 26 sparse slots, a label; in the
``fixed`` layout every slot holds one id, in ``ragged`` 1-3. Prints lines/s of
``pyfleet.data.multislot.parse_multislot`` and of the Python reading (split each
line, walk its slots, ``int``/``float`` each value, numpy arrays at the end), best
of ``--repeat``, their ratio, CPU time (one core), and the load average.

    python benchmarks/micro/bench_multislot.py [--lines 20000] [--repeat 3]
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from pyfleet.data.multislot import parse_multislot

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from harness import load_note  # noqa: E402


class Var:
    def __init__(self, name, dtype, lod_level, per=1):
        self.name, self.dtype, self.lod_level = name, np.dtype(dtype), lod_level
        self.shape = (-1, per)


VARS = ([Var("dense", "float32", 0, 13)] + [Var(f"C{i}", "int64", 1) for i in range(26)]
        + [Var("label", "int64", 0)])


def make(lines, ragged, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(lines):
        parts = ["13"] + [f"{x:.4f}" for x in rng.random(13)]
        for _ in range(26):
            c = int(rng.integers(1, 4)) if ragged else 1
            parts += [str(c)] + [str(int(x)) for x in rng.integers(0, 2 ** 40, c)]
        parts += ["1", str(int(rng.integers(0, 2)))]
        out.append(" ".join(parts))
    return ("\n".join(out) + "\n").encode()


def python_reading(data, use_vars):
    cols = {v.name: ([], []) for v in use_vars}
    for line in data.split(b"\n"):
        t = line.split()
        if not t:
            continue
        pos = 0
        for v in use_vars:
            c = int(t[pos])
            conv = float if v.dtype.kind == "f" else int
            vals, lens = cols[v.name]
            vals.extend(conv(x) for x in t[pos + 1:pos + 1 + c])
            lens.append(c)
            pos += c + 1
    return {k: (np.array(vals, dtype=next(v.dtype for v in use_vars if v.name == k)),
                np.array(lens, np.int64)) for k, (vals, lens) in cols.items()}


def best(fn, repeat):
    wall, cpu = 1e9, 1e9
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{'layout':8s} {'parser':10s} {'MB':>6s} {'lines/s':>11s} {'CPU ms':>8s} {'/ python':>9s}")
    for layout in ("fixed", "ragged"):
        data = make(a.lines, layout == "ragged")
        got, _ = parse_multislot(data, VARS)
        ref = python_reading(data, VARS)
        for v in VARS:   # the same numbers, or the comparison means nothing
            g = got[v.name][0] if v.lod_level else got[v.name].reshape(-1)
            assert np.array_equal(g, ref[v.name][0]), v.name
        pw, pc = best(lambda d=data: python_reading(d, VARS), a.repeat)
        cw, cc = best(lambda d=data: parse_multislot(d, VARS), a.repeat)
        mb = len(data) / 1e6
        print(f"{layout:8s} {'python':10s} {mb:6.1f} {a.lines / pw:11,.0f} {pc * 1e3:8.0f} {1:9.2f}")
        print(f"{layout:8s} {'compiled':10s} {mb:6.1f} {a.lines / cw:11,.0f} {cc * 1e3:8.0f} "
              f"{pw / cw:9.2f}")
    print(load_note())


if __name__ == "__main__":
    main()

"""Instructions per pushed key of each row storage (dim 16, Adam), counted by
callgrind: a figure that does not depend on the machine's load.

    python benchmarks/micro/push_instructions.py [--storages fp32,fp16,bf16,fp16_q8,bf16_q8]

For each storage the same program (20,000 rows pulled, then PUSHES pushes of
all of them) runs under `valgrind --tool=callgrind
--toggle-collect='pyfleet::SparseTable::Push(*'` with 1 and with 4 pushes;
the difference over 3 x 20,000 keys is the cost of a push of an existing row.
Needs valgrind on PATH.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROWS = 20000

LOOP = """
import sys
import numpy as np
import pyfleet
from pyfleet.optimizer import Adam
storage, pushes, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = pyfleet.SparseTable(16, Adam(learning_rate=0.001), seed=1, storage=storage)
keys = np.arange(1, n + 1, dtype=np.uint64)
t.pull(keys)
g = (np.random.default_rng(0).standard_normal((n, 16)) * 0.01).astype(np.float32)
for _ in range(pushes):
    t.push(keys, g)
"""


def collected(storage, pushes, out_dir):
    out = os.path.join(out_dir, f"cg.{storage}.{pushes}")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           "--toggle-collect=pyfleet::SparseTable::Push(*",
           sys.executable, "-c", LOOP, storage, str(pushes), str(ROWS)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=True)
    m = re.search(r"Collected : (\d+)", run.stderr)
    if not m:
        raise RuntimeError(f"no callgrind total for {storage}:\n{run.stderr[-2000:]}")
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--storages", default="fp32,fp16,bf16,fp16_q8,bf16_q8")
    args = ap.parse_args()
    storages = args.storages.split(",")
    per_key = {}
    with tempfile.TemporaryDirectory() as d:
        for s in storages:
            per_key[s] = (collected(s, 4, d) - collected(s, 1, d)) / (3 * ROWS)
    base = per_key.get("fp32")
    print(f"{'storage':>8} | {'instr/key':>9} | {'/ fp32':>6}")
    for s in storages:
        ratio = f"{per_key[s] / base:6.2f}" if base else "     -"
        print(f"{s:>8} | {per_key[s]:9.0f} | {ratio}")


if __name__ == "__main__":
    main()

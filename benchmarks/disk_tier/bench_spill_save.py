"""A full save of a table whose rows are on disk and not in the page cache.

    python benchmarks/disk_tier/bench_spill_save.py [--rows 6000000] [--budget 150000000] [--dir DIR]

Creates --rows rows of dim 16 (Adam, fp32, one push each) in a table with a
disk tier of --budget bytes, syncs, drops the page cache (needs root: writes
/proc/sys/vm/drop_caches; without it the figure is a save from the page
cache, and the program says so), then times table.save(). Run it with two
builds to compare (e.g. an old build installed in a scratch venv). The save
reads the spilled rows in the spill file's order.
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=6_000_000)
    ap.add_argument("--budget", type=int, default=150_000_000)
    ap.add_argument("--dir", default=None, help="where the spill file and the save go "
                                                "(default: a temporary directory)")
    args = ap.parse_args()
    import pyfleet
    from pyfleet.optimizer import Adam

    d = tempfile.mkdtemp(dir=args.dir)
    try:
        table = pyfleet.SparseTable(16, Adam(learning_rate=0.001), seed=1,
                                    memory_budget=args.budget, spill_dir=d)
        keys = np.arange(args.rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        grads = np.full((1 << 18, 16), 0.01, np.float32)
        for s in range(0, args.rows, 1 << 18):
            k = keys[s:s + (1 << 18)]
            table.pull(k)
            table.push(k, grads[:len(k)])
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            cache = "page cache dropped"
        except OSError as e:
            cache = f"page cache NOT dropped ({e.strerror}): a save from memory"
        c0, w0 = time.process_time(), time.perf_counter()
        table.save(os.path.join(d, "ckpt"))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(f"{pyfleet.__file__}: {len(table):,} rows, "
              f"{table.stats()['spilled_rows']:,} on disk; {cache}; "
              f"save {wall:.1f} s wall, {cpu:.1f} s CPU")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()

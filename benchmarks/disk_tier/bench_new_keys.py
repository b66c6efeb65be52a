"""A table with a disk tier while new keys keep coming, against the
all-in-RAM table on the same calls: CPU time a step as its index grows.

    python benchmarks/disk_tier/bench_new_keys.py [--budget 400M] [--steps 1200] [--keys 13312]
                                        [--window 100] [--order ahead|plain] [--spill-dir DIR]

Each step pulls and pushes --keys keys never seen before (26 ids an example
x 512, the headline's shape; Adam, dim 16, fp32), in the service's order by
default (`ahead`: the next step's pull before this step's push, as a server
answering a worker's early pull sees them; `plain`: pull then push). So the
index grows every call, the rows the budget buys fall with it, the row
store's limit moves down every few dozen steps and the shards move their
rows below it (docs/disk_tier.md, "Row memory follows the budget down"), and
nearly every new row goes to disk a few steps after it came. Each table runs
in its own child process; printed per window of --window steps: ms of CPU a
step (the process's, the kernel's writes included) for both tables and their
ratio, then the rows moved below the limit, spilled and read back. The all-in-
RAM table of 1,200 steps holds 16M rows (about 4 GB); --steps 600 halves it.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pyfleet.cli.units import byte_count

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from harness import json_child, load_note  # noqa: E402

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def child(args):
    import pyfleet
    from pyfleet.optimizer import Adam

    kw = {} if args.budget is None else {"memory_budget": args.budget,
                                         "spill_dir": args.spill_dir}
    t = pyfleet.SparseTable(16, Adam(learning_rate=0.001), seed=1, **kw)
    g = np.full((args.keys, 16), 0.01, np.float32)
    out = np.empty((args.keys, 16), np.float32)

    def keys(s):
        return (np.arange(s * args.keys, (s + 1) * args.keys, dtype=np.uint64) + np.uint64(1)) * GOLDEN

    ahead = args.order == "ahead"
    if ahead:
        t.pull(keys(0), out=out)
    windows = []
    c0 = time.process_time()
    for s in range(args.steps):
        k = keys(s)
        t.pull(keys(s + 1) if ahead else k, out=out)
        t.push(k, g)
        if (s + 1) % args.window == 0:
            c1 = time.process_time()
            windows.append((c1 - c0) / args.window * 1e3)
            c0 = c1
    st = t.stats()
    print(json.dumps({"windows": windows, "rows": len(t),
                      "relocated": st.get("relocated_rows", 0),
                      "spilled": st.get("spilled_rows", 0), "reads": st.get("spill_reads", 0)}))


def run_child(args, budget):
    return json_child(__file__, ["--steps", str(args.steps), "--keys", str(args.keys),
                                 "--window", str(args.window), "--order", args.order,
                                 "--spill-dir", args.spill_dir], budget)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=byte_count, default=400 << 20,
                    help="the spilling table's memory_budget (bytes, or 400M, 1G)")
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--keys", type=int, default=13312, help="new keys a step")
    ap.add_argument("--window", type=int, default=100, help="steps a printed window")
    ap.add_argument("--order", choices=("ahead", "plain"), default="ahead")
    ap.add_argument("--spill-dir", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.steps, args.keys, args.window) < 1 or args.window > args.steps:
        ap.error("--steps, --keys and --window must be positive, --window at most --steps")
    if args.child:
        child(args)
        return
    tmp = None
    if args.spill_dir is None:
        tmp = tempfile.TemporaryDirectory()
        args.spill_dir = tmp.name
    spilling = run_child(args, args.budget)
    ram = run_child(args, None)
    print(f"{args.steps:,} steps of {args.keys:,} new keys ({args.order} order), Adam dim 16 fp32; "
          f"budget {args.budget / (1 << 20):,.0f} MiB; {load_note()}")
    print(f"{'steps':>11} {'RAM ms/step':>12} {'spilling':>9} {'ratio':>6}")
    for i, (a, b) in enumerate(zip(ram["windows"], spilling["windows"])):
        print(f"{i * args.window + 1:>5}-{(i + 1) * args.window:<5} {a:>12.1f} {b:>9.1f} {a / b:>6.2f}")
    a, b = sum(ram["windows"]), sum(spilling["windows"])
    print(f"{'all':>11} {a / len(ram['windows']):>12.1f} {b / len(spilling['windows']):>9.1f} {a / b:>6.2f}")
    print(f"spilling table: {spilling['rows']:,} rows, {spilling['spilled']:,} spilled, "
          f"{spilling['relocated']:,} moved below the row limit, {spilling['reads']:,} slots read")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()

"""Bounded memory: admission (CountFilterEntry) + shrink against no policy, on one key stream.

The stream imitates CTR feature ids: Zipf(1.1) draws over an unbounded id space
(a few hot ids, a long tail of rare ones) mixed with one-off ids that are never
seen again (``--keys`` distinct keys in all, 60% of them one-offs: 30M of 50M by
default). It is cut into ``--passes`` passes of ``--batch``-key batches; every
batch is pulled and then pushed (a small gradient), as a worker would.

Two runs, each in a fresh subprocess so that its peak RSS is its own:

- ``none``: a table with no entry policy and no shrink (every key becomes a row);
- ``policy``: ``CountFilterEntry(--admission)`` and ``shrink(max_unseen_passes=
  --max-unseen-passes)`` after every pass.

Printed: peak RSS, rows kept (at the end and the most at any pass end), the
table's own memory estimate and the time, and the policy/none ratios against
the target (peak RSS <= 40% of the no-policy run). The table is dim 8 with Adam
(8 weights + 16 state floats a row) so that 50M rows fit the 24 GiB machine.

    python benchmarks/micro/bench_memory.py                 # 50M distinct keys (~15 GB peak, minutes)
    python benchmarks/micro/bench_memory.py --keys 2000000  # a quick look
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np

# Zipf draws per distinct key wanted from the Zipf part: for a = 1.1 the number
# of distinct values among N draws grows like N^(1/a); 4.25 draws per distinct
# key gives ~40% of --keys distinct Zipf ids at 50M (measured, reported as
# "distinct keys" of the no-policy run).
_ZIPF_DRAWS_PER_KEY = 4.25
_ONE_OFF_FRACTION = 0.6
_C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)


def _mix(x):
    """A bijection of uint64 (odd multiply, xorshift, odd multiply): distinct in, distinct out."""
    with np.errstate(over="ignore"):
        y = x * _C1
        y ^= y >> np.uint64(31)
        return y * _C2


def stream(keys, passes, batch, seed=0):
    """Yield ``(pass, keys uint64[n])`` batches; deterministic in its arguments."""
    one_offs = int(keys * _ONE_OFF_FRACTION)
    zipf = int((keys - one_offs) * _ZIPF_DRAWS_PER_KEY)
    per_pass = (zipf + one_offs) // passes
    n_batches = max(1, -(-per_pass // batch))
    one_off_next = 0
    for p in range(passes):
        z_left, o_left = zipf // passes, one_offs // passes
        for b in range(n_batches):
            rng = np.random.default_rng([seed, p, b])
            nz = z_left // (n_batches - b)
            no = o_left // (n_batches - b)
            z_left -= nz
            o_left -= no
            ranks = rng.zipf(1.1, nz).astype(np.uint64) & np.uint64((1 << 62) - 1)
            # one-off ids live above 2^62, Zipf ranks below: the mix keeps them apart
            ids = np.arange(one_off_next, one_off_next + no, dtype=np.uint64) | np.uint64(1 << 62)
            one_off_next += no
            out = np.concatenate([ranks, ids])
            rng.shuffle(out)
            yield p, _mix(out)


def run_child(a):
    import pyfleet
    from pyfleet.entry import CountFilterEntry
    from pyfleet.optimizer import Adam

    entry = CountFilterEntry(a.admission) if a.child == "policy" else None
    table = pyfleet.SparseTable(a.dim, Adam(learning_rate=0.001), seed=1, entry=entry)
    grads = np.full((a.batch * 2, a.dim), 1e-3, np.float32)
    rows_max, streamed, dropped = 0, 0, 0
    t0 = time.perf_counter()
    current = 0
    for p, keys in stream(a.keys, a.passes, a.batch, a.seed):
        if p != current:
            rows_max = max(rows_max, len(table))
            if entry is not None:
                dropped += table.shrink(max_unseen_passes=a.max_unseen_passes)
            current = p
        table.pull(keys)
        table.push(keys, grads[:keys.shape[0]])
        streamed += keys.shape[0]
    rows_max = max(rows_max, len(table))
    if entry is not None:
        dropped += table.shrink(max_unseen_passes=a.max_unseen_passes)
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "run": a.child, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        * 1024, "rows_end": len(table), "rows_max": rows_max, "dropped": int(dropped),
        "table_memory_bytes": int(table.memory_bytes()), "keys_streamed": streamed,
        "seconds": seconds}), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=float, default=50e6, help="distinct keys in the stream")
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--batch", type=int, default=1 << 20, help="keys per pull/push")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--admission", type=int, default=2, help="CountFilterEntry count")
    p.add_argument("--max-unseen-passes", type=int, default=1,
                   help="shrink drops rows not pushed for more passes than this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--child", choices=["none", "policy"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.keys = int(a.keys)
    if a.child:
        run_child(a)
        return 0
    results = {}
    for run in ("none", "policy"):
        cmd = [sys.executable, __file__, "--child", run, "--keys", str(a.keys),
               "--passes", str(a.passes), "--batch", str(a.batch), "--dim", str(a.dim),
               "--admission", str(a.admission), "--max-unseen-passes",
               str(a.max_unseen_passes), "--seed", str(a.seed)]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        results[run] = json.loads(out.strip().splitlines()[-1])
    none, pol = results["none"], results["policy"]
    ratio = pol["peak_rss_bytes"] / none["peak_rss_bytes"]
    summary = {"keys": a.keys, "distinct_keys": none["rows_end"], "dim": a.dim,
               "optimizer": "Adam", "passes": a.passes, "admission": a.admission,
               "max_unseen_passes": a.max_unseen_passes, "runs": results,
               "peak_rss_ratio": ratio, "target_ratio": 0.40, "meets_target": ratio <= 0.40}
    if a.json:
        print(json.dumps(summary))
        return 0
    gib = 2.0 ** 30
    print(f"stream: {none['keys_streamed']:,} keys, {none['rows_end']:,} distinct "
          f"(Zipf 1.1 + {int(a.keys * _ONE_OFF_FRACTION):,} one-off ids), {a.passes} passes; "
          f"table dim {a.dim}, Adam")
    print(f"{'run':<34}{'peak RSS GiB':>13}{'rows kept':>14}{'rows max':>14}"
          f"{'table GiB':>11}{'seconds':>9}")
    policy_name = f"CountFilterEntry({a.admission}) + shrink({a.max_unseen_passes})/pass"
    for name, r in (("no policy", none), (policy_name, pol)):
        print(f"{name:<34}{r['peak_rss_bytes'] / gib:>13.2f}{r['rows_end']:>14,}"
              f"{r['rows_max']:>14,}{r['table_memory_bytes'] / gib:>11.2f}{r['seconds']:>9.1f}")
    print(f"peak RSS policy / none = {ratio:.3f} (target <= 0.40: "
          f"{'met' if ratio <= 0.40 else 'NOT met'}); rows kept policy / none = "
          f"{pol['rows_end'] / max(1, none['rows_end']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

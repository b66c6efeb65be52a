"""The disk tier: a table holding 4x its memory budget in rows against the
all-in-RAM table, pulled and pushed with Zipf(1.1) ids, measured in one run.

    python benchmarks/disk_tier/bench_capacity.py [--rows 2000000] [--dim 16] [--ratio 4]
                                                  [--batch 100000 16384] [--steps 30] [--warm-steps 300]
                                        [--spill-dir DIR]

Each table lives in its own child process (so RSS is its own): the all-in-RAM
table first, whose memory_bytes() / --ratio becomes the budget of the
spilling table. Each child creates --rows rows (Adam, fp32), then runs
batches of --batch keys drawn from Zipf(1.1) over the rows (ranks 1..rows,
P(r) ~ r^-1.1; rank r -> key (r-1) * 0x9E3779B97F4A7C15, so hot keys spread
over the shards): one pull and one push of the batch per step. Three phases
are measured, --steps steps each:
- "cold start": right after the fill (and 2 unmeasured steps). The fill
  makes the rows in rank order, so what it leaves in RAM is the coldest
  ranks, and these steps read back nearly every key they touch for the first
  time (32 steps touch 343k distinct keys): even a clairvoyant policy reads
  back about 10.4k rows a step there (docs/dev/disk_tier_log.md, "Which rows stay").
- "steady": after --warm-steps more (unmeasured) steps, when the rows in RAM
  follow the use and the spill file's cleaner runs (garbage reaches the
  live rows on disk after about 220 steps; with 70 warm steps it had not
  started, and the phase read 7.9k rows a step where the cleaner's steady
  state reads 18k, its whole-extent reads included): what a long training
  run sees. The issue's target is on this phase.
- "ahead" (right after "steady"): the same steps, with a second thread
  running table.prefetch(batch t+1) while the main thread pulls and pushes
  batch t (the loop waits for both before the next step). The same loop
  for both tables (the prefetch is a no-op all in RAM), so the ratio stays
  fair. Its gain is the overlap of the read-backs on a second core: the
  wall-clock ratio shows it if a core is free, the CPU-time ratio tells the
  work (which the prefetch's lookups of the batch add to).
Reported per phase: keys/s of pull+push steps by wall clock and by the
process's CPU time (and its ms a step, of them in the kernel: the
"kernel-only ceiling" is the ratio by CPU the spilling table would reach if
all its work beyond the all-in-RAM table's but the kernel's were free),
slots read from the spill file a step (read-backs and the cleaner's
whole-extent reads), of them the cleaner's, of them the
prefetch's, and the live records the cleaner moved a step; and the peak RSS of the
process (VmHWM) and of the table (peak minus the RSS before the table
existed), and the table's RSS over time (after the fill and every 10 steps).
Every array the benchmark uses (ids, gradients, the pulls' outputs, the
fill's too) is allocated before that first RSS reading, so the table's RSS is
the table's (and its calls' working memory), not the caller's arrays.
Targets: the spilling table >= 0.5x the RAM table's throughput,
its RSS <= budget + 10%. The spill file goes through the page cache: on a
machine with free RAM its reads are memory copies, not device reads.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from harness import json_child, load_note  # noqa: E402

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


PHASES = {"cold": "cold", "steady": "steady", "prefetched": "ahead"}  # key: printed name


def status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _kernel_s():
    """The process's CPU time in the kernel so far (getrusage: microseconds, not
    os.times' clock ticks)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def zipf_batch(rng, args):
    z = rng.zipf(1.1, args.batch)
    while (far := z > args.rows).any():  # Zipf over the rows: ranks 1..rows
        z[far] = rng.zipf(1.1, int(far.sum()))
    return (z - 1).astype(np.uint64) * GOLDEN


def child(args):
    import pyfleet
    from pyfleet.optimizer import Adam

    rng = np.random.default_rng(7)
    batches = []
    for _ in range(2 + 2 * args.steps + args.warm_steps):
        batches.append(zipf_batch(rng, args))
    grads = rng.normal(0, 0.1, (args.batch, args.dim)).astype(np.float32)
    for _ in range(args.steps + 1):  # the prefetched phase's (drawn after grads: as before)
        batches.append(zipf_batch(rng, args))
    fill = np.arange(args.rows, dtype=np.uint64) * GOLDEN
    fill_chunk = 1 << 18
    out = np.empty((max(args.batch, fill_chunk), args.dim), np.float32)
    out[:] = 0  # its pages touched now (np.zeros would leave them to the first pull)
    rss0 = status_bytes("VmRSS")
    kw = {} if args.budget is None else {"memory_budget": args.budget,
                                         "spill_dir": args.spill_dir}
    table = pyfleet.SparseTable(args.dim, Adam(learning_rate=0.001), seed=1, **kw)
    t0 = time.perf_counter()
    for s in range(0, args.rows, fill_chunk):
        keys = fill[s:s + fill_chunk]
        table.pull(keys, out=out[:len(keys)])
    fill_s = time.perf_counter() - t0
    rss_t = [status_bytes("VmRSS") - rss0]  # the table's RSS after the fill, then every 10 steps
    done = 0

    ahead = ThreadPoolExecutor(1, thread_name_prefix="prefetch")

    def run(steps, timed, prefetch=False):
        nonlocal done
        st0 = table.stats()
        w0, c0, k0 = time.perf_counter(), time.process_time(), _kernel_s()
        for k in batches[done:done + steps]:
            # The next batch's spilled rows read back in another thread while
            # this one is pulled and pushed (a no-op all in RAM: the same loop).
            nxt = ahead.submit(table.prefetch, batches[done + 1]) if prefetch else None
            table.pull(k, out=out[:len(k)])
            table.push(k, grads)
            if nxt is not None:
                nxt.result()
            done += 1
            if done % 10 == 0:
                rss_t.append(status_bytes("VmRSS") - rss0)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        kernel = _kernel_s() - k0
        st1 = table.stats()

        def per_step(name):
            return (st1.get(name, 0) - st0.get(name, 0)) / steps

        n = steps * args.batch
        return {"wall_keys_s": n / wall, "cpu_keys_s": n / cpu,
                "kernel_ms_step": kernel / steps * 1e3,
                "reads_per_step": per_step("spill_reads"),
                "clean_reads_per_step": per_step("spill_clean_reads"),
                "clean_moves_per_step": per_step("spill_clean_moves"),
                "prefetched_per_step": per_step("prefetched_rows"),
                "ghost_hits_per_step": per_step("spill_ghost_hits")} if timed else None

    run(2, False)  # the first batches' new hot rows come to RAM
    cold = run(args.steps, True)
    run(args.warm_steps, False)
    steady = run(args.steps, True)
    prefetched = run(args.steps, True, prefetch=True)
    st = table.stats()
    print(json.dumps({
        "rows": len(table), "fill_s": fill_s, "cold": cold, "steady": steady,
        "prefetched": prefetched,
        "memory_bytes": table.memory_bytes(),
        "peak_rss": status_bytes("VmHWM"), "table_rss": status_bytes("VmHWM") - rss0,
        "rss_before": rss0, "rss_over_time": rss_t, "spilled_rows": st.get("spilled_rows", 0),
        "spill_reads": st.get("spill_reads", 0), "spill_writes": st.get("spill_writes", 0)}))


def run_child(args, budget):
    return json_child(__file__, ["--rows", str(args.rows), "--dim", str(args.dim),
                                 "--batch", str(args.batch), "--steps", str(args.steps),
                                 "--warm-steps", str(args.warm_steps),
                                 "--spill-dir", args.spill_dir], budget)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--ratio", type=float, default=4.0,
                    help="the RAM table's memory_bytes / the spilling table's budget")
    ap.add_argument("--batch", type=int, nargs="+", default=[100_000, 16_384],
                    help="keys a step; each size is a comparison of its own (16,384: about "
                         "what a worker's training step of 512 examples x 26 ids pulls)")
    ap.add_argument("--steps", type=int, default=30, help="measured steps of each phase")
    ap.add_argument("--warm-steps", type=int, default=300,
                    help="unmeasured steps between the cold-start and the steady phase")
    ap.add_argument("--spill-dir", default=None, help="default: a temporary directory")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, default=None,
                    help="only the spilling table, with this budget in bytes (for sizes "
                         "whose all-in-RAM table would not fit)")
    args = ap.parse_args()
    if args.child:
        args.batch = args.batch[0]
        return child(args)
    sizes, ratios, spill_root = args.batch, [], args.spill_dir
    for batch in sizes:
        args.batch, args.spill_dir = batch, spill_root
        ratios.append((batch, compare(args)))
        print(flush=True)
    if len(sizes) > 1 and args.budget is None:
        print("throughput ratio spilling/RAM by batch size (wall, cpu)")
        for batch, r in ratios:
            print(f"  {batch:>9,} keys: " + "; ".join(
                f"{PHASES[phase]} {w:.2f}, {c:.2f}" for phase, (w, c) in r.items()))
    return None


def compare(args):
    """One batch size: the two tables' report; ``{phase: (wall ratio, cpu ratio)}``."""
    if args.budget is not None:
        with tempfile.TemporaryDirectory(dir=args.spill_dir) as d:
            args.spill_dir = d
            r = run_child(args, args.budget)
        print(json.dumps({"rows": args.rows, "dim": args.dim, "budget": args.budget, **r}))
        return None
    with tempfile.TemporaryDirectory(dir=args.spill_dir) as d:
        args.spill_dir = d
        ram = run_child(args, None)
        budget = int(ram["memory_bytes"] / args.ratio)
        disk = run_child(args, budget)
        left = os.listdir(d)
    mib = 1 << 20
    print(f"{args.rows:,} rows of dim {args.dim}, Adam fp32; Zipf(1.1) batches of "
          f"{args.batch:,} keys; budget {budget / mib:.0f} MiB "
          f"(RAM table's memory_bytes {ram['memory_bytes'] / mib:.0f} MiB / {args.ratio:g}); "
          f"{load_note()}")
    print(f"phases of {args.steps} pull+push steps: cold start (right after the fill), "
          f"steady (after {args.warm_steps} more steps)")
    print(f"then {args.steps} steady steps with the next batch prefetched in another thread "
          f"(phase 'ahead')")
    print(f"{'table':<10} {'phase':<7} {'keys/s wall':>12} {'keys/s cpu':>12} "
          f"{'slots read/step':>16} {'of them cleaner':>16} {'prefetched':>11} {'moved/step':>11} "
          f"{'ghost hits':>11}")
    for phase in PHASES:
        for name, r in (("in RAM", ram), ("spilling", disk)):
            p = r[phase]
            print(f"{name:<10} {PHASES[phase]:<7} {p['wall_keys_s']:>12,.0f} "
                  f"{p['cpu_keys_s']:>12,.0f} {p['reads_per_step']:>16,.0f} "
                  f"{p['clean_reads_per_step']:>16,.0f} {p['prefetched_per_step']:>11,.0f} "
                  f"{p['clean_moves_per_step']:>11,.0f} {p['ghost_hits_per_step']:>11,.0f}")
    for phase in PHASES:
        d, m = disk[phase], ram[phase]
        print(f"throughput ratio spilling/RAM, {PHASES[phase]:<6}: wall "
              f"{d['wall_keys_s'] / m['wall_keys_s']:.2f}, cpu {d['cpu_keys_s'] / m['cpu_keys_s']:.2f}"
              + (" (target >= 0.5)" if phase != "cold" else ""))
    # What the kernel's part alone allows: the spilling table's step if its
    # own work beyond the all-in-RAM table's were free, and only the kernel's
    # extra time (its reads of the rows read back, the appends, the
    # cleaner's I/O: system CPU time, getrusage) were left.
    print("ms of CPU a step (of them in the kernel), and the ratio by CPU if only the "
          "kernel's extra time were left")
    for phase in PHASES:
        d, m = disk[phase], ram[phase]
        d_ms, m_ms = (args.batch / r["cpu_keys_s"] * 1e3 for r in (d, m))
        ceiling = m_ms / (m_ms + d["kernel_ms_step"] - m["kernel_ms_step"])
        print(f"  {PHASES[phase]:<6}: in RAM {m_ms:.1f} ({m['kernel_ms_step']:.1f}), "
              f"spilling {d_ms:.1f} ({d['kernel_ms_step']:.1f}); "
              f"kernel-only ceiling {ceiling:.2f}")
    print(f"{'table':<10} {'table RSS MiB':>14} {'peak RSS MiB':>13} {'spilled rows':>13} "
          f"{'rows read':>11}")
    for name, r in (("in RAM", ram), ("spilling", disk)):
        print(f"{name:<10} {r['table_rss'] / mib:>14.0f} {r['peak_rss'] / mib:>13.0f} "
              f"{r['spilled_rows']:>13,} {r['spill_reads']:>11,}")
    print("spilling table's RSS over time, MiB (after the fill, then every 10 steps): "
          + " ".join(f"{b / mib:.0f}" for b in disk["rss_over_time"]))
    print(f"spilling table's memory_bytes / budget: {disk['memory_bytes'] / budget:.2f}")
    print(f"spilling table's RSS / budget: {disk['table_rss'] / budget:.2f} "
          f"(process peak incl. Python and the benchmark's id batches: "
          f"{disk['peak_rss'] / budget:.2f}; target <= 1.1)")
    print(f"files left in the spill directory: {len(left)}")
    return {phase: (disk[phase]["wall_keys_s"] / ram[phase]["wall_keys_s"],
                    disk[phase]["cpu_keys_s"] / ram[phase]["cpu_keys_s"]) for phase in PHASES}


if __name__ == "__main__":
    main()

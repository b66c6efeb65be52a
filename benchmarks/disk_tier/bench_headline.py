"""The disk tier's headline: 100M rows of dim 16 with Adam trained through one server with a
4 GiB memory budget (the rest of the table on disk).

    python benchmarks/disk_tier/bench_headline.py --dir DIR [--ids 100000000] [--unique-slots 26]
                                        [--budget 4G] [--workers 1] [--mode async]
                                        [--timeout 7200] [--json results.json]

    (1/100 scale, minutes: --ids 1000000 --budget 40M)

The synthetic data set (:mod:`pyfleet.data.synthetic`) has about 1M distinct ids at
most, so this writes its own training file, ``DIR/data/train.tsv`` (Criteo text,
kept for the next run with the same arguments): synthetic rows whose first
``--unique-slots`` categorical columns are replaced by a value unique to the
example (its index, 8 hex digits; the slot enters the feature hash, so one
value in two columns is two ids). ``ceil(--ids / --unique-slots)`` examples
give at least ``--ids`` distinct ids: every example brings ``--unique-slots``
new rows, the other columns (and the 13 dense ones) are the synthetic set's.
Everything is drawn and formatted by numpy and one compiled call per block of
the synthetic set's rows (65,536).

Then ``pyfleet train --train DIR/data/train.tsv --servers 1 --workers W --mode M
--embedding-dim 16 --optimizer adam --storage fp32 --memory-budget B --spill-dir
DIR/spill --run-dir DIR/run --overwrite --no-model --json``: one pass, the
pass-end checkpoint into ``DIR/run/checkpoint`` (every row: as large as the
spill file), no inference model export. While it runs, the server process's
``VmRSS``/``VmHWM`` (``/proc/PID/status``) are sampled every second, with the
free space of ``DIR``'s file system and the load average.

Printed: the training examples/s (the worker's training loop, as ``pyfleet
train`` reports it), rows in the table at the end, rows on disk, the server's
peak RSS while training and over its whole life (which includes the pass-end
checkpoint; the server also reports its own VmHWM), the checkpoint's seconds,
the run's wall time and the load average (the machine is shared: the figures
move with it). Disk: the spill file (~230 bytes a row, dim 16 Adam fp32) and
the checkpoint (as much again) are both on ``DIR``'s file system at the end.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

__all__ = ["main", "write_data"]

def _bytes(text):
    from pyfleet.cli.units import byte_count
    return byte_count(text)


def write_data(path, ids, unique_slots, seed=0):
    """Write the training file; returns ``{"examples", "min_distinct_ids", "bytes"}``."""
    from pyfleet.data import synthetic

    if not 1 <= unique_slots <= synthetic.N_SLOTS:
        raise ValueError(f"--unique-slots must be 1..{synthetic.N_SLOTS}, got {unique_slots}")
    n = -(-ids // unique_slots)
    if n >= 1 << 32:
        raise ValueError(f"{n:,} examples do not fit 8 hex digits; raise --unique-slots")
    tmp = path + ".part"
    start = 0
    with open(tmp, "wb") as f:
        # the synthetic set's blocks (one hidden model), a block's columns replaced
        for _, a in synthetic._blocks(n, seed, 0.25):
            rows = a["labels"].shape[0]
            cat, missing = a["cat"], a["cat_missing"]
            cat[:, :unique_slots] = np.arange(start, start + rows, dtype=np.uint32)[:, None]
            missing[:, :unique_slots] = False
            f.write(synthetic.format_tsv(a["labels"], a["dense"], a["dense_missing"], cat,
                                         missing))
            start += rows
    os.replace(tmp, path)
    return {"examples": n, "min_distinct_ids": n * unique_slots,
            "bytes": os.path.getsize(path)}


def _server_pid(run_dir):
    """The pid of the job's server, or None."""
    from bench_train import job_roles  # beside this file (run as a script)

    return next((pid for pid, role in job_roles(run_dir) if role == "server"), None)


def _status(pid):
    """``(VmRSS, VmHWM)`` bytes of ``pid``, or None once it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[:5]] = int(line.split()[1]) * 1024
    except OSError:
        return None
    return out.get("VmRSS"), out.get("VmHWM")


def _phase_times(run_dir):
    """``{event: time}`` of the job's phase events (the first of each)."""
    times = {}
    try:
        with open(os.path.join(run_dir, "progress", "events.jsonl")) as f:
            for line in f:
                e = json.loads(line)
                times.setdefault(e["event"], e["time"])
    except (OSError, ValueError):
        pass
    return times


def run(args, train):
    run_dir = os.path.abspath(os.path.join(args.dir, "run"))
    spill = os.path.abspath(os.path.join(args.dir, "spill"))
    os.makedirs(spill, exist_ok=True)
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--train", train, "--servers", "1",
           "--workers", str(args.workers), "--mode", args.mode, "--embedding-dim", "16",
           "--optimizer", "adam", "--storage", "fp32", "--memory-budget", str(args.budget),
           "--spill-dir", spill, "--run-dir", run_dir, "--overwrite", "--no-model",
           "--json", "--quiet", "--log-interval", "10", "--timeout", str(args.timeout),
           "--request-timeout", str(args.request_timeout)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    samples = []   # (time, VmRSS, VmHWM, free bytes, load average)
    pid = None
    t0 = time.time()
    out_path = os.path.join(args.dir, "train.out")
    with open(out_path, "w") as out, open(os.path.join(args.dir, "train.err"), "w") as err:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        while p.poll() is None:
            if pid is None:
                pid = _server_pid(run_dir)
            st = _status(pid) if pid else None
            if st and None not in st:  # (a zombie has no VmRSS)
                fs = os.statvfs(args.dir)
                samples.append((time.time(), *st, fs.f_bavail * fs.f_frsize,
                                os.getloadavg()[0]))
            time.sleep(1.0)
    wall = time.time() - t0
    with open(out_path) as f:
        text = f.read()
    if p.returncode:
        # what was measured before it failed
        ph = _phase_times(run_dir)
        print(f"FAILED; phases {ph}; server VmHWM sampled "
              f"{max((x[2] for x in samples), default=0) / 2**30:.2f} GiB; wall {wall:.0f} s",
              flush=True)
        with open(os.path.join(args.dir, "train.err")) as f:
            raise RuntimeError(f"pyfleet train failed ({p.returncode}):\n{text[-2000:]}\n"
                               f"{f.read()[-3000:]}")
    summary = json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])
    return summary, samples, wall, _phase_times(run_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True,
                    help="where the data, the spill file and the run go (tens of GB)")
    ap.add_argument("--ids", type=int, default=100_000_000,
                    help="distinct feature ids the training data has at least")
    ap.add_argument("--unique-slots", type=int, default=26,
                    help="categorical columns whose value is unique to each example")
    ap.add_argument("--budget", type=_bytes, default=4 << 30,
                    help="the server's --memory-budget (4G)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--mode", default="async", choices=["async", "sync"])
    ap.add_argument("--timeout", type=float, default=7200.0)
    ap.add_argument("--request-timeout", type=float, default=600.0,
                    help="pyfleet train's --request-timeout: the pass-end checkpoint of "
                         "100M rows may take 10x that (default 600: 100 minutes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    os.makedirs(args.dir, exist_ok=True)
    args.dir = os.path.abspath(args.dir)

    data_dir = os.path.join(args.dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    train = os.path.join(data_dir, "train.tsv")
    meta_path = os.path.join(data_dir, "meta.json")
    key = {"ids": args.ids, "unique_slots": args.unique_slots, "seed": args.seed}
    meta = None
    if os.path.exists(meta_path) and os.path.exists(train):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("key") != key:
            meta = None
    if meta is None:
        t = time.perf_counter()
        meta = {"key": key, **write_data(train, args.ids, args.unique_slots, args.seed)}
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        print(f"wrote {meta['examples']:,} examples ({meta['bytes'] / 2**30:.2f} GiB, "
              f">= {meta['min_distinct_ids']:,} distinct ids) in "
              f"{time.perf_counter() - t:.0f} s", flush=True)
    else:
        print(f"reusing {train}: {meta['examples']:,} examples", flush=True)
    print(f"training: 1 server, {args.workers} worker(s), {args.mode}, dim 16 Adam fp32, "
          f"budget {args.budget / 2**20:,.0f} MiB; load average {os.getloadavg()[0]:.2f}",
          flush=True)

    s, samples, wall, phases = run(args, train)
    rows = sum(s["table_rows"].values())
    saving = phases.get("saving")
    training = [x for x in samples if saving is None or x[0] < saving]
    res = {"examples": s["train_examples"], "examples_per_sec": s["train_examples_per_sec"],
           "train_seconds": s["train_seconds"], "wall_seconds": wall,
           "table_rows": rows, "spilled_rows": sum(s["server_spilled_rows"]),
           "table_memory_bytes": sum(s["server_table_bytes"]),
           "budget_bytes": args.budget,
           "peak_rss_training": max((x[2] for x in training), default=None),
           "peak_rss_life": max(s["server_peak_rss_bytes"]),
           "rss_end": s["server_rss_bytes"][0],
           "rss_first_sample": samples[0][1] if samples else None,
           "checkpoint_seconds": (phases["saved"] - saving
                                  if saving and "saved" in phases else None),
           "min_free_bytes": min((x[3] for x in samples), default=None),
           "load_mean": (sum(x[4] for x in samples) / len(samples)) if samples else None,
           "load_max": max((x[4] for x in samples), default=None),
           "train_auc": s.get("train_auc"), "data": meta,
           "workers": args.workers, "mode": args.mode}
    gib = 2**30
    print(f"examples/s {res['examples_per_sec']:,.0f} ({res['examples']:,} examples in "
          f"{res['train_seconds']:.0f} s of training); train AUC {res['train_auc']:.4f}")
    print(f"rows in the table at the end {rows:,}, of them on disk {res['spilled_rows']:,} "
          f"({res['spilled_rows'] / max(rows, 1):.1%}); table RAM {res['table_memory_bytes'] / gib:.2f}"
          f" GiB of the {args.budget / gib:.2f} GiB budget")
    if res["peak_rss_training"]:
        print(f"server peak RSS while training {res['peak_rss_training'] / gib:.2f} GiB "
              f"({res['peak_rss_training'] / args.budget:.2f}x the budget)")
    if res["rss_first_sample"]:
        print(f"(the server's RSS at the first sample, the interpreter and libraries: "
              f"{res['rss_first_sample'] / gib:.2f} GiB)")
    print(f"server peak RSS over its life (VmHWM, with the checkpoint) "
          f"{res['peak_rss_life'] / gib:.2f} GiB; RSS at the end {res['rss_end'] / gib:.2f} GiB")
    if res["checkpoint_seconds"] is not None:
        print(f"pass-end checkpoint {res['checkpoint_seconds']:.0f} s")
    print(f"wall time {wall:.0f} s; load average mean {res['load_mean'] or 0:.2f}, max "
          f"{res['load_max'] or 0:.2f}; least free space on {args.dir}'s file system "
          f"{(res['min_free_bytes'] or 0) / gib:.1f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

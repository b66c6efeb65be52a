"""Training throughput of the reference DNN: one process against parameter-server clusters.

    python benchmarks/training/bench_train.py [--rows 1000000] [--epochs 1]
                                     [--clusters single 1x1 1x2 2x2 collective2w hybrid1x2]
                                     [--modes async sync]
                                     [--storages fp32 fp16 bf16 fp16_q8 bf16_q8]
                                     [--budget-ratios 4]
                                     [--timeout 1800] [--json results.json]

Generates ``--rows`` synthetic Criteo rows once (``pyfleet.data.synthetic``,
90% train, 10% test), then trains the reference network (``pyfleet train``'s
DNN: 26 slots sharing one sparse table of dim 16, sum-pooled, concatenated
with the 13 dense features, fc 256-128-64 relu, batch 512, Adam 0.001) for
``--epochs`` passes in each configuration, measured in the same run:

- ``single``: :func:`pyfleet.trainer.train_local` in one process with local
  tables and one BLAS thread (what one launched worker gets);
- ``SxW``: ``pyfleet train --servers S --workers W --mode M --json`` on
  127.0.0.1 (every role one process, one BLAS thread each);
- ``collectiveNw``: N ranks of collective mode under ``mpirun`` (no server;
  ``benchmarks/training/bench_mpi_train.py``, the same network and data), and beside it
  ``single b<N*512>``, one process with the batch of all ranks together (what
  the collective job is equivalent to: its AUC is the one to compare with);
- ``hybridSxW``: S servers (``python -m pyfleet.service``, sparse table only, in
  mode M) and W worker ranks under ``mpirun`` all-reducing the dense parameters.

Every process of every row (the single process, each role, each server, each
rank) runs in a session of its own, as ``pyfleet train`` starts its roles:
with Linux's autogroup scheduler (``/proc/sys/kernel/sched_autogroup_enabled``)
a loaded machine's CPU is shared between sessions, not processes.

Each row prints the training examples/s (all workers together, over the
slowest worker's training time), its ratio to ``single``, and the test AUC
of the trained model (every worker's test predictions together). The line
below the table gives the parameter-server overhead: ``1 - (1x1 async) /
single``. Targets: 1x2 async >= 40,000 examples/s; overhead < 20%.

Where the CPU goes, per batch of 512 training examples: ``worker ms`` is the
workers' training loops (every thread: parsing, compute, client), measured
by each worker; ``server ms`` is every server process's whole-life CPU
(sampled from ``/proc`` on Linux, so it includes start-up and the test
pass; blank elsewhere); ``kernel ms`` of all the roles' whole-life CPU, the
part in the kernel (``SxW`` rows); ``server %`` the servers' share of all the run's CPU. With
W workers and S servers on C cores, examples/s can reach at most
``C * 512 / (worker ms + server ms) * 1000`` when nothing else runs.
``queued %`` says how far from that the machine was: of the time the workers'
main threads were runnable, the share they spent waiting for a core (Linux's
schedstat; the single and MPI rows over the training loop, the parameter-server
workers over their whole life). Near 0 on an idle machine; at 50% a worker got
half the CPU it asked for.

``--storages``: each SxW configuration is trained once per sparse
storage type (``pyfleet train --storage``), rows named ``SxW fp16``, and a
line gives each one's test AUC minus fp32's in the same configuration and
mode (target: within 0.0005). The runs share the data, the seed and, in sync
mode with one worker, the order of every update, so the difference is the
storage's.

``--budget-ratios`` (the disk tier): after each SxW configuration (and
storage), the same job again with ``--memory-budget`` = the RAM of the
all-in-RAM run's sparse table per server at its end (each server's
``memory_bytes()``: rows, index, counters; ``pyfleet train``'s summary) / RATIO,
its ``--spill-dir`` in the temporary directory; rows named ``1x1 /4``. A line
per such row gives the rows on disk at the end, its test AUC minus the
all-in-RAM run's (a disk tier moves rows, never changes them: in sync mode with
one worker, where every update comes in the same order, the AUC must be the
same), its examples/s over the all-in-RAM run's and both runs' server peak RSS
(VmHWM). Give ``--rows`` enough distinct ids for the budget to matter: the
default 1M rows give a table of about 193,000 rows (45 MiB of RAM), 96% of them
on disk at the end with ``--budget-ratios 4``. In async mode the AUCs may differ
a little: two all-in-RAM async runs do too (docs/operations.md), the order of a
worker's pushes and next pulls at the server is not fixed there.

The machine's load changes the absolute figures; the ratios much less.
Run each configuration on an otherwise idle machine when comparing changes.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import harness  # noqa: E402

__all__ = ["job_roles", "main"]

_SINGLE = """
import json, sys
from pyfleet.trainer import train_local
def sched():
    try:
        with open("/proc/thread-self/schedstat") as f:
            return [int(x) / 1e9 for x in f.read().split()[:2]]
    except OSError:
        return [0.0, 0.0]
q0 = sched()
r = train_local(json.loads(sys.argv[1]))
q1 = sched()
r["main_thread_ran_seconds"], r["main_thread_queued_seconds"] = q1[0] - q0[0], q1[1] - q0[1]
print(json.dumps(r))
"""


def _role_env():
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env


def _last_json(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON summary in the output:\n" + out[-2000:])


def run_single(data, epochs, timeout, batch_size=512):
    job = {"train": data["train"], "test": data["test"], "format": "criteo",
           "epochs": epochs, "n_dense": 13, "n_slots": 26, "batch_size": batch_size}
    # every process of every row in a session of its own, as pyfleet train starts its
    # roles: Linux's autogroup scheduler shares a loaded machine between sessions
    p = subprocess.run([sys.executable, "-c", _SINGLE, json.dumps(job)], env=_role_env(),
                       capture_output=True, text=True, timeout=timeout, check=False,
                       start_new_session=True)
    if p.returncode:
        raise RuntimeError(f"single-process run failed:\n{p.stderr[-2000:]}")
    return _last_json(p.stdout)


def job_roles(run_dir):
    """(pid, "server" or "worker") of every live process of the job in ``run_dir``
    (its roles run ``pyfleet.trainer RUN_DIR/job.json``; servers have
    TRAINING_ROLE=PSERVER)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"pyfleet.trainer" not in cmd or run_dir.encode() not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:   # gone, or not ours to read
            continue
        yield int(pid), "server" if b"TRAINING_ROLE=PSERVER" in env else "worker"


def _role_cpu(run_dir, seen):
    """Record in ``seen`` {pid: (role, cpu seconds, main thread's (seconds on a core,
    seconds runnable but queued))} every live process of the job in ``run_dir``."""
    tick = os.sysconf("SC_CLK_TCK")
    for pid, role in job_roles(run_dir):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/schedstat") as f:
                sched = tuple(int(x) / 1e9 for x in f.read().split()[:2])
        except OSError:   # gone meanwhile
            continue
        seen[pid] = (role, (int(fields[11]) + int(fields[12])) / tick, sched,
                     int(fields[12]) / tick)


def run_cluster(data, servers, workers, mode, epochs, timeout, run_dir, storage="fp32",
                budget=None):
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--train", data["train"],
           "--test", data["test"], "--servers", str(servers), "--workers", str(workers),
           "--mode", mode, "--epochs", str(epochs), "--run-dir", run_dir, "--json",
           "--timeout", str(timeout), "--storage", storage]
    if budget is not None:  # each server's sparse table in RAM; the rest in run_dir-spill
        cmd += ["--memory-budget", str(budget), "--spill-dir", run_dir + "-spill"]
    seen = {}
    stdout = harness.run_watched(
        cmd, _role_env(), timeout,
        lambda _pid: _role_cpu(run_dir, seen) if os.path.isdir("/proc") else None)
    r = _last_json(stdout)
    if seen:
        r["server_cpu_seconds"] = sum(c for role, c, _, _ in seen.values() if role == "server")
        r["all_cpu_seconds"] = sum(c for _, c, _, _ in seen.values())
        # of all the roles' CPU, the part in the kernel (sockets, page faults, reads)
        r["kernel_cpu_seconds"] = sum(k for _, _, _, k in seen.values())
        # the workers' main threads over their whole life
        r["main_thread_ran_seconds"] = sum(q[0] for role, _, q, _ in seen.values()
                                           if role == "worker")
        r["main_thread_queued_seconds"] = sum(q[1] for role, _, q, _ in seen.values()
                                              if role == "worker")
    return r


def _mpi_env(extra):
    env = _role_env()
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_oob_tcp_if_include": "lo",
                # a rank waiting in a collective yields its core (as pyfleet.launch sets
                # on one host) instead of spinning on the CPU the other roles need
                "OMPI_MCA_mpi_yield_when_idle": "1", **extra})
    return env


def _start_server(index, num, workers, mode):
    p = subprocess.Popen([sys.executable, "-m", "pyfleet.service", "--endpoint", "127.0.0.1:0",
                          "--index", str(index), "--num-servers", str(num), "--workers",
                          str(workers), "--mode", mode, "--log-level", "ERROR"],
                         stdout=subprocess.PIPE, text=True, env=_role_env(),
                         start_new_session=True)   # as run_single
    line = p.stdout.readline()
    if not line.startswith("pyfleet.server ready on "):
        p.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return p, line.split()[-1]


def run_mpi(kind, data, servers, workers, mode, epochs, timeout):
    """A collective or hybrid row: ``bench_mpi_train.py`` under mpirun (and, hybrid,
    ``servers`` server processes in ``mode``)."""
    job = {"train": data["train"], "test": data["test"], "format": "criteo",
           "epochs": epochs, "n_dense": 13, "n_slots": 26, "mode": mode}
    procs, extra = [], {}
    try:
        if kind == "hybrid":
            eps = []
            for i in range(servers):
                p, ep = _start_server(i, servers, workers, mode)
                procs.append(p)
                eps.append(ep)
            extra = {"PYFLEET_ROLE": "worker", "PYFLEET_SERVER_ENDPOINTS": ",".join(eps),
                     "PYFLEET_WORKER_NUM": str(workers)}
        # Each rank a session of its own (util-linux ``setsid -w``; the ranks are
        # process group leaders, so they cannot call setsid() themselves), as
        # pyfleet train starts every parameter-server role: Linux's autogroup
        # scheduler shares a loaded machine equally between sessions, so ranks
        # left in one session would share one part where each role of a
        # parameter-server row gets a part of its own.
        own = ["setsid", "-w"] if shutil.which("setsid") else []
        cmd = ["mpirun", "-np", str(workers), "--oversubscribe", "--allow-run-as-root",
               *own, sys.executable,
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_mpi_train.py"),
               kind, json.dumps(job)]
        p = subprocess.run(cmd, env=_mpi_env(extra), capture_output=True, text=True,
                           timeout=timeout, check=False)
        if p.returncode:
            raise RuntimeError(f"{kind} run failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        r = _last_json(p.stdout)
        if procs:  # the servers' whole-life CPU, from their exit's resource usage
            r["server_cpu_seconds"] = sum(_reap_cpu(q) for q in procs)
        return r
    finally:
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _reap_cpu(p, timeout=30.0):
    """Wait (at most ``timeout`` s) for ``p`` to exit; its user + system CPU seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.05)
    p.kill()
    p.wait()
    return 0.0


def _print_budget(r, ref):
    """The line comparing a disk-tier row with its all-in-RAM run ``ref``."""
    mib = 2**20
    peak, ref_peak = max(r["server_peak_rss"] or [0]), max(ref["server_peak_rss"] or [0])
    print(f"{r['cluster']} {r['mode']}: budget {r['memory_budget'] / mib:,.1f} MiB/server "
          f"(all-in-RAM table {max(ref['table_bytes']) / mib:,.1f} MiB); rows on disk "
          f"{r['spilled_rows']:,} of {r['table_rows']:,}; test AUC "
          f"{r['test_auc'] - ref['test_auc']:+.6f} vs all-in-RAM (target: the same); "
          f"examples/s {r['examples_per_sec'] / ref['examples_per_sec']:.2f}x; server peak "
          f"RSS {peak / mib:,.0f} MiB vs {ref_peak / mib:,.0f} MiB")


def _queued_share(r):
    ran, queued = r.get("main_thread_ran_seconds"), r.get("main_thread_queued_seconds")
    return queued / (ran + queued) if ran and queued is not None else None


def _row(r, name, srv, wrk, mode, storage, t, budget=None):
    """One result row of the summary ``r`` of a run started at ``t`` (printed)."""
    batches = r["train_examples"] / 512
    row = {"cluster": name, "servers": srv, "workers": wrk, "mode": mode,
           "storage": storage,
           "examples_per_sec": r["train_examples_per_sec"],
           "test_auc": r.get("test_auc"), "train_examples": r["train_examples"],
           "wall_seconds": time.perf_counter() - t,
           "worker_ms_per_batch": (r["train_cpu_seconds"] / batches * 1e3
                                   if "train_cpu_seconds" in r else None),
           "server_ms_per_batch": (r["server_cpu_seconds"] / batches * 1e3
                                   if "server_cpu_seconds" in r else None),
           "kernel_ms_per_batch": (r["kernel_cpu_seconds"] / batches * 1e3
                                   if "kernel_cpu_seconds" in r else None),
           "server_cpu_share": (r["server_cpu_seconds"] / r["all_cpu_seconds"]
                                if r.get("all_cpu_seconds") else None),
           "queued_share": _queued_share(r),
           # the servers' sparse tables at the end (pyfleet train's summary)
           "memory_budget": budget, "table_rows": sum(r.get("table_rows", {}).values()),
           "table_bytes": r.get("server_table_bytes"),
           "spilled_rows": sum(r.get("server_spilled_rows", [])),
           "server_peak_rss": r.get("server_peak_rss_bytes")}
    print(f"  {name:>14} {mode:>5}: {row['examples_per_sec']:>10,.0f} examples/s  "
          f"test AUC {row['test_auc']:.4f}", flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--clusters", nargs="+", default=["single", "1x1", "1x2", "2x2"],
                    help="'single', SERVERSxWORKERS, collectiveNw, hybridSERVERSxWORKERS")
    ap.add_argument("--modes", nargs="+", default=["async", "sync"],
                    choices=["async", "sync", "geo"])
    ap.add_argument("--timeout", type=float, default=1800.0,
                    help="seconds any one configuration may take")
    ap.add_argument("--storages", nargs="+", default=["fp32"],
                    choices=["fp32", "fp16", "bf16", "fp16_q8", "bf16_q8"],
                    help="sparse storage types each SxW configuration is trained with")
    ap.add_argument("--budget-ratios", nargs="+", type=float, default=[],
                    help="after each SxW configuration, train it again with a disk tier: "
                         "--memory-budget = the all-in-RAM run's table RAM per server / "
                         "RATIO (e.g. 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if any(r <= 1 for r in args.budget_ratios):
        ap.error(f"--budget-ratios must be > 1 (a budget below the table), got "
                 f"{args.budget_ratios}")
    clusters = []
    for c in args.clusters:
        if c == "single":
            clusters.append(None)
            continue
        if c.startswith("collective") and c.endswith("w") and c[10:-1].isdigit():
            clusters.append(("single", int(c[10:-1]) * 512))  # the equivalent batch
            clusters.append(("collective", 0, int(c[10:-1])))
            continue
        if c.startswith("hybrid"):
            try:
                s, w = (int(x) for x in c[6:].lower().split("x"))
            except ValueError:
                ap.error(f"cluster {c!r} is not hybridSERVERSxWORKERS")
            clusters.append(("hybrid", s, w))
            continue
        try:
            s, w = (int(x) for x in c.lower().split("x"))
        except ValueError:
            ap.error(f"cluster {c!r} is not 'single' or SERVERSxWORKERS")
        clusters.append((s, w))

    from pyfleet.data import synthetic

    with tempfile.TemporaryDirectory(prefix="pyfleet-bench-train-") as tmp:
        t0 = time.perf_counter()
        data = synthetic.generate(os.path.join(tmp, "data"), rows=args.rows, seed=args.seed)
        print(f"{args.rows:,} synthetic rows generated in {time.perf_counter() - t0:.1f} s; "
              f"ground-truth test AUC {data['truth_auc_test']:.4f}; load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        results = []
        for c in clusters:
            plain = c is None or c[0] in ("single", "collective")
            ps = not plain and c[0] != "hybrid"  # pyfleet train: takes --storage
            for mode, storage in [(m, st) for m in (["-"] if plain else args.modes)
                                  for st in (args.storages if ps else ["fp32"])]:
                name = "single" if c is None else f"{c[0]}x{c[1]}"
                if storage != "fp32":
                    name += f" {storage}"
                srv, wrk = (0, 1) if plain and (c is None or c[0] == "single") else c[-2:]
                t = time.perf_counter()
                if c is None:
                    r = run_single(data, args.epochs, args.timeout)
                elif c[0] == "single":
                    name = f"single b{c[1]}"
                    r = run_single(data, args.epochs, args.timeout, c[1])
                elif c[0] in ("collective", "hybrid"):
                    name = (f"collective {c[2]}w" if c[0] == "collective"
                            else f"hybrid {c[1]}s+{c[2]}w")
                    r = run_mpi(c[0], data, c[1], c[2], mode, args.epochs, args.timeout)
                else:
                    r = run_cluster(data, c[0], c[1], mode, args.epochs, args.timeout,
                                    os.path.join(tmp, f"run-{name}-{mode}".replace(" ", "-")),
                                    storage)
                results.append(_row(r, name, srv, wrk, mode, storage, t))
                for ratio in args.budget_ratios if ps else []:
                    # the same job again, each server's table given 1/ratio of the RAM
                    # the all-in-RAM run's held at its end
                    budget = int(sum(r["server_table_bytes"]) / c[0] / ratio)
                    t = time.perf_counter()
                    b = run_cluster(data, c[0], c[1], mode, args.epochs, args.timeout,
                                    os.path.join(tmp, f"run-{name}-{mode}-b{ratio:g}"
                                                 .replace(" ", "-")), storage, budget)
                    results.append(_row(b, f"{name} /{ratio:g}", srv, wrk, mode, storage, t,
                                        budget))
        load = os.getloadavg()[0]

    base = next((r["examples_per_sec"] for r in results if r["cluster"] == "single"), None)
    by = {(r["cluster"], r["mode"]): r for r in results}
    print()
    print(f"{'cluster':>14} {'mode':>6} {'examples/s':>12} {'/ single':>9} {'test AUC':>9} "
          f"{'worker ms':>10} {'server ms':>10} {'kernel ms':>10} {'server %':>9} "
          f"{'queued %':>9}")

    def cell(v, fmt, width):
        return f"{'-':>{width}}" if v is None else f"{v:>{width}{fmt}}"

    for r in results:
        ratio = f"{r['examples_per_sec'] / base:9.2f}" if base else f"{'-':>9}"
        print(f"{r['cluster']:>14} {r['mode']:>6} {r['examples_per_sec']:>12,.0f} {ratio} "
              f"{r['test_auc']:>9.4f} {cell(r['worker_ms_per_batch'], '.1f', 10)} "
              f"{cell(r['server_ms_per_batch'], '.1f', 10)} "
              f"{cell(r['kernel_ms_per_batch'], '.1f', 10)} "
              f"{cell(r['server_cpu_share'], '.0%', 9)} {cell(r['queued_share'], '.0%', 9)}")
    print("(worker ms: the workers' training CPU per batch of 512; server ms: the "
          "servers' whole-run CPU per batch; kernel ms: of every role's whole-run CPU, the "
          "kernel's per batch; queued %: of the time the workers' main threads were "
          "runnable, the share spent waiting for a core)")
    one = next((r["examples_per_sec"] for r in results
                if r["cluster"] == "1x1" and r["mode"] == "async"), None)
    two = next((r["examples_per_sec"] for r in results
                if r["cluster"] == "1x2" and r["mode"] == "async"), None)
    print(f"ground-truth test AUC {data['truth_auc_test']:.4f}; load average at the end "
          f"{load:.2f}")
    if base and one:
        print(f"parameter-server overhead (1 - 1x1 async / single): {1 - one / base:.1%} "
              f"(target < 20%)")
    if two:
        print(f"1x2 async: {two:,.0f} examples/s (target >= 40,000)")
    coll, ref = by.get(("collective 2w", "-")), by.get(("single b1024", "-"))
    if coll and two and ref:
        print(f"collective 2w: {coll['examples_per_sec'] / two:.2f}x 1x2 async (target >= 1); "
              f"test AUC {coll['test_auc'] - ref['test_auc']:+.4f} vs single b1024 "
              f"(target within 0.0005)")
    hyb = by.get(("hybrid 1s+2w", "async"))
    if hyb and two:
        print(f"hybrid 1s+2w async: {hyb['examples_per_sec'] / two:.2f}x 1x2 async "
              f"(target >= 1.1)")
    for r in results:
        if r["memory_budget"] is not None:
            _print_budget(r, by.get((r["cluster"].rsplit(" ", 1)[0], r["mode"])))
        elif r["storage"] != "fp32":
            ref = by.get((r["cluster"].split(" ")[0], r["mode"]))
            if ref:
                print(f"{r['cluster']} {r['mode']}: test AUC {r['test_auc'] - ref['test_auc']:+.4f}"
                      f" vs fp32 (target within 0.0005)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "epochs": args.epochs,
                       "truth_auc_test": data["truth_auc_test"], "results": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos: a self-healing ``pyfleet train`` job whose roles are SIGKILLed at random.

    python benchmarks/service/bench_chaos.py [--rows 1000000] [--mode async|sync|collective|hybrid]
                                     [--kill-every 30,60]
                                     [--checkpoint-steps 100] [--max-restarts 20]
                                     [--servers 2] [--workers 2] [--epochs 3] [--seed 0] [--kill-seed 0]
                                     [--hosts 2 [--port 41000]] [--json out.json]

Loopback, or with ``--hosts N`` (root) N hosts made of network namespaces
(tests/support/netns.py): the job runs from the first through ``pyfleet train --hosts``,
mpirun placing the roles (a parameter-server job's whole mpirun job restarts on fresh
ports; a collective or hybrid job's ranks are placed across the hosts, its servers on
the first). Generates (or reuses, ``--cache-dir``) ``--rows`` synthetic Criteo rows, then
runs the same ``pyfleet train`` job twice (``--servers`` servers, ``--workers`` workers, the
reference DNN, one pass, ``--checkpoint-steps`` K):

1. undisturbed;
2. with ``--max-restarts`` and a random live role (server, worker, or in ``--mode
   collective|hybrid`` one MPI rank, ``rank.N``) SIGKILLed after every
   uniform(a, b) seconds of ``--kill-every a,b`` until the job ends (never within 3 s of a
   restart, so every kill hits a running job).

For every kill it reports the role, the **recovery time** (from the kill to the moment every
worker of the restarted job trains again: its ``training from batch`` log line, so it includes
the stop, the restart, the servers' checkpoint load and the workers' skip to their
position), and the **examples replayed** (what the workers had trained at the kill, from
their progress files written every 0.2 s, minus the position the restart resumed from:
the work lost, to within 0.2 s of training). Then the test AUC of both runs and its
difference (target: within 0.002; async runs differ by about 0.001 between two undisturbed
runs), and both runs' examples trained (the healed run must equal the undisturbed one).
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train_cmd(args, run_dir, extra=()):
    servers = [] if args.mode == "collective" else ["--servers", str(args.servers)]
    return [sys.executable, "-m", "pyfleet.cli", "train", "--rows", str(args.rows),
            *servers, "--workers", str(args.workers),
            "--mode", args.mode, "--seed", str(args.seed), "--run-dir", run_dir,
            "--epochs", str(args.epochs),
            "--cache-dir", args.cache_dir, "--checkpoint-steps", str(args.checkpoint_steps),
            "--log-interval", "0.2", "--quiet", "--json", "--timeout", str(args.timeout),
            *extra]


def _children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _ranks(run_dir):
    """``{"rank.N": pid}`` of the MPI ranks training into ``run_dir`` (the launcher's
    grandchildren, under mpiexec)."""
    want, out = f"PYFLEET_CHECKPOINT_DIR={run_dir}".encode(), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                trainer = b"pyfleet.trainer" in f.read()
        except OSError:
            continue
        rank = [kv.split(b"=", 1)[1] for kv in env if kv.startswith(b"OMPI_COMM_WORLD_RANK=")]
        if trainer and want in env and rank:
            out[f"rank.{rank[0].decode()}"] = int(pid)
    return out


def _placed(run_dir):
    """``{"server.0": pid, "worker.1": pid, ...}`` of the roles mpirun placed on the
    hosts (namespaces share this machine's process table) training into ``run_dir``."""
    want, out = f"PYFLEET_CHECKPOINT_DIR={run_dir}".encode(), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                trainer = b"pyfleet.trainer" in f.read()
        except OSError:
            continue
        role = env.get(b"PYFLEET_ROLE", b"").decode()
        if trainer and role and env.get(b"PYFLEET_CHECKPOINT_DIR") == want.split(b"=", 1)[1]:
            key = b"PYFLEET_SERVER_INDEX" if role == "server" else b"PYFLEET_WORKER_INDEX"
            out[f"{role}.{env.get(key, b'').decode()}"] = int(pid)
    return out


def _roles(pid, run_dir, mpi, across_hosts=False):
    if across_hosts:
        return _placed(run_dir)
    out = _ranks(run_dir) if mpi else {}
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        role = env.get(b"PYFLEET_ROLE", b"").decode()
        key = b"PYFLEET_SERVER_INDEX" if role == "server" else b"PYFLEET_WORKER_INDEX"
        if role and not (mpi and role == "worker"):  # (the MPI job's mpiexec)
            out[f"{role}.{env.get(key, b'').decode()}"] = child
    return out


def _worker_examples(run_dir, workers):
    got = {}
    for w in range(workers):
        try:
            with open(os.path.join(run_dir, "progress", f"worker{w}.json")) as f:
                got[w] = json.load(f)["examples"]
        except (OSError, ValueError, KeyError):
            got[w] = None
    return got


_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def _run(cmd, cwd, env=None):
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=cwd, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench_chaos: the job failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--mode", default="async", choices=["async", "sync", "collective", "hybrid"])
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--kill-seed", type=int, default=0, help="which roles die, and when")
    p.add_argument("--kill-every", default="30,60", metavar="A,B",
                   help="seconds between kills: uniform in [A, B]")
    p.add_argument("--checkpoint-steps", type=int, default=100)
    p.add_argument("--max-restarts", type=int, default=20)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "pyfleet-bench"))
    p.add_argument("--work-dir", default=None, help="default: a new temporary directory")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--hosts", type=int, default=0, metavar="N",
                   help="run the job across N hosts made of network namespaces (root); "
                        "0: this machine")
    p.add_argument("--port", type=int, default=41000, help="with --hosts: the first port")
    args = p.parse_args(argv)
    mpi = args.mode in ("collective", "hybrid")
    if args.hosts:
        sys.path.insert(0, os.path.join(REPO, "tests"))
        from support.netns import NetnsHosts, why_no_netns
        why = why_no_netns()
        if why:
            raise SystemExit(f"bench_chaos: --hosts: {why}")
    work = args.work_dir or tempfile.mkdtemp(prefix="bench-chaos-")
    os.makedirs(work, exist_ok=True)
    hosts = NetnsHosts(args.hosts, work, subnet="10.213.80") if args.hosts else None
    try:
        return _measure(args, mpi, work, hosts)
    finally:
        if hosts is not None:
            hosts.delete()


def _measure(args, mpi, work, hosts):
    """The undisturbed run, the run under kills, the table."""
    wrap, env, extra = (lambda cmd: cmd), None, []
    if hosts is not None:
        wrap = lambda cmd: hosts.on(0, cmd)  # noqa: E731
        env = hosts.mpi_env({k: v for k, v in os.environ.items()
                             if not k.startswith("PYFLEET_")})
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        extra = ["--hosts", ",".join(hosts.addrs)]
        if args.mode != "collective":
            extra += ["--port", str(args.port)]
    if args.mode == "collective":
        args.servers = 0
    lo, hi = (float(x) for x in args.kill_every.split(","))
    rng = random.Random(args.kill_seed)
    print(f"work directory {work}; load average {os.getloadavg()[0]:.1f}", flush=True)

    t0 = time.time()
    calm = _run(wrap(_train_cmd(args, os.path.join(work, "calm"), extra)), work, env)
    calm_wall = time.time() - t0
    print(f"undisturbed: {calm['train_examples']:,} examples, test AUC "
          f"{calm['test_auc']:.4f}, {calm_wall:.0f} s", flush=True)

    run_dir = os.path.join(work, "chaos")
    t0 = time.time()
    proc = subprocess.Popen(wrap(_train_cmd(args, run_dir, [*extra, "--max-restarts",
                                                            str(args.max_restarts)])),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
                            env=env)
    kills = []
    try:
        next_kill = time.time() + rng.uniform(lo, hi)
        while proc.poll() is None:
            time.sleep(0.05)
            if time.time() < next_kill:
                continue
            # (an MPI job's ranks and servers are found as on one machine)
            roles = _roles(proc.pid, run_dir, mpi, hosts is not None and not mpi)
            if len(roles) < args.servers + args.workers:  # restarting: try again soon
                next_kill = time.time() + 3
                continue
            role = rng.choice(sorted(roles))
            seen = _worker_examples(run_dir, args.workers)
            try:
                os.kill(roles[role], signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills.append({"role": role, "time": time.time(), "examples_at_kill": seen})
            print(f"  {time.time() - t0:6.1f} s: SIGKILL {role}", flush=True)
            next_kill = time.time() + rng.uniform(lo, hi)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    chaos_wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench_chaos: the healed job failed ({proc.returncode}):\n{err}")
    chaos = json.loads(out)

    resumed = _resumptions(run_dir, args.workers, mpi)
    rows = []
    for i, kill in enumerate(kills, start=1):
        back = resumed.get(i, {})
        times = [t for t, _ in back.values() if t is not None]
        recovery = (max(times) - kill["time"]) if len(times) == args.workers else None
        at_kill = kill["examples_at_kill"]
        replayed = None
        if len(back) == args.workers and all(v is not None for v in at_kill.values()):
            replayed = sum(max(at_kill[w] - back[w][1], 0) for w in range(args.workers))
        rows.append({"role": kill["role"], "recovery_seconds": recovery,
                     "examples_replayed": replayed})
    result = {"rows": args.rows, "mode": args.mode, "hosts": args.hosts, "servers": args.servers,
              "workers": args.workers, "kills": rows,
              "restarts": chaos["restarts"],
              "undisturbed": {"test_auc": calm["test_auc"],
                              "train_examples": calm["train_examples"], "wall": calm_wall},
              "healed": {"test_auc": chaos["test_auc"],
                         "train_examples": chaos["train_examples"], "wall": chaos_wall,
                         "checkpoint_rounds": chaos.get("checkpoint_rounds")},
              "auc_difference": chaos["test_auc"] - calm["test_auc"]}
    print(f"{'kill':>4}  {'role':9} {'recovery s':>10} {'replayed':>9}")
    for i, row in enumerate(rows, start=1):
        rec = "-" if row["recovery_seconds"] is None else f"{row['recovery_seconds']:.1f}"
        rep = "-" if row["examples_replayed"] is None else f"{row['examples_replayed']:,}"
        print(f"{i:>4}  {row['role']:9} {rec:>10} {rep:>9}")
    print(f"healed: {chaos['train_examples']:,} examples, test AUC {chaos['test_auc']:.4f}, "
          f"{chaos_wall:.0f} s, {len(chaos['restarts'])} restart(s); undisturbed: "
          f"{calm['train_examples']:,} examples, AUC {calm['test_auc']:.4f}, {calm_wall:.0f} s; "
          f"AUC difference {result['auc_difference']:+.4f}; load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if chaos["train_examples"] == calm["train_examples"] else 1


def _resumptions(run_dir, workers, mpi=False):
    """``{attempt: {worker: (time it trains again, examples in all it restored)}}`` from
    the workers' logs (a restart before any checkpoint restores 0 examples); an MPI job's
    ranks share ``workers.log``, each line labelled ``worker.N``."""
    out = {}
    for w in range(workers):
        attempt = 0
        log = "workers.log" if mpi else f"worker.{w}.log"
        with open(os.path.join(run_dir, "logs", log), errors="replace") as f:
            for line in f:
                if mpi and not line.startswith("---") and f" worker.{w} " not in line:
                    continue
                if line.startswith("--- pyfleet.launch: restart "):
                    attempt = int(line.split()[3])
                    out.setdefault(attempt, {})[w] = (None, 0)
                    continue
                m = _STAMP.match(line)
                if not m or attempt == 0:
                    continue
                t, restored = out[attempt][w]
                got = re.search(r"restored at pass \d+ batch \d+ \(\d+ examples of the "
                                r"pass, (\d+) in all\)", line)
                if got:
                    restored = int(got.group(1))
                if "training from batch" in line and t is None:
                    t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(
                        m.group(2)) / 1000.0
                out[attempt][w] = (t, restored)
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Examples/s of a job across hosts against the network's bandwidth and round-trip time.

Hosts are network namespaces joined by a bridge (tests/support/netns.py), one server
and one worker on each, the DNN trained for one pass on generated data. Conditions:

- ``base``: the bridge as it is (veth pairs, no limit);
- ``10gbit`` / ``1gbit``: ``tc qdisc ... tbf`` on both ends of every host's link;
- ``relay`` and ``rtt 0.1/1/5 ms``: this kernel has no ``netem``, so each worker reaches
  the servers of other hosts through a relay process in its own namespace that holds
  every chunk for RTT/2 in each direction (``relay`` = the relay with no delay: its own
  cost, the baseline of the RTT rows). A worker reaches its own host's server directly.

Every condition runs between two runs of its baseline (``base`` for bandwidth, ``relay``
for RTT), and is reported as a ratio to their mean, with the load average beside it
(the machine is shared). The bytes a step per worker are counted on the hosts' links
(``/sys/class/net/eth0/statistics``); the round trips a step that wait on the network
are the slope of the step time against the RTT.

    sudo python benchmarks/training/bench_scaleout.py --hosts 2 4 --rows 60000 \\
        --json docs/scaleout_network.json --plot docs/scaleout_network.png

Needs root (namespaces, tc); refuses with the reason otherwise.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # the checkout
RELAY_PORT = 47000
SERVER_PORT = 46000


# -- the delaying relay (run as: bench_scaleout.py --relay DELAY_S LPORT:HOST:PORT ...)

async def _pipe(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def send():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            queue.put_nowait((loop.time() + delay, data or None))
            if not data:
                break
    except ConnectionError:
        queue.put_nowait((0, None))
    await sender


async def _relay(delay, routes):
    async def handle(target, reader, writer):
        try:
            r2, w2 = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, w2, delay), _pipe(r2, writer, delay),
                             return_exceptions=True)

    servers = []
    for route in routes:
        lport, host, port = route.split(":")
        target = (host, int(port))
        servers.append(await asyncio.start_server(
            lambda r, w, t=target: handle(t, r, w), "127.0.0.1", int(lport)))
    print("ready", flush=True)
    await asyncio.Event().wait()


# -- one run

def _load():
    return os.getloadavg()[0]


def _tc(hosts, rate):
    """tbf at ``rate`` on both ends of every host's link (None: remove)."""
    for i, ns in enumerate(hosts.names):
        for where, dev in ((ns, "eth0"), (hosts.hub, f"p{i}")):
            subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev,
                            "root"], capture_output=True, check=False)
            if rate:
                burst = "4mb" if rate.startswith("10") else "512kb"
                subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev,
                                "root", "tbf", "rate", rate, "burst", burst, "latency", "50ms"],
                               check=True, capture_output=True, text=True)


def _link_bytes(hosts):
    total = 0
    for ns in hosts.names:
        for what in ("tx_bytes",):
            r = subprocess.run(["ip", "netns", "exec", ns, "cat",
                                f"/sys/class/net/eth0/statistics/{what}"],
                               capture_output=True, text=True, check=True)
            total += int(r.stdout)
    return total


def run_job(hosts, job_path, run_dir, keys, rtt_ms=None):
    """Train once; ``{"examples_per_sec", "seconds", "steps", "bytes"}``."""
    from pyfleet.launch import role_env
    n = len(hosts.names)
    eps = [f"{a}:{SERVER_PORT + i}" for i, a in enumerate(hosts.addrs)]
    relays = []
    for f in ("checkpoint", "progress", "model"):
        shutil.rmtree(os.path.join(run_dir, f), ignore_errors=True)
    procs = []
    try:
        worker_eps = []
        for i, ns in enumerate(hosts.names):
            mine = list(eps)
            if rtt_ms is not None:  # the other hosts' servers through this host's relay
                routes = []
                for j in range(n):
                    if j != i:
                        routes.append(f"{RELAY_PORT + j}:{hosts.addrs[j]}:{SERVER_PORT + j}")
                        mine[j] = f"127.0.0.1:{RELAY_PORT + j}"
                p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__,
                                      "--relay", str(rtt_ms / 2000.0), *routes],
                                     stdout=subprocess.PIPE, text=True)
                relays.append(p)
                assert p.stdout.readline().strip() == "ready"
            worker_eps.append(mine)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PYFLEET_", "PADDLE_"))}
        base.update(OPENBLAS_NUM_THREADS="1", PYFLEET_CURVE_DIR=keys,
                    PYFLEET_CHECKPOINT_DIR=run_dir, PYFLEET_MODE="async",
                    PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        cmd = [sys.executable, "-m", "pyfleet.trainer", job_path]
        logs = os.path.join(run_dir, "logs")
        os.makedirs(logs, exist_ok=True)
        before = _link_bytes(hosts)
        for role in ("server", "worker"):
            for i, ns in enumerate(hosts.names):
                env = dict(base, **role_env(role, i, eps if role == "server" else worker_eps[i],
                                            n))
                with open(os.path.join(logs, f"{role}{i}.log"), "wb") as log:
                    procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *cmd], env=env,
                                                  stdout=log, stderr=subprocess.STDOUT,
                                                  cwd=run_dir))
        codes = [p.wait(timeout=900) for p in procs]
        if any(codes):
            tail = "".join(open(os.path.join(logs, f)).read()[-1500:] for f in os.listdir(logs))
            raise RuntimeError(f"a role failed ({codes}):\n{tail}")
        moved = _link_bytes(hosts) - before
    finally:
        for p in procs + relays:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [json.load(open(os.path.join(run_dir, f"worker{i}.json"))) for i in range(n)]
    examples = sum(r["examples"] for r in results)
    seconds = max(r["train_seconds"] for r in results)
    with open(job_path) as f:
        batch = json.load(f)["batch_size"]
    steps = sum(-(-r["examples"] // batch) for r in results)
    return {"examples_per_sec": examples / seconds, "seconds": seconds, "steps": steps,
            "bytes_per_step": moved / steps, "step_ms": 1000.0 * seconds * n / steps}


def measure(n_hosts, rows, workdir, conditions):
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from support.netns import NetnsHosts

    from pyfleet.data import synthetic
    from pyfleet.service import auth
    from pyfleet.trainer import JOB_DEFAULTS
    work = tempfile.mkdtemp(prefix=f"scaleout{n_hosts}-", dir=workdir)
    hosts = NetnsHosts(n_hosts, work, subnet="10.213.79")
    out = []
    try:
        data = synthetic.generate(os.path.join(work, "data"), rows=rows, seed=1)
        keys = os.path.join(work, "keys")
        auth.keygen(keys)
        run_dir = os.path.join(work, "run")
        os.makedirs(run_dir)
        job = {**JOB_DEFAULTS, "train": data["train"], "test": None, "model": "dnn",
               "embedding_dim": 16, "layers": [256, 128, 64], "batch_size": 512,
               "mode": "async", "run_dir": run_dir, "n_dense": 13, "n_slots": 26,
               "save_model": False, "request_timeout": 60.0}
        job_path = os.path.join(run_dir, "job.json")
        with open(job_path, "w") as f:
            json.dump(job, f)
        for name, rate, rtt in conditions:
            _tc(hosts, rate)
            try:
                load = _load()
                r = run_job(hosts, job_path, run_dir, keys, rtt)
            finally:
                _tc(hosts, None)
            r.update(hosts=n_hosts, condition=name, load=load)
            out.append(r)
            print(f"  {n_hosts} hosts  {name:<10} {r['examples_per_sec']:>9,.0f} ex/s  "
                  f"step {r['step_ms']:6.1f} ms  {r['bytes_per_step'] / 1024:7.1f} KiB/step  "
                  f"load {load:.1f}", flush=True)
    finally:
        hosts.delete()
        shutil.rmtree(work, ignore_errors=True)
    return out


# Each condition between two runs of its baseline.
PLAN = [("base", None, None), ("10gbit", "10gbit", None), ("base", None, None),
        ("1gbit", "1gbit", None), ("base", None, None),
        ("relay", None, 0.0), ("rtt 0.1ms", None, 0.1), ("relay", None, 0.0),
        ("rtt 1ms", None, 1.0), ("relay", None, 0.0), ("rtt 5ms", None, 5.0),
        ("relay", None, 0.0)]


def summarize(runs):
    rows = []
    for h in sorted({r["hosts"] for r in runs}):
        mine = [r for r in runs if r["hosts"] == h]
        for k, r in enumerate(mine):
            if r["condition"] in ("base", "relay"):
                continue
            around = [mine[k - 1]["examples_per_sec"], mine[k + 1]["examples_per_sec"]]
            rows.append({**r, "baseline": mine[k - 1]["condition"],
                         "ratio": r["examples_per_sec"] / (sum(around) / 2)})
        base = [r for r in mine if r["condition"] == "base"]
        relay = [r for r in mine if r["condition"] == "relay"]
        for name, group in (("base", base), ("relay", relay)):
            if group:
                rows.append({"hosts": h, "condition": name, "ratio": 1.0,
                             "examples_per_sec": sum(r["examples_per_sec"] for r in group)
                             / len(group),
                             "step_ms": sum(r["step_ms"] for r in group) / len(group),
                             "bytes_per_step": sum(r["bytes_per_step"] for r in group)
                             / len(group),
                             "load": sum(r["load"] for r in group) / len(group)})
        # round trips a step: the slope of the step time against the RTT
        pts = [(0.0, sum(r["step_ms"] for r in relay) / len(relay))] if relay else []
        pts += [(r["rtt"], r["step_ms"]) for r in rows if r["hosts"] == h and "rtt" in r]
        if len(pts) >= 2:
            mx = sum(x for x, _ in pts) / len(pts)
            my = sum(y for _, y in pts) / len(pts)
            slope = (sum((x - mx) * (y - my) for x, y in pts)
                     / sum((x - mx) ** 2 for x, _ in pts))
            rows.append({"hosts": h, "condition": "round trips a step", "value": slope})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--relay", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--hosts", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rows", type=int, default=60000, help="generated rows (90%% trained)")
    p.add_argument("--json", default=None, help="write the runs and the table here")
    p.add_argument("--plot", default=None, help="write the figure here (matplotlib)")
    p.add_argument("--report", default=None, metavar="JSON",
                   help="draw --plot from a --json file of an earlier run, measure nothing")
    args = p.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            _plot(json.load(f)["table"], args.plot)
        return 0
    if args.relay:
        asyncio.run(_relay(float(args.relay[0]), args.relay[1:]))
        return 0
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from support.netns import why_no_netns
    why = why_no_netns() or (None if shutil.which("tc") else "no tc (apt-get install iproute2)")
    if why:
        print(f"bench_scaleout: {why}", file=sys.stderr)
        return 2
    print(f"load average at start {_load():.1f} ({os.cpu_count()} cores)")
    runs = []
    for h in args.hosts:
        got = measure(h, args.rows, None, PLAN)
        for r, (_, _, rtt) in zip(got, PLAN):
            if rtt:
                r["rtt"] = rtt
        runs += got
    table = summarize(runs)
    print(f"\n{'hosts':>5}  {'condition':<19} {'examples/s':>10}  {'ratio':>6}  "
          f"{'step ms':>7}  {'KiB/step/worker':>15}  load")
    for r in table:
        if "value" in r:
            print(f"{r['hosts']:>5}  {r['condition']:<19} {r['value']:>10.2f}")
            continue
        print(f"{r['hosts']:>5}  {r['condition']:<19} {r['examples_per_sec']:>10,.0f}  "
              f"{r['ratio']:>6.2f}  {r['step_ms']:>7.1f}  "
              f"{r['bytes_per_step'] / 1024:>15.1f}  {r['load']:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "table": table, "rows": args.rows,
                       "command": " ".join(sys.argv)}, f, indent=1)
    if args.plot:
        _plot(table, args.plot)
    return 0


def _plot(table, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for h in sorted({r["hosts"] for r in table}):
        mine = [r for r in table if r["hosts"] == h and "value" not in r]
        bw = [r for r in mine if r["condition"] in ("base", "10gbit", "1gbit")]
        order = {"base": 0, "10gbit": 1, "1gbit": 2}
        bw.sort(key=lambda r: order[r["condition"]])
        axes[0].plot([r["condition"] for r in bw], [r["ratio"] for r in bw], "o-",
                     label=f"{h} hosts")
        rt = [r for r in mine if r["condition"] == "relay" or "rtt" in r]
        rt.sort(key=lambda r: r.get("rtt", 0.0))
        axes[1].plot([r.get("rtt", 0.0) for r in rt], [r["ratio"] for r in rt], "o-",
                     label=f"{h} hosts")
    axes[0].set_title("bandwidth (tbf)")
    axes[1].set_title("round-trip time (relay)")
    axes[1].set_xscale("symlog", linthresh=0.1)
    axes[1].set_xlabel("RTT ms")
    for ax in axes:
        ax.set_ylabel("examples/s, ratio to baseline")
        ax.set_ylim(0, max([1.2] + [r["ratio"] * 1.1 for r in table if "ratio" in r]))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

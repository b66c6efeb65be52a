"""Service pull/push throughput against a raw pyzmq round trip of the same bytes.

    python benchmarks/service/bench_service.py [--sizes 1000 16000 128000] [--dim 16]
                                       [--servers 1 2] [--seconds 1.0] [--cpu]

Everything on loopback, measured in the same run:

- ``raw``: a DEALER/ROUTER echo process (no table, no protocol): the request
  carries the bytes of the keys (pull) or keys + gradients (push), the reply the
  bytes of the rows (pull) or 8 bytes (push);
- ``service``: ``Client.pull_sparse`` / ``push_sparse`` through 1 and 2
  ``pyfleet.service`` processes (Adam, dim 16, rows already present, batches of
  distinct keys);
- ``in-process``: the same calls on a ``pyfleet.SparseTable`` in this process.

Targets: at 16k keys and more, service pull >= 0.5x the raw round trip of the
same bytes with every server count; a 1-key pull's latency <= 1.5x a raw round
trip (S=1). Times are medians
of calls interleaved round by round (every contender sees the same machine
load); the table prints keys/s and the ratios, including service vs the
in-process table, which bounds the service when the table is slower than the
wire.

``--cpu`` adds a table of CPU time per pull (this process, and the echo or
server processes, from ``/proc``) over back-to-back calls: on a machine with
few cores it shows how much of the wall time is work that no overlap can hide.
"""

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zmq

import pyfleet
from pyfleet.optimizer import Adam
from pyfleet.service.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
from harness import interleaved_medians, load_note, servers  # noqa: E402


def echo_main():
    """The raw baseline: reply to [size, payload...] with ``size`` bytes."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    replies = {}
    while True:
        ident, size, *_ = sock.recv_multipart(copy=False)
        n = int.from_bytes(size.buffer, "little")
        if n not in replies:
            # Filled, not np.zeros: untouched zeros are the kernel's one shared
            # zero page, which makes sending them a cache-hot copy (~5% faster
            # at 8 MB than bytes in real memory, which a server always sends).
            replies[n] = np.full(n, 0x3C, np.uint8)
        sock.send_multipart([ident, replies[n]], copy=False)


def _cpu_seconds(pid=None):
    """CPU seconds (user + system, every thread) of process ``pid``: the
    scheduler's run time of each of its threads, in nanoseconds (not the 10 ms
    ticks of /proc/<pid>/stat). None: this process, from getrusage."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # a thread that just ended
            pass
    return total / 1e9


def cpu_per_call(fn, pids, calls):
    """``(wall, this process's CPU, the CPU of pids)``, seconds per call of
    ``fn`` over ``calls`` calls back to back."""
    fn()
    w0, c0, p0 = time.perf_counter(), _cpu_seconds(), sum(_cpu_seconds(p) for p in pids)
    for _ in range(calls):
        fn()
    w1, c1, p1 = time.perf_counter(), _cpu_seconds(), sum(_cpu_seconds(p) for p in pids)
    return (w1 - w0) / calls, (c1 - c0) / calls, (p1 - p0) / calls


def calls(n, dim, batches, raw, table, clients):
    """``{op: {who: fn}}`` for batches of ``n`` distinct keys."""
    bs = batches(n)
    grads = np.full((n, dim), 1e-3, np.float32)
    it = iter(range(10**12))

    def nxt():
        return bs[next(it) % len(bs)]

    pull = {"raw": lambda: raw([bs[0]], n * dim * 4),
            "in-process": lambda: table.pull(nxt())}
    push = {"raw": lambda: raw([bs[0], grads], 8),
            "in-process": lambda: table.push(nxt(), grads)}
    for who, c in clients.items():
        pull[who] = lambda c=c: c.pull_sparse("emb", nxt())
        push[who] = lambda c=c: c.push_sparse("emb", nxt(), grads)
    return {"pull": pull, "push": push}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 16000, 128000])
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="measuring time per (batch, op, contender)")
    ap.add_argument("--max-request-keys", type=int, default=None,
                    help="the clients' max_request_keys, pushes (default: the Client's)")
    ap.add_argument("--max-pull-keys", type=int, default=None,
                    help="the clients' max_pull_keys (default: the Client's)")
    ap.add_argument("--split-pull-keys", type=int, default=None,
                    help="the servers' split_pull_keys (default: the Server's)")
    ap.add_argument("--cpu", action="store_true",
                    help="also print CPU time per pull of 16k keys and more")
    a = ap.parse_args()
    dim = a.dim
    rng = np.random.default_rng(0)
    pool = rng.choice(2**62, size=4 * max(a.sizes), replace=False).astype(np.uint64)

    def batches(n):
        return [pool[i * n:(i + 1) * n] for i in range(4)]

    config = {"kind": "sparse", **pyfleet.SparseTable(dim, Adam(0.001), name="emb").config()}
    echo = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--echo"],
                            stdout=subprocess.PIPE, text=True)
    groups, clients = [], {}
    stack = contextlib.ExitStack()
    try:
        port = int(echo.stdout.readline())
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{port}")

        def raw(frames, reply_bytes):
            sock.send_multipart([reply_bytes.to_bytes(8, "little"), *frames], copy=False)
            sock.recv_multipart(copy=False)

        table = pyfleet.SparseTable(dim, Adam(0.001), name="emb")
        table.pull(pool)
        for S in a.servers:
            g = stack.enter_context(servers(
                S, 1, mode="async", heartbeat_timeout=10.0, barrier_timeout=60.0,
                handler_threads=2, split_pull_keys=a.split_pull_keys))
            groups.append(g)
            extra = {k: v for k, v in (("max_request_keys", a.max_request_keys),
                                       ("max_pull_keys", a.max_pull_keys)) if v is not None}
            c = clients[f"service S={S}"] = Client(g.endpoints, timeout=60, **extra)
            c.create_tables([config])
            for i in range(0, pool.shape[0], 100_000):
                c.pull_sparse("emb", pool[i:i + 100_000])
        sizes = [1, *a.sizes]
        t = {}
        for n in sizes:
            for op, fns in calls(n, dim, batches, raw, table, clients).items():
                for who, sec in interleaved_medians(fns, a.seconds).items():
                    t[(n, op, who)] = sec
        cpu = {}
        if a.cpu:
            pids = {"raw": [echo.pid], "in-process": [],
                    **{f"service S={S}": g.pids
                       for S, g in zip(a.servers, groups)}}
            for n in (n for n in a.sizes if n >= 16000):
                for who, fn in calls(n, dim, batches, raw, table, clients)["pull"].items():
                    cpu[(n, who)] = cpu_per_call(fn, pids[who], max(20, 8_000_000 // n))
        for c in clients.values():
            c.stop_worker()
            c.close()
    finally:
        stack.close()
        echo.kill()
        echo.wait()

    whos = ["raw", "in-process", *clients]
    print(f"\nloopback, dim {dim}, median of repeated calls (keys/s; 1-key rows: microseconds); "
          f"{load_note()}")
    print(f"{'keys':>7} {'op':>5} " + " ".join(f"{w:>14}" for w in whos)
          + "  " + " ".join(f"{'S=' + str(S) + '/raw':>9}" for S in a.servers)
          + f" {'S=1/in-proc':>12}")
    verdicts = []
    for n in sizes:
        for op in ("pull", "push"):
            if n == 1:
                cells = [f"{t[(n, op, w)] * 1e6:>12.0f}us" for w in whos]
                ratios = [t[(n, op, f"service S={S}")] / t[(n, op, "raw")] for S in a.servers]
                print(f"{n:>7} {op:>5} " + " ".join(cells) + "  "
                      + " ".join(f"{r:>8.2f}x" for r in ratios) + "  (latency ratio)")
                if op == "pull":
                    verdicts.append(("1-key pull latency <= 1.5x raw", ratios[0] <= 1.5,
                                     f"{ratios[0]:.2f}x"))
            else:
                cells = [f"{n / t[(n, op, w)]:>14.3g}" for w in whos]
                ratios = [t[(n, op, "raw")] / t[(n, op, f"service S={S}")] for S in a.servers]
                bound = t[(n, op, "in-process")] / t[(n, op, f"service S={a.servers[0]}")]
                print(f"{n:>7} {op:>5} " + " ".join(cells) + "  "
                      + " ".join(f"{r:>8.2f}x" for r in ratios) + f" {bound:>11.2f}x")
                if op == "pull" and n >= 16000:
                    for S, r in zip(a.servers, ratios):
                        verdicts.append((f"{n}-key pull >= 0.5x raw (S={S})", r >= 0.5,
                                         f"{r:.2f}x"))
    if cpu:
        print("\npulls back to back: ms per call (wall, CPU of this process, CPU of the "
              f"echo/server processes) on {os.cpu_count()} cores")
        print(f"{'keys':>7} {'who':>12} {'wall':>7} {'client':>7} {'peers':>7} {'CPU/wall':>9}")
        for (n, who), (wall, mine, peers) in cpu.items():
            print(f"{n:>7} {who:>12} {wall * 1e3:>7.2f} {mine * 1e3:>7.2f} {peers * 1e3:>7.2f} "
                  f"{(mine + peers) / wall:>8.2f}x")
    print()
    for what, ok, value in verdicts:
        print(f"{'PASS' if ok else 'MISS'}  {what}: {value}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--echo"]:
        echo_main()
    else:
        main()

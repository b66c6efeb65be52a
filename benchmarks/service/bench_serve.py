"""`pyfleet serve` under load: requests/s, rows/s and latency against the
in-process predict of the same model on the same rows (the floor), all in one run,
with the CPU time each side spends a row, so a loaded machine still shows the ratio.

    python benchmarks/service/bench_serve.py [--rows 100000] [--seconds 4]
        [--client auto|python|wrk] [--client-procs 2] [--out FILE.json]

The reference DNN (``pyfleet train``'s default: embedding dim 16, layers
256-128-64) is trained for one pass on ``--rows`` generated Criteo rows in this
process and saved as an inference model. Then ``pyfleet serve`` runs as its
own process on 127.0.0.1 and a load generator in other processes sends Criteo
TSV requests of 1 row at concurrency 1, 8, 64 and of 256 rows at concurrency 1
and 8, for ``--seconds`` each after a warm-up: ``wrk`` (Debian's package) when
it is on PATH and ``--client`` is auto or wrk, else ``--client-procs`` Python
processes (asyncio streams, keep-alive connections each sending one request
after the other; the concurrency split among them). The floor is
``ModelVersion.predict`` in this process on the same rows in steps of 1, 64 and
256 rows, measured before and after the server runs (their mean is printed).

Beside the wall figures, for each load: the server process's CPU time (user +
system, all its threads, from /proc/PID/stat) a row answered, the rows of the
model steps the server formed (its /metrics), and the load generator's CPU a
request. "CPU / floor" is the floor's CPU a row divided by the server's: the
share of the in-process speed the server reaches a CPU second, whatever the
machine's load. "HTTP alone" is a server's HTTP with nothing behind it, under the
same load generator (``--echo``): the Python server's layer
(:mod:`pyfleet.serving.http`, what ``--front python`` reads every request with,
a handler answering a fixed JSON once the body is read) and the native front end
(its two threads, a step function that predicts nothing): that stack's own CPU a
request, which no batching removes. The server runs with its default native
front end; "RAM, JSON" sends the single row as a JSON object of named columns,
and "RAM, --front python" is the same model with every request read in Python,
both at concurrency 64.

Also: a version swap under load (concurrency 8, single rows, a new version
committed into ``--follow``'s directory mid-run: failed requests must be 0), and
the same model served with ``--memory-budget`` a quarter of its all-in-RAM
table bytes (rows beyond it on the disk tier), against all in RAM.

"rows/s / floor" divides by the floor of steps of 1 row (one row at concurrency
1), of 64 rows (one row at concurrency 8 and 64: what the server can gather
from the clients) and of 256 rows (256-row requests).

Targets (issue "pyfleet serve"): single-row p99 <= 5 ms at concurrency 1; rows/s
at concurrency 64 >= 50% of the floor (in-process steps of 64 rows); zero failed
requests across the swap.
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

# One BLAS thread, as the server runs (before numpy loads OpenBLAS): with its
# default of a thread a core, the floor's 64-row steps cost 20x the CPU on a
# loaded 2-core machine, and the floor was that much too low.
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# -- the load generator (run as: bench_serve.py --load-url URL ...) ----------------

async def _request(reader, writer, head, body):
    """One keep-alive HTTP/1.1 round trip: ``(status, X-Model-Version)``."""
    writer.write(head + body)
    status_line = await reader.readline()
    status, length, version = int(status_line.split()[1]), 0, None
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "x-model-version":
            version = value.strip()
    await reader.readexactly(length)
    return status, version


def _json_row(tsv_line):
    """A Criteo TSV line (label first) as a JSON row of named columns."""
    f = tsv_line.decode().split("\t")
    row = {f"I{i}": float(f[i]) if "." in f[i] else int(f[i]) for i in range(1, 14) if f[i]}
    row.update({f"C{i - 13}": f[i] for i in range(14, 40) if f[i]})
    return row


def _content_type(body_path):
    return "application/json" if body_path.endswith(".json") else "text/tab-separated-values"


async def _client_main(url, body, concurrency, seconds, warmup, content_type):
    # A lean client (asyncio streams, the request's bytes built once).
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    head = (f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"{content_type}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    lat, failed, versions, answered = [], 0, {}, 0
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup

    async def worker():
        nonlocal failed, answered
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                try:
                    status, v = await asyncio.wait_for(_request(reader, writer, head, body), 30)
                    ok = status == 200
                except (OSError, ValueError, asyncio.TimeoutError,
                        asyncio.IncompleteReadError):
                    ok, v = False, None
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
                t1 = time.perf_counter()
                answered += ok
                if t0 >= measure_from:
                    if ok:
                        lat.append(t1 - t0)
                        versions[v] = versions.get(v, 0) + 1
                    else:
                        failed += 1
        finally:
            writer.close()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return {"latencies": lat, "failed": failed, "versions": versions, "seconds": seconds,
            "answered": answered}


def client_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--load-url", required=True)
    p.add_argument("--body", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--warmup", type=float, default=1.0)
    a = p.parse_args(argv)
    with open(a.body, "rb") as f:
        body = f.read()
    out = asyncio.run(_client_main(a.load_url, body, a.concurrency, a.seconds, a.warmup,
                                   _content_type(a.body)))
    json.dump(out, sys.stdout)


ECHO_ANSWER = b'{"predictions": [0.5], "model_version": "echo"}'


def echo_main(front="python"):
    """``--echo [python|native]``: a server's HTTP alone, answering a fixed JSON once
    the body is read: the Python server's layer (:mod:`pyfleet.serving.http` on the
    same event loop, a handler a request) or the native front end's (its threads,
    a step function that predicts nothing): the HTTP stack's own cost a request."""
    from pyfleet.cli.serve import _event_loop_run
    from pyfleet.serving.http import HTTPServer, Route

    def answer(request):
        request.respond(200, ECHO_ANSWER, b"application/json")

    def ready(request):
        request.respond(200, b"ready")

    def step(text, raw, text_ends, raw_ends, info):
        rows = info[:, 1].astype(np.int64)
        return (np.full(int(rows.sum()), 0.5), rows, [], b'{"predictions": [',
                b'], "model_version": "echo"}', b"")

    async def run():
        server = HTTPServer({"/predict": {"POST": Route(answer)},
                             "/healthz": {"GET": Route(ready)}},
                            max_body_bytes=16 << 20, read_timeout=30.0,
                            on_done=lambda *a: None, on_abort=lambda r: None, log=None)
        if front == "python":
            port = await server.start("127.0.0.1", 0)
        else:  # the serving defaults: 1 ms batch wait, 4096 rows a step
            from pyfleet.serving import _front
            from pyfleet.serving.native import KEEPALIVE_TIMEOUT, listen
            loop = asyncio.get_running_loop()
            socks = listen("127.0.0.1", 0)
            server.serve_handed_over()
            native = _front.Front(
                [s.fileno() for s in socks], step, lambda fd, data: loop.call_soon_threadsafe(
                    server.adopt, fd, data), 0.001, 4096, 64 << 10, 30.0, KEEPALIVE_TIMEOUT,
                256, [1.0])
            native.start()
            port = socks[0].getsockname()[1]
        print(f"pyfleet serve: listening on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()  # until SIGTERM
    _event_loop_run()(run())


# -- the parts run by the benchmark --------------------------------------------------

def build_model(where, data_dir, seed=0):
    """The reference DNN trained one pass on ``data_dir/train.tsv``, saved at ``where``."""
    from pyfleet import fluid, models
    from pyfleet.data import Dataset
    from pyfleet.fluid import inference
    from pyfleet.trainer import feed_of
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = seed
    with fluid.program_guard(main, startup):
        m = models.build("dnn", num_dense=13, num_slots=26, embedding_dim=16,
                         layers=(256, 128, 64))
        fluid.optimizer.Adam(learning_rate=0.001).minimize(m.avg_cost)
    exe = fluid.Executor()
    exe.run(startup)
    for b in Dataset(os.path.join(data_dir, "train.tsv"), format="criteo", batch_size=512,
                     shuffle=True, seed=seed):
        exe.run(main, feed=feed_of(b, m), fetch_list=[m.avg_cost])
    inference.save(where, main, [v.name for v in m.inputs if v is not m.label], [m.predict],
                   inference.LocalSource(main.backend))
    return where


class Server:
    """``pyfleet serve ARGS`` (or the echo server) as its own process on 127.0.0.1."""

    def __init__(self, *args, echo=None):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        cmd = ([sys.executable, os.path.abspath(__file__), "--echo", echo] if echo else
               [sys.executable, "-m", "pyfleet.cli", "serve", "--port", "0", *map(str, args)])
        self.echo = echo
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.err = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()
        line = self.proc.stdout.readline()
        if not line.startswith("pyfleet serve: listening on "):
            self.proc.kill()
            raise SystemExit(f"pyfleet serve did not start: {line!r} {''.join(self.err)}")
        self.url = line.rsplit(" ", 1)[1].strip()
        import urllib.request
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"pyfleet serve exited: {''.join(self.err)}")
            time.sleep(0.1)
        raise SystemExit("pyfleet serve not ready in 600 s")

    def metrics(self):
        import urllib.request
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def steps(self):
        """``(model steps, rows)`` so far, from /metrics' batch_rows histogram."""
        if self.echo:
            return 0, 0
        got = {}
        for line in self.metrics().splitlines():
            name, _, value = line.partition(" ")
            if name in ("pyfleet_serve_batch_rows_count", "pyfleet_serve_batch_rows_sum"):
                got[name] = float(value)
        return got["pyfleet_serve_batch_rows_count"], got["pyfleet_serve_batch_rows_sum"]

    def cpu_seconds(self):
        """User + system CPU of the server process so far (every thread, /proc/PID/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _children_cpu():
    t = os.times()
    return t.children_user + t.children_system


def _python_load(url, body_path, concurrency, seconds, procs, during):
    """``procs`` client processes sharing ``concurrency``: merged results."""
    procs = max(1, min(procs, concurrency))
    shares = [concurrency // procs + (i < concurrency % procs) for i in range(procs)]
    running = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--load-url", url,
                                 "--body", body_path, "--concurrency", str(c),
                                 "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True)
               for c in shares]
    if during is not None:
        during()
    outs = [json.loads(p.communicate(timeout=seconds + 300)[0]) for p in running]
    versions = {}
    for o in outs:
        for v, n in o["versions"].items():
            versions[v] = versions.get(v, 0) + n
    lat = np.concatenate([np.asarray(o["latencies"], dtype=np.float64) for o in outs])
    return {"latencies": lat, "failed": sum(o["failed"] for o in outs), "versions": versions,
            "answered": sum(o["answered"] for o in outs)}


_WRK_SCRIPT = """wrk.method = "POST"
local f = assert(io.open(os.getenv("BENCH_SERVE_BODY"), "rb"))
wrk.body = f:read("*all")
f:close()
local json = os.getenv("BENCH_SERVE_BODY"):match("%.json$")
wrk.headers["Content-Type"] = json and "application/json" or "text/tab-separated-values"
"""


def _wrk_seconds(text):
    for unit, scale in (("us", 1e-6), ("ms", 1e-3), ("m", 60.0), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[:-len(unit)]) * scale
    return float(text)


def _wrk(url, script, body_path, concurrency, seconds):
    env = {**os.environ, "BENCH_SERVE_BODY": body_path}
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency",
                          "--timeout", "30s", "-s", script, url + "/predict"],
                         env=env, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise SystemExit(f"wrk failed: {out.stderr or out.stdout}")
    r = {"failed": 0}
    for line in out.stdout.splitlines():
        words = line.split()
        if line.strip().startswith(("50%", "99%")):
            r["p" + words[0].rstrip("%")] = _wrk_seconds(words[1])
        elif " requests in " in line:
            r["requests"] = int(words[0])
        elif line.startswith("Non-2xx"):
            r["failed"] += int(words[-1])
        elif line.strip().startswith("Socket errors"):
            r["failed"] += sum(int(w.rstrip(",")) for w in words[3::2])
    return r


def load(server, body_path, rows, concurrency, seconds, client="python", procs=1,
         during=None, tmp=None):
    """Requests of ``rows`` rows at ``concurrency`` for ``seconds`` (after a warm-up)
    against ``server``; ``during()`` runs in this process meanwhile (Python client).
    Wall figures, and the CPU the server and the load generator spent a row/request."""
    url = server.url
    if client == "wrk":
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write(_WRK_SCRIPT)
        _wrk(url, script, body_path, concurrency, 1)  # warm-up
    steps0, cpu0, ccpu0 = server.steps(), server.cpu_seconds(), _children_cpu()
    if client == "wrk":
        w = _wrk(url, script, body_path, concurrency, seconds)
        answered, n, failed, versions = w["requests"], w["requests"], w["failed"], {}
        p50, p99 = w["p50"], w["p99"]
    else:
        r = _python_load(url, body_path, concurrency, seconds, procs, during)
        lat, answered, failed, versions = r["latencies"], r["answered"], r["failed"], \
            r["versions"]
        n = int(lat.shape[0])
        p50, p99 = (np.percentile(lat, 50), np.percentile(lat, 99)) if n else (np.nan,) * 2
    steps1, cpu1, ccpu1 = server.steps(), server.cpu_seconds(), _children_cpu()
    answered = max(answered, 1)
    formed = steps1[0] - steps0[0]
    return {"client": client if client == "wrk" else f"python x{max(1, min(procs, concurrency))}",
            "requests_s": n / seconds, "p50_ms": 1e3 * p50, "p99_ms": 1e3 * p99,
            "failed": failed, "versions": versions, "n": n,
            "server_cpu_ms_row": 1e3 * (cpu1 - cpu0) / (answered * rows),
            "client_cpu_ms_request": 1e3 * (ccpu1 - ccpu0) / answered,
            "rows_step": (steps1[1] - steps0[1]) / formed if formed else float("nan"),
            "steps": formed}


def floor(model_dir, batch, steps_seconds=2.0):
    """rows/s, ms a step and CPU ms a row of ``ModelVersion.predict`` on ``batch`` here."""
    from pyfleet.serving.model import ModelVersion
    v = ModelVersion(model_dir)
    for _ in range(3):
        v.predict(batch)
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - t0 < steps_seconds:
        v.predict(batch)
        n += 1
    dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"rows_s": n * len(batch) / dt, "ms": 1e3 * dt / n,
            "cpu_ms_row": 1e3 * cpu / (n * len(batch))}


def main():
    if "--load-url" in sys.argv:
        return client_main(sys.argv[1:])
    if sys.argv[1:2] == ["--echo"]:
        return echo_main(*sys.argv[2:3])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="generated training rows")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per load")
    p.add_argument("--client", default="auto", choices=["auto", "python", "wrk"],
                   help="the load generator (auto: wrk when on PATH, else Python processes; "
                        "the swap run always uses the Python one, which reads the versions)")
    p.add_argument("--client-procs", type=int, default=2,
                   help="Python load generator processes sharing the concurrency")
    p.add_argument("--out", default=None, help="also write the results as JSON")
    a = p.parse_args()
    client = a.client
    if client == "auto":
        client = "wrk" if shutil.which("wrk") else "python"
    elif client == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--client wrk: wrk is not on PATH (apt-get install wrk)")
    if a.client_procs < 1:
        raise SystemExit(f"--client-procs must be >= 1, got {a.client_procs}")
    from pyfleet.data import synthetic
    from pyfleet.serving.model import ModelVersion
    from pyfleet.serving.rows import RowSchema

    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    load0 = os.getloadavg()
    opts = {"client": client, "procs": a.client_procs, "tmp": tmp}
    try:
        data = os.path.join(tmp, "data")
        synthetic.generate(data, rows=a.rows, seed=0)
        models_dir = os.path.join(tmp, "models")
        os.makedirs(models_dir)
        t0 = time.perf_counter()
        v1 = build_model(os.path.join(tmp, "v1"), data, seed=0)
        print(f"model trained and saved in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        shutil.copytree(v1, os.path.join(models_dir, "1"))
        lines = open(os.path.join(data, "test.tsv"), "rb").read().splitlines()
        bodies = {}
        for n in (1, 64, 256):
            path = os.path.join(tmp, f"body{n}.tsv")
            with open(path, "wb") as f:
                f.write(b"\n".join(lines[:n]) + b"\n")
            bodies[n] = path
        bodies["json"] = os.path.join(tmp, "body1.json")  # the same row as JSON columns
        with open(bodies["json"], "w") as f:
            json.dump({"rows": [_json_row(lines[0])]}, f)
        schema = RowSchema(13, 26, max_rows=1 << 20)
        batches = {n: schema.parse("text/tab-separated-values", open(bodies[n], "rb").read())
                   for n in (1, 64, 256)}
        ram = ModelVersion(v1)
        table_bytes = sum(t.memory_bytes() for t in ram.tables.values())
        table_rows = sum(len(t) for t in ram.tables.values())
        del ram
        budget = table_bytes // 4

        floors = [{n: floor(v1, batches[n]) for n in (1, 64, 256)}]
        results = []
        for front, label in (("python", "HTTP alone, Python"), ("native", "HTTP alone, native")):
            echo = Server(echo=front)
            try:
                for conc in (1, 64):
                    r = load(echo, bodies[1], 1, conc, a.seconds, **opts)
                    results.append({"table": label, "rows": 1, "concurrency": conc, **r})
            finally:
                echo.close()
        server = Server("--follow", models_dir, "--poll-interval", "0.2")
        try:
            for rows, conc in ((1, 1), (1, 8), (1, 64), (256, 1), (256, 8)):
                r = load(server, bodies[rows], rows, conc, a.seconds, **opts)
                results.append({"table": "RAM", "rows": rows, "concurrency": conc, **r})
            r = load(server, bodies["json"], 1, 64, a.seconds, **opts)
            results.append({"table": "RAM, JSON", "rows": 1, "concurrency": 64, **r})

            def swap():
                time.sleep(a.seconds / 2 + 1.0)
                shutil.copytree(v1, os.path.join(models_dir, ".2.tmp"))
                os.rename(os.path.join(models_dir, ".2.tmp"), os.path.join(models_dir, "2"))
            r = load(server, bodies[1], 1, 8, a.seconds, **{**opts, "client": "python"},
                     during=swap)
            results.append({"table": "RAM, swap", "rows": 1, "concurrency": 8, **r})
        finally:
            server.close()
        server = Server("--model", v1, "--front", "python")  # every request in Python
        try:
            r = load(server, bodies[1], 1, 64, a.seconds, **opts)
            results.append({"table": "RAM, --front python", "rows": 1, "concurrency": 64, **r})
        finally:
            server.close()
        spill = os.path.join(tmp, "spill")
        server = Server("--model", v1, "--memory-budget", str(budget), "--spill-dir", spill)
        try:
            tiers = {ln.split('tier="')[1].split('"')[0]: int(float(ln.rsplit(" ", 1)[1]))
                     for ln in server.metrics().splitlines()
                     if ln.startswith("pyfleet_serve_table_rows{")}
            for rows, conc in ((1, 1), (1, 64), (256, 8)):
                r = load(server, bodies[rows], rows, conc, a.seconds, **opts)
                results.append({"table": "1/4 in RAM", "rows": rows, "concurrency": conc, **r})
        finally:
            server.close()
        floors.append({n: floor(v1, batches[n]) for n in (1, 64, 256)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()

    fl = {n: {k: (floors[0][n][k] + floors[1][n][k]) / 2 for k in ("rows_s", "ms", "cpu_ms_row")}
          for n in (1, 64, 256)}
    print(f"\nreference DNN (dim 16, 256-128-64), {table_rows:,} rows in its table "
          f"({table_bytes / 2**20:.1f} MiB in RAM; budget of the 1/4 runs "
          f"{budget / 2**20:.1f} MiB: {tiers.get('ram', 0):,} rows in RAM, "
          f"{tiers.get('disk', 0):,} on disk)")
    print("floor, in-process ModelVersion.predict: "
          + ", ".join(f"{n} rows {fl[n]['rows_s']:,.0f} rows/s ({fl[n]['ms']:.2f} ms a step, "
                      f"{fl[n]['cpu_ms_row']:.4f} ms CPU a row)" for n in (1, 64, 256))
          + f"  [before/after: {floors[0][64]['rows_s']:,.0f}/{floors[1][64]['rows_s']:,.0f}"
            f" rows/s at 64]")
    print("\n| table | client | rows/request | concurrency | requests/s | rows/s | p50 ms | "
          "p99 ms | failed | rows a step | server CPU ms a row | client CPU ms a request | "
          "rows/s / floor | CPU / floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ref = fl[256 if r["rows"] == 256 else 1 if r["concurrency"] == 1 else 64]
        echo_row = r["table"].startswith("HTTP alone")
        print(f"| {r['table']} | {r['client']} | {r['rows']} | {r['concurrency']} | "
              f"{r['requests_s']:,.0f} | {r['requests_s'] * r['rows']:,.0f} | "
              f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['failed']} | "
              f"{'-' if echo_row else format(r['rows_step'], '.1f')} | "
              f"{r['server_cpu_ms_row']:.4f} | {r['client_cpu_ms_request']:.4f} | "
              f"{'-' if echo_row else format(r['requests_s'] * r['rows'] / ref['rows_s'], '.2f')}"
              f" | {ref['cpu_ms_row'] / r['server_cpu_ms_row']:.2f} |")
    by = {(r["table"], r["rows"], r["concurrency"]): r for r in results}
    swap = by[("RAM, swap", 1, 8)]
    c1, c64 = by[("RAM", 1, 1)], by[("RAM", 1, 64)]
    ratio = c64["requests_s"] / fl[64]["rows_s"]
    cpu_ratio = fl[64]["cpu_ms_row"] / c64["server_cpu_ms_row"]
    echo64, necho64 = by[("HTTP alone, Python", 1, 64)], by[("HTTP alone, native", 1, 64)]
    print(f"\nswap under load: versions answered {swap['versions']}, failed {swap['failed']}")
    print(f"targets: single-row p99 at concurrency 1 {c1['p99_ms']:.2f} ms (<= 5: "
          f"{'met' if c1['p99_ms'] <= 5 else 'NOT met'}); concurrency 64 rows/s "
          f"{ratio:.2f}x the 64-row floor, {cpu_ratio:.2f}x by CPU a row (>= 0.5: "
          f"{'met' if ratio >= 0.5 else 'NOT met'}); swap with {swap['failed']} failed "
          f"requests and {len(swap['versions'])} versions seen "
          f"({'met' if swap['failed'] == 0 and len(swap['versions']) == 2 else 'NOT met'})")
    py64, json64 = by[("RAM, --front python", 1, 64)], by[("RAM, JSON", 1, 64)]
    print(f"single rows at concurrency 64, server CPU a row: the native front end "
          f"{c64['server_cpu_ms_row']:.4f} ms in steps of {c64['rows_step']:.1f} rows "
          f"(JSON rows {json64['server_cpu_ms_row']:.4f} ms), --front python "
          f"{py64['server_cpu_ms_row']:.4f} ms ({py64['requests_s'] / fl[64]['rows_s']:.2f}x "
          f"the floor's rows/s); HTTP alone {necho64['server_cpu_ms_row']:.4f} ms a request "
          f"(native), {echo64['server_cpu_ms_row']:.4f} ms (Python); the 64-row floor "
          f"{fl[64]['cpu_ms_row']:.4f} ms a row")
    for rows, conc in ((1, 1), (1, 64), (256, 8)):
        d, r = by[("1/4 in RAM", rows, conc)], by[("RAM", rows, conc)]
        print(f"1/4 in RAM vs all in RAM, {rows} row(s) at {conc}: rows/s "
              f"{d['requests_s'] / r['requests_s']:.2f}x, p99 {d['p99_ms']:.2f} vs "
              f"{r['p99_ms']:.2f} ms, server CPU a row {d['server_cpu_ms_row']:.4f} vs "
              f"{r['server_cpu_ms_row']:.4f} ms")
    print(f"load average: {load0[0]:.2f} at the start, {load1[0]:.2f} at the end "
          f"(2 cores: wall figures are this machine's at that load; the CPU figures less so)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"results": results, "floor": fl, "load": [load0, load1],
                       "table_rows": table_rows, "table_bytes": table_bytes}, f, indent=1)


if __name__ == "__main__":
    main()

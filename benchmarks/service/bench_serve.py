"""`pyfleet serve` under load: requests/s, rows/s and latency against the
in-process predict of the same model on the same rows (the floor), all in one run.

    python benchmarks/service/bench_serve.py [--rows 100000] [--seconds 4] [--out FILE.json]

The reference DNN (``pyfleet train``'s default: embedding dim 16, layers
256-128-64) is trained for one pass on ``--rows`` generated Criteo rows in this
process and saved as an inference model. Then ``pyfleet serve`` runs as its
own process on 127.0.0.1, and a load generator in another process (asyncio
streams, ``C`` keep-alive connections each sending one request after the other) sends
Criteo TSV requests of 1 row at concurrency 1, 8, 64 and of 256 rows at
concurrency 1 and 8, for ``--seconds`` each after a warm-up. The floor is
``ModelVersion.predict`` in this process on the same rows in steps of 1, 64 and
256 rows, measured before and after the server runs (their mean is printed).

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

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


# -- the load generator (run as: bench_serve.py --client URL ...) ------------------

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


async def _client_main(url, body, concurrency, seconds, warmup):
    # A lean client (asyncio streams, the request's bytes built once): its CPU a
    # request is a small part of the server's, so the figures are the server's.
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    head = (f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"text/tab-separated-values\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    lat, failed, versions = [], 0, {}
    stop_at = time.perf_counter() + warmup + seconds
    measure_from = time.perf_counter() + warmup

    async def worker():
        nonlocal failed
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
                if t0 >= measure_from:
                    if ok:
                        lat.append(t1 - t0)
                        versions[v] = versions.get(v, 0) + 1
                    else:
                        failed += 1
        finally:
            writer.close()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return {"latencies": lat, "failed": failed, "versions": versions, "seconds": seconds}


def client_main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--client", required=True)
    p.add_argument("--body", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--warmup", type=float, default=1.0)
    a = p.parse_args(argv)
    with open(a.body, "rb") as f:
        body = f.read()
    out = asyncio.run(_client_main(a.client, body, a.concurrency, a.seconds, a.warmup))
    json.dump(out, sys.stdout)


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
    def __init__(self, *args):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "pyfleet.cli", "serve", "--port",
                                      "0", *map(str, args)], env=env, stdout=subprocess.PIPE,
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

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def load(url, body_path, concurrency, seconds, during=None):
    """The client process's result; ``during()`` runs in this process meanwhile."""
    cmd = [sys.executable, os.path.abspath(__file__), "--client", url, "--body", body_path,
           "--concurrency", str(concurrency), "--seconds", str(seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    if during is not None:
        during()
    out, _ = proc.communicate(timeout=seconds + 300)
    r = json.loads(out)
    lat = np.array(r["latencies"])
    return {"requests_s": lat.shape[0] / r["seconds"], "p50_ms": 1e3 * np.percentile(lat, 50),
            "p99_ms": 1e3 * np.percentile(lat, 99), "failed": r["failed"],
            "versions": r["versions"], "n": int(lat.shape[0])}


def floor(model_dir, batch, steps_seconds=2.0):
    """rows/s and ms per step of ``ModelVersion.predict`` on ``batch`` in this process."""
    from pyfleet.serving.model import ModelVersion
    v = ModelVersion(model_dir)
    for _ in range(3):
        v.predict(batch)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < steps_seconds:
        v.predict(batch)
        n += 1
    dt = time.perf_counter() - t0
    return {"rows_s": n * len(batch) / dt, "ms": 1e3 * dt / n}


def main():
    if "--client" in sys.argv:
        return client_main(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="generated training rows")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per load")
    p.add_argument("--out", default=None, help="also write the results as JSON")
    a = p.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    from pyfleet.data import synthetic
    from pyfleet.serving.model import ModelVersion
    from pyfleet.serving.rows import RowSchema

    tmp = tempfile.mkdtemp(prefix="bench-serve-")
    load0 = os.getloadavg()
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
        schema = RowSchema(13, 26, max_rows=1 << 20)
        batches = {n: schema.parse("text/tab-separated-values", open(bodies[n], "rb").read())
                   for n in bodies}
        ram = ModelVersion(v1)
        table_bytes = sum(t.memory_bytes() for t in ram.tables.values())
        table_rows = sum(len(t) for t in ram.tables.values())
        del ram
        budget = table_bytes // 4

        floors = [{n: floor(v1, batches[n]) for n in (1, 64, 256)}]
        results = []
        server = Server("--follow", models_dir, "--poll-interval", "0.2")
        try:
            for rows, conc in ((1, 1), (1, 8), (1, 64), (256, 1), (256, 8)):
                r = load(server.url, bodies[rows], conc, a.seconds)
                results.append({"table": "RAM", "rows": rows, "concurrency": conc, **r})

            def swap():
                time.sleep(a.seconds / 2 + 1.0)
                shutil.copytree(v1, os.path.join(models_dir, ".2.tmp"))
                os.rename(os.path.join(models_dir, ".2.tmp"), os.path.join(models_dir, "2"))
            r = load(server.url, bodies[1], 8, a.seconds, during=swap)
            results.append({"table": "RAM, swap", "rows": 1, "concurrency": 8, **r})
        finally:
            server.close()
        spill = os.path.join(tmp, "spill")
        server = Server("--model", v1, "--memory-budget", str(budget), "--spill-dir", spill)
        try:
            tiers = {ln.split('tier="')[1].split('"')[0]: int(float(ln.rsplit(" ", 1)[1]))
                     for ln in server.metrics().splitlines()
                     if ln.startswith("pyfleet_serve_table_rows{")}
            for rows, conc in ((1, 1), (1, 64), (256, 8)):
                r = load(server.url, bodies[rows], conc, a.seconds)
                results.append({"table": "1/4 in RAM", "rows": rows, "concurrency": conc, **r})
        finally:
            server.close()
        floors.append({n: floor(v1, batches[n]) for n in (1, 64, 256)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()

    fl = {n: {k: (floors[0][n][k] + floors[1][n][k]) / 2 for k in ("rows_s", "ms")}
          for n in (1, 64, 256)}
    print(f"\nreference DNN (dim 16, 256-128-64), {table_rows:,} rows in its table "
          f"({table_bytes / 2**20:.1f} MiB in RAM; budget of the 1/4 runs "
          f"{budget / 2**20:.1f} MiB: {tiers.get('ram', 0):,} rows in RAM, "
          f"{tiers.get('disk', 0):,} on disk)")
    print("floor, in-process ModelVersion.predict: "
          + ", ".join(f"{n} rows {fl[n]['rows_s']:,.0f} rows/s ({fl[n]['ms']:.2f} ms)"
                      for n in (1, 64, 256))
          + f"  [before/after: {floors[0][64]['rows_s']:,.0f}/{floors[1][64]['rows_s']:,.0f}"
            f" rows/s at 64]")
    print("\n| table | rows/request | concurrency | requests/s | rows/s | p50 ms | p99 ms | "
          "failed | rows/s / floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ref = fl[256 if r["rows"] == 256 else 1 if r["concurrency"] == 1 else 64]["rows_s"]
        print(f"| {r['table']} | {r['rows']} | {r['concurrency']} | {r['requests_s']:,.0f} | "
              f"{r['requests_s'] * r['rows']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
              f"{r['failed']} | {r['requests_s'] * r['rows'] / ref:.2f} |")
    by = {(r["table"], r["rows"], r["concurrency"]): r for r in results}
    swap = by[("RAM, swap", 1, 8)]
    c1, c64 = by[("RAM", 1, 1)], by[("RAM", 1, 64)]
    ratio = c64["requests_s"] / fl[64]["rows_s"]
    print(f"\nswap under load: versions answered {swap['versions']}, failed {swap['failed']}")
    print(f"targets: single-row p99 at concurrency 1 {c1['p99_ms']:.2f} ms (<= 5: "
          f"{'met' if c1['p99_ms'] <= 5 else 'NOT met'}); concurrency 64 rows/s "
          f"{ratio:.2f}x the 64-row floor (>= 0.5: {'met' if ratio >= 0.5 else 'NOT met'}); "
          f"swap with {swap['failed']} failed requests and "
          f"{len(swap['versions'])} versions seen "
          f"({'met' if swap['failed'] == 0 and len(swap['versions']) == 2 else 'NOT met'})")
    for rows, conc in ((1, 1), (1, 64), (256, 8)):
        d, r = by[("1/4 in RAM", rows, conc)], by[("RAM", rows, conc)]
        print(f"1/4 in RAM vs all in RAM, {rows} row(s) at {conc}: rows/s "
              f"{d['requests_s'] / r['requests_s']:.2f}x, p99 {d['p99_ms']:.2f} vs "
              f"{r['p99_ms']:.2f} ms")
    print(f"load average: {load0[0]:.2f} at the start, {load1[0]:.2f} at the end "
          f"(2 cores: figures are this machine's at that load)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"results": results, "floor": fl, "load": [load0, load1],
                       "table_rows": table_rows, "table_bytes": table_bytes}, f, indent=1)


if __name__ == "__main__":
    main()

"""What the benchmarks share: timing, alternation, the load average, child
processes that answer in JSON, and server processes on loopback.

A benchmark in a group folder (``benchmarks/micro/``, ``service/``, ...)
imports it after putting this folder on ``sys.path``::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
    import harness  # noqa: E402

On a shared machine the absolute speed drifts by tens of percent within
minutes: compare only figures measured in the same run, alternated
(:func:`interleaved_medians`), and print the load average beside them
(:func:`load_note`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parent  # benchmarks/
REPO = ROOT.parent

__all__ = [
    "REPO",
    "ROOT",
    "Servers",
    "best_of",
    "clock",
    "emit",
    "generated_rows",
    "interleaved_medians",
    "json_child",
    "load_average",
    "load_note",
    "median_seconds",
    "servers",
]


def load_average() -> float:
    """The 1-minute load average (how busy the machine was beside a figure)."""
    return os.getloadavg()[0]


def load_note() -> str:
    """``"load average 1.23"``, to print beside every table of figures."""
    return f"load average {load_average():.2f}"


def clock(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """Milliseconds of wall clock and of this process's CPU per call of ``fn``, over ``n`` calls."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n * 1e3, (time.process_time() - c0) / n * 1e3


def best_of(repeat: int, fn: Callable[[], object],
            timer: Callable[[], float] = time.perf_counter) -> float:
    """The fastest of ``repeat`` calls of ``fn``, in seconds of ``timer``."""
    best = float("inf")
    for _ in range(repeat):
        t0 = timer()
        fn()
        best = min(best, timer() - t0)
    return best


def median_seconds(fn: Callable[[], object], n: int,
                   timer: Callable[[], float] = time.perf_counter) -> float:
    """The median of ``n`` calls of ``fn``, in seconds of ``timer``."""
    times = []
    for _ in range(n):
        t0 = timer()
        fn()
        times.append(timer() - t0)
    return float(np.median(times))


def interleaved_medians(fns: dict[str, Callable[[], object]], seconds: float,
                        min_rounds: int = 5) -> dict[str, float]:
    """Median seconds per call of each function, called in turn round after
    round (each once to warm first) so that every one sees the same machine load."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    end = time.perf_counter() + seconds * len(fns)
    rounds = 0
    while rounds < min_rounds or time.perf_counter() < end:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        rounds += 1
    return {name: float(np.median(t)) for name, t in times.items()}


def emit(result: dict, path: str | os.PathLike | None = None) -> None:
    """One JSON line on stdout (what :func:`json_child` reads back), and the
    same object written to ``path`` (indented) when one is given."""
    print(json.dumps(result), flush=True)
    if path is not None:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def generated_rows(cache: str | os.PathLike, rows: int, seed: int) -> dict:
    """``pyfleet gen-data --rows ROWS --seed SEED``, made once under ``cache``
    (``generated-ROWS-SEED/``) and reused by every later run: ``{"train",
    "test", "truth_auc"}`` (paths, and the ground-truth test AUC)."""
    out = Path(cache) / f"generated-{rows}-{seed}"
    if not (out / "truth.json").exists():
        env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
        subprocess.run([sys.executable, "-m", "pyfleet.cli", "gen-data", "--out", str(out),
                        "--rows", str(rows), "--seed", str(seed)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    truth = json.loads((out / "truth.json").read_text())
    return {"train": str(out / "train.tsv"), "test": str(out / "test.tsv"),
            "truth_auc": truth.get("truth_auc_test", truth.get("auc_test"))}


def json_child(script: str | os.PathLike, argv: list[str], budget: int | None = None) -> dict:
    """``python script --child *argv [--budget budget]`` in a process of its own (so
    its RSS is its own): the JSON object its last line prints."""
    cmd = [sys.executable, str(script), "--child", *argv]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_watched(cmd: list[str], env: dict, timeout: float, watch: Callable[[int], None],
                every: float = 0.2) -> str:
    """Run ``cmd`` to its end, calling ``watch(pid)`` every ``every`` seconds while it
    runs (to sample its processes' CPU); its stdout. Killed after ``timeout`` + 60 s;
    a non-zero exit raises with the tail of both streams."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + timeout + 60
        while p.poll() is None:
            watch(p.pid)
            if time.monotonic() > deadline:
                p.kill()
                p.wait()
                raise RuntimeError(f"{' '.join(cmd)} did not finish in {timeout + 60:.0f} s")
            time.sleep(every)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return stdout


class Servers(NamedTuple):
    endpoints: list[str]  # in index order
    pids: list[int]


@contextlib.contextmanager
def servers(num_servers: int, workers: int, *, start_timeout: float = 60.0, **options):
    """``num_servers`` ``python -m pyfleet.service`` processes on 127.0.0.1 with
    ephemeral ports, as :class:`Servers`; always stopped at the end. ``options``
    become flags: ``handler_threads=2`` is ``--handler-threads 2`` (``None``
    leaves a flag out)."""
    flags = []
    for name, value in options.items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    procs, endpoints = [], []
    try:
        for i in range(num_servers):
            cmd = [sys.executable, "-m", _server_module(), "--endpoint", "127.0.0.1:0",
                   "--index", str(i), "--num-servers", str(num_servers),
                   "--workers", str(workers), "--log-level", "ERROR", *flags]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE))
            endpoints.append(_ready_endpoint(procs[-1], start_timeout))
        yield Servers(endpoints, [p.pid for p in procs])
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
            p.stdout.close()


def _server_module() -> str:
    """``pyfleet.service`` (``python -m pyfleet.service``), or ``pyfleet.server`` in a
    revision before it (``tools/ab.py`` runs a benchmark against older builds too)."""
    found = importlib.util.find_spec("pyfleet.service.__main__") is not None
    return "pyfleet.service" if found else "pyfleet.server"


def _ready_endpoint(p: subprocess.Popen, timeout: float) -> str:
    """The endpoint a server's ``pyfleet.server ready on HOST:PORT`` line names."""
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end and b"\n" not in buf:
        if select.select([p.stdout], [], [], 0.1)[0]:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    line = buf.split(b"\n", 1)[0].decode()
    if line.startswith("pyfleet.server ready on "):
        return line.rsplit(" ", 1)[1]
    p.kill()
    raise RuntimeError(f"server did not start within {timeout} s "
                       f"(exit {p.poll()}, said {line!r})")

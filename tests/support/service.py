"""Helpers for tests and benchmarks of the service: server processes on loopback
and scripted worker processes (``from support.service import ServerGroup``).

``ServerGroup`` starts ``S`` ``python -m pyfleet.service`` processes on
127.0.0.1 with ephemeral ports and always stops them (context manager).
``python tests/support/service.py SCENARIO JSON`` runs one scripted worker
(see ``SCENARIOS``; :func:`start_worker` starts one); deterministic data comes
from :func:`batch`.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np

from pyfleet.service.client import Client

__all__ = ["SCENARIOS", "ServerGroup", "batch", "start_worker"]


class ServerGroup:
    """``num_servers`` server processes; ``.endpoints`` in index order."""

    def __init__(self, num_servers, workers, mode="async", checkpoint_dir=None,
                 heartbeat_timeout=10.0, barrier_timeout=60.0, handler_threads=2,
                 max_message_bytes=None, inline_limit=None, start_timeout=30.0,
                 split_pull_keys=None, extra_args=()):
        self.procs, self.endpoints = [], []
        try:
            for i in range(num_servers):
                cmd = [sys.executable, "-m", "pyfleet.service", "--endpoint", "127.0.0.1:0",
                       "--index", str(i), "--num-servers", str(num_servers),
                       "--workers", str(workers), "--mode", mode,
                       "--heartbeat-timeout", str(heartbeat_timeout),
                       "--barrier-timeout", str(barrier_timeout),
                       "--handler-threads", str(handler_threads), "--log-level", "ERROR"]
                if checkpoint_dir is not None:
                    cmd += ["--checkpoint-dir", str(checkpoint_dir)]
                if inline_limit is not None:
                    cmd += ["--inline-limit", str(inline_limit)]
                if max_message_bytes is not None:
                    cmd += ["--max-message-bytes", str(max_message_bytes)]
                if split_pull_keys is not None:
                    cmd += ["--split-pull-keys", str(split_pull_keys)]
                cmd += [str(a) for a in extra_args]
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE)
                self.procs.append(p)
                self.endpoints.append(_ready_line(p, start_timeout))
        except BaseException:
            self.stop()
            raise

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def wait(self, timeout):
        """Exit codes of every server, waiting up to ``timeout`` seconds in all."""
        end = time.monotonic() + timeout
        return [p.wait(max(0.01, end - time.monotonic())) for p in self.procs]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            if p.stdout:
                p.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _ready_line(p, timeout):
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.1)
        if r:
            chunk = os.read(p.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                line = buf.split(b"\n", 1)[0].decode()
                if line.startswith("pyfleet.server ready on "):
                    return line.rsplit(" ", 1)[1]
                raise RuntimeError(f"unexpected server output {line!r}")
        elif p.poll() is not None:
            break
    p.kill()
    raise RuntimeError(f"server did not start within {timeout} s (exit {p.poll()})")


def batch(seed, step, n, dim, num_keys=1000, dyadic=False):
    """A deterministic ``(keys, grads)`` batch. ``dyadic``: gradients are
    multiples of 1/4 in [-4, 4], so SGD sums are exact in any order."""
    rng = np.random.default_rng([seed, step])
    keys = rng.integers(0, num_keys, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    if dyadic:
        grads = (rng.integers(-16, 17, (n, dim)) / 4.0).astype(np.float32)
    else:
        grads = rng.standard_normal((n, dim)).astype(np.float32)
    return keys, grads


def start_worker(scenario, **args):
    """A worker process running ``SCENARIOS[scenario](**args)``."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), scenario,
                             json.dumps(args)])


def _async_push(endpoints, worker, steps, n, dim, table, timeout=20.0):
    with Client(endpoints, worker_index=worker, timeout=timeout) as c:
        futs = []
        for step in range(steps):
            keys, grads = batch(worker, step, n, dim, dyadic=True)
            futs.append(c.push_sparse_async(table, keys, grads))
        for f in futs:
            f.result()
        c.stop_worker()


def _sync_steps(endpoints, worker, steps, n, dim, table, out=None, hang_after=None,
                timeout=20.0):
    pulled = []
    with Client(endpoints, worker_index=worker, timeout=timeout) as c:
        for step in range(steps):
            if hang_after is not None and step == hang_after:
                time.sleep(3600)  # parked: the test kills this process here
            keys, grads = batch(worker, step, n, dim, dyadic=True)
            pulled.append(c.pull_sparse(table, keys))
            c.push_sparse(table, keys, grads)
            c.barrier()
        c.stop_worker()
    if out:
        np.save(out, np.stack(pulled))


SCENARIOS = {"async_push": _async_push, "sync_steps": _sync_steps}


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](**json.loads(sys.argv[2]))


def run_launched_script(tmp_path, script, env):
    """Launch one ``python -m pyfleet.service`` on a free loopback port and
    ``script`` (Python source, given the path of a report file to write as its
    argument) as the job's one worker, through ``launch_local`` with ``env``;
    the report file's JSON (asserting the job succeeded)."""
    import io

    from pyfleet.launch import free_ports, launch_local

    path = tmp_path / "worker.py"
    path.write_text(script)
    report = tmp_path / "report.json"
    port = free_ports(1, "127.0.0.1")[0]

    def cmd(role, index):
        if role == "server":
            return [sys.executable, "-m", "pyfleet.service", "--endpoint", f"127.0.0.1:{port}",
                    "--index", str(index), "--num-servers", "1", "--workers", "1"]
        return [sys.executable, str(path), str(report)]

    code = launch_local(cmd, servers=1, workers=1, env=env, log_dir=tmp_path / "logs",
                        timeout=120, server_endpoints=[f"127.0.0.1:{port}"],
                        output=io.StringIO(), messages=io.StringIO())
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").iterdir()))
    assert code == 0, logs
    return json.loads(report.read_text())

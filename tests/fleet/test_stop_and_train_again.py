"""Fluid's trainer lifecycle in zero-edit mode: a trainer trains, calls
``fleet.stop_worker()``, then ``fleet.init_worker()`` and trains again (Paddle
1.5's own Fleet test base does). Fluid's pservers served until killed; pyfleet's
serve while a stopped worker's process lives, end once every worker stopped
and its process ended (it says so at exit), and take a stopped worker killed
afterwards as gone after their heartbeat timeout: never a hang.

Real processes on 127.0.0.1, started as Paddle's test base starts them (no
launcher; ``paddle`` is pyfleet through the zero-edit PYTHONPATH), with bounded
waits. Every parameter starts at a constant and each trainer feeds one batch
again and again, so a second round that started from fresh parameters would
repeat the first round's first loss exactly."""

import json
import os
import signal
import subprocess
import sys

import pytest
from support import REPO
from support.wait import file_text, wait_until

from pyfleet import as_paddle
from pyfleet.launch import free_ports

JOB = REPO / "tests" / "fleet" / "stop_and_train_again_job.py"


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "TRAINING_ROLE"))}
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    return as_paddle.child_env(env)


def _start(tmp_path, role, i, endpoints, trainers, *extra):
    log = open(tmp_path / f"{role}{i}.log", "w")
    cmd = [sys.executable, str(JOB), "--role", role, "--endpoints", ",".join(endpoints),
           "--current_id", str(i), "--trainers", str(trainers), "--out", str(tmp_path), *extra]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc


def _logs(tmp_path):
    return "\n".join(f"--- {p.name}\n{file_text(p)[-2500:]}" for p in sorted(tmp_path.glob("*.log")))


def _exit_code(proc, timeout, what, tmp_path):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} still running after {timeout} s\n{_logs(tmp_path)}") from None


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainers_train_stop_and_train_again_then_the_servers_end(tmp_path, mode):
    endpoints = [f"127.0.0.1:{p}" for p in free_ports(2)]
    # A heartbeat timeout far beyond the servers' exit bound below: they must end
    # because the trainers said they left at exit, not because they fell silent.
    extra = ["--heartbeat_timeout", "120"] + (["--sync_mode"] if mode == "sync" else [])
    servers = [_start(tmp_path, "pserver", i, endpoints, 2, *extra) for i in range(2)]
    trainers = [_start(tmp_path, "trainer", i, endpoints, 2, *extra) for i in range(2)]
    try:
        for i, t in enumerate(trainers):
            assert _exit_code(t, 150, f"trainer {i}", tmp_path) == 0, _logs(tmp_path)
        for i, s in enumerate(servers):
            assert _exit_code(s, 30, f"server {i} after every trainer ended",
                              tmp_path) == 0, _logs(tmp_path)
    finally:
        _kill_all(servers + trainers)
    for i in range(2):
        r = json.loads((tmp_path / f"trainer{i}.json").read_text())
        assert len(r["first"]) == len(r["second"]) == 5
        # The second round starts from the parameters the first one left on the
        # servers (fresh constants would give exactly the first round's first
        # loss again, ln 2), and it trains on.
        assert abs(r["second"][0] - r["first"][0]) > 1e-3, r
        assert r["second"][-1] < r["second"][0] - 1e-3, r
    assert "started again after it stopped" in file_text(tmp_path / "pserver0.log")


@pytest.mark.timeout(180)
def test_a_stopped_trainer_keeps_the_servers_until_it_starts_again_or_is_killed(tmp_path):
    endpoints = [f"127.0.0.1:{p}" for p in free_ports(1)]
    extra = ["--heartbeat_timeout", "3", "--wait-before-again"]
    server = _start(tmp_path, "pserver", 0, endpoints, 2, *extra)
    trainers = [_start(tmp_path, "trainer", i, endpoints, 2, *extra) for i in range(2)]
    try:
        for i in range(2):
            wait_until(lambda i=i: (tmp_path / f"stopped{i}").exists() or trainers[i].poll(),
                       120, f"trainer {i} to stop after its first round", detail=lambda:
                       _logs(tmp_path))
            assert trainers[i].poll() is None, _logs(tmp_path)
        # Both stopped, both alive: the server serves on (heartbeats go on
        # meanwhile). Trainer 0 starts again and ends normally.
        (tmp_path / "again0").touch()
        assert _exit_code(trainers[0], 90, "trainer 0", tmp_path) == 0, _logs(tmp_path)
        assert server.poll() is None, _logs(tmp_path)
        # Trainer 1, stopped and waiting, is killed: the server takes it as gone
        # after its heartbeat timeout (3 s) and ends normally.
        trainers[1].send_signal(signal.SIGKILL)
        trainers[1].wait(10)
        assert _exit_code(server, 60, "the server after the stopped trainer was killed",
                          tmp_path) == 0, _logs(tmp_path)
    finally:
        _kill_all([server, *trainers])
    log = file_text(tmp_path / "pserver0.log")
    assert "fell silent" in log, log[-3000:]
    r = json.loads((tmp_path / "trainer0.json").read_text())
    assert abs(r["second"][0] - r["first"][0]) > 1e-3, r

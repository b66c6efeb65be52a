"""A restarted job keeps its servers' ports, and talks only to servers of the job.

The attacks: binding a SIGKILLed server's port 10 ms after its death made every restart
fail with ``Address already in use`` (the job ended with rc 1 after 3.4 s, its three
restarts used up); with job keys off, a process on that port received the job's
``CREATE_TABLES``. Now the launcher holds every server's listening socket for the whole
job (the servers accept on an inherited copy), a server that finds its endpoint taken
does not use up a restart, and a client sends nothing but a challenge to a server that
cannot prove it holds the job's secret.
"""

import io
import os
import signal
import socket
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from support.wait import wait_until

from pyfleet.errors import PyfleetError
from pyfleet.launch import free_ports, launch_local
from pyfleet.service.client import Client
from pyfleet.service.server import Server

pytestmark = pytest.mark.timeout(300)

WORKER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
    from pyfleet.service import auth
    from pyfleet.service.client import Client
    out = sys.argv[1]
    attempt = int(os.environ["PYFLEET_RESTART_COUNT"])
    role = PaddleCloudRoleMaker()
    role.generate_role()
    with Client(role.server_endpoints(), worker_index=0, timeout=20, connect_deadline=30,
                **auth.client_options_from_env()) as c:
        c.create_tables([{"kind": "sparse", "name": "emb", "dim": 4,
                          "optimizer": {"type": "SGD", "learning_rate": 1.0},
                          "initializer": {"type": "Constant", "value": 0.0}}])
        c.push_sparse("emb", np.arange(1, 5, dtype=np.uint64), np.ones((4, 4), np.float32))
        open(os.path.join(out, f"ready.{attempt}"), "w").close()
        if attempt == 0 and sys.argv[2] == "wait":
            time.sleep(200)          # parked: the test kills server 0 meanwhile
        c.stop_worker()
    open(os.path.join(out, f"done.{attempt}"), "w").close()
""")


def _server_cmd(port, index):
    return [sys.executable, "-m", "pyfleet.service", "--endpoint", f"127.0.0.1:{port}",
            "--index", str(index), "--num-servers", "2", "--workers", "1",
            "--heartbeat-timeout", "30"]


def _server_pid(index):
    """This process's child running server ``index`` (the launcher runs in a thread of
    this process: the children of every thread are read)."""
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if b"PYFLEET_ROLE=server" in env and f"PYFLEET_SERVER_INDEX={index}".encode() in env:
                return pid
    return None


def _wait(path, what, timeout=120):
    wait_until(lambda: os.path.exists(path), timeout, what)


def _launch_in_thread(tmp_path, ports, result, **kw):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    how = kw.pop("worker", "wait")

    def cmd(role, index):
        if role == "server":
            return _server_cmd(ports[index], index)
        return [sys.executable, str(script), str(tmp_path), how]

    def run():
        result["code"] = launch_local(
            cmd, servers=2, workers=1, log_dir=tmp_path / "logs", timeout=240,
            server_endpoints=[f"127.0.0.1:{p}" for p in ports], output=io.StringIO(),
            messages=kw.pop("messages", io.StringIO()), **kw)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_port_taken_right_after_a_servers_death_does_not_stop_its_restart(tmp_path):
    ports = free_ports(2, "127.0.0.1")
    result, restarts = {}, []
    t = _launch_in_thread(tmp_path, ports, result, max_restarts=3, restarts=restarts)
    squatter = socket.socket()
    # as a server binds (libzmq does): the dead server's connections in TIME_WAIT do not
    # keep it off the port
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatted = []
    try:
        _wait(tmp_path / "ready.0", "attempt 0's worker")
        pid = _server_pid(0)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        # the attack: bind the dead server's port at once, and keep trying until the
        # restarted job is done (then the launcher lets the port go)
        end = time.monotonic() + 5.0
        while time.monotonic() < end and not squatted and \
                not (tmp_path / "ready.1").exists():
            try:
                squatter.bind(("127.0.0.1", ports[0]))
                squatter.listen(8)
                squatted.append(time.monotonic())
            except OSError:
                time.sleep(0.002)  # the attack itself: try again at once, for 5 s
        t.join(240)
    finally:
        squatter.close()
        t.join(60)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").iterdir()))
    assert not squatted, "another process bound the dead server's port"
    assert result.get("code") == 0, logs
    assert (tmp_path / "done.1").exists()
    assert [d["role"] for d in restarts] == ["server.0"]  # one death, one restart


def test_a_taken_endpoint_does_not_use_up_a_restart(tmp_path):
    # A port the launcher cannot hold (taken before the job starts): the server that
    # finds it taken ends its attempt with exit 75, which is not a death.
    ports = free_ports(2, "127.0.0.1")
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports[1]))
    squatter.listen(8)
    messages = io.StringIO()
    result, restarts = {}, []
    t = _launch_in_thread(tmp_path, ports, result, max_restarts=1, restarts=restarts,
                          messages=messages, worker="go")
    try:
        def refused():
            assert t.is_alive(), messages.getvalue()
            return "could not bind its endpoint" in messages.getvalue()

        wait_until(refused, 60, "the taken endpoint's message", detail=messages.getvalue)
    finally:
        squatter.close()
        t.join(240)
    assert result.get("code") == 0, messages.getvalue()
    assert restarts == [], "a taken port used up a restart"
    assert "server.1 could not bind its endpoint (taken by another process); starting the " \
           "job again, not counted as a restart" in messages.getvalue()


def test_a_client_sends_nothing_to_a_server_that_cannot_prove_it_belongs_to_the_job():
    for token in (None, "another job's secret"):
        impostor = Server("127.0.0.1:0", 0, 1, 1, job_token=token)
        t = threading.Thread(target=impostor.run, daemon=True)
        t.start()
        try:
            with pytest.raises(PyfleetError, match=r"cannot prove it belongs to this job"):
                Client([impostor.endpoint], timeout=5, connect_deadline=5,
                       heartbeat_interval=0, job_token="this job's secret")
            counters = impostor.stats()["counters"]
            assert set(counters) == {"op_heartbeat"}, counters  # no CREATE_TABLES, nothing
        finally:
            impostor.stop()
            t.join(10)
    # the job's own server proves it, and the job's client works with it
    server = Server("127.0.0.1:0", 0, 1, 1, job_token="this job's secret")
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        with Client([server.endpoint], timeout=5, heartbeat_interval=0,
                    job_token="this job's secret") as c:
            c.create_tables([{"kind": "sparse", "name": "emb", "dim": 2,
                              "optimizer": {"type": "SGD", "learning_rate": 1.0},
                          "initializer": {"type": "Constant", "value": 0.0}}])
            c.push_sparse("emb", np.array([3], np.uint64), np.ones((1, 2), np.float32))
            c.stop_worker()
    finally:
        server.stop()
        t.join(10)

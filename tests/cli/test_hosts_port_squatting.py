"""A server's port taken on another host of a ``pyfleet train --hosts`` job (two hosts
made of network namespaces, tests/support/netns.py; mpirun reaches the second through
an ssh stand-in). Without ``--max-restarts`` the server that cannot bind ends the job,
the console names the endpoint and why, and an impostor on the port learns nothing of
the job (with restarts the job moves to fresh ports: test_hosts_self_healing.py).

Skipped, with the reason, where the kernel or the user cannot make namespaces.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest
from support.netns import mpi_hosts

from pyfleet.service.protocol import Op

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PORT = 40300

# Listens on the second host's server port; an impostor (zmq) prints the op of every
# request it gets.
SQUATTER = textwrap.dedent("""
    import socket, sys, time, zmq
    host, port, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if kind == "tcp":
        s = socket.socket()
        s.bind((host, port))
        s.listen()
        print("ready", flush=True)
        time.sleep(600)  # parked: holds the port until the test kills it
    s = zmq.Context().socket(zmq.ROUTER)
    s.bind(f"tcp://{host}:{port}")
    print("ready", flush=True)
    while True:
        frames = s.recv_multipart()
        if len(frames) > 1 and len(frames[1]) > 5:
            print("op", frames[1][5], flush=True)
""")


@pytest.fixture
def hosts(tmp_path):
    with mpi_hosts(2, tmp_path) as h:
        yield h


@pytest.mark.parametrize("kind, env", [
    ("tcp", {}),                                                    # job keys on (default)
    ("zmq", {"PYFLEET_JOB_KEYS": "0", "PYFLEET_INSECURE": "1"}),    # keys off: the token
])
def test_a_port_taken_on_another_host_ends_the_job_naming_it(hosts, tmp_path, kind, env):
    a, b = hosts.addrs
    script = tmp_path / "squat.py"
    script.write_text(SQUATTER)
    squatter = subprocess.Popen(["ip", "netns", "exec", hosts.names[1], sys.executable,
                                 script, b, str(PORT + 1), kind],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "ready"
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("PYFLEET_")}
        run_env.update(env, OPENBLAS_NUM_THREADS="1",
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        argv = [sys.executable, "-m", "pyfleet.cli", "train", "--hosts", f"{a},{b}",
                "--servers", 2, "--workers", 2, "--rows", 2000, "--layers", "8",
                "--embedding-dim", 4, "--run-dir", tmp_path / "run", "--port", PORT]
        t0 = time.monotonic()
        r = subprocess.run(hosts.on(0, argv), env=hosts.mpi_env(run_env), cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        print(f"port taken on host 2 ({kind}): the job ended after "
              f"{time.monotonic() - t0:.1f} s")
    finally:
        squatter.kill()
        seen = squatter.communicate(timeout=30)[0]
    console = r.stdout + r.stderr   # the launcher's messages go to stdout without --json
    assert r.returncode == 75, console[-3000:]   # EndpointInUse: the job stops, named
    assert (f"pyfleet.launch: pyfleet server 1: server 1: cannot serve on {b}:{PORT + 1}: "
            f"Address already in use") in console, console[-3000:]
    assert f"pyfleet.launch: server.1 on {b} exited with code 75; the job failed" in console
    # nothing but a challenge (HEARTBEAT) ever reached the impostor
    ops = {int(line.split()[1]) for line in seen.splitlines() if line.startswith("op ")}
    assert ops <= {int(Op.HEARTBEAT)}, seen

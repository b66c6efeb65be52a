"""`pyfleet train --hosts` and `python -m pyfleet.launch --hosts` across hosts made of
network namespaces (tests/support/netns.py): mpirun, started on host 1, reaches host 2
through an ssh stand-in that enters its namespace; the roles are placed across both.

Skipped, with the reason, where the kernel or the user cannot make namespaces.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.netns import mpi_hosts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def hosts(tmp_path):
    with mpi_hosts(2, tmp_path) as h:
        yield h


def _env(hosts, tmp_path):
    return hosts.mpi_env({**hosts.test_env(), "PYFLEET_CACHE_DIR": str(tmp_path / "cache")})


def test_pyfleet_train_places_servers_and_workers_across_hosts(hosts, tmp_path):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "pyfleet.cli", "train", "--hosts", ",".join(hosts.addrs),
            "--servers", 2, "--workers", 2, "--rows", 4000, "--layers", "16",
            "--embedding-dim", 4, "--run-dir", run, "--port", 40100, "--json"]
    r = subprocess.run(hosts.on(0, argv), env=_env(hosts, tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stderr[-4000:]
    # server i listens on host i: 10.213.78.2 exists only in the second host's namespace
    assert (f"servers at {hosts.addrs[0]}:40100,{hosts.addrs[1]}:40101" in r.stderr)
    assert hosts.launches() == [hosts.addrs[1]]  # one launch daemon on the other host
    summary = json.loads(r.stdout)
    assert summary["workers"] == 2 and summary["servers"] == 2
    assert summary["train_examples"] == 3600  # the generated 90% train split, read once
    assert summary["test_auc"] > 0.55
    assert (run / "checkpoint" / "MANIFEST.json").exists() and (run / "model").is_dir()
    for role in ("server.0", "server.1", "worker.0", "worker.1"):
        assert (run / "logs" / f"{role}.log").exists()


ROLE_SCRIPT = textwrap.dedent("""
    import json, os, socket, sys
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
    r = PaddleCloudRoleMaker()
    r.generate_role()
    label = (f"server.{r.server_index()}" if r.is_server() else f"worker.{r.worker_index()}")
    with open(os.path.join(sys.argv[1], label), "w") as f:
        json.dump({"host": socket.gethostname(), "endpoints": r.server_endpoints(),
                   "workers": r.worker_num()}, f)
""")


def test_the_launcher_places_roles_round_robin_and_fails_on_a_missing_host(hosts, tmp_path):
    script = tmp_path / "role.py"
    script.write_text(ROLE_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-m", "pyfleet.launch", "--hosts", ",".join(hosts.addrs),
            "--server_num", 3, "--worker_num", 3, "--port", 40200, script, out]
    r = subprocess.run(hosts.on(0, argv), env=_env(hosts, tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    seen = {name: json.loads((out / name).read_text()) for name in os.listdir(out)}
    a, b = hosts.addrs
    eps = [f"{a}:40200", f"{b}:40201", f"{a}:40202"]
    for name, host in (("server.0", 0), ("server.1", 1), ("server.2", 0),
                       ("worker.0", 0), ("worker.1", 1), ("worker.2", 0)):
        assert seen[name]["host"] == hosts.names[host], (name, seen[name])
        assert seen[name]["endpoints"] == eps and seen[name]["workers"] == 3
    # A host nobody answers for: the job fails, named, within the timeout; nothing hangs.
    argv = [sys.executable, "-m", "pyfleet.launch", "--hosts", f"{a},10.213.78.99",
            "--server_num", 2, "--worker_num", 2, "--timeout", 120, script, out]
    r = subprocess.run(hosts.on(0, argv), env=_env(hosts, tmp_path), cwd=tmp_path,
                       capture_output=True, text=True, timeout=200)
    assert r.returncode not in (0, 124), r.stderr[-3000:]
    assert "10.213.78.99" in r.stderr


@pytest.mark.parametrize("extra, message", [
    (["--port", "40000"], "--port is the servers' first port with --hosts"),
    (["--hosts", "a,b", "--mode", "collective", "--port", "40000"],
     "--mode collective has no server"),
    (["--hosts", "10.213.99.1,10.213.99.2", "--mode", "hybrid"],
     "runs the servers beside pyfleet train, on the first host (10.213.99.1), and this "
     "machine cannot listen there (Cannot assign requested address)"),
    (["--hosts", "a,b", "--hostfile", "f"], "--hosts h1,h2 or --hostfile FILE (one of them)"),
    (["--hostfile", "no-such-file"], "--hostfile no-such-file: No such file"),
    (["--hosts", "a", "--port", "80"], "--port must be in 1024.."),
])
def test_train_refuses_bad_host_options_before_anything_starts(tmp_path, extra, message):
    from support.cli import pyfleet
    r = pyfleet("train", "--rows", 1000, "--run-dir", tmp_path / "run", *extra, cwd=tmp_path,
                timeout=120)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()

"""Per-job CURVE keys by default ("Secure by default"): a job the launcher starts
(``pyfleet train`` runs its roles through it) gets a fresh key directory, so its servers
admit only its own roles, on loopback too; an unauthenticated local client cannot connect;
the keys are removed when the job ends. ``PYFLEET_JOB_KEYS=0`` (or keys named by the
environment) turns it off."""

import io
import os
import textwrap

import pytest
from support.service import run_launched_script

from pyfleet.errors import ConfigError
from pyfleet.launch import launch_local

pytestmark = pytest.mark.timeout(300)

WORKER = textwrap.dedent("""
    import json, os, stat, sys
    from pyfleet.errors import PeerTimeout
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
    from pyfleet.service import auth
    from pyfleet.service.client import Client
    role = PaddleCloudRoleMaker()
    role.generate_role()
    keys = os.environ.get("PYFLEET_CURVE_DIR")
    out = {"keys": keys, "mode": stat.S_IMODE(os.stat(keys).st_mode) if keys else None}
    try:  # a local process without the job's keys
        Client(role.server_endpoints(), worker_index=0, timeout=2, connect_deadline=2,
               heartbeat_interval=0).close()
        out["plain"] = "connected"
    except PeerTimeout:
        out["plain"] = "refused"
    with Client(role.server_endpoints(), worker_index=0, timeout=20,
                **auth.client_options_from_env()) as c:
        out["servers"] = len(c.stats())
        c.stop_worker()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
""")


def _run(tmp_path, env):
    return run_launched_script(tmp_path, WORKER, env)


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("PYFLEET_"):
            monkeypatch.delenv(k)


def test_a_launched_job_has_its_own_keys_and_refuses_other_clients(tmp_path, clean_env):
    out = _run(tmp_path, {})
    assert out["keys"] and out["mode"] == 0o700
    assert out["plain"] == "refused"          # no key, no connection
    assert out["servers"] == 1                # the job's own roles are served
    assert not os.path.exists(out["keys"])    # removed with the job


def test_job_keys_can_be_turned_off_and_bad_values_are_refused(tmp_path, clean_env):
    out = _run(tmp_path, {"PYFLEET_JOB_KEYS": "0"})
    assert out["keys"] is None and out["plain"] == "connected"
    with pytest.raises(ConfigError, match="PYFLEET_JOB_KEYS must be 0 or 1"):
        launch_local(["true"], servers=1, workers=1, env={"PYFLEET_JOB_KEYS": "yes"},
                     output=io.StringIO(), messages=io.StringIO())


LAUNCHER = textwrap.dedent("""
    import sys
    from pyfleet.launch import free_ports, launch_local
    port = free_ports(1, "127.0.0.1")[0]
    worker = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write("
              "os.environ['PYFLEET_CURVE_DIR'] + '\\\\n' + os.environ['PYFLEET_IPC_DIR']); "
              "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(120)")

    def cmd(role, index):
        if role == "server":
            return [sys.executable, "-m", "pyfleet.service", "--endpoint", f"127.0.0.1:{port}",
                    "--index", "0", "--num-servers", "1", "--workers", "1"]
        return [sys.executable, "-c", worker, sys.argv[1]]

    launch_local(cmd, servers=1, workers=1, timeout=300, output=sys.stderr)
""")


def test_the_next_job_removes_the_keys_a_killed_launcher_left(tmp_path, clean_env, request):
    """A SIGKILLed launcher cannot remove its job's key and socket directories (the
    keys are secrets); the next launcher on this host removes them before it makes
    its own, and leaves those of a live launcher or of another host alone."""
    import pathlib
    import re
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    from support.wait import wait_until

    from pyfleet.launch import job_dirs

    # a short temporary directory: Unix socket paths must stay under 108 bytes
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="jd", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    report = tmp_path / "dirs.txt"
    env = {**os.environ, "TMPDIR": str(tmp)}
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(report)], env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: report.exists() or launcher.poll() is not None, timeout=120,
                   what="the launched worker's report")
        assert report.exists(), (tmp_path / "launcher.log").read_text()
        keys, ipc = report.read_text().split("\n")
        assert os.path.dirname(keys) == os.path.dirname(ipc) == str(tmp)
        assert os.path.isfile(os.path.join(keys, "server.key_secret"))
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert os.path.isdir(keys) and os.path.isdir(ipc)   # nobody removed them
    other_host = tmp / "pyfleet-keys-elsewhere-1-abc"
    other_host.mkdir()
    host = re.fullmatch(r"pyfleet-keys-(.+)-(\d+)-[^-]+", os.path.basename(keys)).group(1)
    live = tmp / f"pyfleet-keys-{host}-{os.getpid()}-x"
    live.mkdir()   # named as this (live) process's
    mine = job_dirs.make_job_dir("pyfleet-keys-", str(tmp))
    assert not os.path.exists(keys) and os.path.isdir(ipc)   # the killed job's keys
    assert os.path.isdir(live) and os.path.isdir(mine) and other_host.is_dir()
    assert job_dirs.sweep_stale("pyfleet-ipc-", str(tmp)) == [ipc]

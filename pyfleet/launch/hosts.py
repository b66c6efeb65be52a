"""A parameter-server job across several hosts, through ``mpirun`` (Open MPI, the ``mpi``
extra): ``pyfleet train --hosts h1,h2`` and ``python -m pyfleet.launch --hosts h1,h2``.

mpirun is only the launcher here: it starts every role on its host (over ssh, or
whatever ``plm_ssh_agent`` / ``PRTE_MCA_plm_ssh_agent`` names), forwards the
environment, and stops every role when one fails. The roles talk over pyfleet's own
wire as in a local job and learn their role from the same environment contract
(:func:`pyfleet.launch.role_env`), set per role with one MPMD application context each::

    mpirun --host h1:2,h2:2 \\
        -np 1 --host h1 -x PYFLEET_ROLE=server -x PYFLEET_SERVER_INDEX=0 ... CMD : \\
        -np 1 --host h2 -x PYFLEET_ROLE=server -x PYFLEET_SERVER_INDEX=1 ... CMD : \\
        -np 1 --host h1 -x PYFLEET_ROLE=worker -x PYFLEET_WORKER_INDEX=0 ... CMD : ...

Placement (:func:`placement`): server ``i`` on host ``i % H``, worker ``j`` on host
``j % H``, so each host holds its share of both. Server ``i`` listens on
``<its host>:<port + i>``: the host names given must be the addresses the other hosts
reach it by. What the hosts must share: the same Python and pyfleet at the same path
(a container image), and the working directory (the run directory of ``pyfleet
train``, the job's keys) at the same path (NFS or a volume); docs/scaleout.md.

With ``max_restarts`` the launcher heals the job: mpirun stops every role when one dies,
and the launcher starts the whole mpirun job again from the latest committed checkpoint
(:func:`launch_hosts`), on the next block of ports and with a new job secret.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence

from pyfleet.errors import ConfigError, EndpointInUse
from pyfleet.launch.collective import mpiexec_command
from pyfleet.launch.contract import CONTRACT_VARS, FORWARD_VARS, role_env
from pyfleet.launch.job_dirs import job_key_dir
from pyfleet.launch.mpirun import run_watched
from pyfleet.launch.processes import BIND_RETRIES, catch_signals, describe_rc, reporter
from pyfleet.launch.restart import RESTART_PAUSE, RestartPolicy, restart_vars, resume_position
from pyfleet.service import auth

__all__ = ["DEFAULT_PORT", "host_list", "hosts_command", "launch_hosts", "placement"]

DEFAULT_PORT = 36000


def host_list(hosts: str | None = None, hostfile: str | os.PathLike | None = None) -> list[str]:
    """The hosts of ``--hosts h1,h2`` (``h1:slots`` allowed, the slots ignored: pyfleet
    places the roles) or of an Open MPI ``--hostfile`` (``host [slots=N]`` a line,
    ``#`` comments); each host once, in order."""
    if bool(hosts) == bool(hostfile):
        raise ConfigError("give the hosts with --hosts h1,h2 or --hostfile FILE (one of them)")
    names = []
    if hosts:
        names = [h.strip().split(":")[0] for h in hosts.split(",") if h.strip()]
    else:
        try:
            with open(hostfile) as f:
                for line in f:
                    line = line.split("#", 1)[0].strip()
                    if line:
                        names.append(line.split()[0])
        except OSError as e:
            raise ConfigError(f"--hostfile {hostfile}: {e.strerror}") from None
    names = list(dict.fromkeys(n for n in names if n))
    if not names:
        raise ConfigError(f"no host in {'--hosts' if hosts else '--hostfile'}")
    return names


def placement(hosts: Sequence[str], servers: int, workers: int) -> list[tuple[str, int, str]]:
    """``(role, index, host)`` of every role: servers then workers, round-robin."""
    return ([("server", i, hosts[i % len(hosts)]) for i in range(servers)]
            + [("worker", j, hosts[j % len(hosts)]) for j in range(workers)])


def hosts_command(cmd: Sequence[str], servers: int, workers: int, hosts: Sequence[str], *,
                  port: int = DEFAULT_PORT, mode: str | None = None,
                  log_dir: str | os.PathLike | None = None,
                  forward: Sequence[str] = (),
                  environ: Mapping[str, str] | None = None,
                  ) -> tuple[list[str], dict[str, str], list[str]]:
    """``(argv, env, endpoints)``: the mpirun command of the job, the variables mpirun
    itself needs, and the servers' endpoints. ``forward``: more variable names every
    role gets from the launcher's environment. ``log_dir``: each role's output goes to
    ``log_dir/<role>.<index>.log`` on its host (a directory all hosts share).
    ``environ``: the launcher's environment (default ``os.environ``): only the
    variables it sets are forwarded."""
    if servers < 1 or workers < 1:
        raise ConfigError("a job across hosts needs >= 1 server and >= 1 worker")
    if not (port > 0 and port + servers <= 65536):
        raise ConfigError(f"--port must leave room for {servers} server port(s), got {port}")
    places = placement(hosts, servers, workers)
    eps = [f"{host}:{port + i}" for role, i, host in places if role == "server"]
    mpi, env = mpiexec_command(len(places))  # its path, and Open MPI's root variables
    argv = [mpi[0]]
    if "--allow-run-as-root" in mpi:
        argv.append("--allow-run-as-root")
    slots = {}
    for _, _, host in places:
        slots[host] = slots.get(host, 0) + 1
    # --bind-to none: a server's handler threads and a worker's prefetch need more than
    # the one core Open MPI would pin each process to (and a host may hold more roles
    # than cores)
    argv += ["--host", ",".join(f"{h}:{n}" for h, n in slots.items()), "--bind-to", "none"]
    environ = os.environ if environ is None else environ
    names = [k for k in dict.fromkeys([*forward, *FORWARD_VARS]) if k in environ]
    for i, (role, index, host) in enumerate(places):
        if i:
            argv.append(":")
        argv += ["-np", "1", "--host", host]
        for k, v in role_env(role, index, eps, workers, mode).items():
            argv += ["-x", f"{k}={v}"]
        for k in names:  # the value mpirun has (not on its command line: keys, paths)
            argv += ["-x", k]
        role_cmd = [str(c) for c in cmd]
        if log_dir is not None:
            log = os.path.join(os.fspath(log_dir), f"{role}.{index}.log")
            role_cmd = ["sh", "-c", 'exec "$@" >>"$0" 2>&1', log, *role_cmd]
        argv += role_cmd
    return argv, env, eps


def launch_hosts(cmd: Sequence[str], servers: int, workers: int, *, hosts: str | None = None,
                 hostfile: str | os.PathLike | None = None, port: int = DEFAULT_PORT,
                 mode: str | None = None, env: Mapping[str, str] | None = None,
                 log_dir: str | os.PathLike | None = None, timeout: float | None = None,
                 cwd: str | os.PathLike | None = None, messages=None, max_restarts: int = 0,
                 restart_window: float | None = None,
                 restore_dir: str | os.PathLike | None = None,
                 restarts: list | None = None) -> int:
    """Run the job's ``servers`` and ``workers`` across ``hosts`` (or ``hostfile``) with
    mpirun and wait (see the module). ``env`` adds to the launcher's environment (every
    ``PYFLEET_*`` variable in it reaches every role). Returns mpirun's exit code (a
    role's failure stops the job; the failure line of each role's log is then printed,
    as mpirun names only a rank: a server whose port is taken on its host, say),
    :data:`EXIT_TIMEOUT` past ``timeout`` seconds (over every attempt), or 128 + signal
    when SIGINT, SIGTERM or SIGHUP stopped it (on the main thread).

    Every attempt of the job gets its own secret (``PYFLEET_JOB_TOKEN``: a worker talks
    only to servers that prove they hold it) and, unless the environment names keys or
    sets ``PYFLEET_JOB_KEYS=0``, its own CURVE keys, in a directory made in ``cwd``
    (which the hosts share) and removed when the attempt ends.

    ``max_restarts`` > 0 (TorchElastic's rule, :mod:`pyfleet.launch.restart`): when a
    role dies (mpirun then stops every role) the whole job starts again, from the
    committed checkpoint in ``restore_dir`` at its recorded position
    (``PYFLEET_RESTORE_DIR``, ``PYFLEET_RESTART_COUNT``), at most that many times within
    ``restart_window`` seconds; ``restarts`` (a list) gets one dict per death, with the
    role's host. Each attempt listens on fresh ports, the block after the last one's
    (attempt ``a`` of the job: server ``i`` on ``port + a*servers + i``), so a process
    that took a dead server's port is never dialled, and a secret it does not hold
    would refuse it anyway. A server that finds its port taken moves the job to the next
    block without using up a restart (at most 5 times in a row). The launcher prints,
    one line each, the restart and its count, the role that died and its host, and the
    position the job resumes from."""
    if mode in ("hybrid", "collective"):
        raise ConfigError(f"--mode {mode} across hosts: start it with mpirun itself "
                          f"(docs/collective.md); --hosts places parameter-server jobs "
                          f"(sync, async, geo)")
    names = host_list(hosts, hostfile)
    policy = RestartPolicy(max_restarts, restart_window, restore_dir, restarts)
    base = {k: v for k, v in os.environ.items()
            if k not in CONTRACT_VARS and k not in restart_vars()}
    base.update(env or {})
    base.setdefault("PYTHONUNBUFFERED", "1")
    base.setdefault("OPENBLAS_NUM_THREADS", "1")
    base["PYFLEET_IPC_DIR"] = ""  # Unix sockets are of one machine: the roles talk over TCP
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    flag = base.get("PYFLEET_JOB_KEYS", "1").strip()
    if flag not in ("0", "1"):
        raise ConfigError(f"PYFLEET_JOB_KEYS must be 0 or 1, got {flag!r}")
    own_keys = flag == "1" and not any(k.startswith("PYFLEET_CURVE_") and v
                                       for k, v in base.items())
    hosts_command(cmd, servers, workers, names, port=port, mode=mode)  # refused here, once
    if log_dir is not None:
        os.makedirs(log_dir, exist_ok=True)
    msg = sys.stderr if messages is None else messages
    report = reporter(msg)
    signals_seen: list[int] = []
    previous = catch_signals(signals_seen)
    deadline = None if timeout is None else time.monotonic() + timeout
    block, bind_retries = 0, 0
    try:
        while True:
            first = port + block * servers
            if first + servers > 65536:
                report(f"no ports left above --port {port} for another attempt of the job "
                       f"(attempt {block} would start at {first}); the job fails")
                return 1
            offsets = _mark_logs(log_dir, servers, workers, policy)
            ending, places = _attempt(cmd, servers, workers, names, first, mode, base,
                                      log_dir, where, own_keys, policy, deadline,
                                      signals_seen, report)
            if ending.timed_out:
                report(f"the job ran past --timeout {timeout:g} s; stopped it")
            if ending.code == 0 or ending.signal is not None or ending.timed_out:
                return ending.code
            role, host, description = _who_ended(ending, places)
            if log_dir is not None:  # mpirun names only a rank: the reason is in the logs
                for line in _role_errors(log_dir, servers, workers, offsets):
                    report(line)
            block += 1  # whatever ended it, the next attempt dials fresh ports
            if (policy.max_restarts and role.startswith("server.")
                    and ending.returncode == EndpointInUse.EXIT_CODE
                    and bind_retries < BIND_RETRIES):
                bind_retries += 1
                report(f"{role} on {host} could not bind its port (taken by another "
                       f"process); placing the job on the next ports, not counted as a "
                       f"restart ({bind_retries} of at most {BIND_RETRIES} such retries)")
                continue
            bind_retries = 0
            if not policy.record(role, ending.returncode if ending.returncode is not None
                                 else ending.code, description, host):
                report(policy.gave_up() if policy.max_restarts
                       else f"{role} on {host} {description}; the job failed")
                return ending.code
            report(f"restart {policy.attempt} of at most {policy.max_restarts} within "
                   f"{policy.window:g} s: the whole job starts again on fresh ports")
            report(f"restart {policy.attempt} reason: {role} on {host} {description}")
            report(f"restart {policy.attempt} resumes {resume_position(policy.restore_dir)}")
            time.sleep(RESTART_PAUSE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _attempt(cmd, servers, workers, names, port, mode, base, log_dir, where, own_keys,
             policy, deadline, signals_seen, report):
    """One attempt of the job on ``port``'s block: ``(Ending, placement)``."""
    env = dict(base, **policy.env())
    env[auth.JOB_TOKEN_VAR] = secrets.token_hex(32)  # this attempt's secret
    keys = None
    try:
        if own_keys:
            keys = env["PYFLEET_CURVE_DIR"] = job_key_dir(where)
        forward = [k for k in env if k.startswith("PYFLEET_") and k not in CONTRACT_VARS]
        argv, needed, eps = hosts_command(cmd, servers, workers, names, port=port, mode=mode,
                                          log_dir=log_dir,
                                          forward=[*forward, auth.JOB_TOKEN_VAR], environ=env)
        for k, v in needed.items():
            env.setdefault(k, v)
        where_eps = f"servers at {','.join(eps)}"
        if policy.starts == 0:
            report(f"{servers} server(s) and {workers} worker(s) on {len(names)} host(s) "
                   f"through {argv[0]}; {where_eps}")
        else:
            report(f"attempt {policy.starts + 1} of the job: {where_eps}")
        policy.starts += 1
        return (run_watched(argv, env, where, deadline, signals_seen),
                placement(names, servers, workers))
    finally:
        if keys is not None:
            shutil.rmtree(keys, ignore_errors=True)


def _who_ended(ending, places):
    """``(role, host, words)`` of the rank whose end stopped the job."""
    if ending.rank is None or not 0 <= ending.rank < len(places):
        return "a role", "an unknown host", f"ended the job (mpirun's exit code {ending.code})"
    role, index, host = places[ending.rank]
    return f"{role}.{index}", host, describe_rc(ending.returncode)


def _mark_logs(log_dir, servers, workers, policy):
    """Each role log's size before this attempt (its failure lines are read from there),
    after a line marking a restart's start."""
    offsets = {}
    if log_dir is None:
        return offsets
    for role, count in (("server", servers), ("worker", workers)):
        for i in range(count):
            path = os.path.join(log_dir, f"{role}.{i}.log")
            try:
                if policy.starts:
                    with open(path, "a") as f:  # the line a local restart writes too
                        f.write(f"--- pyfleet.launch: restart {policy.attempt} ---\n")
                offsets[path] = os.path.getsize(path)
            except OSError:
                offsets[path] = 0
    return offsets


# The one line a role prints when it fails ("pyfleet server 1: ...", trainer/role.py).
_ROLE_ERROR = re.compile(r"^pyfleet (server|worker) \d+: ")


def _role_errors(log_dir, servers, workers, offsets=None):
    """The last failure line (``pyfleet server N: ...``) of each role's log in
    ``log_dir`` (``<role>.<index>.log``, written on its host), servers first; read from
    ``offsets[path]`` on (the current attempt's part)."""
    out = []
    for role, count in (("server", servers), ("worker", workers)):
        for i in range(count):
            last = None
            path = os.path.join(log_dir, f"{role}.{i}.log")
            try:
                with open(path, errors="replace") as f:
                    f.seek((offsets or {}).get(path, 0))
                    for line in f:
                        if _ROLE_ERROR.match(line):
                            last = line.strip()
            except OSError:
                continue
            if last is not None:
                out.append(last)
    return out

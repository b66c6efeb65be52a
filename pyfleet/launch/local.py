"""A local job: every role a supervised child process (the rules are in :mod:`pyfleet.launch`)."""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Callable, TextIO, Union

from pyfleet.endpoint import parse_endpoints
from pyfleet.errors import ConfigError, EndpointInUse
from pyfleet.launch.collective import mpiexec_command
from pyfleet.launch.contract import (
    CONTRACT_VARS,
    EXIT_TIMEOUT,
    FORWARD_VARS,
    LISTEN_FD_VAR,
    hold_endpoints,
    role_env,
)
from pyfleet.launch.job_dirs import job_key_dir, make_job_dir
from pyfleet.launch.mpirun import ended_rank, lost_peer
from pyfleet.launch.processes import (
    BIND_RETRIES,
    REAP_WAIT,
    Role,
    catch_signals,
    describe_rc,
    exit_code,
    pdeathsig_preexec,
    pump,
    release,
    reporter,
    stop_roles,
)
from pyfleet.launch.restart import (
    RESTART_PAUSE,
    RestartPolicy,
    restart_vars,
    resume_position,
)
from pyfleet.service.wire import check_ipc_dir

_POLL = 0.05


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
                 cwd: str | os.PathLike | None = None, max_restarts: int = 0,
                 restart_window: float | None = None,
                 restore_dir: str | os.PathLike | None = None,
                 restarts: list | None = None,
                 mpi_hosts: Sequence[str] | None = None) -> int:
    """Run ``servers`` servers and ``workers`` workers locally and supervise them.

    ``cmd_for_role`` is the argv of every role, or a callable ``(role, index) -> argv`` with
    ``role`` in ``{"server", "worker"}``. ``env`` adds to (and overrides) the launcher's own
    environment, below the contract variables. ``server_endpoints`` (default: free ports on
    ``host``) must have ``servers`` entries. ``output`` receives the prefixed role lines
    (default ``sys.stdout``), ``messages`` the launcher's own reports (default
    ``sys.stderr``). ``stop_timeout`` is how long a stopped role has between SIGTERM and
    SIGKILL. ``cwd`` is the roles' working directory (default: the launcher's).

    ``mode="hybrid"`` (docs/collective.md): the servers start as in any mode, the
    ``workers`` as **one** MPI job (``mpiexec -np workers``: one supervised role labelled
    ``workers``, its log ``workers.log``) with ``PYFLEET_ROLE=worker``, the servers'
    endpoints and the worker count but no worker index (each takes its MPI rank).
    ``mode="collective"``: no server (``servers=0``), the workers one MPI job without the
    parameter-server contract. ``mpi_hosts`` (collective only): the hosts mpirun places
    the ranks on, rank ``j`` on host ``j % len(mpi_hosts)`` (``--map-by node``), each
    rank given the launcher's ``PYFLEET_*`` and Python variables (``-x``); the run
    directory must be at the same path on every host (docs/scaleout.md).

    ``max_restarts`` > 0: a role's death stops every role and starts the whole job again
    (servers on the same endpoints), at most that many times within ``restart_window``
    seconds (default 3600); the roles of attempt n get ``PYFLEET_RESTART_COUNT=n`` and, once
    ``restore_dir`` holds a committed checkpoint, ``PYFLEET_RESTORE_DIR`` (see
    :mod:`pyfleet.launch.restart`). ``restarts``: a list that gets one dict per death.
    The launcher binds every server's port itself and holds it for the whole job
    (:func:`~pyfleet.launch.contract.hold_endpoints`; the server accepts on an inherited
    copy), so no other process can take a dead server's port before its restart; a server
    that still finds its endpoint taken (exit 75, one the launcher could not hold) starts
    the attempt again without using up a restart (at most 5 times in a row). Every role
    gets ``PYFLEET_JOB_TOKEN``, the job's secret: a worker's client talks only to servers
    that prove they hold it (:func:`pyfleet.service.auth.job_proof`).
    ``timeout`` counts over every attempt.

    A job with servers gets its own CURVE keys unless the environment names keys
    (``PYFLEET_CURVE_*``) or sets ``PYFLEET_JOB_KEYS=0``: every role's
    ``PYFLEET_CURVE_DIR`` is a fresh key directory (mode 0700, removed at the
    end), so the servers admit only this job's roles, on loopback too.
    Unless the environment sets ``PYFLEET_IPC_DIR`` (empty: off), every role's
    ``PYFLEET_IPC_DIR`` is a fresh 0700 directory where the servers also listen on
    Unix sockets: the roles talk through them, without TCP or encryption.

    Blocks until the job ends; returns 0 on success, else the failing role's exit code,
    :data:`EXIT_TIMEOUT` on timeout, or 128 + signal when interrupted. Every child process
    group is stopped before returning, whatever happens. Signal handlers for SIGINT, SIGTERM
    and SIGHUP are installed for the duration of the call when it runs on the main thread
    (elsewhere only KeyboardInterrupt-free shutdown paths apply). Not reentrant.
    """
    make_cmd, given = _checked(cmd_for_role, servers, workers, mode, timeout, grace_period,
                               stop_timeout, server_endpoints)
    if mpi_hosts and mode not in ("collective", "hybrid"):
        raise ConfigError(f"mpi_hosts places the ranks of a collective or hybrid job, not "
                          f"of a {mode or 'parameter-server'} job")
    out = sys.stdout if output is None else output
    report = reporter(sys.stderr if messages is None else messages)
    policy = RestartPolicy(max_restarts, restart_window, restore_dir, restarts)
    base = _base_env(env)
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    signals_seen: list[int] = []
    previous = catch_signals(signals_seen)
    lock = threading.Lock()
    deadline = None if timeout is None else time.monotonic() + timeout
    listeners, made = {}, []
    try:
        eps, listeners = _held_endpoints(servers, host, given, mpi_hosts)
        if servers:  # the job's keys and socket directory (removed at the end)
            # ranks on other hosts read the keys from the run directory they share
            made.append(_job_keys(base, os.fspath(cwd or os.getcwd()) if mpi_hosts else None))
            if mpi_hosts:  # Unix sockets are of one machine
                base.setdefault("PYFLEET_IPC_DIR", "")
            made.append(_job_ipc(base))
        bind_retries = 0
        while True:
            roles = _roles(servers, workers, mode)
            try:
                code, died = _attempt(roles, make_cmd, base, eps, workers, mode, log_dir, cwd,
                                      policy, out, lock, report, deadline, timeout,
                                      grace_period, signals_seen, listeners, mpi_hosts)
            finally:
                _end_attempt(roles, signals_seen, report, stop_timeout, lock)
            if died is None or signals_seen:
                return code
            bind_retries = _restart_after(died, policy, bind_retries, report, mpi_hosts)
            if bind_retries is None:
                return code
            time.sleep(RESTART_PAUSE)
    finally:
        release(previous, made, listeners)


def _checked(cmd_for_role, servers, workers, mode, timeout, grace_period, stop_timeout,
             server_endpoints):
    """``launch_local``'s arguments checked, each bad one refused by name:
    ``(make_cmd, the parsed server endpoints or None)``."""
    if mode is not None and mode not in ("sync", "async", "geo", "hybrid", "collective"):
        raise ConfigError(f"mode must be sync, async, geo, hybrid or collective, got {mode!r}")
    if mode == "collective" and servers != 0:
        raise ConfigError(f"a collective job has no server: servers must be 0, got "
                          f"{servers!r}")
    least = 0 if mode == "collective" else 1
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < least:
        raise ConfigError(f"servers must be an int >= {least}, got {servers!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not grace_period >= 0:
        raise ConfigError(f"grace_period must be >= 0 seconds, got {grace_period!r}")
    if not stop_timeout > 0:
        raise ConfigError(f"stop_timeout must be > 0 seconds, got {stop_timeout!r}")
    if mode in ("hybrid", "collective"):
        mpiexec_command(workers)  # no mpiexec: refused here, not when the roles start
    given = None
    if server_endpoints is not None:
        given = parse_endpoints(list(server_endpoints), "server_endpoints")
        if len(given) != servers:
            raise ConfigError(f"{len(given)} server endpoints given for {servers} servers")
    return _command_maker(cmd_for_role), given


def _command_maker(cmd_for_role):
    """``(role, index) -> argv`` of ``cmd_for_role`` (a callable already, or one argv)."""
    if callable(cmd_for_role):
        return cmd_for_role
    fixed = list(cmd_for_role)
    if not fixed:
        raise ConfigError("the command to run is empty")

    def make_cmd(role, index):
        return fixed
    return make_cmd


def _base_env(env):
    """The environment every role starts from: the launcher's without a contract or
    restart variable, then ``env``, and the job's secret."""
    base = {k: v for k, v in os.environ.items()
            if k not in CONTRACT_VARS and k not in restart_vars()}
    base.update(env or {})
    base.setdefault("PYTHONUNBUFFERED", "1")
    # The job's secret: a server answers a client's challenge with it, so a restarted
    # job's workers talk only to servers of this job (pyfleet.service.auth.job_proof).
    base["PYFLEET_JOB_TOKEN"] = secrets.token_hex(32)
    return base


def _roles(servers, workers, mode):
    """One attempt's roles: the servers, then the workers (one MPI role in hybrid and
    collective jobs)."""
    return ([Role("server", i) for i in range(servers)]
            + ([Role("worker", 0, "workers")] if mode in ("hybrid", "collective")
               else [Role("worker", i) for i in range(workers)]))


def _end_attempt(roles, signals_seen, report, stop_timeout, lock):
    """Stop every role of an attempt, let its output drain, close its logs."""
    stop_roles(roles, signals_seen, report, stop_timeout)
    for role in roles:
        if role.reader is not None:
            role.reader.join(timeout=REAP_WAIT)
        with lock, contextlib.suppress(OSError):  # a full disk: reported by pump
            if role.log is not None:
                role.log.close()


def _rank_death(died, mpi_hosts):
    """``(words, host)`` of the death of ``died``: for an MPI job, the rank mpirun's
    notice names (and its host, with ``mpi_hosts``), else the role's own exit."""
    words, host = describe_rc(died.returncode), None
    named = ended_rank("".join(died.tail)) if died.label == "workers" else None
    if named is not None and named[1] is None:  # a survivor aborted: who it lost
        host = lost_peer("".join(died.tail))
        words = (f"(rank {named[0]} aborted the job"
                 + (f": it lost its peer on host {host}" if host else "") + f") {words}")
    elif named is not None:
        rank, rc = named
        host = mpi_hosts[rank % len(mpi_hosts)] if mpi_hosts else None
        words = (f"(rank {rank}" + (f" on {host}" if host else "") + ") "
                 + describe_rc(rc))
    return words, host


def _restart_after(died, policy, bind_retries, report, mpi_hosts=None):
    """Whether the death of ``died`` starts the job again: the taken-endpoint retries in
    a row so far for the next attempt, or None when the job ends."""
    if (policy.max_restarts and died.kind == "server" and bind_retries < BIND_RETRIES
            and died.returncode == EndpointInUse.EXIT_CODE):
        # Another process held the port (one the launcher could not hold):
        # try again without using up a restart.
        bind_retries += 1
        report(f"{died.label} could not bind its endpoint (taken by another "
               f"process); starting the job again, not counted as a restart "
               f"({bind_retries} of at most {BIND_RETRIES} such retries)")
        return bind_retries
    words, host = _rank_death(died, mpi_hosts)
    if not policy.record(died.label, died.returncode, words, host):
        if policy.max_restarts:
            report(policy.gave_up())
        return None
    report(f"{died.label} {words}; restarting the whole job "
           f"(restart {policy.attempt} of at most {policy.max_restarts} within "
           f"{policy.window:g} s)" + (f" from {policy.restore_dir}"
                                      if "PYFLEET_RESTORE_DIR" in policy.env() else ""))
    report(f"restart {policy.attempt} resumes {resume_position(policy.restore_dir)}")
    return 0


def _job_ipc(base):
    """Every role's ``PYFLEET_IPC_DIR`` unless the environment sets it (empty:
    none): a fresh directory (mode 0700, removed when the job ends) in which the
    servers, all on this machine, listen on Unix sockets beside their loopback
    TCP ports, so the roles' traffic skips TCP and CURVE's encryption; the
    directory's permissions admit the same user the job's keys do. Returns the
    directory (None when none was made)."""
    if "PYFLEET_IPC_DIR" in base:
        return None
    path = make_job_dir("pyfleet-ipc-")
    try:
        check_ipc_dir(path)
    except ValueError:   # a temporary directory too deep for a socket's path: TCP
        os.rmdir(path)
        return None
    base["PYFLEET_IPC_DIR"] = path
    return path


def _held_endpoints(servers, host, given, mpi_hosts):
    """:func:`hold_endpoints`; in a hybrid job across hosts the servers run here, so
    ``host`` must be an address of this machine the other hosts reach."""
    try:
        if mpi_hosts:   # given endpoints are not held when they cannot be: check first
            hold_endpoints(1, host)[1][0].close()
        return hold_endpoints(servers, host, given)
    except OSError as e:
        if not mpi_hosts:
            raise
        raise ConfigError(f"a hybrid job across hosts runs its servers beside the launcher, "
                          f"on the first host ({host}), and this machine cannot listen "
                          f"there: {e.strerror or e}; start it on {host}") from None


def _job_keys(base, where=None):
    """Per-job CURVE keys (docs/operations.md, "Secure a cluster"): unless the
    environment names keys already (``PYFLEET_CURVE_*``) or says
    ``PYFLEET_JOB_KEYS=0``, a fresh ``pyfleet keygen`` directory (mode 0700,
    removed when the job ends) becomes every role's ``PYFLEET_CURVE_DIR``, so
    the servers admit this job's roles only, on loopback too. Returns the
    directory (None when none was made)."""
    flag = base.get("PYFLEET_JOB_KEYS", "1").strip()
    if flag not in ("0", "1"):
        raise ConfigError(f"PYFLEET_JOB_KEYS must be 0 or 1, got {flag!r}")
    if flag == "0" or any(k.startswith("PYFLEET_CURVE_") and v for k, v in base.items()):
        return None
    path = base["PYFLEET_CURVE_DIR"] = job_key_dir(where)
    return path



def _mpi_prefix(workers, mode, mpi_hosts):
    """``(argv, env)`` of the mpiexec running an MPI job's ranks (None, None: no MPI)."""
    if mode not in ("hybrid", "collective"):
        return None, None
    if not mpi_hosts:
        return mpiexec_command(workers)
    slots = collections.Counter(mpi_hosts[j % len(mpi_hosts)] for j in range(workers))
    argv, env = mpiexec_command(workers, hosts=",".join(f"{h}:{n}" for h, n in slots.items()))
    return [*argv, "--map-by", "node", "--bind-to", "none"], env


def _forwarded(child_env):
    """mpirun's ``-x NAME`` of every variable a rank on another host needs: the
    launcher's, and the workers' contract in a hybrid job."""
    names = [k for k in child_env if k != LISTEN_FD_VAR and (
        k.startswith(("PYFLEET_", "PADDLE_")) or k in CONTRACT_VARS or k in FORWARD_VARS)]
    return [x for k in names for x in ("-x", k)]


def _attempt(roles, make_cmd, base, eps, workers, mode, log_dir, cwd, policy, out, lock,
             report, deadline, timeout, grace_period, signals_seen, listeners,
             mpi_hosts=None):
    """Start one attempt's roles and supervise them: ``(exit code, role that died or
    None)``. The caller stops the roles."""
    preexec = pdeathsig_preexec()
    mpi_argv, mpi_env = _mpi_prefix(workers, mode, mpi_hosts)
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
        if mode != "collective":
            child_env.update(role_env(role.kind, role.index, eps, workers, mode))
        if mpi_argv and role.kind == "worker":  # one MPI job: each worker takes its rank
            argv = [*mpi_argv, *argv]
            for k in ("PYFLEET_WORKER_INDEX", "PADDLE_TRAINER_ID"):
                child_env.pop(k, None)
            for k, v in mpi_env.items():
                child_env.setdefault(k, v)
        child_env.update(policy.env())
        if mpi_argv and role.kind == "worker" and mpi_hosts:
            argv[len(mpi_argv):len(mpi_argv)] = _forwarded(child_env)
        fds = ()
        if role.kind == "server" and role.index in listeners:
            fds = (listeners[role.index].fileno(),)
            child_env[LISTEN_FD_VAR] = str(fds[0])
        try:
            if log_dir is not None:  # a restarted attempt appends to the role's log
                role.log = open(Path(log_dir) / f"{role.label}.log",  # noqa: SIM115
                                "a" if policy.starts else "w",
                                encoding="utf-8")  # closed by launch_local
                if policy.starts:
                    role.log.write(f"--- pyfleet.launch: restart {policy.attempt} ---\n")
            role.proc = subprocess.Popen(argv, env=child_env, cwd=cwd,
                                         stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True, pass_fds=fds,
                                         preexec_fn=preexec)  # noqa: PLW1509
        except OSError as exc:  # (the log's path, when it is the log that failed)
            report(f"cannot start {role.label} ({' '.join(argv)}): {exc}")
            return 1, None
    for role in roles:
        if role.proc is not None:
            role.reader = threading.Thread(target=pump, args=(role, out, lock, report),
                                           name=f"pyfleet-launch-{role.label}", daemon=True)
            role.reader.start()
    policy.starts += 1
    if not signals_seen and policy.starts == 1:
        report((f"{len(eps)} server(s) at {','.join(eps)}, " if eps else "no server, ")
               + f"{workers} worker(s)" + (" as one MPI job" if mpi_argv else ""))
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    return _supervise(roles, left, timeout, grace_period, signals_seen, report,
                      restarting=policy.max_restarts > 0)


def _supervise(roles: list[Role], timeout, total_timeout, grace, signals_seen, report,
               restarting=False):
    """``(exit code, the role whose death ended the attempt, or None)``."""
    start = time.monotonic()
    workers_done_at = None
    servers = [r for r in roles if r.kind == "server"]
    workers = [r for r in roles if r.kind == "worker"]
    late = set()  # servers reported failing after every worker finished
    while True:
        if signals_seen:
            report(f"got {signal.Signals(signals_seen[0]).name}; stopping every role")
            return 128 + signals_seen[0], None
        # The job is judged by the workers: once every worker exited 0, a
        # server's exit code is reported, not the job's (Fluid's launcher
        # killed the servers; a script without stop_worker stops at exit).
        workers_ok = all(w.returncode == 0 for w in workers)
        for role in roles:
            rc = role.returncode
            if rc is not None and rc != 0 and not role.stopped_by_launcher:
                if workers_ok and role.kind == "server":
                    if role.label not in late:
                        report(f"{role.label} {describe_rc(rc)} after every worker finished")
                        late.add(role.label)
                    continue
                if not restarting:
                    report(f"{role.label} {describe_rc(rc)}; stopping the other roles")
                return exit_code(rc), role
        now = time.monotonic()
        if workers_ok:
            if all(s.returncode is not None for s in servers):
                return 0, None
            if workers_done_at is None:
                workers_done_at = now
            elif now - workers_done_at >= grace:
                left = [s for s in servers if s.returncode is None]
                report(f"every worker finished but {', '.join(s.label for s in left)} still "
                       f"ran {grace:g}s later; terminating it")
                for s in left:
                    s.stopped_by_launcher = True
                return 0, None
        if timeout is not None and now - start >= timeout:
            running = [r.label for r in roles if r.returncode is None]
            report(f"timed out after {total_timeout:g}s with {', '.join(running)} still "
                   "running; stopping every role")
            return EXIT_TIMEOUT, None
        time.sleep(_POLL)

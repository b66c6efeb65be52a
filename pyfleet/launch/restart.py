"""``--max-restarts``: how a supervised job restarts after a role dies, and when it gives up.

The rule is TorchElastic's: on any role's death (a non-zero exit or a signal) every role is
stopped and the **whole job** starts again, the servers on the same endpoints, every role
with ``PYFLEET_RESTART_COUNT`` (the attempt, from 0) and, once a checkpoint was committed,
``PYFLEET_RESTORE_DIR`` (the directory to restore from: ``fleet.init_server()`` loads it, a
worker reads its position from its manifest's ``meta``). Restarting one role alone would
leave the others' state (the live servers' rows, the sync step barrier, the other workers'
positions) newer than the restarted role's checkpoint; restarting all from one committed
checkpoint keeps every example trained once, plus what the checkpoint implies.

At most ``max_restarts`` restarts within any ``window`` seconds: one more death in that
window fails the job, with the history of what died and when (one line per death).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import NamedTuple

from pyfleet.errors import ConfigError

DEFAULT_WINDOW = 3600.0
RESTART_PAUSE = 0.5  # seconds between a stopped attempt and the next (ports, files settle)
MANIFEST = "MANIFEST.json"


class Death(NamedTuple):
    """One role's death: wall-clock ``time``, ``role`` (``server.0``), its return code,
    the words for it (``was killed by SIGKILL``), the ``attempt`` it ended (from 0) and,
    in a job across hosts, the ``host`` it ran on."""

    time: float
    role: str
    returncode: int
    description: str
    attempt: int
    host: str | None = None

    def line(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.time))
        where = "" if self.host is None else f" on {self.host}"
        return (f"  {when}.{int(self.time * 1000) % 1000:03d} UTC  attempt {self.attempt}: "
                f"{self.role}{where} {self.description}")

    def to_json(self) -> dict:
        out = {"time": self.time, "role": self.role, "returncode": self.returncode,
               "description": self.description, "attempt": self.attempt}
        if self.host is not None:
            out["host"] = self.host
        return out


def check_restart_options(max_restarts, window) -> tuple[int, float]:
    """``(max_restarts, window)`` validated; a bad value is refused by name."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    window = DEFAULT_WINDOW if window is None else window
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not window > 0:
        raise ConfigError(f"restart window must be > 0 seconds, got {window!r}")
    return max_restarts, float(window)


class RestartPolicy:
    """Counts deaths; :meth:`record` says whether the job may restart once more."""

    def __init__(self, max_restarts: int, window: float | None = None,
                 restore_dir: str | os.PathLike | None = None,
                 history: list | None = None):
        self.max_restarts, self.window = check_restart_options(max_restarts, window)
        self.restore_dir = None if restore_dir is None else os.path.abspath(restore_dir)
        self.deaths: list[Death] = []
        self._sink = history  # the caller's list: gets each death's to_json()
        self.attempt = 0
        self.starts = 0  # attempts started, with those a taken endpoint ended (not counted)

    def record(self, role: str, returncode: int, description: str,
               host: str | None = None) -> bool:
        """Note a death; True when the job restarts (then :attr:`attempt` is the next)."""
        death = Death(time.time(), role, returncode, description, self.attempt, host)
        self.deaths.append(death)
        if self._sink is not None:
            self._sink.append(death.to_json())
        recent = [d for d in self.deaths if death.time - d.time <= self.window]
        if self.max_restarts == 0 or len(recent) > self.max_restarts:
            return False
        self.attempt += 1
        return True

    def history(self) -> str:
        return "\n".join(d.line() for d in self.deaths)

    def gave_up(self) -> str:
        return (f"{len(self.deaths)} role death(s); more than {self.max_restarts} restart(s) "
                f"within {self.window:g} s, so the job fails. What died and when:\n"
                + self.history())

    def env(self) -> dict[str, str]:
        """The restart variables of the current attempt's roles."""
        env = {"PYFLEET_RESTART_COUNT": str(self.attempt)}
        if self.attempt and self.restore_dir and os.path.exists(
                os.path.join(self.restore_dir, MANIFEST)):
            env["PYFLEET_RESTORE_DIR"] = self.restore_dir
        return env


def resume_position(restore_dir) -> str:
    """Where a restarted job resumes, in words: the committed checkpoint in
    ``restore_dir`` and the position its manifest records (inside a pass: each
    worker's batch, :mod:`pyfleet.trainer.rounds`), or the start of the job."""
    if not restore_dir or not os.path.exists(os.path.join(restore_dir, MANIFEST)):
        return "from the start of the job (no checkpoint committed yet)"
    from pyfleet.service.checkpoint import read_manifest
    try:
        meta = (read_manifest(restore_dir) or {}).get("meta") or {}
    except ValueError as e:  # the roles refuse it too, naming the file
        return f"from {restore_dir}, whose manifest does not read: {e}"
    pos, done = meta.get("position"), meta.get("pass")
    if isinstance(pos, dict) and isinstance(pos.get("workers"), dict) and pos["workers"]:
        workers = sorted(pos["workers"].items(), key=lambda kv: str(kv[0]).zfill(9))
        at = ", ".join(f"worker {k} at batch {(v or {}).get('batches')}" for k, v in workers)
        examples = sum(int((v or {}).get("pass_examples") or 0) for _, v in workers)
        return (f"from {restore_dir} inside pass {pos.get('pass')} (round "
                f"{pos.get('round')}): {at}; {examples:,} examples of the pass trained")
    if isinstance(done, int) and not isinstance(done, bool):
        return f"from {restore_dir} after pass {done}: pass {done + 1} from its start"
    return f"from {restore_dir}"


def restart_vars() -> Sequence[str]:
    return ("PYFLEET_RESTART_COUNT", "PYFLEET_RESTORE_DIR")

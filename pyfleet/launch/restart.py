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
    the words for it (``was killed by SIGKILL``) and the ``attempt`` it ended (from 0)."""

    time: float
    role: str
    returncode: int
    description: str
    attempt: int

    def line(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.time))
        return (f"  {when}.{int(self.time * 1000) % 1000:03d} UTC  attempt {self.attempt}: "
                f"{self.role} {self.description}")

    def to_json(self) -> dict:
        return {"time": self.time, "role": self.role, "returncode": self.returncode,
                "description": self.description, "attempt": self.attempt}


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

    def record(self, role: str, returncode: int, description: str) -> bool:
        """Note a death; True when the job restarts (then :attr:`attempt` is the next)."""
        death = Death(time.time(), role, returncode, description, self.attempt)
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


def restart_vars() -> Sequence[str]:
    return ("PYFLEET_RESTART_COUNT", "PYFLEET_RESTORE_DIR")

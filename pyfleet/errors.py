"""Exceptions raised by pyfleet.

Two tiers, as in the C++ core: a caller's mistake is a ``ValueError`` (or
``TypeError``) naming the bad value; a failure of the distributed system (a
dead or unreachable peer, a timed-out barrier, an error reply from a server) is
a :class:`PyfleetError` naming the endpoint and the operation.
"""

import os
import sys

__all__ = [
    "BarrierError",
    "ConfigError",
    "EndpointInUse",
    "NoRoleError",
    "PeerTimeout",
    "PyfleetError",
    "RemoteError",
    "UncheckedModelWarning",
    "UnsupportedError",
]


class PyfleetError(RuntimeError):
    """Base class of every distributed-system failure pyfleet reports."""


class PeerTimeout(PyfleetError):
    """A server or worker did not answer within the configured timeout."""


class RemoteError(PyfleetError):
    """A server answered a request with an error reply."""


class BarrierError(PyfleetError):
    """A sync-mode barrier could not complete (for example a worker died)."""


class ConfigError(PyfleetError, ValueError):
    """A role, environment variable or configuration value is missing or malformed."""


class UnsupportedError(ConfigError, NotImplementedError):
    """A Fluid name or option pyfleet does not provide, named with the reason
    (see :mod:`pyfleet.fluid.refusals`)."""


class NoRoleError(ConfigError):
    """A role maker found no role in the environment: most often a Fleet script run by
    itself instead of by a launcher. The message says how to launch it; uncaught, it is
    that one line on stderr instead of a traceback (:func:`_one_line_when_uncaught`)."""

    def __init__(self, what: str):
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "script.py"
        super().__init__(
            f"{what}. A Fleet script is one role of a job: start every role with the "
            f"launcher, `python -m pyfleet.launch --server_num 1 --worker_num 2 {script}` "
            f"(or fleetrun; --hosts h1,h2 across hosts), or under mpirun")
        _one_line_when_uncaught()


def _one_line_when_uncaught():
    """Make an uncaught :class:`NoRoleError` print its message alone (exit status 1)."""
    previous = sys.excepthook
    if getattr(previous, "_pyfleet_no_role", False):
        return

    def hook(exc_type, exc, tb):
        if isinstance(exc, NoRoleError):
            print(f"{os.path.basename(sys.argv[0]) or 'python'}: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    hook._pyfleet_no_role = True
    sys.excepthook = hook


class EndpointInUse(PyfleetError):
    """A server could not bind its endpoint: another process listens there.
    ``python -m pyfleet.server`` and a job's server role exit with
    :data:`EXIT_CODE` (75, ``EX_TEMPFAIL``) for it, which a supervising launcher
    does not count as a role's death."""

    EXIT_CODE = 75


class UncheckedModelWarning(UserWarning):
    """A model directory loaded with nothing to check its files against: Fluid's
    layout without pyfleet's checksums (written by Paddle itself, or edited).
    Fluid's ``load_inference_model`` loads one with this warning (Paddle's
    models carry no checksums); pyfleet's own loaders refuse one unless asked
    (``unchecked_ok=True``, ``--unchecked-model``)."""

"""Exceptions raised by pyfleet.

Two tiers, as in the C++ core: a caller's mistake is a ``ValueError`` (or
``TypeError``) naming the bad value; a failure of the distributed system (a
dead or unreachable peer, a timed-out barrier, an error reply from a server) is
a :class:`PyfleetError` naming the endpoint and the operation.
"""

__all__ = ["PyfleetError", "PeerTimeout", "RemoteError", "BarrierError", "ConfigError",
           "UnsupportedError"]


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

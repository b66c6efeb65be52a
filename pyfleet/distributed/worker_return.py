"""A worker that stops and starts again: Fluid's trainer lifecycle, for Fleet.

In Fluid a pserver served until it was killed: a trainer's ``fleet.stop_worker()``
(its executor's ``close``) told the pservers it was done, they dropped it from their
barriers' count and went on serving, so the same trainer process could call
``fleet.init_worker()`` and train again (Paddle 1.5's own Fleet test trains twice,
stopping in between). pyfleet's servers end the job once every worker has stopped,
which is what a job of pyfleet's own wants (``run_server`` returns, the launcher sees
every role end).

``fleet.stop_worker(may_return=True)`` is the Fluid rule, without serving forever:
the worker is done for now (barriers go on without it), its client keeps sending
heartbeats, and the servers keep serving while its process lives. A later
``fleet.init_worker()`` in that process starts it again (barriers wait for it
again); when the process ends (an ``atexit`` hook) it stops for good (a plain
``STOP_WORKER``), and the servers end once every worker has stopped for good. A
process killed after it stopped falls silent: the servers take it as gone after
their heartbeat timeout.

Default of ``may_return``: True in zero-edit mode (:mod:`pyfleet.as_paddle`: code
written for Fluid, run as Fluid ran it), False otherwise.
"""

import logging

from pyfleet.errors import PeerTimeout, PyfleetError

__all__ = ["fluid_lifecycle", "leave", "may_return", "rejoin"]

_log = logging.getLogger("pyfleet.fleet")

# Seconds a leaving process waits for a server's answer at most (it is exiting).
_LEAVE_TIMEOUT = 5.0

_default = {"may_return": False}


def fluid_lifecycle(on=True):
    """Make ``fleet.stop_worker()`` default to ``may_return=on`` in this process
    (zero-edit mode switches it on)."""
    _default["may_return"] = bool(on)


def may_return(value):
    """``stop_worker``'s ``may_return`` argument resolved: None is the process default."""
    if value is None:
        return _default["may_return"]
    if not isinstance(value, bool):
        raise TypeError(f"may_return must be True, False or None, got {value!r}")
    return value


def rejoin(client):
    """``client`` (kept since ``stop_worker(may_return=True)``) starts its worker
    again on every server; closed and re-raised with the reason when a server
    is gone (it ended the job: another worker died, or this process was silent)."""
    try:
        client.join()
    except PyfleetError as exc:
        client.close()
        raise PeerTimeout(f"fleet.init_worker() after fleet.stop_worker(may_return=True): "
                          f"a server did not take this worker back ({exc}); the servers end "
                          f"the job when a worker dies or a stopped one is silent for their "
                          f"heartbeat timeout") from exc
    return client


def leave(client):
    """This process ends: ``client``'s worker, stopped with ``may_return``, stops for
    good; the servers may end the job. A server that does not answer is
    logged, not raised (the process is exiting)."""
    try:
        client.stop_worker(timeout=min(client.timeout, _LEAVE_TIMEOUT))  # for good
    except PyfleetError as e:
        _log.warning("telling the servers this stopped worker left failed: %s "
                     "(they take it as gone after their heartbeat timeout)", e)
    finally:
        client.close()

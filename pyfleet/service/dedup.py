"""At-most-once pushes: the request ids a server has seen (:class:`RecentRequests`).

A client that gets no answer to a push within its timeout may send the same
request again (same request id, header ``request``), on a new socket. The
first copy may still reach the server (it was only slow, or stopped): the
server must then apply the push once. Request ids are chosen by the client
(:mod:`pyfleet.service.channel`: a random 40-bit prefix per process, then a
counter), so ``(sender, request id)`` names one push; the sender is the
worker index of the header (0: anonymous).

The memory is bounded: the last ``per_sender`` ids of each of at most
``senders`` senders (a header's sender outside ``[0, senders)`` shares
bucket 0). A retry arriving after ``per_sender`` newer pushes of the same
sender is not recognized: clients retry within one timeout, so a few
thousand ids are many minutes of pushes.

Thread-safe (one lock; the handler threads and the socket thread call it).
"""

import threading
from collections import OrderedDict

__all__ = ["PER_SENDER", "RecentRequests"]

PER_SENDER = 4096


class RecentRequests:
    """The recent push request ids of up to ``senders`` senders."""

    def __init__(self, senders, per_sender=PER_SENDER):
        self.per_sender = int(per_sender)
        self._seen = [OrderedDict() for _ in range(max(int(senders), 1))]
        self._lock = threading.Lock()

    def first(self, sender, rid):
        """True the first time ``(sender, rid)`` is offered (apply the push);
        False for a repeat (answer it without applying). Request id 0 is
        never remembered (always True)."""
        if rid == 0:
            return True
        seen = self._seen[sender if 0 <= sender < len(self._seen) else 0]
        with self._lock:
            if rid in seen:
                seen.move_to_end(rid)
                return False
            seen[rid] = None
            if len(seen) > self.per_sender:
                seen.popitem(last=False)
            return True

    def forget(self, sender, rid):
        """The push ``(sender, rid)`` was refused: a retry may try again."""
        seen = self._seen[sender if 0 <= sender < len(self._seen) else 0]
        with self._lock:
            seen.pop(rid, None)

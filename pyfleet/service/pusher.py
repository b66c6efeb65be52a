"""A client's push sender: :class:`Pusher`, one background thread with a bounded queue.

Pushes queued to the same table while the previous one is on the wire are merged
(their keys and gradients concatenated; a server sums the gradients of equal keys)
into one request, so a trainer that pushes faster than the wire never waits for
each push, and never queues more than ``max_queue`` of them.

Thread safety: :meth:`Pusher.submit`, :meth:`Pusher.flush` and :meth:`Pusher.close`
may be called from any thread.
"""

import threading
from concurrent.futures import Future

import numpy as np

from pyfleet.errors import PyfleetError

__all__ = ["Pusher"]


class Pusher:
    """The background thread sending pushes, merging those queued to one table.

    ``send(table, keys, grads, flags, unique)`` sends one push and waits until
    every server applied it; ``join_timeout``: seconds :meth:`close` waits."""

    def __init__(self, send, max_queue, join_timeout):
        self.send, self.join_timeout = send, join_timeout
        self.max_queue = max_queue
        self.cond = threading.Condition()
        self.queue = []        # (table, flags, keys, grads, future, unique)
        self.busy = False
        self.closed = False
        self.unobserved = []   # errors of pushes since the last flush()
        self.thread = threading.Thread(target=self._loop, name="pyfleet-pusher", daemon=True)
        self.thread.start()

    def submit(self, table, flags, keys, grads, unique=False):
        fut = Future()
        with self.cond:
            if self.closed:
                raise PyfleetError("the client is closed")
            while len(self.queue) >= self.max_queue:
                self.cond.wait()
            self.queue.append((table, flags, keys, grads, fut, unique))
            self.cond.notify_all()
        return fut

    def flush(self):
        with self.cond:
            while self.queue or self.busy:
                self.cond.wait()
            errors, self.unobserved = self.unobserved, []
        if errors:
            raise errors[0]

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join(self.join_timeout)

    def _loop(self):
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if not self.queue:
                    return
                batch, self.queue = self.queue, []
                self.busy = True
                self.cond.notify_all()
            groups = {}
            for item in batch:
                groups.setdefault((item[0], item[1]), []).append(item)
            for (table, flags), items in groups.items():
                if len(items) == 1:
                    keys, grads, unique = items[0][2], items[0][3], items[0][5]
                else:  # merged pushes may share keys
                    keys = np.concatenate([it[2] for it in items])
                    grads = np.concatenate([it[3] for it in items])
                    unique = False
                try:
                    self.send(table, keys, grads, flags, unique)
                    err = None
                except Exception as e:  # handed to the futures and to flush()
                    err = e
                for it in items:
                    if err is None:
                        it[4].set_result(None)
                    else:
                        it[4].set_exception(err)
                if err is not None:
                    with self.cond:
                        self.unobserved.append(err)
            with self.cond:
                self.busy = False
                self.cond.notify_all()

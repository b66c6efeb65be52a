"""Run an iterator in a daemon thread, a bounded number of items ahead.

Used by the data readers (parsing releases the GIL, so it overlaps training)
and by Fluid's double-buffered PyReader.
"""

import queue
import threading

__all__ = ["prefetched"]

_DONE = object()


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def prefetched(items, depth, name="pyfleet-prefetch"):
    """Yield what ``items`` yields, produced by a daemon thread up to ``depth``
    items ahead. An error in the thread is raised here; closing (or abandoning)
    this generator stops the thread and closes ``items``."""
    q = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer, which re-raises it
            put(_Failure(e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=10.0)

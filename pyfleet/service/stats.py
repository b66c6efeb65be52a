"""What a server reports of itself in ``stats()``: counts of its events (:class:`Counters`)
and its memory (:func:`rss_bytes`, :func:`peak_rss_bytes`)."""

import os
import threading

__all__ = ["Counters", "peak_rss_bytes", "rss_bytes"]


class Counters:
    """Named counts of a server's events (requests by kind, errors, drops), counted
    from any thread."""

    def __init__(self):
        self._counts = {}
        self._lock = threading.Lock()

    def add(self, name, n=1):
        """Count ``n`` more ``name``; returns the new count."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n
            return self._counts[name]

    def get(self, name, default=0):
        return self._counts.get(name, default)

    def snapshot(self):
        with self._lock:
            return dict(self._counts)


def rss_bytes():
    """The process's resident memory now (Linux's statm); -1 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return -1


def peak_rss_bytes():
    """The process's peak resident memory so far (Linux's VmHWM); -1 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return -1

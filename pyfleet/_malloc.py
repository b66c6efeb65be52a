"""Keep a training role's freed buffers in its heap (glibc only).

A training step allocates and frees the same few MB every batch: activations
and gradients of 0.1-1 MB each, the rows and replies of pulls and pushes; a
worker's reader adds its 8 MiB blocks of text and their parsed columns. With
glibc's defaults these are served by ``mmap`` or from a heap top returned to
the kernel after each use, so every batch faults the same pages in again:
measured on the reference DNN (batch 512) about 370 page faults and ~2 ms of
the ~13 ms of CPU a worker's step takes, and the reader's blocks ~0.4 ms of
kernel time a batch more. Fixed thresholds keep them: buffers below the mmap
threshold come from the heap, and up to the trim threshold of free heap stays
mapped, a bounded cost in resident memory.

:func:`keep_freed_memory` sets both through ``mallopt``; ``fleet.init`` calls
it, so every worker and server of a job has them: :data:`WORKER` (room for the
reader's blocks) or :data:`SERVER` (a server holds its tables' memory budget:
less free heap kept). It does nothing where the C library is not glibc, or
when ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` is in the
environment (glibc's own variables: the user's choice wins).
"""

import ctypes
import ctypes.util
import os

__all__ = ["SERVER", "WORKER", "keep_freed_memory"]

# (mmap threshold, trim threshold), bytes
WORKER = (32 << 20, 128 << 20)
SERVER = (4 << 20, 32 << 20)

_M_TRIM_THRESHOLD = -1   # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_applied = []


def keep_freed_memory(thresholds=WORKER):
    """Set ``thresholds`` (mmap, trim) once per process; the pair in force (set
    now or by an earlier call, whose pair stays), or None when left to the C library."""
    if _applied:
        return _applied[0]
    if any(v in os.environ for v in _ENV):
        _applied.append(None)
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):   # musl's mallopt is a no-op stub
            raise AttributeError("not glibc")
    except (OSError, AttributeError):
        _applied.append(None)
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap, trim = thresholds
    ok = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap))) and bool(mallopt(_M_TRIM_THRESHOLD, int(trim)))
    _applied.append((int(mmap), int(trim)) if ok else None)
    return _applied[0]

"""Keep a training role's freed buffers in its heap (glibc only).

A training step allocates and frees the same few MB every batch: activations
and gradients of 0.1-1 MB each, the rows and replies of pulls and pushes. With
glibc's defaults some of these sizes are served by ``mmap`` and the heap's
free top is returned to the kernel, so every batch faults the same pages in
again: measured on the reference DNN (batch 512) about 370 page faults and
~2 ms of the ~13 ms of CPU a worker's step takes
(``benchmarks/micro/bench_fluid_step.py``). Fixed thresholds keep them:
buffers below :data:`MMAP_THRESHOLD` come from the heap, and up to
:data:`TRIM_THRESHOLD` of free heap stays mapped, a bounded cost in resident
memory.

:func:`keep_freed_memory` sets both through ``mallopt``; ``fleet.init`` calls
it, so every worker and server of a job has them. It does nothing where the
C library is not glibc, or when ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` is in the environment (glibc's own variables: the
user's choice wins).
"""

import ctypes
import ctypes.util
import os

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 32 << 20

_M_TRIM_THRESHOLD = -1   # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_applied = None


def keep_freed_memory():
    """Set the thresholds once per process; True if they are in force
    (set now or before by this function), False if left to the C library."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if any(v in os.environ for v in _ENV):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):   # musl's mallopt is a no-op stub
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied

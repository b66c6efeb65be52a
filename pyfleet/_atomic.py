"""The one way pyfleet writes a file that must never be seen half-written.

Every writer goes: a temporary name in the same directory, write, flush,
fsync the file, rename onto the final name, fsync the directory (so the rename
itself survives a power cut). A failure at any point removes the temporary
file and leaves the old file, if any, untouched. Readers therefore see either
the old content or the new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np

__all__ = ["atomic_open", "write_json", "save_npy", "fsync_dir"]


def fsync_dir(path: str) -> None:
    """fsync the directory ``path`` so a rename inside it is durable."""
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "wb", durable: bool = True):
    """Open a temporary file beside ``path``; on a clean exit make it ``path``.

    ``mode`` is ``"wb"`` or ``"w"``. An exception inside the block deletes the
    temporary file and re-raises; ``path`` is then unchanged. ``durable=False``
    skips both fsyncs: readers still see the old or the new file whole, but a
    power cut may lose the update (for files that only report progress).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes whole files: mode must be 'w' or 'wb', got {mode!r}")
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_json(path: str, obj, indent: int | None = None, durable: bool = True) -> None:
    """Write ``obj`` as JSON at ``path`` atomically (``durable``: as :func:`atomic_open`)."""
    with atomic_open(path, "w", durable=durable) as f:
        json.dump(obj, f, indent=indent)


def save_npy(path: str, value) -> None:
    """Write ``value`` as a ``.npy`` file at ``path`` atomically (no pickle)."""
    with atomic_open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(value), allow_pickle=False)

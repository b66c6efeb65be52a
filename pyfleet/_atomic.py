"""The one way pyfleet writes a file that must never be seen half-written.

Every writer goes: a temporary name in the same directory, write, flush,
fsync the file, rename onto the final name, fsync the directory (so the rename
itself survives a power cut). A failure at any point removes the temporary
file and leaves the old file, if any, untouched. Readers therefore see either
the old content or the new one, never a torn file. A failure to write (a full
disk) is a :class:`WriteError` naming the final path, one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

import numpy as np

__all__ = [
    "BODY_KEY",
    "WriteError",
    "append_line",
    "atomic_open",
    "body_digest",
    "check_body",
    "fsync_dir",
    "save_npy",
    "write_json",
    "writing",
]

# A sealed JSON file (a checkpoint's manifest, a model's description) holds the
# sha256 of its own body under this key.
BODY_KEY = "body_sha256"


class WriteError(OSError):
    """An OSError while writing ``filename`` (a full disk: ``errno.ENOSPC``).
    ``str()`` is one line naming the file: ``cannot write PATH: STRERROR``."""

    def __str__(self):
        return f"cannot write {self.filename}: {self.strerror}"


@contextlib.contextmanager
def writing(path):
    """Raise any OSError of the block as a :class:`WriteError` naming ``path``
    (the OSError of a ``write()`` names no file)."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(e.errno, e.strerror or str(e), os.fspath(path)) from None


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
        with writing(path):
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
        with writing(path):
            fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_json(path: str, obj, indent: int | None = None, durable: bool = True) -> None:
    """Write ``obj`` as JSON at ``path`` atomically (``durable``: as :func:`atomic_open`)."""
    with atomic_open(path, "w", durable=durable) as f:
        json.dump(obj, f, indent=indent)


def save_npy(path: str, value) -> None:
    """Write ``value`` as a ``.npy`` file at ``path`` atomically (no pickle)."""
    with atomic_open(path, "wb") as f:
        np.save(_Stream(f), np.ascontiguousarray(value), allow_pickle=False)


class _Stream:
    """A file seen by numpy through its ``write`` alone: numpy writes a real
    file with ``tofile``, whose short write (a full disk) raises an OSError
    without errno ("N requested and M written"); ``write`` raises ENOSPC."""

    def __init__(self, f):
        self.write = f.write


def append_line(path: str, line: str) -> None:
    """Append ``line`` and a newline to ``path`` whole or not at all: a write
    that fails (a full disk) is cut off again, so a reader never sees a torn
    line; raises :class:`WriteError` naming ``path``."""
    data = (line + "\n").encode()
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            end = os.fstat(fd).st_size
            try:
                done = 0
                while done < len(data):  # a short write: the next one raises why
                    done += os.write(fd, data[done:])
            except OSError:
                os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


def body_digest(obj: dict) -> str:
    """The sha256 (hex) of a sealed JSON object's body: its JSON without
    :data:`BODY_KEY`, keys sorted, no spaces."""
    body = {k: v for k, v in obj.items() if k != BODY_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def check_body(path: str, obj: dict, unchecked_ok: bool = False, complete: bool = True) -> None:
    """Refuse (ValueError naming ``path``) a sealed JSON object whose body does
    not match its :data:`BODY_KEY`, or that carries no checksums (no
    :data:`BODY_KEY`, or ``complete`` False: a part of them is missing) unless
    ``unchecked_ok``: edited, or written before they were recorded."""
    want = obj.get(BODY_KEY)
    if want is None or not complete:
        if unchecked_ok:
            return
        raise ValueError(f"{path} carries no checksums ({BODY_KEY} or those of its files): "
                         f"edited, or written before pyfleet recorded them; refused (read it "
                         f"with unchecked_ok=True only if you trust it)")
    if want != body_digest(obj):
        raise ValueError(f"{path} is damaged: its body does not match its {BODY_KEY} (a bit "
                         f"flip or an edit); refused")

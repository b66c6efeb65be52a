"""Data files: opening (plain or gzip), reading in blocks, and what format and
:class:`Schema` a file has (Criteo TSV, CSV with a header, PaddleRec slots).

The readers of :mod:`pyfleet.data.readers` build on these; the formats are
specified in ``docs/formats.md``.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from pyfleet.data import _parse

__all__ = ["FORMATS", "GZIP_MAGIC", "MAX_LINE_BYTES", "DataError", "Schema", "blocks",
           "criteo_columns", "criteo_labelled", "criteo_schema", "csv_schema", "detect_format", "list_files",
           "open_data", "read_first_line", "slot_schema", "split_header"]

FORMATS = ("criteo", "csv", "slot")
GZIP_MAGIC = b"\x1f\x8b"
# The longest line a reader accepts (bytes, without its newline): Criteo lines are
# about 200 bytes, PaddleRec slot lines a few KiB; a longer line is a damaged or
# wrong file, refused by name instead of buffered (Dataset(max_line_bytes=...)).
MAX_LINE_BYTES = 1 << 20

log = logging.getLogger(__name__)

# What reading a damaged, truncated or unreadable file raises.
_READ_ERRORS = (OSError, EOFError, zlib.error)


class DataError(ValueError):
    """Input data that cannot be read: the message is one line that starts with
    ``file:line:`` (or ``file:`` when no line is concerned) and says why."""


def _read_error(path: str, e: BaseException, after_line: int = 0) -> DataError:
    where = f"{path}:{after_line + 1}" if after_line else path
    if isinstance(e, EOFError):
        what = "the gzip data ends early (a truncated .gz file)"
    elif isinstance(e, (zlib.error, gzip.BadGzipFile)):
        what = f"damaged gzip data ({e})"
    elif isinstance(e, OSError) and e.strerror:
        what = f"cannot read: {e.strerror}"
    else:
        what = f"cannot read ({e})"
    return DataError(f"{where}: {what}")


def _too_long(path: str, line: int, max_line: int) -> DataError:
    return DataError(f"{path}:{line}: a line longer than {max_line:,} bytes (a damaged or "
                     f"binary file? the limit is max_line_bytes: pyfleet train --max-line-bytes, "
                     f"Dataset(max_line_bytes=))")


@dataclass(frozen=True)
class Schema:
    """What one example holds: a label, ``dense_names`` columns, ``slot_names`` slots.

    ``columns`` is the CSV header in file order (empty for other formats). The
    hash slot index of a slot is its position in ``slot_names``.
    """

    format: str
    dense_names: tuple[str, ...]
    slot_names: tuple[str, ...]
    label_name: str | None = "label"  # None: unlabelled rows (read for prediction only)
    columns: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        return self.label_name is not None

    @property
    def n_dense(self) -> int:
        return len(self.dense_names)

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)


def criteo_schema(labelled: bool = True) -> Schema:
    """The Criteo schema: label, dense I1..I13, categorical slots C1..C26 (hash slots
    0..25); ``labelled=False``: the 39 fields of Criteo's test file, with no label."""
    dense = tuple(f"I{i}" for i in range(1, 14))
    slots = tuple(f"C{i}" for i in range(1, 27))
    if not labelled:
        return Schema("criteo", dense, slots, None, dense + slots)
    return Schema("criteo", dense, slots, "label", ("label",) + dense + slots)


def criteo_labelled(path: str) -> bool:
    """False when the first line of a Criteo TSV file has the 39 fields of Criteo's
    test file (no label column), else True (a line with a wrong field count is then
    named by the parser)."""
    return read_first_line(path).count(b"\t") != 38


def open_data(path: str):
    """``(stream, raw)``: the file's bytes (gunzipped when it starts with the gzip
    magic) and the raw file to close after the stream (None for a plain file).
    Raises :class:`DataError` naming the file when it cannot be opened."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _read_error(path, e) from None
    try:
        magic = f.read(2)
        f.seek(0)
    except OSError as e:
        f.close()
        raise _read_error(path, e) from None
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb"), f
    return f, None


def _long_line(data, start: int, end: int, max_line: int) -> int:
    """The offset of the first line of ``data[start:end]`` (whole lines) longer than
    ``max_line`` bytes, or -1: one ``rfind`` per ``max_line`` bytes, not per line."""
    while end - start > max_line:
        nl = data.rfind(b"\n", start, start + max_line + 1)
        if nl < 0:
            return start
        start = nl + 1
    return -1


def blocks(path: str, block_size: int, max_line: int = MAX_LINE_BYTES) -> Iterator[memoryview]:
    """Successive buffers of whole lines of a file (the last may lack its newline).

    A line longer than ``max_line`` bytes (0: no limit) raises :class:`DataError`
    naming the file and line as soon as it is seen: it is never buffered whole. The
    pieces of a line that spans blocks are joined once, when its end is read.
    Unreadable, truncated or damaged (gzip) data raises :class:`DataError` too.
    """
    f, raw = open_data(path)
    done = 0  # newlines yielded so far: the line in progress is line done + 1
    try:
        parts, held = [], 0  # the pieces of a line that spans blocks
        while True:
            try:
                block = f.read(block_size)
            except _READ_ERRORS as e:
                raise _read_error(path, e, done) from None
            if not block:
                break
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                parts.append(block)
                held += len(block)
                if max_line and held > max_line:
                    raise _too_long(path, done + 1, max_line)
                continue
            if parts:
                data = b"".join(parts + [block])
                cut += held
            else:
                data = block
            if max_line:
                bad = _long_line(data, 0, cut, max_line)
                if bad >= 0:
                    raise _too_long(path, done + data.count(b"\n", 0, bad) + 1, max_line)
            yield memoryview(data)[:cut]
            done += data.count(b"\n", 0, cut)
            parts, held = ([data[cut:]], len(data) - cut) if cut < len(data) else ([], 0)
            if max_line and held > max_line:
                raise _too_long(path, done + 1, max_line)
        if parts:
            yield memoryview(b"".join(parts))
    finally:
        f.close()
        if raw is not None:
            raw.close()


def read_first_line(path: str, limit: int = MAX_LINE_BYTES) -> bytes:
    """The first line of a file without its line end; :class:`DataError` naming the
    file when it is longer than ``limit`` bytes or cannot be read."""
    f, raw = open_data(path)
    try:
        line = f.readline(limit + 2)
    except _READ_ERRORS as e:
        raise _read_error(path, e) from None
    finally:
        f.close()
        if raw is not None:
            raw.close()
    line = line.rstrip(b"\r\n") if line.endswith(b"\n") else line
    if limit and len(line) > limit:
        raise _too_long(path, 1, limit)
    return line.rstrip(b"\r")


def count_data_lines(paths, header_lines: int = 0, max_line: int = MAX_LINE_BYTES) -> int:
    """Read every file of ``paths`` whole (as :func:`blocks` does) and return their
    data lines (``header_lines`` per non-empty file excluded): the check that finds
    a truncated gzip file, an unreadable shard or an overlong line before a job
    starts. Raises :class:`DataError` naming the file (and line)."""
    total = 0
    for path in list_files(paths):
        n = 0
        for buf in blocks(path, 1 << 20, max_line):
            n += buf.obj.count(b"\n", 0, len(buf)) if buf[-1] == 10 else \
                buf.obj.count(b"\n", 0, len(buf)) + 1
        total += max(n - header_lines, 0)
    return total


def list_files(paths) -> list[str]:
    """Expand files and directories into a sorted, de-duplicated list of files.

    A directory contributes its files (not recursive), skipping names that start
    with ``.`` or ``_`` (``_SUCCESS``, ``.crc``); a subdirectory in it is skipped
    with a warning. Anything else that is not a regular file (a dangling symlink,
    a FIFO, a socket, a device) raises :class:`DataError` naming it: a shard is
    never lost silently. Raises FileNotFoundError for a missing path and
    ValueError when nothing is left.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = set()
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                full = os.path.join(p, name)
                if name.startswith((".", "_")):
                    continue
                if os.path.isdir(full):
                    log.warning("%s: a directory among the data files, skipped (not read "
                                "recursively)", full)
                    continue
                _check_regular(full)
                out.add(full)
        elif os.path.lexists(p):
            _check_regular(p)
            out.add(p)
        else:
            raise FileNotFoundError(f"no such data file or directory: {p!r}")
    if not out:
        raise ValueError(f"no data files found in {list(map(os.fspath, paths))!r}")
    return sorted(out)


def _check_regular(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(f"{path}: a dangling symbolic link (to {os.readlink(path)!r}) "
                        f"among the data files") from None
    except OSError as e:
        raise _read_error(path, e) from None
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
        raise DataError(f"{path}: {kind} among the data files (only regular files are read)")


def criteo_columns(labelled: bool = True):
    kind = np.array([_parse.KIND_LABEL] + [_parse.KIND_DENSE] * 13 + [_parse.KIND_SLOT] * 26,
                    dtype=np.int8)
    index = np.array([0] + list(range(13)) + list(range(26)), dtype=np.int32)
    return (kind, index) if labelled else (kind[1:].copy(), index[1:].copy())


def split_header(header: bytes, path: str = "") -> list[str]:
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError:
        where = f"{path}:1: " if path else ""
        raise DataError(f"{where}the CSV header is not UTF-8: {header[:80]!r}") from None
    text = text.lstrip("\ufeff")  # a UTF-8 byte order mark, as spreadsheet exports write
    return [name.strip().strip('"') for name in text.rstrip("\r\n").split(",")]


_DENSE_RE = re.compile(r"^I(\d+)$", re.IGNORECASE)
_SLOT_RE = re.compile(r"^C(\d+)$", re.IGNORECASE)


def csv_schema(header: bytes, path: str, require_label: bool = True):
    if not header.strip():
        raise ValueError(f"{path}:1: a CSV file must start with a header naming its columns")
    names = split_header(header, path)
    kind = np.zeros(len(names), dtype=np.int8)
    index = np.zeros(len(names), dtype=np.int32)
    label_col, dense, slots = None, [], []
    for c, name in enumerate(names):
        low = name.lower()
        if low in ("label", "click"):
            if label_col is not None:
                raise ValueError(f"{path}:1: CSV header has two label columns: {name!r}")
            label_col = c
        elif _DENSE_RE.match(name):
            dense.append((int(_DENSE_RE.match(name).group(1)), c, name))
        elif _SLOT_RE.match(name):
            slots.append((int(_SLOT_RE.match(name).group(1)), c, name))
        elif low != "id":
            raise ValueError(f"{path}:1: unknown CSV column {name!r}; expected label/click, "
                             f"Id, I<k> (dense) or C<k> (categorical)")
    if label_col is None and require_label:
        raise ValueError(f"{path}:1: CSV header has no 'label' or 'click' column: {names!r}")
    if not dense and not slots:
        raise ValueError(f"{path}:1: CSV header has no I<k> or C<k> columns: {names!r}")
    if label_col is not None:
        kind[label_col] = _parse.KIND_LABEL
    dense.sort()
    slots.sort()
    for j, (_, c, _) in enumerate(dense):
        kind[c], index[c] = _parse.KIND_DENSE, j
    for j, (_, c, _) in enumerate(slots):
        kind[c], index[c] = _parse.KIND_SLOT, j
    schema = Schema("csv", tuple(n for _, _, n in dense), tuple(n for _, _, n in slots),
                    None if label_col is None else names[label_col], tuple(names))
    return schema, kind, index


def slot_schema(path: str, slots, label_name: str, dense_name: str) -> Schema:
    first = read_first_line(path).decode("utf-8", "replace").split()
    n_dense = sum(1 for tok in first if tok.split(":", 1)[0] == dense_name)
    if slots is None:
        seen = {}
        for tok in first:
            name = tok.split(":", 1)[0]
            if ":" in tok and name not in (label_name, dense_name):
                seen.setdefault(name, None)
        slots = tuple(seen)
        if not slots:
            raise ValueError(f"{path}:1: no slot tokens ('<slot>:<id>') in the first line")
    slots = tuple(str(s) for s in slots)
    if len(set(slots)) != len(slots) or any(not s or ":" in s or " " in s for s in slots):
        raise ValueError(f"slot names must be distinct, non-empty, without ':' or spaces: "
                         f"{slots!r}")
    dense_names = tuple(f"{dense_name}_{j}" for j in range(n_dense))
    return Schema("slot", dense_names, slots, label_name)


def detect_format(path: str) -> str:
    line = read_first_line(path)
    if not line:
        raise ValueError(f"{path}: cannot detect the format from an empty first line; "
                         f"pass format='criteo', 'csv' or 'slot'")
    first = line.split(b" ", 1)[0]
    if b":" in first and b"\t" not in line:
        return "slot"
    if b"," in line and not line.split(b",", 1)[0].strip().replace(b".", b"").isdigit():
        return "csv"
    if b"\t" in line:
        return "criteo"
    raise ValueError(f"{path}: cannot detect the format of {line[:80]!r}; "
                     f"pass format='criteo', 'csv' or 'slot'")

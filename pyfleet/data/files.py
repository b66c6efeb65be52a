"""Data files: opening (plain or gzip), reading in blocks, and what format and
:class:`Schema` a file has (Criteo TSV, CSV with a header, PaddleRec slots).

The readers of :mod:`pyfleet.data.readers` build on these; the formats are
specified in ``docs/formats.md``.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from pyfleet.data import _parse

__all__ = ["FORMATS", "GZIP_MAGIC", "Schema", "blocks", "criteo_columns", "criteo_schema",
           "csv_schema", "detect_format", "open_data", "read_first_line", "slot_schema",
           "split_header"]

FORMATS = ("criteo", "csv", "slot")
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Schema:
    """What one example holds: a label, ``dense_names`` columns, ``slot_names`` slots.

    ``columns`` is the CSV header in file order (empty for other formats). The
    hash slot index of a slot is its position in ``slot_names``.
    """

    format: str
    dense_names: Tuple[str, ...]
    slot_names: Tuple[str, ...]
    label_name: str = "label"
    columns: Tuple[str, ...] = ()

    @property
    def n_dense(self) -> int:
        return len(self.dense_names)

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)


def criteo_schema() -> Schema:
    """The Criteo schema: label, dense I1..I13, categorical slots C1..C26 (hash slots 0..25)."""
    dense = tuple(f"I{i}" for i in range(1, 14))
    slots = tuple(f"C{i}" for i in range(1, 27))
    return Schema("criteo", dense, slots, "label", ("label",) + dense + slots)


def open_data(path: str):
    f = open(path, "rb")
    try:
        magic = f.read(2)
        f.seek(0)
    except BaseException:
        f.close()
        raise
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb"), f
    return f, None


def blocks(path: str, block_size: int) -> Iterator[memoryview]:
    """Successive buffers of whole lines of a file (the last may lack its newline)."""
    f, raw = open_data(path)
    try:
        carry = b""
        while True:
            try:
                block = f.read(block_size)
            except (OSError, EOFError) as e:
                raise ValueError(f"{path}: cannot read ({e})") from e
            if not block:
                break
            data = carry + block if carry else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            yield memoryview(data)[:cut]
            carry = data[cut:]
        if carry:
            yield memoryview(carry)
    finally:
        f.close()
        if raw is not None:
            raw.close()


def read_first_line(path: str, limit: int = 1 << 20) -> bytes:
    f, raw = open_data(path)
    try:
        line = f.readline(limit)
    finally:
        f.close()
        if raw is not None:
            raw.close()
    return line.rstrip(b"\r\n")


def criteo_columns():
    kind = np.array([_parse.KIND_LABEL] + [_parse.KIND_DENSE] * 13 + [_parse.KIND_SLOT] * 26,
                    dtype=np.int8)
    index = np.array([0] + list(range(13)) + list(range(26)), dtype=np.int32)
    return kind, index


def split_header(header: bytes) -> List[str]:
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"CSV header is not UTF-8: {header[:80]!r}") from e
    text = text.lstrip("\ufeff")  # a UTF-8 byte order mark, as spreadsheet exports write
    return [name.strip().strip('"') for name in text.rstrip("\r\n").split(",")]


_DENSE_RE = re.compile(r"^I(\d+)$", re.IGNORECASE)
_SLOT_RE = re.compile(r"^C(\d+)$", re.IGNORECASE)


def csv_schema(header: bytes, path: str):
    if not header.strip():
        raise ValueError(f"{path}:1: a CSV file must start with a header naming its columns")
    names = split_header(header)
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
    if label_col is None:
        raise ValueError(f"{path}:1: CSV header has no 'label' or 'click' column: {names!r}")
    if not dense and not slots:
        raise ValueError(f"{path}:1: CSV header has no I<k> or C<k> columns: {names!r}")
    kind[label_col] = _parse.KIND_LABEL
    dense.sort()
    slots.sort()
    for j, (_, c, _) in enumerate(dense):
        kind[c], index[c] = _parse.KIND_DENSE, j
    for j, (_, c, _) in enumerate(slots):
        kind[c], index[c] = _parse.KIND_SLOT, j
    schema = Schema("csv", tuple(n for _, _, n in dense), tuple(n for _, _, n in slots),
                    names[label_col], tuple(names))
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

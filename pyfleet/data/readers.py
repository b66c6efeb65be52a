"""Readers of CTR training data: raw Criteo TSV, CSV with a header, PaddleRec slot format.

A :class:`Dataset` turns files into :class:`Batch` objects of numpy arrays. Files
are read in large blocks (``block_size``, 8 MiB by default) cut at the last
newline; each block is parsed by one call into :mod:`pyfleet.data._parse` that
releases the GIL, so no Python object is made per line. The formats, the
feature hash and the sharding rule are specified in ``docs/formats.md``.

Thread safety: a :class:`Dataset` holds only its configuration and the
statistics of its latest pass; iterate one pass at a time per object. Different
objects may be used from different threads (parsing runs without the GIL).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Union

import numpy as np

from pyfleet.data import _parse
from pyfleet.data.chunks import Chunk, concat_parts, holdout_mask
from pyfleet.data.files import (
    FORMATS,
    MAX_LINE_BYTES,
    DataError,
    Schema,
    blocks,
    criteo_columns,
    criteo_labelled,
    criteo_schema,
    csv_schema,
    detect_format,
    list_files,
    read_first_line,
    slot_schema,
    split_header,
)
from pyfleet.data.prefetch import prefetched

log = logging.getLogger("pyfleet.data")

__all__ = [
    "Batch",
    "DataError",
    "Dataset",
    "Schema",
    "criteo_schema",
    "describe_malformed",
    "feature_hash",
    "list_files",
    "parse_criteo_bytes",
    "shard_files",
]

feature_hash = _parse.feature_hash

BLOCK_SIZE = 8 << 20

PathLike = Union[str, os.PathLike]


class Batch:
    """One batch of examples, as numpy arrays.

    - ``labels``: float32[B]
    - ``dense``: float32[B, n_dense] (already transformed)
    - ``sparse``: list, one ``(ids, offsets)`` per slot in ``slot_names`` order:
      ``ids`` uint64[nnz], ``offsets`` int64[B + 1]; example ``i`` owns
      ``ids[offsets[i]:offsets[i + 1]]`` (CSR). Every example has at least one id
      in every slot (an absent value gets the slot's missing id).

    The arrays may be views of a larger parse buffer: treat them as read-only.
    """

    __slots__ = ("dense", "labels", "slot_names", "sparse")

    def __init__(self, labels: np.ndarray, dense: np.ndarray,
                 sparse: list[tuple[np.ndarray, np.ndarray]], slot_names: Sequence[str]):
        self.labels = labels
        self.dense = dense
        self.sparse = sparse
        self.slot_names = tuple(slot_names)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def ids_matrix(self) -> np.ndarray:
        """uint64[B, n_slots] when every example has exactly one id per slot (Criteo TSV/CSV).

        Raises ValueError for a batch with multi-id slots (use ``sparse``).
        """
        n = len(self)
        out = np.empty((n, len(self.sparse)), dtype=np.uint64)
        for s, (ids, _offsets) in enumerate(self.sparse):
            if ids.shape[0] != n:
                raise ValueError(f"slot {self.slot_names[s]!r} has {ids.shape[0]} ids for "
                                 f"{n} examples; use Batch.sparse for multi-id slots")
            out[:, s] = ids
        return out

    def __repr__(self) -> str:
        return (f"Batch(size={len(self)}, n_dense={self.dense.shape[1]}, "
                f"slots={len(self.sparse)})")


def parse_criteo_bytes(buf, dense_transform: str = "log", dense_min=None,
                       dense_max=None) -> dict:
    """Parse complete Criteo TSV lines held in ``buf`` (bytes-like) in one call.

    Returns a dict with ``labels`` float32[n], ``dense`` float32[n, 13],
    ``ids`` uint64[n, 26] (slot j = column C(j+1)), ``bad_lines`` int64 (0-based
    line numbers of malformed lines), ``bad_reasons`` int8 (codes of
    ``pyfleet.data._parse.REASONS``) and the counts ``lines``, ``blank``,
    ``examples``, ``malformed``. The fast path the benchmark measures.
    """
    kind, index = criteo_columns()
    return _parse.parse_delimited(_as_bytes_view(buf), 9, kind, index, 13, 26,
                                  dense_transform, dense_min, dense_max)


def describe_malformed(stats, limit: int = 3) -> list[str]:
    """``["file:line: reason", ...]``: the first ``limit`` malformed lines of
    :meth:`Dataset.stats` (or a saved copy of it)."""
    return [f"{f}:{line}: {why}" for (f, line), why in
            zip(stats["first_malformed"][:limit], stats["first_malformed_reasons"][:limit])]


def shard_files(files: Sequence[str], worker_index: int, worker_num: int):
    """This worker's share: ``(files, line_mod, line_rem)``.

    With at least as many files as workers, worker i reads ``files[i::N]``
    whole (``line_mod == 1``). With fewer files, every worker reads every file
    and keeps the data lines whose number (counted from 0 over all files in
    order, header lines excluded, blank lines included) is i modulo N.
    """
    if not isinstance(worker_num, (int, np.integer)) or worker_num < 1:
        raise ValueError(f"worker_num must be a positive integer, got {worker_num!r}")
    if not isinstance(worker_index, (int, np.integer)) or not 0 <= worker_index < worker_num:
        raise ValueError(f"worker_index must be in [0, {worker_num}), got {worker_index!r}")
    files = list(files)
    if len(files) >= worker_num:
        return files[worker_index::worker_num], 1, 0
    return files, int(worker_num), int(worker_index)


class Dataset:
    """An iterable of :class:`Batch` over CTR data files; each iteration is one pass.

    ``paths``: a file, a directory of shards, or a list of either; plain or
    gzip (detected by magic bytes). ``format``: ``"criteo"`` (TSV, no header),
    ``"csv"`` (header names the columns: ``label``/``click``, ``I<k>`` dense,
    ``C<k>`` categorical, ``Id`` ignored), ``"slot"`` (PaddleRec
    ``click:1 dense_feature:0.5 ... 1:123 2:456``) or ``"auto"`` (from the first
    line of the first non-empty file, which also gives the CSV header and the
    slot names).

    ``dense_transform``: ``"log"`` (``log(1 + max(x, 0))``), ``"minmax"``
    (``(x - dense_min) / (dense_max - dense_min)`` per column) or ``"none"``; the
    default ``None`` means "log" for criteo/csv and "none" for slot (its values
    are already scaled). A missing dense value is 0.

    Worker ``worker_index`` of ``worker_num`` reads its share (:func:`shard_files`).
    ``shuffle`` visits this worker's files in a random order (file sharding
    only) and shuffles examples within each block; ``seed`` and the pass number
    fix the order. Malformed lines are skipped and counted (:meth:`stats`), or
    with ``strict=True`` raise ValueError naming the file and line.

    For the slot format, ``slots`` (names in order) defaults to the slot names
    of the first line of the first non-empty file, in order of appearance;
    tokens of other names are ignored and counted.

    ``holdout=(fraction, side)`` splits the examples in two by their content
    (a hash of their features, never of the label or of which worker reads
    them): about ``fraction`` of them are the "valid" side, the rest the
    "train" side, and this dataset yields only ``side``'s. The same rows fall
    on the same side for any number of workers, any shuffle and any pass.

    ``prefetch > 0`` reads and parses in a background thread, up to that many
    batches ahead (parsing releases the GIL, so it overlaps the training step);
    an error in the thread is raised from the iteration, and abandoning the
    iteration stops the thread.

    Input that cannot be read raises :class:`DataError` (a ValueError) whose
    one-line message starts with the file (and line): a dangling symlink or a
    FIFO among the shards, an unreadable file, a truncated or damaged gzip file,
    and a line longer than ``max_line_bytes`` (1 MiB by default; 0 for no limit),
    which is refused as soon as it is seen instead of being buffered.

    ``labels="optional"`` (prediction) also reads unlabelled rows: Criteo TSV
    whose first line has 39 fields (Criteo's test file), CSV whose header has
    no label column; their labels read as 0 and ``schema.labelled`` is False.
    """

    def __init__(self, paths, format: str = "criteo", batch_size: int = 512,
                 worker_index: int = 0, worker_num: int = 1, strict: bool = False,
                 dense_transform: str | None = None, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, *, dense_min=None, dense_max=None,
                 slots: Sequence[str] | None = None, label_name: str = "click",
                 dense_name: str = "dense_feature", block_size: int = BLOCK_SIZE,
                 max_reported: int = 10, prefetch: int = 0, holdout=None,
                 max_line_bytes: int = MAX_LINE_BYTES, labels: str = "required",
                 max_malformed: int | None = None):
        if holdout is not None:
            fraction, side = holdout
            if not 0.0 < float(fraction) < 1.0 or side not in ("train", "valid"):
                raise ValueError(f"holdout must be (fraction in (0, 1), 'train' or 'valid'), "
                                 f"got {holdout!r}")
            holdout = (float(fraction), side)
        self.holdout = holdout
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size!r}")
        if isinstance(max_line_bytes, bool) or not isinstance(
                max_line_bytes, (int, np.integer)) or max_line_bytes < 0:
            raise ValueError(f"max_line_bytes must be an integer >= 0 (0: no limit), got "
                             f"{max_line_bytes!r}")
        self.max_line_bytes = int(max_line_bytes)
        if max_malformed is not None and (isinstance(max_malformed, bool) or not isinstance(
                max_malformed, (int, np.integer)) or max_malformed < 0):
            raise ValueError(f"max_malformed must be an integer >= 0 or None, got "
                             f"{max_malformed!r}")
        self.max_malformed = None if max_malformed is None else int(max_malformed)
        if not isinstance(prefetch, (int, np.integer)) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative integer, got {prefetch!r}")
        self.all_files = list_files(paths)
        self.files, self._line_mod, self._line_rem = shard_files(
            self.all_files, worker_index, worker_num)
        # The schema comes from the first file with a first line, the same for every worker.
        self._schema_file = next((f for f in self.all_files
                                  if read_first_line(f, self.max_line_bytes)),
                                 self.all_files[0])
        if format == "auto":
            format = detect_format(self._schema_file)
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS + ('auto',)}, got {format!r}")
        self.format = format
        self.batch_size = int(batch_size)
        self.worker_index, self.worker_num = int(worker_index), int(worker_num)
        self.strict, self.shuffle, self.seed = bool(strict), bool(shuffle), int(seed)
        self.drop_last = bool(drop_last)
        self.block_size = int(block_size)
        self.max_reported = int(max_reported)
        self.prefetch = int(prefetch)
        self._label_name = label_name.encode()
        self._dense_name = dense_name.encode()
        if labels not in ("required", "optional"):
            raise ValueError(f"labels must be 'required' or 'optional', got {labels!r}")
        if format == "criteo":
            labelled = labels == "required" or criteo_labelled(self._schema_file)
            self.schema = criteo_schema(labelled)
            self._kind, self._index = criteo_columns(labelled)
        elif format == "csv":
            self.schema, self._kind, self._index = csv_schema(
                read_first_line(self._schema_file), self._schema_file, labels == "required")
        else:
            self.schema = slot_schema(self._schema_file, slots, label_name, dense_name)
        if dense_transform is None:
            dense_transform = "none" if format == "slot" else "log"
        self.dense_transform = dense_transform
        self._dense_min, self._dense_max = dense_min, dense_max
        # Validates the transform and its parameters now rather than mid-pass.
        _parse.check_dense_transform(dense_transform, self.schema.n_dense, dense_min, dense_max)
        self._pass = 0
        self._stats = self._empty_stats()

    @property
    def slot_names(self) -> tuple[str, ...]:
        return self.schema.slot_names

    @property
    def n_dense(self) -> int:
        return self.schema.n_dense

    def stats(self) -> dict:
        """Counts of the latest (or current) pass over this worker's share.

        ``lines`` (data lines of this worker, headers excluded), ``examples``,
        ``malformed``, ``blank``, ``ignored_tokens`` (slot format), ``files``,
        ``first_malformed`` [(file, line number from 1), ...] and
        ``first_malformed_reasons`` (same order), ``malformed_by_reason``.
        """
        s = dict(self._stats)
        s["first_malformed"] = list(s["first_malformed"])
        s["first_malformed_reasons"] = list(s["first_malformed_reasons"])
        s["malformed_by_reason"] = dict(s["malformed_by_reason"])
        return s

    @property
    def passes(self) -> int:
        """Passes begun so far (the number of the current or latest pass)."""
        return self._pass

    def set_pass(self, n: int) -> None:
        """Make the next iteration pass ``n`` (from 1): its shuffle is the one
        pass ``n`` of an uninterrupted run reads, so a job resumed after pass
        ``n - 1`` goes on in the same order."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"set_pass needs a pass number >= 1, got {n!r}")
        self._pass = int(n) - 1

    def __iter__(self) -> Iterator[Batch]:
        self._pass += 1
        self._stats = self._empty_stats()
        rng = np.random.default_rng([self.seed, self._pass]) if self.shuffle else None
        files = list(self.files)
        if rng is not None and self._line_mod == 1:
            files = [files[i] for i in rng.permutation(len(files))]
        if self.prefetch:
            return prefetched(self._batches(files, rng), self.prefetch, "pyfleet-data-prefetch")
        return self._batches(files, rng)

    def _batches(self, files, rng) -> Iterator[Batch]:
        bs, names = self.batch_size, self.schema.slot_names
        pending, pending_n = [], 0
        for chunk in self._chunks(files):
            if rng is not None and len(chunk) > 1:
                chunk = chunk.permute(rng.permutation(len(chunk)))
            n, a = len(chunk), 0
            if pending_n:
                a = min(bs - pending_n, n)
                pending.append(chunk.take(0, a))
                pending_n += a
                if pending_n == bs:
                    yield Batch(*concat_parts(pending), names)
                    pending, pending_n = [], 0
            while n - a >= bs:
                yield Batch(*chunk.take(a, a + bs), names)
                a += bs
            if a < n:
                pending, pending_n = [chunk.take(a, n)], n - a
        if pending_n and not self.drop_last:
            yield Batch(*concat_parts(pending), names)

    def _chunks(self, files) -> Iterator[Chunk]:
        data_line = 0  # data lines seen over all files: the line-sharding counter
        for path in files:
            self._stats["files"] += 1
            line_no = 1
            first = True
            for buf in blocks(path, self.block_size, self.max_line_bytes):
                if first and self.format == "csv":
                    nl = buf.obj.find(b"\n", 0, len(buf))
                    header_end = nl + 1 if nl >= 0 else len(buf)
                    self._check_header(bytes(buf[:header_end]), path)
                    buf = buf[header_end:]
                    line_no = 2
                first = False
                r = self._parse(buf, data_line)
                data_line += r["lines"]
                self._account(r, path, line_no)
                line_no += r["lines"]
                if r["examples"]:
                    chunk = self._chunk(r)
                    if self.holdout is not None:
                        fraction, side = self.holdout
                        valid = holdout_mask(chunk, fraction)
                        chunk = chunk.permute(np.flatnonzero(valid if side == "valid"
                                                             else ~valid))
                    if len(chunk):
                        yield chunk

    def _parse(self, buf, data_line: int) -> dict:
        if self.format == "slot":
            return _parse.parse_slots(
                buf, [s.encode() for s in self.schema.slot_names], self.schema.n_dense,
                self._label_name, self._dense_name, self.dense_transform, self._dense_min,
                self._dense_max, data_line, self._line_mod, self._line_rem)
        delim = 9 if self.format == "criteo" else 44
        return _parse.parse_delimited(
            buf, delim, self._kind, self._index, self.schema.n_dense, self.schema.n_slots,
            self.dense_transform, self._dense_min, self._dense_max, data_line,
            self._line_mod, self._line_rem)

    def _chunk(self, r) -> Chunk:
        if self.format == "slot":
            starts = r["slot_starts"]
            ids = r["ids"]
            slot_ids = [ids[starts[s]:starts[s + 1]] for s in range(self.schema.n_slots)]
            return Chunk(r["labels"], r["dense"], slot_ids, r["offsets"])
        ids_t = np.ascontiguousarray(r["ids"].T)
        return Chunk(r["labels"], r["dense"], list(ids_t), None)

    def _check_header(self, header: bytes, path: str) -> None:
        names = tuple(split_header(header, path))
        if names != self.schema.columns:
            raise ValueError(f"{path}:1: CSV header {names!r} differs from the header of "
                             f"{self._schema_file!r}: {self.schema.columns!r}")

    def _account(self, r: dict, path: str, line_no: int) -> None:
        st = self._stats
        st["lines"] += r["lines"] - r["other_shard"]
        st["examples"] += r["examples"]
        st["blank"] += r["blank"]
        st["ignored_tokens"] += r["ignored_tokens"]
        if not r["malformed"]:
            return
        bad = r["bad_lines"] + line_no
        reasons = r["bad_reasons"]
        if self.strict:
            raise ValueError(f"{path}:{int(bad[0])}: malformed line "
                             f"({_parse.REASONS[int(reasons[0])]})")
        before = st["malformed"]
        st["malformed"] += r["malformed"]
        limit = self.max_malformed
        if limit is not None and st["malformed"] > limit:
            at = limit - before  # the first line past the limit
            raise DataError(f"{path}:{int(bad[at])}: malformed line "
                            f"({_parse.REASONS[int(reasons[at])]}), more than the "
                            f"{limit} allowed (max_malformed, pyfleet train's --max-malformed)")
        if before == 0:  # said at the first, not only in the end's count
            log.warning("%s:%d: malformed line (%s), skipped; %s", path, int(bad[0]),
                        _parse.REASONS[int(reasons[0])],
                        "every malformed line is skipped and counted" if limit is None else
                        f"more than {limit} stop the job")
        codes, counts = np.unique(reasons, return_counts=True)
        for code, count in zip(codes.tolist(), counts.tolist()):
            word = _parse.REASONS[code]
            st["malformed_by_reason"][word] = st["malformed_by_reason"].get(word, 0) + count
        room = self.max_reported - len(st["first_malformed"])
        for line, code in zip(bad[:room].tolist(), reasons[:room].tolist()):
            st["first_malformed"].append((path, line))
            st["first_malformed_reasons"].append(_parse.REASONS[code])

    @staticmethod
    def _empty_stats() -> dict:
        return {"lines": 0, "examples": 0, "malformed": 0, "blank": 0, "ignored_tokens": 0,
                "files": 0, "first_malformed": [], "first_malformed_reasons": [],
                "malformed_by_reason": {}}

    def __repr__(self) -> str:
        return (f"Dataset(format={self.format!r}, files={len(self.files)}/{len(self.all_files)}, "
                f"batch_size={self.batch_size}, worker={self.worker_index}/{self.worker_num})")


def _as_bytes_view(buf):
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv

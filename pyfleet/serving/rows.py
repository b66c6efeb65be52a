"""Request bodies of ``POST /predict`` into :class:`pyfleet.data.Batch` objects.

Every form goes through the parsers ``pyfleet predict`` and training read files
with (:mod:`pyfleet.data._parse`, one call per body, GIL released), so a row
gets the same ids and dense values whether it is served or scored from a file:

==============================  =================================================
``Content-Type``                the body
==============================  =================================================
``application/json``            ``{"rows": [ROW, ...]}``; a ROW is an object of
                                Criteo/CSV columns ``I1..I<n>`` (numbers, raw:
                                log-transformed as the Criteo and CSV readers
                                do) and ``C1..C<m>`` (the categorical value as
                                in the data, e.g. ``"68fd1e64"``), an absent or
                                null column being a missing value; or of the
                                PaddleRec slot format: ``"dense_feature"`` (a
                                list of n numbers, used as they are) and the
                                slot names (``--slots``) each with an id or a
                                list of ids. ``label``/``click``/``Id`` are
                                accepted and ignored.
``text/tab-separated-values``   Criteo TSV lines, with or without the label
                                (``n + m + 1`` or ``n + m`` fields)
``text/csv``                    a CSV header (``label``, ``Id``, ``I<k>``,
                                ``C<k>``) and its rows
``text/plain``                  PaddleRec slot-format lines
``application/x-npz``           ``numpy.savez`` of ``dense`` float32 ``[B, n]``
                                (as the model reads it: transformed) and ``ids``
                                uint64 ``[B, m]`` (one hashed id per slot, as
                                ``Batch.ids_matrix()`` gives)
==============================  =================================================

A malformed body is a :class:`BadRequest` whose message is one line naming
the problem (the row or line, the column, the expected count).
"""

import io
import json
import math
import zipfile

import numpy as np

from pyfleet.data import _parse
from pyfleet.data.chunks import Chunk
from pyfleet.data.files import csv_schema
from pyfleet.data.readers import Batch

__all__ = ["CONTENT_TYPES", "BadRequest", "Pending", "RowSchema", "concat_batches"]

# Criteo TSV bodies up to this size wait for their model step and are parsed with the
# other requests of the step in one call (the parser's fixed cost is paid once a step);
# larger ones are parsed on arrival.
JOIN_BYTES = 64 << 10
CONTENT_TYPES = ("application/json", "text/tab-separated-values", "text/csv", "text/plain",
                 "application/x-npz")
IGNORED_COLUMNS = ("label", "click", "id")


class BadRequest(ValueError):
    """A request the server refuses; ``status`` is its HTTP code (4xx)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def _line_error(r, what):
    line = int(r["bad_lines"][0]) + 1
    return BadRequest(f"{what} {line}: malformed ({_parse.REASONS[int(r['bad_reasons'][0])]})")


class Pending:
    """A request's rows, checked on arrival: ``kind`` "tsv" or "tsv+label" (``data``:
    Criteo TSV lines, parsed with the step's other requests of that kind), "json"
    (``data``: a JSON body, decoded with the step; ``rows``: an estimate until then)
    or "batch" (``data``: the parsed :class:`Batch`); ``rows``: how many."""

    __slots__ = ("data", "kind", "rows", "what")

    def __init__(self, kind, data, rows, what="line"):
        self.kind, self.data, self.rows = kind, data, rows
        self.what = what  # how a malformed one is named: "line" or (JSON) "row"


def _rows_of_lines(body):
    """The lines of ``body`` the parser reads as rows (not blank after a CR is cut)."""
    return sum(1 for line in body.split(b"\n") if line.rstrip(b"\r"))


class RowSchema:
    """How a model's inputs are written in requests: ``n_dense`` dense columns
    ``I1..I<n>`` and ``n_slots`` slots ``C1..C<m>`` (slot format: ``slot_names``)."""

    def __init__(self, n_dense, n_slots, slot_names=None, max_rows=65536):
        self.n_dense, self.n_slots, self.max_rows = int(n_dense), int(n_slots), int(max_rows)
        self.slot_names = tuple(slot_names or (str(i) for i in range(1, n_slots + 1)))
        if len(self.slot_names) != n_slots:
            raise ValueError(f"--slots names {len(self.slot_names)} slots, the model reads "
                             f"{n_slots}")
        self.dense_names = tuple(f"I{i}" for i in range(1, n_dense + 1))
        self.cat_names = tuple(f"C{i}" for i in range(1, n_slots + 1))
        header = ",".join(self.dense_names + self.cat_names).encode()
        _, self._kind, self._index = csv_schema(header, "the model", require_label=False)
        _, self._kind_l, self._index_l = csv_schema(b"label," + header, "the model")
        self._column = {name.lower(): j for j, name in
                        enumerate(self.dense_names + self.cat_names)}
        self._column.update({name: j for j, name in  # as written (I1), found without lower()
                             enumerate(self.dense_names + self.cat_names)})
        self._slot_of = {name: j for j, name in enumerate(self.slot_names)}

    # -- the forms --------------------------------------------------------

    def parse(self, content_type, body):
        """The :class:`Batch` of ``body`` sent as ``content_type``; BadRequest otherwise."""
        batch, order, results = self.assemble([self.prepare(content_type, body)])
        if isinstance(results[0], BadRequest):
            raise results[0]
        return batch

    def prepare(self, content_type, body):
        """The :class:`Pending` rows of ``body`` sent as ``content_type``: every check
        but the parse of small Criteo TSV bodies (left to :meth:`assemble`, with the
        step's other requests). BadRequest naming the problem."""
        if content_type == "application/json":
            if len(body) <= JOIN_BYTES:  # decoded with the step (off the event loop)
                return Pending("json", body, max(1, body.count(b"{") - 1))
            return self._json(body)
        if content_type == "text/tab-separated-values" and len(body) <= JOIN_BYTES:
            nl = body.find(b"\n")
            if nl == len(body) - 1 and nl > 0 and b"\r" not in body:  # one line: one row
                return Pending(self._tsv_kind_of(body.count(b"\t") + 1, 1), body, 1)
            if body[:1] != b"\n" and b"\r" not in body and b"\n\n" not in body:
                # no blank line: the first line is line 1, and every line is a row
                kind = self._tsv_kind_of(body[:nl].count(b"\t") + 1 if nl >= 0 else
                                         body.count(b"\t") + 1, 1)
                rows = body.count(b"\n") + (not body.endswith(b"\n"))
            else:
                kind = self._tsv_kind(body)
                rows = _rows_of_lines(body)
            self._check_rows(rows)
            if rows == 0:
                raise BadRequest("the request holds no row")
            return Pending(kind, body if body.endswith(b"\n") else body + b"\n", rows)
        if content_type == "text/tab-separated-values":
            batch = self._tsv(body)
        elif content_type == "text/csv":
            batch = self._csv(body)
        elif content_type == "text/plain":
            batch = self._slot_lines(body, "line")
        elif content_type == "application/x-npz":
            batch = self._npz(body)
        else:
            raise BadRequest(f"Content-Type {content_type or '(none)'!r} is not served; use one "
                             f"of {', '.join(CONTENT_TYPES)}", status=415)
        if len(batch) == 0:
            raise BadRequest("the request holds no row")
        return Pending("batch", batch, len(batch))

    def assemble(self, pendings):
        """``(batch, order, results)`` of one model step: ``batch`` holds the rows of
        the requests whose ``results[i]`` is a row count, request ``order[0]``'s
        first, then ``order[1]``'s...; ``results[i]`` is a BadRequest for a request
        whose lines are malformed (found by parsing the joined lines, then each
        request's alone to name it), or None for none."""
        results = [None] * len(pendings)
        segments = []
        if any(p.kind == "json" for p in pendings):
            # Each body decoded alone: one json.loads of the bodies joined would let a
            # crafted body shift the rows of the requests after it.
            pendings = list(pendings)
            for i, p in enumerate(pendings):
                if p.kind == "json":
                    try:
                        pendings[i] = self._json(p.data)
                    except BadRequest as e:
                        results[i] = e
                        pendings[i] = Pending("refused", None, 0)
        for kind in ("tsv", "tsv+label"):
            idx = [i for i, p in enumerate(pendings) if p.kind == kind]
            if not idx:
                continue
            cols = (self._kind, self._index) if kind == "tsv" else (self._kind_l, self._index_l)
            joined = b"".join(pendings[i].data for i in idx)
            r = _parse.parse_delimited(memoryview(joined), 9, *cols, self.n_dense,
                                       self.n_slots, "log", None, None)
            if not r["malformed"] and r["examples"] == sum(pendings[i].rows for i in idx):
                segments.append((self._batch(self._delimited_chunk(r)), idx))
                for i in idx:
                    results[i] = pendings[i].rows
                continue
            for i in idx:  # one of them is malformed: which
                try:
                    b = self._delimited(pendings[i].data, 9, *cols, pendings[i].what)
                except BadRequest as e:
                    results[i] = e
                    continue
                segments.append((b, [i]))
                results[i] = len(b)
        for i, p in enumerate(pendings):
            if p.kind == "batch":
                segments.append((p.data, [i]))
                results[i] = p.rows
        batch = concat_batches([b for b, _ in segments]) if segments else None
        return batch, [i for _, idx in segments for i in idx], results

    def _check_rows(self, n):
        if n > self.max_rows:
            raise BadRequest(f"the request holds {n:,} rows, more than --max-rows "
                             f"{self.max_rows:,}", status=413)

    def _delimited(self, buf, delim, kind, index, what, line_base=0):
        if buf and not buf.endswith(b"\n"):
            buf += b"\n"  # the parser reads complete lines
        lines = buf.count(b"\n") + (0 if buf.endswith(b"\n") else 1)
        self._check_rows(lines)
        r = _parse.parse_delimited(memoryview(buf), delim, kind, index, self.n_dense,
                                   self.n_slots, "log", None, None)
        if r["malformed"]:
            r["bad_lines"] = r["bad_lines"] + line_base
            raise _line_error(r, what)
        return self._batch(self._delimited_chunk(r))

    @staticmethod
    def _delimited_chunk(r):
        ids_t = np.ascontiguousarray(r["ids"].T)
        return Chunk(r["labels"], r["dense"], list(ids_t), None)

    def _batch(self, chunk):
        return Batch(*chunk.take(0, len(chunk)), self.cat_names)

    def _tsv_kind(self, body):
        """"tsv+label" or "tsv", by the field count of the first line that is not blank."""
        start, line_no = 0, 1
        while True:
            nl = body.find(b"\n", start)
            first = body[start:len(body) if nl < 0 else nl].rstrip(b"\r")
            if first or nl < 0:
                break
            start, line_no = nl + 1, line_no + 1
        return self._tsv_kind_of(first.count(b"\t") + 1, line_no)

    def _tsv_kind_of(self, fields, line_no):
        want = self.n_dense + self.n_slots
        if fields == want + 1:
            return "tsv+label"
        if fields == want:
            return "tsv"
        raise BadRequest(f"line {line_no} has {fields} tab-separated fields; the model reads "
                         f"{want} ({self.n_dense} dense, {self.n_slots} categorical) or "
                         f"{want + 1} with the label first")

    def _tsv(self, body):
        if self._tsv_kind(body) == "tsv+label":
            return self._delimited(body, 9, self._kind_l, self._index_l, "line")
        return self._delimited(body, 9, self._kind, self._index, "line")

    def _csv(self, body):
        nl = body.find(b"\n")
        header, rest = (body, b"") if nl < 0 else (body[:nl + 1], body[nl + 1:])
        try:
            schema, kind, index = csv_schema(header, "the CSV body", require_label=False)
        except ValueError as e:
            raise BadRequest(str(e)) from None
        if schema.n_dense != self.n_dense or schema.n_slots != self.n_slots:
            raise BadRequest(f"the CSV header names {schema.n_dense} I<k> and {schema.n_slots} "
                             f"C<k> columns; the model reads {self.n_dense} and "
                             f"{self.n_slots}")
        return self._delimited(rest, 44, kind, index, "line", line_base=1)

    def _slot_lines(self, body, what):
        if body and not body.endswith(b"\n"):
            body += b"\n"
        lines = body.count(b"\n") + (0 if body.endswith(b"\n") else 1)
        self._check_rows(lines)
        r = _parse.parse_slots(memoryview(body), [s.encode() for s in self.slot_names],
                               self.n_dense, b"click", b"dense_feature", "none", None, None)
        if r["malformed"]:
            raise _line_error(r, what)
        starts = r["slot_starts"]
        ids = r["ids"]
        slot_ids = [ids[starts[s]:starts[s + 1]] for s in range(self.n_slots)]
        return self._batch(Chunk(r["labels"], r["dense"], slot_ids, r["offsets"]))

    def _npz(self, body):
        try:
            z = zipfile.ZipFile(io.BytesIO(body))
            infos = {i.filename: i for i in z.infolist()}
        except (zipfile.BadZipFile, ValueError, OSError) as e:
            raise BadRequest(f"the application/x-npz body is not a numpy.savez file ({e})") \
                from None
        want = {"dense.npy", "ids.npy"}
        if set(infos) != want:
            raise BadRequest(f"the npz body holds {sorted(infos)}; it must hold exactly "
                             f"'dense' and 'ids' (numpy.savez(f, dense=..., ids=...))")
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos.values()):
            raise BadRequest("the npz body is compressed: send numpy.savez's, not "
                             "savez_compressed's")
        try:
            with np.load(io.BytesIO(body), allow_pickle=False) as f:
                dense, ids = f["dense"], f["ids"]
        except (ValueError, OSError, zipfile.BadZipFile) as e:
            raise BadRequest(f"the npz body cannot be read: {e}") from None
        n = dense.shape[0] if dense.ndim else 0
        if dense.dtype != np.float32 or dense.shape != (n, self.n_dense):
            raise BadRequest(f"npz 'dense' is {dense.dtype} {dense.shape}; the model reads "
                             f"float32 (B, {self.n_dense})")
        if ids.dtype != np.uint64 or ids.shape != (n, self.n_slots):
            raise BadRequest(f"npz 'ids' is {ids.dtype} {ids.shape}; the model reads uint64 "
                             f"({n}, {self.n_slots}) beside its {n} dense rows")
        self._check_rows(n)
        if not np.isfinite(dense).all():
            raise BadRequest(f"npz 'dense' row {int(np.argmin(np.isfinite(dense).all(1))) + 1}"
                             f" holds NaN or infinity")
        chunk = Chunk(np.zeros(n, np.float32), np.ascontiguousarray(dense),
                       list(np.ascontiguousarray(ids.T)), None)
        return self._batch(chunk)

    # -- JSON -------------------------------------------------------------

    def _json(self, body):
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not valid JSON ({e})") from None
        rows = doc.get("rows") if isinstance(doc, dict) else None
        if not isinstance(rows, list):
            raise BadRequest('the JSON body must be an object {"rows": [row, ...]}')
        self._check_rows(len(rows))
        if not rows:
            raise BadRequest("the request holds no row")
        if all(isinstance(r, dict) and "dense_feature" in r for r in rows):
            text = "\n".join(self._slot_line(r, i) for i, r in enumerate(rows, 1))
            batch = self._slot_lines(text.encode(), "row")
            return Pending("batch", batch, len(batch))
        text = "".join(self._tsv_line(r, i) + "\n" for i, r in enumerate(rows, 1))
        if len(text) > JOIN_BYTES:
            batch = self._delimited(text.encode(), 9, self._kind, self._index, "row")
            return Pending("batch", batch, len(batch))
        return Pending("tsv", text.encode(), len(rows), "row")

    def _tsv_line(self, row, i):
        if not isinstance(row, dict):
            raise BadRequest(f"row {i} is a {type(row).__name__}, not an object of columns")
        fields = [""] * (self.n_dense + self.n_slots)
        column, n_dense = self._column, self.n_dense
        for name, value in row.items():
            j = column.get(name)
            if j is None:
                j = column.get(name.lower())
            t = type(value)  # the usual values first, each checked as _field does
            if j is not None and (t is str and "\t" not in value and "\n" not in value
                                  and "\r" not in value and j >= n_dense):
                fields[j] = value
                continue
            if j is not None and (t is int or (t is float and math.isfinite(value))):
                fields[j] = repr(value)
                continue
            if j is None:
                if name.lower() in IGNORED_COLUMNS:
                    continue
                if "dense_feature" in (k.lower() for k in row):
                    raise BadRequest(f"row {i} has 'dense_feature': every row of a request "
                                     f"must then be in the slot form")
                raise BadRequest(f"row {i}: unknown column {name!r}; the model reads "
                                 f"I1..I{self.n_dense} and C1..C{self.n_slots}")
            fields[j] = _field(value, i, name, numeric=j < n_dense)
        return "\t".join(fields)

    def _slot_line(self, row, i):
        dense = row["dense_feature"]
        if not isinstance(dense, list) or len(dense) != self.n_dense:
            raise BadRequest(f"row {i}: 'dense_feature' must be a list of {self.n_dense} "
                             f"numbers")
        toks = ["click:0"] + [f"dense_feature:{_field(v, i, 'dense_feature', True) or 0}"
                              for v in dense]
        for name, value in row.items():
            if name == "dense_feature" or name.lower() in IGNORED_COLUMNS:
                continue
            if name not in self._slot_of:
                raise BadRequest(f"row {i}: unknown slot {name!r}; the slots are "
                                 f"{', '.join(self.slot_names)} (--slots)")
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise BadRequest(f"row {i}: slot {name!r} holds {v!r}; ids are "
                                     f"non-negative integers")
                toks.append(f"{name}:{v}")
        return " ".join(toks)


def _field(value, i, name, numeric):
    if value is None:
        return ""
    if isinstance(value, bool):
        raise BadRequest(f"row {i}: column {name!r} holds a boolean")
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRequest(f"row {i}: column {name!r} holds {value!r}")
        return repr(value)
    if isinstance(value, str):
        if "\t" in value or "\r" in value or "\n" in value:
            raise BadRequest(f"row {i}: column {name!r} holds a tab or a line break")
        return value
    raise BadRequest(f"row {i}: column {name!r} holds {type(value).__name__} "
                     f"{str(value)[:40]!r}; expected a "
                     f"{'number' if numeric else 'string or integer'}")


def concat_batches(batches):
    """One :class:`Batch` of ``batches`` in order (a micro-batch of several requests)."""
    if len(batches) == 1:
        return batches[0]
    labels = np.concatenate([b.labels for b in batches])
    dense = np.concatenate([b.dense for b in batches])
    n = labels.shape[0]
    one_each = None  # offsets of a slot with one id per row, shared as the readers do
    sparse = []
    for s in range(len(batches[0].sparse)):
        parts = [b.sparse[s] for b in batches]
        ids = np.concatenate([p[0] for p in parts])
        if ids.shape[0] == n:  # every row has at least one id: here exactly one
            if one_each is None:
                one_each = np.arange(n + 1, dtype=np.int64)
            sparse.append((ids, one_each))
            continue
        offsets, base = [np.zeros(1, dtype=np.int64)], 0
        for _, o in parts:  # each request's offsets start at 0
            offsets.append(o[1:] + base)
            base += int(o[-1])
        sparse.append((ids, np.concatenate(offsets)))
    return Batch(labels, dense, sparse, batches[0].slot_names)

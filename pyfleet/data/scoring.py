"""Scoring a data file: read it in order, predict every example, write one line per
example, optionally with an id column carried through (a Kaggle-style submission),
and measure AUC and logloss when the rows are labelled.

The model is any ``predict(batch) -> probabilities`` callable
(``pyfleet.fluid.inference.Predictor.predict_file`` passes its network's). The id
column's bytes are cut out of each parsed block with numpy (its field's span per
line, from the positions of the delimiters), never line by line in Python.
"""

from __future__ import annotations

import numpy as np

from pyfleet.data.files import blocks
from pyfleet.data.readers import Batch, Dataset

__all__ = ["id_column_index", "score_file"]


def id_column_index(ds: Dataset, name: str) -> int:
    """The position of column ``name`` in ``ds``'s CSV header (an exact match, else
    the only case-insensitive one); ValueError naming the columns otherwise."""
    columns = ds.schema.columns
    if ds.format != "csv":
        raise ValueError(f"--id-column needs a CSV file with a header naming its columns; "
                         f"{ds._schema_file} is {ds.format} (no column names)")
    if name in columns:
        return columns.index(name)
    folded = [i for i, c in enumerate(columns) if c.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    raise ValueError(f"{ds._schema_file}:1: no column {name!r} for --id-column in the header "
                     f"{list(columns)!r}")


def _field_spans(arr: np.ndarray, delim: int, col: int, n_cols: int):
    """``(starts, ends, kept_candidates)``: the byte span of field ``col`` of every
    line of ``arr`` (uint8, whole lines) and which lines are not blank, in line order.
    Lines with too few fields get a clipped (meaningless) span: the parser refuses
    them, and only the spans of the lines it kept are used."""
    n = arr.shape[0]
    nl = np.flatnonzero(arr == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [n]))
    if starts[-1] == n:  # the buffer ends with a newline: no line after it
        starts, ends = starts[:-1], ends[:-1]
    cr = (ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr
    not_blank = ends > starts
    d = np.flatnonzero(arr == delim)
    if d.shape[0] == 0:
        d = np.array([n], dtype=np.int64)
    first = np.searchsorted(d, starts)  # each line's first delimiter
    last = d.shape[0] - 1
    f_start = starts if col == 0 else d[np.minimum(first + col - 1, last)] + 1
    f_end = ends if col == n_cols - 1 else d[np.minimum(first + col, last)]
    f_end = np.minimum(np.maximum(f_end, f_start), ends)
    return f_start, f_end, not_blank


def _gather_ids(arr: np.ndarray, f_start: np.ndarray, f_end: np.ndarray) -> np.ndarray:
    """The fields as a numpy bytes array (``S<longest>``), one gather for all."""
    lens = f_end - f_start
    width = max(int(lens.max()) if lens.shape[0] else 0, 1)
    idx = f_start[:, None] + np.arange(width)
    inside = np.arange(width) < lens[:, None]
    out = np.where(inside, arr[np.minimum(idx, arr.shape[0] - 1)], 0).astype(np.uint8)
    return np.ascontiguousarray(out).view(f"S{width}").reshape(-1)


def _ids_of_block(ds: Dataset, buf, r: dict, col: int) -> np.ndarray:
    arr = np.frombuffer(buf, dtype=np.uint8)
    delim = 9 if ds.format == "criteo" else 44
    f_start, f_end, not_blank = _field_spans(arr, delim, col, len(ds.schema.columns))
    kept = not_blank.copy()
    kept[r["bad_lines"]] = False  # the parser's refused lines (0-based in this block)
    return _gather_ids(arr, f_start[kept], f_end[kept])


def _blocks_with_ids(ds: Dataset, col):
    """``(chunk, ids)`` per block of ``ds``'s files in order (ids None without ``col``),
    read as :meth:`Dataset._chunks` reads them (no shuffle, no sharding)."""
    for path in ds.files:
        ds._stats["files"] += 1
        line_no, first = 1, True
        for buf in blocks(path, ds.block_size, ds.max_line_bytes):
            if first and ds.format == "csv":
                nl = buf.obj.find(b"\n", 0, len(buf))
                header_end = nl + 1 if nl >= 0 else len(buf)
                ds._check_header(bytes(buf[:header_end]), path)
                buf, line_no = buf[header_end:], 2
            first = False
            r = ds._parse(buf, 0)
            ds._account(r, path, line_no)  # raises for a malformed line when strict
            line_no += r["lines"]
            if r["examples"]:
                yield ds._chunk(r), (None if col is None else _ids_of_block(ds, buf, r, col))


def score_file(path, out, predict, *, format="auto", batch_size=4096, strict=True,
               id_column=None, predicted_name="Predicted", labelled_batches=None) -> dict:
    """Score every example of ``path`` in order and write to ``out`` (a binary file).

    Without ``id_column``: one probability per line. With it (a CSV column name):
    a CSV with the header ``<id column>,<predicted_name>`` and one ``id,probability``
    line per example, the id copied byte for byte. Returns the reader's stats
    (:meth:`Dataset.stats`) with ``rows``, ``labelled`` and ``format``; for labelled
    rows, ``labelled_batches(probabilities, labels)`` is called per batch (the
    caller's metrics). A malformed line is a :class:`DataError` naming
    the file and line (``strict``), else skipped and counted; a non-finite
    prediction is a ValueError naming the example.
    """
    ds = Dataset(path, format=format, batch_size=batch_size, strict=strict, labels="optional")
    col = None if id_column is None else id_column_index(ds, id_column)
    if col is not None:
        out.write(f"{ds.schema.columns[col]},{predicted_name}\n".encode())
    rows = 0
    for chunk, ids in _blocks_with_ids(ds, col):
        for a in range(0, len(chunk), batch_size):
            b = min(a + batch_size, len(chunk))
            batch = Batch(*chunk.take(a, b), ds.schema.slot_names)
            prob = np.asarray(predict(batch), dtype=np.float64).reshape(len(batch), -1)[:, -1]
            if not np.isfinite(prob).all():
                raise ValueError(f"the model predicts NaN or infinity for example "
                                 f"{rows + 1 + int(np.argmin(np.isfinite(prob))):,} of "
                                 f"{path}")
            if ids is None:  # "%.9g" as np.savetxt wrote them
                out.write(b"".join(b"%.9g\n" % v for v in prob.tolist()))
            else:
                out.write(b"".join(b"%s,%.9g\n" % iv for iv in zip(ids[a:b].tolist(),
                                                                   prob.tolist())))
            rows += len(batch)
            if ds.schema.labelled and labelled_batches is not None:
                labelled_batches(prob, batch.labels)
    stats = ds.stats()
    stats.update(rows=rows, labelled=ds.schema.labelled, format=ds.format)
    return stats

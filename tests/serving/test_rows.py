"""Request bodies into batches (pyfleet.serving.rows), in one process: every form
gives the ids and dense values the file readers give the same rows, micro-batches
join requests exactly, and any body is a batch or a BadRequest, never a crash."""

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import DATA
from support.serving import criteo_json_rows, slot_json_rows

from pyfleet.data import Dataset
from pyfleet.serving.rows import CONTENT_TYPES, BadRequest, RowSchema, concat_batches

TSV = DATA / "criteo-paddlerec-part0" / "part-0.tsv"
SLOT = DATA / "criteo-paddlerec-dnn-slot" / "sample_train.txt"
needs_data = pytest.mark.skipif(not (TSV.exists() and SLOT.exists()),
                                reason="shared Criteo samples missing")
SCHEMA = RowSchema(13, 26, max_rows=1000)


def _same(a, b):
    np.testing.assert_array_equal(a.dense, b.dense)
    assert len(a.sparse) == len(b.sparse)
    for (ia, oa), (ib, ob) in zip(a.sparse, b.sparse):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(oa, ob)


@needs_data
def test_tsv_json_and_npz_bodies_give_the_readers_batch():
    want = next(iter(Dataset(str(TSV), format="criteo", batch_size=1000)))
    _same(SCHEMA.parse("text/tab-separated-values", TSV.read_bytes()), want)
    # CRLF line ends and no final newline
    crlf = TSV.read_bytes().replace(b"\n", b"\r\n").rstrip()
    _same(SCHEMA.parse("text/tab-separated-values", crlf), want)
    rows = [{"label": 1, **{k.lower(): v for k, v in row.items()}}  # any case, label ignored
            for row in criteo_json_rows(TSV.read_text().splitlines())]
    _same(SCHEMA.parse("application/json", json.dumps({"rows": rows}).encode()), want)
    buf = io.BytesIO()
    np.savez(buf, dense=want.dense, ids=want.ids_matrix())
    _same(SCHEMA.parse("application/x-npz", buf.getvalue()), want)


@needs_data
def test_slot_lines_and_slot_json_rows_give_the_readers_batch():
    want = next(iter(Dataset(str(SLOT), format="slot", batch_size=1000)))
    _same(SCHEMA.parse("text/plain", SLOT.read_bytes()), want)
    rows = slot_json_rows(SLOT.read_text().splitlines())
    _same(SCHEMA.parse("application/json", json.dumps({"rows": rows}).encode()), want)


@needs_data
def test_a_micro_batch_is_its_requests_joined_in_order():
    lines = TSV.read_bytes().splitlines(keepends=True)
    parts = [SCHEMA.parse("text/tab-separated-values", b"".join(lines[a:b]))
             for a, b in ((0, 1), (1, 40), (40, 41), (41, 100))]
    _same(concat_batches(parts), SCHEMA.parse("text/tab-separated-values", b"".join(lines)))
    slot = SLOT.read_bytes().splitlines(keepends=True)  # several ids per slot
    parts = [SCHEMA.parse("text/plain", b"".join(slot[a:b])) for a, b in ((0, 3), (3, 80))]
    _same(concat_batches(parts), SCHEMA.parse("text/plain", b"".join(slot)))


def _npz(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.mark.parametrize("body, message", [
    (_npz(dense=np.zeros((2, 13), np.float32)), "it must hold exactly 'dense' and 'ids'"),
    (_npz(dense=np.zeros((2, 13), np.float64), ids=np.zeros((2, 26), np.uint64)),
     "npz 'dense' is float64 (2, 13)"),
    (_npz(dense=np.zeros((2, 13), np.float32), ids=np.zeros((3, 26), np.uint64)),
     "npz 'ids' is uint64 (3, 26)"),
    (_npz(dense=np.full((2, 13), np.nan, np.float32), ids=np.zeros((2, 26), np.uint64)),
     "npz 'dense' row 1 holds NaN"),
    (b"PK\x03\x04 not a zip", "not a numpy.savez file"),
])
def test_bad_npz_bodies_are_named(body, message):
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        SCHEMA.parse("application/x-npz", body)


def test_compressed_npz_is_refused_before_it_is_inflated():
    buf = io.BytesIO()
    np.savez_compressed(buf, dense=np.zeros((2, 13), np.float32),
                        ids=np.zeros((2, 26), np.uint64))
    with pytest.raises(BadRequest, match="compressed"):
        SCHEMA.parse("application/x-npz", buf.getvalue())


@pytest.mark.parametrize("rows, message", [
    ([{"I1": True}], "row 1: column 'I1' holds a boolean"),
    ([{"C1": "a\tb"}], "row 1: column 'C1' holds a tab or a line break"),
    ([{"I1": float("inf")}], "row 1: column 'I1' holds inf"),
    ([{"I1": 1}, 5], "row 2 is a int, not an object of columns"),
    ([{"dense_feature": [0.1] * 13, "1": -5}], "row 1: slot '1' holds -5"),
    ([{"dense_feature": [0.1] * 12}], "row 1: 'dense_feature' must be a list of 13 numbers"),
    ([{"dense_feature": [0.1] * 13, "zz": 1}], "row 1: unknown slot 'zz'"),
    ([{"I1": 1}, {"dense_feature": [0.1] * 13}], "row 2 has 'dense_feature'"),
])
def test_bad_json_rows_are_named(rows, message):
    body = json.dumps({"rows": rows}, allow_nan=True).encode()
    with pytest.raises(BadRequest, match=message.replace("(", r"\(")):
        SCHEMA.parse("application/json", body)


def test_more_rows_than_the_limit_is_413_before_parsing():
    with pytest.raises(BadRequest, match="1,001 rows, more than --max-rows 1,000") as e:
        SCHEMA.parse("application/json", json.dumps({"rows": [{}] * 1001}).encode())
    assert e.value.status == 413


@settings(max_examples=300, deadline=None)
@given(ctype=st.sampled_from(CONTENT_TYPES), body=st.binary(max_size=600))
def test_any_body_is_a_batch_or_a_bad_request(ctype, body):
    try:
        batch = SCHEMA.parse(ctype, body)
    except BadRequest as e:
        assert 400 <= e.status < 500 and "\n" not in str(e)  # noqa: PT017 (either outcome is valid)
        return
    assert len(batch) >= 1 and batch.dense.shape == (len(batch), 13)
    assert all(o.shape == (len(batch) + 1,) for _, o in batch.sparse)


@needs_data
def test_a_step_parses_its_requests_together_and_names_only_the_malformed_one():
    lines = TSV.read_bytes().splitlines(keepends=True)
    unlabelled = [line.split(b"\t", 1)[1] for line in lines]
    buf = io.BytesIO()
    whole = SCHEMA.parse("text/tab-separated-values", b"".join(lines))
    np.savez(buf, dense=whole.dense[:2], ids=whole.ids_matrix()[:2])
    bodies = [("text/tab-separated-values", b"".join(lines[0:3])),
              ("text/tab-separated-values", b"\n".join(unlabelled[3:5])),   # no label
              ("text/tab-separated-values", lines[5] + b"\n" + b"1\tx" + b"\t" * 38 + b"\n"),
              ("application/json", json.dumps(
                  {"rows": criteo_json_rows([line.decode().rstrip() for line in lines[6:8]])})
               .encode()),
              ("application/json", b'{"rows": [{"I1": "seven"}]}'),
              ("application/x-npz", buf.getvalue()),
              ("text/tab-separated-values", b"\r\n" + lines[8].rstrip() + b"\r\n\r\n")]
    pendings = [SCHEMA.prepare(ct, body) for ct, body in bodies]
    batch, order, results = SCHEMA.assemble(pendings)
    assert [r if isinstance(r, int) else type(r) for r in results] == [
        3, 2, BadRequest, 2, BadRequest, 2, 1]
    assert str(results[2]) == "line 3: malformed (bad dense value)"  # (line 2 is blank)
    assert str(results[4]) == "row 1: malformed (bad dense value)"
    assert sorted(order) == [0, 1, 3, 5, 6]
    parts, a = {}, 0
    for i in order:
        parts[i] = (a, a + results[i])
        a += results[i]
    assert a == len(batch)
    ids, want_ids = batch.ids_matrix(), whole.ids_matrix()
    for i, rows in ((0, range(0, 3)), (1, range(3, 5)), (3, range(6, 8)), (5, range(0, 2)),
                    (6, range(8, 9))):
        lo, hi = parts[i]
        np.testing.assert_array_equal(ids[lo:hi], want_ids[list(rows)])
        np.testing.assert_array_equal(batch.dense[lo:hi], whole.dense[list(rows)])

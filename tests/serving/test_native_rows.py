"""The native front end writes JSON rows as the TSV lines the Python server makes of
them (so both get the same ids and dense values), leaves every other JSON to the
Python server, and writes a probability as Python's repr does."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfleet.serving.rows import BadRequest, RowSchema

_front = pytest.importorskip("pyfleet.serving._front")

SCHEMA = RowSchema(13, 26)
COLUMNS = [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


def python_lines(body):
    """What the Python server parses for ``body``: its TSV lines, or its refusal."""
    rows = json.loads(body)["rows"]
    try:
        return "".join(SCHEMA._tsv_line(r, i) + "\n" for i, r in enumerate(rows, 1)).encode()
    except BadRequest as e:
        return e


numbers = st.one_of(st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False))
cat_values = st.one_of(st.text(alphabet="0123456789abcdef", min_size=1, max_size=10),
                       st.integers(0, 2**64))
plain_rows = st.lists(st.fixed_dictionaries({}, optional={
    **{f"I{i}": st.one_of(st.none(), numbers) for i in range(1, 14)},
    **{f"C{i}": st.one_of(st.none(), cat_values) for i in range(1, 27)},
    "label": st.integers(0, 1)}), min_size=1, max_size=4)
any_value = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=6),
                      st.lists(st.integers(), max_size=2))
any_rows = st.lists(st.dictionaries(
    st.sampled_from(COLUMNS + ["i3", "c7", "label", "Click", "Id", "Z1", "I0", "dense_feature"]),
    any_value, max_size=8), min_size=0, max_size=3)


@settings(max_examples=300, deadline=None)
@given(plain_rows, st.sampled_from([None, 0, 2]))
def test_plain_json_rows_become_the_python_server_s_lines(rs, indent):
    body = json.dumps({"rows": rs}, indent=indent).encode()
    assert _front.json_to_tsv(body, 13, 26) == python_lines(body)


@settings(max_examples=300, deadline=None)
@given(any_rows)
def test_any_json_row_is_the_python_server_s_lines_or_left_to_it(rs):
    body = json.dumps({"rows": rs}).encode()
    got = _front.json_to_tsv(body, 13, 26)
    if got is not None:
        assert got == python_lines(body)


@pytest.mark.parametrize("body", [
    b'{"rows": [{"I1": 1.}]}', b'{"rows": [{"I1": 01}]}', b'{"rows": [{"I1": true}]}',
    b'{"rows": [{"I1": "3"}]}', b'{"rows": [{"C1": "a\\tb"}]}', b'{"rows": [{"C1": "\xc3\xa9"}]}',
    b'{"rows": [{"Z9": 1}]}', b'{"rows": [{"I14": 1}]}', b'{"rows": [{"I0": 1}]}',
    b'{"rows": [{"dense_feature": [1]}]}', b'{"rows": []}', b'{"rows": [{"I1": 1}], "x": 1}',
    b'{"rows": [{"I1": 1e400}]}', b'{"rows": [{"I1": -0}]}', b'{"rows": [{"I1": [1]}]}',
    b'{"rows": [{"I1": 1}]', b'{"rows": [{"I1": 1}]} x', b'\xef\xbb\xbf{"rows": [{}]}',
    b'{"rows": [{"I1": 1,}]}', b'{"rows": [{"I1" 1}]}', b'[{"I1": 1}]',
])
def test_every_other_json_is_left_to_the_python_server(body):
    assert _front.json_to_tsv(body, 13, 26) is None


def test_json_rows_read_by_name_in_either_case_and_ignored_columns():
    body = b'{"rows": [{"i2": 5, "C26": "ff", "label": 1, "ID": "x"}, {}]}'
    want = ["", "5"] + [""] * 11 + [""] * 25 + ["ff"]
    assert _front.json_to_tsv(body, 13, 26) == ("\t".join(want) + "\n" +
                                                 "\t" * 38 + "\n").encode()


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_probability_is_written_as_python_s_repr(x):
    assert _front.repr_of(x) == repr(x)


@pytest.mark.parametrize("x", [0.0, 1.0, 1e-4, 9.999999999999999e-05, 1e-5, 1e16, 1e15,
                               0.1, 0.5, 1 - 2**-53, 5e-324, -0.25, math.ulp(1.0)])
def test_repr_at_the_edges_of_python_s_formats(x):
    assert _front.repr_of(x) == repr(x)

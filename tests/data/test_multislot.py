"""Fluid's MultiSlot text through the compiled parser, against a plain Python
reading of the same text: random ragged layouts (blank lines, CRLF, tabs, ids up
to 2^64 - 1, negative integers, floats in every notation), and each kind of bad
line refused with the line and the variable named."""

import numpy as np
import pytest

from pyfleet.data.multislot import parse_multislot


class _V:
    def __init__(self, name, dtype, lod_level, per=1):
        self.name, self.dtype, self.lod_level = name, np.dtype(dtype), lod_level
        self.shape = (-1, per)


def _reference(text, use_vars):
    """Line by line, token by token: the format's definition."""
    lines = [ln.split() for ln in text.split(b"\n") if ln.strip()]
    cols = {v.name: ([], []) for v in use_vars}
    for t in lines:
        pos = 0
        for v in use_vars:
            c = int(t[pos])
            vals, lens = cols[v.name]
            for tok in t[pos + 1:pos + 1 + c]:
                if v.dtype.kind == "f":
                    vals.append(float(tok))
                else:
                    x = int(tok)
                    vals.append(x - 2 ** 64 if x >= 2 ** 63 else x)
            lens.append(c)
            pos += c + 1
        assert pos == len(t)
    return cols, len(lines)


def _line(rng, use_vars):
    parts = []
    for v in use_vars:
        c = int(rng.integers(0, 5)) if v.lod_level else 1
        parts.append(str(c))
        for _ in range(c):
            if v.dtype.kind == "f":
                x = rng.normal() * 10 ** int(rng.integers(-3, 4))
                parts.append(rng.choice([repr(float(x)), f"{x:.3e}", f"{x:.2f}", "7"]))
            else:
                pick = [int(rng.integers(-5, 5)), int(rng.integers(0, 2 ** 63 - 1)),
                        2 ** 64 - 1, -(2 ** 63)]
                parts.append(str(pick[int(rng.integers(0, 4))]))
    sep = str(rng.choice([" ", "\t", "  "]))
    return sep.join(parts)


@pytest.mark.parametrize("seed", range(6))
def test_random_ragged_text_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    use_vars = [_V("label", "int64", 0), _V("ids", "int64", 1), _V("w", "float32", 1),
                _V("d", "float64", 0)]
    lines = [_line(rng, use_vars) for _ in range(200)]
    text = ""
    for ln in lines:
        text += ln + str(rng.choice(["\n", "\r\n", "\n\n", "\n  \n"]))
    data = text.encode()
    got, n = parse_multislot(data, use_vars)
    want, m = _reference(data, use_vars)
    assert n == m == 200
    for v in use_vars:
        vals, lens = want[v.name]
        if v.lod_level:
            gv, off = got[v.name]
            np.testing.assert_array_equal(np.diff(off), lens)
        else:
            gv = got[v.name].reshape(-1)
        assert gv.dtype == v.dtype
        if v.dtype.kind == "f":
            np.testing.assert_array_equal(gv, np.array(vals, dtype=np.float64).astype(v.dtype))
        else:
            np.testing.assert_array_equal(gv, np.array(vals, dtype=np.int64))


def test_a_last_line_without_newline_and_empty_input():
    use_vars = [_V("ids", "int64", 1)]
    cols, n = parse_multislot(b"2 5 6\n1 9", use_vars)
    assert n == 2
    np.testing.assert_array_equal(cols["ids"][0], [5, 6, 9])
    np.testing.assert_array_equal(cols["ids"][1], [0, 2, 3])
    assert parse_multislot(b"", use_vars) == ({}, 0)
    assert parse_multislot(b"\n \n", use_vars) == ({}, 0)


@pytest.mark.parametrize("text,message", [
    (b"1 5 1 7\n1 5\n", r"line 2: 2 slots expected, found 1"),
    (b"1 5 1 7 8\n", r"line 1: 1 values left after 2 slots"),
    (b"1 5 x 7\n", r"line 1: slot 'w': count 'x' is not a whole number"),
    (b"1 5 -1 7\n", r"line 1: slot 'w': count '-1' is not a whole number"),
    (b"1 5 1 7.5.1\n", r"line 1: slot 'w': value '7.5.1' is not a number of float32"),
    (b"1 5.0 1 7\n", r"line 1: slot 'ids': value '5.0' is not a number of int64"),
    (b"1 18446744073709551616 1 7\n", r"slot 'ids': value '18446744073709551616'"),
    (b"1 5 1 7\n3 1 2\n", r"line 2: 2 slots expected, found 1"),
])
def test_a_bad_line_is_refused_naming_the_line_and_the_slot(text, message):
    with pytest.raises(ValueError, match=message):
        parse_multislot(text, [_V("ids", "int64", 1), _V("w", "float32", 1)])


def test_a_narrow_integer_slot_refuses_values_out_of_its_range():
    cols, _ = parse_multislot(b"1 7\n1 -3\n", [_V("y", "int32", 0)])
    np.testing.assert_array_equal(cols["y"].reshape(-1), [7, -3])
    assert cols["y"].dtype == np.int32
    with pytest.raises(ValueError, match=r"slot 'y': values .* do not fit int32"):
        parse_multislot(b"1 4294967296\n", [_V("y", "int32", 0)])

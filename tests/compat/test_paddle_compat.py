"""paddle.compat (pyfleet.compat): Fluid 1.8's text/bytes conversion and Python 2
rounding, which Paddle's own test bases import (``import paddle.compat as cpt``)."""

import math

import pytest

from pyfleet import compat as cpt


def test_to_text_decodes_bytes_in_containers_and_keeps_the_rest():
    assert cpt.to_text(b"\xc3\xa9t\xc3\xa9") == "été"
    assert cpt.to_text(b"\xe9", encoding="latin-1") == "é"
    assert cpt.to_text(None) is None and cpt.to_text(1.5) == 1.5 and cpt.to_text(True) is True
    assert cpt.to_text([b"a", "b", None]) == ["a", "b", None]
    assert cpt.to_text({b"a", "b"}) == {"a", "b"}
    assert cpt.to_text({b"k": b"v", "x": 1}) == {"k": "v", "x": 1}
    items = [b"a", b"b"]
    assert cpt.to_text(items, inplace=True) is items and items == ["a", "b"]
    s = {b"a"}
    assert cpt.to_text(s, inplace=True) is s and s == {"a"}
    d = {b"k": b"v"}
    assert cpt.to_text(d, inplace=True) is d and d == {b"k": b"v", "k": "v"}   # as Fluid


def test_to_bytes_encodes_str_and_refuses_what_it_cannot_encode():
    assert cpt.to_bytes("été") == "été".encode()
    assert cpt.to_bytes(["a", b"b", None]) == [b"a", b"b", None]
    assert cpt.to_bytes({"a"}) == {b"a"}
    items = ["x"]
    assert cpt.to_bytes(items, inplace=True) is items and items == [b"x"]
    with pytest.raises(TypeError, match="cannot encode a int"):
        cpt.to_bytes(5)


def _round_half_away(x, d):
    """Python 2's round, from the decimal expansion: halves away from zero."""
    from decimal import ROUND_HALF_UP, Decimal
    q = Decimal(1).scaleb(-d)
    return float(Decimal(repr(x)).quantize(q, rounding=ROUND_HALF_UP))


@pytest.mark.parametrize("x,d", [(2.5, 0), (-2.5, 0), (0.5, 0), (-0.5, 0), (1.25, 1),
                                 (-1.25, 1), (123.456, 2), (7.0, 0), (1e-9, 3)])
def test_round_takes_halves_away_from_zero_as_python_2(x, d):
    assert cpt.round(x, d) == pytest.approx(_round_half_away(x, d), abs=1e-12)
    if x == 2.5:
        assert round(x) == 2 and cpt.round(x) == 3.0     # not Python 3's banker's rounding


def test_round_of_zero_keeps_its_sign_and_the_rest():
    assert math.copysign(1.0, cpt.round(-0.0)) == -1.0 and cpt.round(0.0) == 0.0
    assert cpt.floor_division(7, 2) == 3 and cpt.floor_division(-7, 2) == -4
    assert cpt.floor_division(7.5, 2) == 3.0
    assert cpt.get_exception_message(ValueError("bad x")) == "bad x"
    assert cpt.long_type is int and cpt.int_type is int
    with pytest.raises(ValueError, match="no exception"):
        cpt.get_exception_message(None)

"""``paddle.compat`` (Fluid 1.8's Python 2/3 helpers; in zero-edit mode ``import
paddle.compat as cpt``, which Paddle's own test bases do at import time).

- ``to_text(obj, encoding="utf-8", inplace=False)``: bytes decoded to str; a list,
  set or dict (keys and values) converted item by item (``inplace``: the same
  container, changed; a dict gets the converted pairs added, its bytes keys stay,
  as in Fluid); anything else returned as it is.
- ``to_bytes(obj, encoding="utf-8", inplace=False)``: str encoded to bytes; a list
  or set item by item; bytes and None as they are.
- ``round(x, d=0)``: halves rounded away from zero (Python 2's ``round``, which
  Python 3's banker's rounding is not): ``round(2.5) == 3.0``, ``round(-0.5) == -1.0``.
- ``floor_division(x, y)``: ``x // y``.
- ``get_exception_message(exc)``: ``str(exc)``.
- ``int_type``, ``long_type``: ``int``.
"""

from __future__ import annotations

import math

__all__ = ["floor_division", "get_exception_message", "long_type", "round", "to_bytes",
           "to_text"]

int_type = int
long_type = int

def _text(obj, encoding):
    if isinstance(obj, bytes):
        return obj.decode(encoding)
    return obj


def _bytes(obj, encoding):
    if isinstance(obj, str):
        return obj.encode(encoding)
    if obj is None or isinstance(obj, bytes):
        return obj
    raise TypeError(f"paddle.compat.to_bytes: cannot encode a {type(obj).__name__} "
                    f"({obj!r}); give str or bytes")


def _convert(obj, one, encoding, inplace, dicts):
    if isinstance(obj, list):
        items = [one(item, encoding) for item in obj]
        if inplace:
            obj[:] = items
            return obj
        return items
    if isinstance(obj, set):
        items = {one(item, encoding) for item in obj}
        if inplace:
            obj.clear()
            obj.update(items)
            return obj
        return items
    if dicts and isinstance(obj, dict):
        items = {one(k, encoding): one(v, encoding) for k, v in obj.items()}
        if inplace:      # as Fluid: the converted pairs are added, a bytes key stays too
            obj.update(items)
            return obj
        return items
    return one(obj, encoding)


def to_text(obj, encoding="utf-8", inplace=False):
    return _convert(obj, _text, encoding, inplace, dicts=True)


def to_bytes(obj, encoding="utf-8", inplace=False):
    return _convert(obj, _bytes, encoding, inplace, dicts=False)


def round(x, d=0):  # noqa: A001 (Fluid's name)
    p = 10 ** d
    if x > 0.0:
        return float(math.floor(x * p + 0.5)) / p
    if x < 0.0:
        return float(math.ceil(x * p - 0.5)) / p
    return math.copysign(0.0, x)


def floor_division(x, y):
    return x // y


def get_exception_message(exc):
    if exc is None:
        raise ValueError("paddle.compat.get_exception_message: no exception given")
    return str(exc)

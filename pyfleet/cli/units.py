"""Sizes typed on the command line: ``4G``, ``512M``, ``1048576``."""

import argparse

__all__ = ["byte_count"]

_BYTE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_count(text):
    """``4G``, ``512M``, ``1048576``: bytes (binary units, a trailing B or iB allowed)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _BYTE_UNITS else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 4G, 512M)") from None
    if not value > 0 or value * _BYTE_UNITS[unit] >= 1 << 63:
        raise argparse.ArgumentTypeError(f"a byte count must be > 0, got {text!r}")
    return int(value * _BYTE_UNITS[unit])

"""The feature hash: its documented definition, stability, and the parser's use of it."""

import random

import numpy as np
import pytest
from support.hashing import mix64

from pyfleet.data import _parse, feature_hash, parse_criteo_bytes

M64 = (1 << 64) - 1


def reference_hash(slot, value: bytes) -> int:
    """docs/formats.md, "Feature ids", written out in plain Python."""
    h = mix64(((0xCBF29CE484222325 ^ len(value)) + (slot + 1) * 0x9E3779B97F4A7C15) & M64)
    for i in range(0, len(value), 8):
        h = mix64(h ^ int.from_bytes(value[i:i + 8], "little"))
    return h


# Computed once from the definition; a change here breaks every saved model.
FROZEN = [
    (0, b"", 14087677454934409008),
    (1, b"", 1156539639830188822),
    (0, b"05db9164", 1946200247655360824),
    (13, b"68fd1e64", 13738746004983679383),
    (25, b"abcdefghijklmnopq", 9463499680416252079),
    (0, b"737395", 16419937241915011194),
    (4294967295, b"x", 236468319937021702),
]


@pytest.mark.parametrize("slot,value,expected", FROZEN)
def test_frozen_ids(slot, value, expected):
    assert feature_hash(slot, value) == expected
    assert reference_hash(slot, value) == expected


def test_matches_reference_on_random_inputs():
    rng = random.Random(7)
    for _ in range(5000):
        value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 41)))
        slot = rng.randrange(0, 1 << 32)
        assert feature_hash(slot, value) == reference_hash(slot, value), (slot, value)


def test_str_is_utf8_and_missing_ids_differ_per_slot():
    assert feature_hash(3, "é1") == feature_hash(3, "é1".encode())
    missing = _parse.missing_ids(64)
    assert len(set(missing.tolist())) == 64
    assert [int(m) for m in missing[:5]] == [feature_hash(s, b"") for s in range(5)]
    # The same value in two slots never gets the same id (a bijection of h + salt).
    assert len({feature_hash(s, b"a1b2c3d4") for s in range(1000)}) == 1000


@pytest.mark.parametrize("bad", [(-1, b"x"), (1 << 32, b"x"), (0, 5), (0, None)])
def test_bad_arguments(bad):
    with pytest.raises(ValueError):
        feature_hash(*bad)


def test_parser_hashes_fields_of_every_length_at_buffer_edges():
    # Values of 0..20 bytes, with the line at the very end of the buffer (no
    # newline) so the word-at-a-time fast path must fall back near the end.
    rng = random.Random(3)
    alphabet = b"0123456789abcdefXYZ-_."
    for trial in range(60):
        lines, expected = [], []
        for _ in range(rng.randrange(1, 4)):
            vals = [bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 21)))
                    for _ in range(26)]
            dense = [str(rng.randrange(0, 50)) if rng.random() < 0.8 else "" for _ in range(13)]
            lines.append(b"\t".join([b"1"] + [d.encode() for d in dense] + vals))
            expected.append([reference_hash(j, v) for j, v in enumerate(vals)])
        buf = b"\n".join(lines) + (b"\n" if trial % 2 else b"")
        r = parse_criteo_bytes(buf)
        assert r["examples"] == len(lines)
        np.testing.assert_array_equal(r["ids"], np.array(expected, dtype=np.uint64))

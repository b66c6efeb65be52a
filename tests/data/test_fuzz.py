"""Damaged input: random byte mutations never crash the parsers, and every line is
either parsed exactly as a plain-Python reference parses it or counted as malformed."""

import math
import random
import re

import numpy as np

from pyfleet.data import _parse, feature_hash, parse_criteo_bytes

NUMBER = re.compile(rb"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
ALPHABET = b"0123456789abcdef\t\n\r.-+eE: x\x00\xff,"


def ref_number(text):
    """None when the field is not a number the format accepts."""
    if not NUMBER.match(text):
        return None
    x = float(text)
    return x if math.isfinite(x) else None


def ref_line(line):
    f = line.split(b"\t")
    if len(f) != 40:
        return None
    label = ref_number(f[0])
    if label is None or not 0.0 <= label <= 1.0:
        return None
    dense = []
    for x in f[1:14]:
        if x == b"":
            dense.append(0.0)
            continue
        v = ref_number(x)
        if v is None:
            return None
        dense.append(math.log1p(v) if v > 0 else 0.0)
    return label, dense, [feature_hash(j, f[14 + j]) for j in range(26)]


def good_line(rng):
    dense = [str(rng.choice([0, 1, 5, 37, 4095, 4096, 123456, -2])) if rng.random() < 0.8
             else "" for _ in range(13)]
    cats = [f"{rng.randrange(1 << 32):08x}" if rng.random() < 0.9 else "" for _ in range(26)]
    return "\t".join([str(rng.randrange(2))] + dense + cats).encode()


def mutate(rng, line):
    b = bytearray(line)
    for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
        op = rng.randrange(3)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.choice(ALPHABET)
        elif op == 1:
            b.insert(i, rng.choice(ALPHABET))
        elif b:
            del b[min(i, len(b) - 1)]
    return bytes(b)


def test_criteo_mutations_match_the_reference():
    rng = random.Random(12345)
    for trial in range(8):
        buf = b"\n".join(mutate(rng, good_line(rng)) for _ in range(400))
        if trial % 2:
            buf += b"\n"
        lines = buf.split(b"\n")
        if lines[-1] == b"":
            lines.pop()
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
        want = [(i, ref_line(ln)) for i, ln in enumerate(lines) if ln]
        ok = [(i, r) for i, r in want if r is not None]
        r = parse_criteo_bytes(buf)
        assert r["lines"] == len(lines)
        assert r["blank"] == sum(1 for ln in lines if not ln)
        assert r["bad_lines"].tolist() == [i for i, x in want if x is None]
        assert r["examples"] == len(ok)
        assert r["examples"] + r["malformed"] + r["blank"] == len(lines)
        np.testing.assert_array_equal(r["labels"], np.float32([x[0] for _, x in ok]))
        np.testing.assert_allclose(r["dense"], np.float32([x[1] for _, x in ok]).reshape(-1, 13),
                                   rtol=1e-6)
        np.testing.assert_array_equal(
            r["ids"], np.array([x[2] for _, x in ok], dtype=np.uint64).reshape(-1, 26))


def test_slot_mutations_keep_the_counts_consistent():
    rng = random.Random(7)
    names = [str(i).encode() for i in range(1, 27)]
    for _ in range(8):
        lines = []
        for _ in range(300):
            toks = [f"click:{rng.randrange(2)}"] + [f"dense_feature:{rng.random():.3f}"
                                                    for _ in range(13)]
            toks += [f"{rng.randrange(1, 28)}:{rng.randrange(10**6)}" for _ in range(30)]
            lines.append(mutate(rng, " ".join(toks).encode()))
        buf = b"\n".join(lines)
        r = _parse.parse_slots(buf, names, 13)
        n = r["examples"]
        assert n + r["malformed"] + r["blank"] == r["lines"] == buf.count(b"\n") + 1
        offs = r["offsets"]
        assert offs.shape == (n + 1, 26) and (offs[0] == 0).all()
        assert (np.diff(offs, axis=0) >= 1).all()
        assert r["slot_starts"][-1] == r["ids"].shape[0] == offs[-1].sum()
        assert r["dense"].shape == (n, 13) and np.isfinite(r["dense"]).all()
        assert set(np.unique(r["labels"]).tolist()) <= {0.0, 1.0}

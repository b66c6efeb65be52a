"""The key index (src/key_index.cc) through the table API: capacities that are
not powers of two (a table with a disk tier grows its index by 1.25x at a load
of 4/5), erasure at high load, runs that wrap around the end of the array,
checked against a Python dict of numpy rows.
"""

import numpy as np
import pytest
from support.hashing import mix64

import pyfleet
from pyfleet.optimizer import SGD

M64 = (1 << 64) - 1
DIM = 4


def unmix64(h):
    """The key whose Mix64 (splitmix64's finalizer, src/hash.h) is h."""
    def unxorshift(x, s):
        y = x
        for _ in range(64 // s + 1):
            y = x ^ (y >> s)
        return y
    h = unxorshift(h, 31)
    h = (h * pow(0x94D049BB133111EB, -1, 1 << 64)) & M64
    h = unxorshift(h, 27)
    h = (h * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & M64
    return unxorshift(h, 30)


def table(tmp_path, disk):
    kw = {"memory_budget": 64 << 20, "spill_dir": tmp_path / "spill"} if disk else {}
    return pyfleet.SparseTable(DIM, SGD(learning_rate=1.0), seed=3, **kw)


def check(t, model, absent):
    keys = np.fromiter(model, np.uint64, len(model))
    assert len(t) == len(model)
    assert np.array_equal(np.sort(t.keys()), np.sort(keys))
    want = np.array([model[int(k)] for k in keys]).reshape(len(keys), DIM)
    assert np.array_equal(t.pull(keys, create=False), want)
    # Keys never inserted, or erased: not found (their initial values, not created).
    absent = np.asarray(absent, np.uint64)
    assert np.array_equal(t.pull(absent, create=False), t.initial_values(absent))
    assert len(t) == len(model)


@pytest.mark.parametrize("disk", [False, True], ids=["in_ram", "disk_tier"])
def test_random_inserts_erases_and_finds_match_a_dict(tmp_path, disk):
    # Up to ~300k keys: each shard's index walks its growth sequence into
    # the huge-page arena (arrays of 64 KiB and more) and back after erasures.
    t = table(tmp_path, disk)
    rng = np.random.default_rng(17)
    model = {}  # key -> row as the table must hold it
    erased = []
    for step in range(12):
        new = rng.integers(0, M64, int(rng.integers(10_000, 40_000)), dtype=np.uint64,
                           endpoint=True)
        if step == 0:
            new = np.concatenate([new, np.array([0, M64], np.uint64)])
        rows = t.pull(new)
        for k, r in zip(new.tolist(), rows):
            model.setdefault(k, r.copy())
        held = np.fromiter(model, np.uint64, len(model))
        # Push a random part of the keys; a shrink with max_unseen_passes=0
        # then erases every key not pushed in this pass.
        keep = held[rng.random(len(held)) < (0.9 if step < 8 else 0.4)]
        g = rng.standard_normal((len(keep), DIM)).astype(np.float32)
        t.push(keep, g)
        for k, gi in zip(keep.tolist(), g):
            model[k] = model[k] - gi
        keep_set = set(keep.tolist())
        gone = [k for k in model if k not in keep_set]
        assert t.shrink(max_unseen_passes=0) == len(gone)
        for k in gone:
            del model[k]
        erased = gone[:2000]
        check(t, model, erased + [int(x) for x in rng.integers(0, M64, 500, dtype=np.uint64)])


@pytest.mark.parametrize("disk", [False, True], ids=["in_ram", "disk_tier"])
def test_a_run_that_wraps_around_the_array(tmp_path, disk):
    # Keys whose hashes share the shard bits and have all 32 low bits set:
    # every one's home is the last slot at every capacity, so they form one
    # run that wraps to slot 0 and grows the shard through several sizes;
    # erasing from its middle shifts members back across the wrap.
    t = table(tmp_path, disk)
    base = 0x2A << 58
    # First keys of the same shard whose home is slot 0; the run then wraps
    # behind them, and erasing its member in the last slot must leave them
    # where they are (the hole's successor has its home in the hole's
    # cyclic past).
    near = np.array([unmix64(base | (i << 32)) for i in range(1, 50)], np.uint64)
    model = {k: r.copy() for k, r in zip(near.tolist(), t.pull(near))}
    keys = [unmix64(base | (i << 32) | 0xFFFFFFFF) for i in range(1, 400)]
    assert all(mix64(k) & 0xFFFFFFFF == 0xFFFFFFFF for k in keys)
    karr = np.array(keys, np.uint64)
    for k, r in zip(keys, t.pull(karr)):
        model[k] = r.copy()
    check(t, model, [unmix64(base | (7 << 40) | 0xFFFFFFFF)])
    keep = np.concatenate([karr[1::50], near])
    g = np.full((len(keep), DIM), 0.5, np.float32)
    t.push(keep, g)
    for k in keep.tolist():
        model[k] = model[k] - np.float32(0.5)
    gone = [k for k in model if k not in set(keep.tolist())]
    assert t.shrink(max_unseen_passes=0) == len(gone)
    for k in gone:
        del model[k]
    check(t, model, gone)


def test_an_index_larger_than_the_budget(tmp_path):
    # Only rows leave RAM, never keys: a budget smaller than the index of the
    # keys held (about 19 bytes a key, docs/disk_tier.md) is exceeded by the
    # index, the rows in RAM fall to the floor (a row a shard, and a call's
    # rows until it evicts), and every value stays right.
    ram = pyfleet.SparseTable(DIM, SGD(learning_rate=1.0), seed=3)
    budget = ram.min_memory_budget()
    t = pyfleet.SparseTable(DIM, SGD(learning_rate=1.0), seed=3, memory_budget=budget,
                            spill_dir=tmp_path / "spill")
    keys = np.arange(60_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    assert np.array_equal(t.pull(keys), ram.pull(keys))
    g = np.random.default_rng(1).standard_normal((len(keys), DIM)).astype(np.float32)
    t.push(keys, g)
    ram.push(keys, g)
    assert np.array_equal(t.pull(keys, create=False), ram.pull(keys, create=False))
    assert budget < 60_000 * 12
    assert t.memory_bytes() > budget
    st = t.stats()
    assert len(keys) - st["spilled_rows"] <= 64 * 65 * 2

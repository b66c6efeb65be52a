"""SparseTable/DenseTable behaviour: validation, initial values, routing, admission, shrink."""

import subprocess
import sys

import numpy as np
import pytest

import pyfleet
from pyfleet.entry import CountFilterEntry, ProbabilityEntry
from pyfleet.initializer import Constant, Normal, TruncatedNormal, Uniform
from pyfleet.optimizer import SGD, Adam


def keys(*ks):
    return np.array(ks, dtype=np.uint64)


def test_pull_validates_dtype_and_shape():
    t = pyfleet.SparseTable(4, SGD(0.1))
    with pytest.raises(ValueError, match="uint64"):
        t.pull(np.array([1, 2], dtype=np.int64))
    with pytest.raises(ValueError, match="uint64"):
        t.pull([1, 2])
    with pytest.raises(ValueError, match="float32"):
        t.push(keys(1, 2), np.zeros((2, 4), dtype=np.float64))
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        t.push(keys(1, 2), np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="dim"):
        pyfleet.SparseTable(0, SGD(0.1))
    assert len(t) == 0  # nothing was created by the refused calls


def test_empty_and_duplicate_pulls():
    t = pyfleet.SparseTable(3, SGD(0.1))
    assert t.pull(keys()).shape == (0, 3)
    t.push(keys(), np.zeros((0, 3), np.float32))
    out = t.pull(keys(5, 5, 0, 2**64 - 1, 5))
    np.testing.assert_array_equal(out[0], out[1])
    np.testing.assert_array_equal(out[0], out[4])
    assert len(t) == 3
    assert sorted(t.keys().tolist()) == [0, 5, 2**64 - 1]


def _pushed_table(dim, n_old, n_new):
    """``(rng, table, old, new, want)``: an SGD(0.5) table holding ``n_old``
    rows pushed once, ``n_new`` keys it does not hold, and the numpy reference
    ``want[key]`` of each one's row (pushed, or initial)."""
    rng = np.random.default_rng(dim)
    t = pyfleet.SparseTable(dim, SGD(0.5), initializer=Uniform(-1, 1), seed=3)
    old = rng.choice(2**62, n_old, replace=False).astype(np.uint64)
    grads = rng.standard_normal((n_old, dim)).astype(np.float32)
    t.push(old, grads)
    new = rng.choice(2**62, n_new, replace=False).astype(np.uint64) | np.uint64(2**63)
    want = {int(k): v for k, v in zip(old, t.initial_values(old) - np.float32(0.5) * grads)}
    want.update({int(k): v for k, v in zip(new, t.initial_values(new))})
    return rng, t, old, new, want


@pytest.mark.parametrize("dim", [1, 3, 8, 16, 17, 32, 64, 100])
def test_pull_of_every_dim_matches_a_numpy_reference(dim):
    # Pull has a copy loop unrolled for dims 8, 16, 32 and 64 and a generic
    # one; rows that exist, rows it creates and repeated keys, in one call
    # longer than its pipeline's groups, all in the caller's order.
    rng, t, old, new, want = _pushed_table(dim, 700, 300)
    batch = np.concatenate([old, new, old[:50], new[:50]])[rng.permutation(1100)]
    got = t.pull(batch)
    np.testing.assert_array_equal(got, np.stack([want[int(k)] for k in batch]))
    assert len(t) == 1000


@pytest.mark.parametrize("dim", [3, 16])
def test_pull_without_create_answers_initial_rows_and_leaves_the_table(dim):
    rng, t, old, new, want = _pushed_table(dim, 500, 200)
    batch = np.concatenate([old, new, new[:20]])[rng.permutation(720)]
    before = t.stats()
    got = t.pull(batch, create=False)
    np.testing.assert_array_equal(got, np.stack([want[int(k)] for k in batch]))
    assert len(t) == 500 and not np.isin(new, t.keys()).any()
    assert t.stats()["memory_bytes"] == before["memory_bytes"]
    # under an admission policy nothing is counted towards admission either
    f = pyfleet.SparseTable(2, SGD(1.0), initializer=Constant(0.5), entry=CountFilterEntry(2))
    for _ in range(3):
        np.testing.assert_array_equal(f.pull(keys(7), create=False), [[0.5, 0.5]])
    assert len(f) == 0 and f.stats()["candidates"] == 0
    f.pull(keys(7))
    f.pull(keys(7))
    assert len(f) == 1  # admitted by two counted pulls, as without the lookups


def test_nonfinite_gradient_rejects_whole_push():
    t = pyfleet.SparseTable(2, SGD(1.0))
    before = t.pull(keys(1, 2)).copy()
    g = np.ones((2, 2), np.float32)
    g[1, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        t.push(keys(1, 2), g)
    np.testing.assert_array_equal(t.pull(keys(1, 2)), before)
    assert t.stats()["rejected_pushes"] == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", [0, 1234, 4095], ids=lambda w: f"row{w}")
def test_nonfinite_check_names_the_first_bad_value(bad, where):
    """The check is one vectorized pass, then a search: it must still name the
    first bad key, wherever it sits (the largest accepted value, 1e18, is fine)."""
    n, dim = 4096, 8
    ks = np.arange(n, dtype=np.uint64) + np.uint64(100)
    g = np.full((n, dim), 1e18, np.float32)
    g[where, 3] = bad
    g[-1, -1] = np.nan  # a later one: not the one named
    t = pyfleet.SparseTable(dim, SGD(1e-30))
    with pytest.raises(ValueError, match=rf"key {where + 100} \(position {where}\)"):
        t.push(ks, g)
    assert len(t) == 0
    d = pyfleet.DenseTable((n, dim), SGD(1.0))
    with pytest.raises(ValueError, match=rf"element {where * dim + 3} is"):
        d.push(g)
    np.testing.assert_array_equal(d.pull(), np.zeros((n, dim), np.float32))


@pytest.mark.parametrize("init", [Uniform(-0.5, 0.5), Normal(0.0, 0.3), TruncatedNormal(0.1, 0.2),
                                  Constant(0.25)], ids=repr)
def test_initial_value_is_a_pure_function_of_seed_key_initializer(init):
    ks = np.random.default_rng(0).integers(0, 2**64, 500, dtype=np.uint64)
    a = pyfleet.SparseTable(8, SGD(0.1), initializer=init, seed=42)
    b = pyfleet.SparseTable(8, Adam(), initializer=init, seed=42)
    ra = a.pull(ks)
    rb = b.pull(ks[::-1])[::-1]  # other order, other optimizer
    np.testing.assert_array_equal(ra, rb)
    np.testing.assert_array_equal(ra, a.initial_values(ks))
    c = pyfleet.SparseTable(8, SGD(0.1), initializer=init, seed=43)
    if not isinstance(init, Constant):
        assert not np.array_equal(ra, c.pull(ks))


def test_initial_values_match_in_another_process():
    ks = np.arange(0, 2**64 - 1, 2**58, dtype=np.uint64)
    here = pyfleet.SparseTable(4, SGD(0.1), initializer=Normal(0, 1), seed=9).pull(ks)
    code = ("import numpy as np, pyfleet, sys;"
            "from pyfleet.initializer import Normal; from pyfleet.optimizer import SGD;"
            "ks=np.arange(0, 2**64-1, 2**58, dtype=np.uint64);"
            "sys.stdout.buffer.write(pyfleet.SparseTable(4, SGD(0.1), initializer=Normal(0,1),"
            " seed=9).pull(ks).tobytes())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    np.testing.assert_array_equal(np.frombuffer(out.stdout, np.float32).reshape(here.shape), here)


def test_initializer_distributions():
    ks = np.arange(20000, dtype=np.uint64)
    u = pyfleet.SparseTable(4, SGD(0.1), initializer=Uniform(-1, 3)).pull(ks)
    assert u.min() >= -1 and u.max() < 3
    assert abs(u.mean() - 1.0) < 0.03 and abs(u.std() - 4 / np.sqrt(12)) < 0.03
    n = pyfleet.SparseTable(4, SGD(0.1), initializer=Normal(0.5, 2.0)).pull(ks)
    assert abs(n.mean() - 0.5) < 0.05 and abs(n.std() - 2.0) < 0.05
    tn = pyfleet.SparseTable(4, SGD(0.1), initializer=TruncatedNormal(0.0, 1.0)).pull(ks)
    assert np.abs(tn).max() <= 2.0 and 0.8 < tn.std() < 0.9


def test_route_is_balanced_and_not_modulo():
    ks = np.arange(0, 300000, 3, dtype=np.uint64)  # ids sharing low bits
    for n in (1, 2, 3, 7):
        r = pyfleet.route(ks, n)
        assert r.dtype == np.int32 and r.min() >= 0 and r.max() < n
        counts = np.bincount(r, minlength=n)
        assert counts.min() > 0.95 * len(ks) / n
    assert not np.array_equal(pyfleet.route(ks, 3), (ks % 3).astype(np.int32))
    np.testing.assert_array_equal(pyfleet.route(ks[:10], 4),
                                  [pyfleet.route(ks[i:i + 1], 4)[0] for i in range(10)])
    with pytest.raises(ValueError):
        pyfleet.route(ks, 0)


def test_count_filter_admission():
    t = pyfleet.SparseTable(2, SGD(1.0), initializer=Constant(0.5), entry=CountFilterEntry(3))
    k = keys(10)
    for _ in range(2):
        # Duplicates inside one call count once.
        np.testing.assert_array_equal(t.pull(keys(10, 10)), np.full((2, 2), 0.5, np.float32))
        assert len(t) == 0
        t.push(k, np.ones((1, 2), np.float32))  # dropped: not a row yet
    s = t.stats()
    assert s["dropped_push_keys"] == 2 and s["candidates"] == 1
    t.pull(k)  # third call admits
    assert len(t) == 1
    t.push(k, np.ones((1, 2), np.float32))
    np.testing.assert_allclose(t.pull(k), [[-0.5, -0.5]])


def test_count_filter_candidates_reset_by_shrink():
    t = pyfleet.SparseTable(2, SGD(1.0), entry=CountFilterEntry(2))
    t.pull(keys(1))
    t.shrink()
    t.pull(keys(1))
    assert len(t) == 0
    t.pull(keys(1))
    assert len(t) == 1


def test_probability_admission():
    t = pyfleet.SparseTable(2, SGD(1.0), entry=ProbabilityEntry(0.25), seed=1)
    ks = np.arange(20000, dtype=np.uint64)
    t.pull(ks)
    assert 0.22 < len(t) / len(ks) < 0.28
    t.pull(ks)  # a second sighting is a fresh draw
    assert 0.40 < len(t) / len(ks) < 0.47


def test_shrink_by_unseen_passes_and_update_count():
    t = pyfleet.SparseTable(2, SGD(0.1))
    t.pull(keys(1, 2, 3))
    g = np.ones((1, 2), np.float32)
    t.push(keys(1), g)
    t.push(keys(2), g)
    assert t.shrink(max_unseen_passes=0) == 1  # key 3 unseen for one pass
    assert sorted(t.keys().tolist()) == [1, 2]
    t.push(keys(1), g)
    assert t.shrink(max_unseen_passes=1) == 0  # key 2: unseen 1, not > 1
    assert t.shrink(max_unseen_passes=1) == 1  # key 2: 2 passes > 1; key 1: 1 pass
    assert t.keys().tolist() == [1]
    t.pull(keys(9))
    assert t.shrink(min_update_count=1) == 1  # key 9 never updated
    assert t.keys().tolist() == [1]
    info = t.export(keys(1))
    assert info["update_count"].tolist() == [2]
    assert t.stats()["shrunk_rows"] == 3


def test_memory_bytes_grows_and_shrinks():
    t = pyfleet.SparseTable(16, Adam())
    base = t.memory_bytes()
    ks = np.arange(100000, dtype=np.uint64)
    t.pull(ks)
    grown = t.memory_bytes()
    assert grown - base >= 100000 * (16 + 34) * 4
    # Row pages are touched (and counted) as rows are allocated: rows (216
    # bytes with Adam at dim 16) plus the index (~30 bytes a row here) and
    # at most a page per column of slack; not the rows a chunk could hold.
    assert grown - base < 100000 * 260


def test_tables_with_index_arrays_in_huge_page_slabs(tmp_path):
    """600k keys: every shard's index array (~196 KiB) lives in the table's
    huge-page slabs, and grew there through a smaller one; rows stay exact
    through pushes, a shrink that drops half, re-inserts, and save/load."""
    n = 600_000
    ks = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    t = pyfleet.SparseTable(4, SGD(1.0), initializer=Constant(0.0))
    base = t.memory_bytes()
    t.push(ks, np.ones((n, 4), np.float32))
    t.push(ks[::2], np.ones((n // 2, 4), np.float32))
    assert len(t) == n
    want = -np.where(np.arange(n) % 2 == 0, 2.0, 1.0).astype(np.float32)
    np.testing.assert_array_equal(t.pull(ks), np.repeat(want[:, None], 4, 1))
    grown = t.memory_bytes() - base
    payload = n * (8 + 4 * 4 + 16)
    assert payload < grown < 2 * payload
    assert t.shrink(min_update_count=2) == n // 2  # the odd keys were pushed once
    assert len(t) == n // 2
    np.testing.assert_array_equal(t.pull(ks[1::2]), np.zeros((n // 2, 4), np.float32))
    assert len(t) == n
    t.save(tmp_path / "t.bin")
    u = pyfleet.SparseTable(4, SGD(1.0), initializer=Constant(0.0))
    u.load(tmp_path / "t.bin")
    assert len(u) == n
    np.testing.assert_array_equal(u.pull(ks), t.pull(ks))


def test_dense_table_validation():
    d = pyfleet.DenseTable((3, 2), SGD(0.5), initial=np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="shape"):
        d.push(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="float32"):
        d.push(np.ones((3, 2)))
    bad = np.ones((3, 2), np.float32)
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="rejected"):
        d.push(bad)
    np.testing.assert_array_equal(d.pull(), np.ones((3, 2)))

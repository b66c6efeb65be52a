"""The C++ batch kernels of pyfleet._core against plain numpy references."""

import numpy as np
import pytest

import pyfleet
from pyfleet import _core

U64_MAX = np.uint64(2**64 - 1)


def first_occurrence_unique(keys):
    """numpy reference: distinct keys in first-occurrence order, and the inverse."""
    u, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # sorted-unique index -> rank by first seen
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return u[order], rank[inv.reshape(-1)]


def key_cases():
    rng = np.random.default_rng(7)
    return {
        "empty": np.empty(0, np.uint64),
        "one": np.array([42], np.uint64),
        "all-duplicate": np.full(1000, 5, np.uint64),
        "extremes": np.array([0, U64_MAX, 0, 1, U64_MAX, 2**63], np.uint64),
        "distinct": rng.choice(2**62, size=5000, replace=False).astype(np.uint64),
        "many-duplicates": rng.integers(0, 300, size=20000).astype(np.uint64),
        "big": rng.integers(0, 2**64 - 1, size=300000, dtype=np.uint64, endpoint=True),
    }


@pytest.mark.parametrize("case", list(key_cases()))
def test_unique_inverse_matches_numpy(case):
    keys = key_cases()[case]
    uniq, inverse = _core.unique_inverse(keys)
    want_u, want_inv = first_occurrence_unique(keys)
    assert uniq.dtype == np.uint64 and inverse.dtype == np.int64
    np.testing.assert_array_equal(uniq, want_u)
    np.testing.assert_array_equal(inverse, want_inv)
    np.testing.assert_array_equal(uniq[inverse], keys)


def test_unique_inverse_repeated_calls_do_not_leak_state():
    # The hash table is reused between calls on a thread: keys of an earlier
    # call must not be seen as duplicates of a later one.
    a = np.arange(1000, dtype=np.uint64)
    b = np.arange(500, 1500, dtype=np.uint64)
    for _ in range(3):
        ua, _ = _core.unique_inverse(a)
        ub, ib = _core.unique_inverse(b)
        np.testing.assert_array_equal(ua, a)
        np.testing.assert_array_equal(ub, b)
        np.testing.assert_array_equal(ib, np.arange(1000))


def test_unique_inverse_non_contiguous_input():
    keys = np.repeat(np.arange(10, dtype=np.uint64), 2)[::2]  # strided view: 0..9
    assert not keys.flags.c_contiguous
    uniq, inverse = _core.unique_inverse(keys)
    np.testing.assert_array_equal(uniq, np.arange(10))
    np.testing.assert_array_equal(inverse, np.arange(10))


@pytest.mark.parametrize("bad, message", [
    (np.arange(5, dtype=np.int64), "dtype uint64"),
    (np.arange(5, dtype=np.uint32), "dtype uint64"),
    (np.arange(5, dtype=">u8"), "dtype uint64"),
    (np.zeros((2, 2), np.uint64), "1-D"),
    ([1, 2, 3], "numpy array"),
])
def test_unique_inverse_rejects_bad_keys(bad, message):
    with pytest.raises(ValueError, match=message):
        _core.unique_inverse(bad)


@pytest.mark.parametrize("dim", [1, 3, 16, 17, 64])
def test_sum_rows_matches_add_at(dim):
    rng = np.random.default_rng(dim)
    n, m = 5000, 300
    inverse = rng.integers(0, m, size=n).astype(np.int64)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    want = np.zeros((m, dim), np.float32)
    np.add.at(want, inverse, values)
    got = _core.sum_rows(values, inverse, m)
    assert got.dtype == np.float32 and got.shape == (m, dim)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sum_rows_with_unique_inverse_sums_equal_keys():
    keys = np.array([3, 0, 3, U64_MAX, 0, 3], np.uint64)
    grads = np.arange(12, dtype=np.float32).reshape(6, 2)
    uniq, inverse = _core.unique_inverse(keys)
    sums = _core.sum_rows(grads, inverse, uniq.shape[0])
    np.testing.assert_array_equal(uniq, [3, 0, U64_MAX])
    np.testing.assert_array_equal(sums, [[0 + 4 + 10, 1 + 5 + 11], [2 + 8, 3 + 9], [6, 7]])


def test_sum_rows_untouched_rows_are_zero_and_empty_input():
    out = _core.sum_rows(np.ones((2, 4), np.float32), np.array([0, 0], np.int64), 3)
    np.testing.assert_array_equal(out, [[2] * 4, [0] * 4, [0] * 4])
    empty = _core.sum_rows(np.empty((0, 4), np.float32), np.empty(0, np.int64), 0)
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("inverse, message", [
    (np.array([0, 3], np.int64), r"inverse\[1\] = 3 is out of range \[0, 3\)"),
    (np.array([-1, 0], np.int64), r"inverse\[0\] = -1"),
])
def test_sum_rows_checks_bounds(inverse, message):
    with pytest.raises(ValueError, match=message):
        _core.sum_rows(np.ones((2, 4), np.float32), inverse, 3)


@pytest.mark.parametrize("args, message", [
    ((np.ones((2, 4), np.float64), np.zeros(2, np.int64), 1), "values must have dtype float32"),
    ((np.ones(8, np.float32), np.zeros(2, np.int64), 1), "values must be 2-D"),
    ((np.ones((2, 4), np.float32), np.zeros(2, np.int32), 1), "inverse must have dtype int64"),
    ((np.ones((2, 4), np.float32), np.zeros(3, np.int64), 1), "inverse has 3 entries for 2"),
    ((np.ones((2, 4), np.float32), np.zeros(2, np.int64), -1), "m must be >= 0"),
])
def test_sum_rows_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        _core.sum_rows(*args)


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
@pytest.mark.parametrize("case", ["empty", "extremes", "many-duplicates", "big"])
def test_unique_route_groups_by_owner(servers, case):
    keys = key_cases()[case]
    grouped, inverse, offsets = _core.unique_route(keys, servers)
    want_u, _ = first_occurrence_unique(keys)
    assert offsets.shape == (servers + 1,) and offsets[0] == 0
    assert offsets[-1] == grouped.shape[0] == want_u.shape[0]
    np.testing.assert_array_equal(grouped[inverse], keys)
    owner = pyfleet.route(want_u, servers)
    for s in range(servers):
        # server s's share: its keys, in first-occurrence order
        np.testing.assert_array_equal(grouped[offsets[s]:offsets[s + 1]], want_u[owner == s])


def test_unique_route_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_servers must be in"):
        _core.unique_route(np.arange(3, dtype=np.uint64), 0)
    with pytest.raises(ValueError, match="dtype uint64"):
        _core.unique_route(np.arange(3, dtype=np.int64), 2)


@pytest.mark.parametrize("dim", [1, 5, 16])
def test_gather_rows_matches_fancy_indexing(dim):
    rng = np.random.default_rng(dim)
    sizes = [0, 7, 100, 1, 33]
    pieces = [rng.standard_normal((k, dim)).astype(np.float32) for k in sizes]
    rows = np.concatenate(pieces)
    inverse = rng.integers(0, rows.shape[0], size=1000).astype(np.int64)
    got = _core.gather_rows(pieces, inverse, dim)
    np.testing.assert_array_equal(got, rows[inverse])
    assert _core.gather_rows([], np.empty(0, np.int64), dim).shape == (0, dim)


def test_gather_rows_rejects_bad_arguments():
    p = [np.zeros((3, 4), np.float32)]
    with pytest.raises(ValueError, match=r"inverse\[0\] = 3 is out of range \[0, 3\)"):
        _core.gather_rows(p, np.array([3], np.int64), 4)
    with pytest.raises(ValueError, match="piece 0 has rows of 4 floats, expected 2"):
        _core.gather_rows(p, np.array([0], np.int64), 2)
    with pytest.raises(ValueError, match="each piece must have dtype float32"):
        _core.gather_rows([np.zeros((3, 4))], np.array([0], np.int64), 4)

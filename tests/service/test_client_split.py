"""The client's dedup, routing, request splitting and reassembly, end to end
against one in-process table: every path of ``Client._plan`` (one key, distinct
keys on one server, duplicates, several servers, requests cut into chunks)."""

import numpy as np
import pytest
from support.service import ServerGroup

import pyfleet
from pyfleet.initializer import Uniform
from pyfleet.optimizer import Adam
from pyfleet.service.client import Client, unique_keys

DIM = 4
U64_MAX = 2**64 - 1


def batches(rng):
    distinct = rng.choice(2**62, size=300, replace=False).astype(np.uint64)
    return {
        "one": np.array([7], np.uint64),
        "extremes": np.array([0, U64_MAX, 5, 0, U64_MAX], np.uint64),
        "distinct": distinct,
        "duplicates": rng.choice(distinct[:40], size=200).astype(np.uint64),
        "all-equal": np.full(50, 9, np.uint64),
    }


@pytest.mark.parametrize("num_servers", [1, 2])
def test_pulls_and_pushes_match_one_table_with_small_requests(num_servers):
    ref = pyfleet.SparseTable(DIM, Adam(0.01), initializer=Uniform(-0.1, 0.1), seed=3,
                              name="emb")
    rng = np.random.default_rng(num_servers)
    with ServerGroup(num_servers, 1) as g, \
            Client(g.endpoints, timeout=20, max_request_keys=7, max_pull_keys=5) as c:
        c.create_tables([{"kind": "sparse", **ref.config()}])
        for _step in range(2):
            for name, keys in batches(rng).items():
                got = c.pull_sparse("emb", keys)
                assert got.shape == (keys.shape[0], DIM), name
                # Many equal keys' gradients are summed in a different order
                # by the table and by the client: equal to rounding.
                np.testing.assert_allclose(got, ref.pull(keys), rtol=1e-6, atol=1e-7,
                                           err_msg=name)
                grads = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
                c.push_sparse("emb", keys, grads)
                ref.push(keys, grads)
        keys = ref.keys()
        np.testing.assert_allclose(c.pull_sparse("emb", keys), ref.pull(keys), rtol=1e-6,
                                   atol=1e-7)
        assert sum(s["tables"]["emb"]["rows"] for s in c.stats()) == len(ref)
        fut = c.pull_sparse_async("emb", np.empty(0, np.uint64))
        assert fut.done() and fut.result().shape == (0, DIM)


def test_unique_keys_first_occurrence_order():
    keys = np.array([5, 3, 5, 0, 3], np.uint64)
    uniq, inverse = unique_keys(keys)
    np.testing.assert_array_equal(uniq, [5, 3, 0])
    np.testing.assert_array_equal(uniq[inverse], keys)
    distinct = np.array([4, 1, 2], np.uint64)
    same, none = unique_keys(distinct)
    assert same is distinct and none is None


@pytest.mark.parametrize("num_servers", [1, 2])
def test_unique_flag_and_handed_over_arrays_match_one_table(num_servers, monkeypatch):
    """``unique=True`` skips the client's dedup with one server (the keys go
    out as they are: no hash pass) and gives the same rows as without it;
    ``copy=False`` pushes the caller's arrays."""
    ref = pyfleet.SparseTable(DIM, Adam(0.01), initializer=Uniform(-0.1, 0.1), seed=3,
                              name="emb")
    rng = np.random.default_rng(10 + num_servers)
    calls = []
    real = pyfleet._core.unique_route
    monkeypatch.setattr(pyfleet._core, "unique_route",
                        lambda *a: calls.append(1) or real(*a))
    with ServerGroup(num_servers, 1) as g, \
            Client(g.endpoints, timeout=20, max_request_keys=64, max_pull_keys=64) as c:
        c.create_tables([{"kind": "sparse", **ref.config()}])
        for name, keys in batches(rng).items():
            keys = unique_keys(keys)[0]
            calls.clear()
            got = c.pull_sparse("emb", keys, unique=True)
            assert bool(calls) == (num_servers > 1), name
            np.testing.assert_allclose(got, ref.pull(keys), rtol=1e-6, atol=1e-7,
                                       err_msg=name)
            grads = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
            fut = c.push_sparse_async("emb", keys, grads, unique=True, copy=False)
            fut.result()
            ref.push(keys, grads)
            np.testing.assert_allclose(c.pull_sparse("emb", keys, unique=True),
                                       ref.pull(keys), rtol=1e-6, atol=1e-7, err_msg=name)
        # copy=True (the default) lets the caller reuse its arrays at once
        keys = batches(rng)["distinct"]
        grads = np.ones((keys.shape[0], DIM), np.float32)
        futs = [c.push_sparse_async("emb", keys, grads)]
        grads[:] = np.nan  # would be refused by the server had it not been copied
        futs[0].result()
        ref.push(keys, np.ones_like(grads))
        np.testing.assert_allclose(c.pull_sparse("emb", keys), ref.pull(keys), rtol=1e-6,
                                   atol=1e-7)


def test_pulls_go_out_in_requests_of_max_pull_keys_and_pushes_of_max_request_keys():
    ref = pyfleet.SparseTable(DIM, Adam(0.01), initializer=Uniform(-0.1, 0.1), seed=3,
                              name="emb")
    keys = np.arange(1, 251, dtype=np.uint64)
    grads = np.ones((250, DIM), np.float32)

    def requests(c, op):
        return c.stats()[0]["counters"].get(op, 0)

    with ServerGroup(1, 1) as g:
        with Client(g.endpoints, timeout=20, max_pull_keys=100, max_request_keys=60) as c:
            c.create_tables([{"kind": "sparse", **ref.config()}])
            np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
            assert requests(c, "op_pull_sparse") == 3  # 100 + 100 + 50
            c.push_sparse("emb", keys, grads)
            ref.push(keys, grads)
            assert requests(c, "op_push_sparse") == 5  # 60 x 4 + 10
        with Client(g.endpoints, timeout=20) as c:  # the defaults: one request each
            np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
            assert requests(c, "op_pull_sparse") == 4
            c.stop_worker()


@pytest.mark.parametrize("arg", ["max_pull_keys", "max_request_keys"])
def test_request_size_limits_below_one_are_refused_naming_them(arg):
    with pytest.raises(ValueError, match=arg):
        Client(["127.0.0.1:1"], **{arg: 0})

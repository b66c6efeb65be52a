"""Pulls and pushes through real server processes on loopback, checked against
in-process tables and numpy references, in async, sync and geo modes."""

import threading

import numpy as np
import pytest
from support.service import ServerGroup, batch, start_worker

import pyfleet
from pyfleet.initializer import Constant, Uniform
from pyfleet.optimizer import SGD, Adagrad, Adam
from pyfleet.service.client import Client
from pyfleet.service.geo import GeoClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DIM = 8


def _no_triples(keys):
    """Mask keeping at most two copies of each key: any two float sums commute
    exactly, so the server's merge order cannot differ from the in-process table's."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.concatenate(([True], sk[1:] != sk[:-1]))
    group_start = np.maximum.accumulate(np.where(starts, np.arange(sk.shape[0]), 0))
    keep = np.empty(keys.shape[0], bool)
    keep[order] = np.arange(sk.shape[0]) - group_start < 2
    return keep


@pytest.mark.parametrize("num_servers", [1, 2, 3])
def test_pull_push_equals_one_in_process_table(num_servers):
    ref = pyfleet.SparseTable(DIM, Adam(learning_rate=0.01), initializer=Uniform(-0.1, 0.1),
                              seed=7, name="emb")
    dense_ref = pyfleet.DenseTable((5, 7), Adagrad(0.1), initial=np.arange(35, dtype=np.float32)
                                   .reshape(5, 7))
    with ServerGroup(num_servers, 1) as g, Client(g.endpoints, timeout=20) as c:
        placement = [("fc.w", 0, 12, 0), ("fc.w", 12, 35, num_servers - 1)]
        c.create_tables([{"kind": "sparse", **ref.config()},
                         {"kind": "dense", "name": "fc.w", "shape": [5, 7],
                          "optimizer": Adagrad(0.1).to_config(),
                          "initial": np.arange(35).tolist()}], placement=placement)
        c.create_tables([{"kind": "sparse", **ref.config()}])  # idempotent
        assert c.dense_placement() == placement
        for step in range(6):
            keys, grads = batch(3, step, 400, DIM, num_keys=300)
            keep = _no_triples(keys)
            keys, grads = keys[keep], grads[keep]
            got = c.pull_sparse("emb", keys)
            np.testing.assert_array_equal(got, ref.pull(keys))
            if step % 2:
                c.push_sparse_async("emb", keys, grads).result()
            else:
                c.push_sparse("emb", keys, grads)
            ref.push(keys, grads)
            dg = np.full((5, 7), 0.5 * (step + 1), np.float32)
            c.push_dense("fc.w", dg)
            dense_ref.push(dg)
            np.testing.assert_array_equal(c.pull_dense("fc.w"), dense_ref.pull())
        all_keys = ref.keys()
        np.testing.assert_array_equal(c.pull_sparse("emb", all_keys), ref.pull(all_keys))
        rows = sum(s["tables"]["emb"]["rows"] for s in c.stats())
        assert rows == len(ref)
        # evaluation pulls: unseen keys answered with their initial rows, none made
        unseen = np.arange(10**12, 10**12 + 500, dtype=np.uint64)
        mixed = np.concatenate([all_keys[:300], unseen, unseen[:50]])
        want = ref.pull(mixed, create=False)
        np.testing.assert_array_equal(c.pull_sparse("emb", mixed, create=False), want)
        np.testing.assert_array_equal(
            c.pull_sparse_async("emb", np.unique(mixed), unique=True, create=False).result(),
            ref.pull(np.unique(mixed), create=False))
        assert sum(s["tables"]["emb"]["rows"] for s in c.stats()) == len(ref) == rows
        assert c.pull_sparse("emb", np.empty(0, np.uint64)).shape == (0, DIM)


def test_split_pulls_equal_the_in_process_table():
    """A pull of at least ``split_pull_keys`` keys is pulled in parts by several
    server threads at once: same rows, each missing key created exactly once."""
    ref = pyfleet.SparseTable(DIM, Adam(learning_rate=0.01), initializer=Uniform(-0.1, 0.1),
                              seed=3, name="emb")
    with ServerGroup(1, 1, handler_threads=3, split_pull_keys=64) as g, \
            Client(g.endpoints, timeout=20) as c:
        c.create_tables([{"kind": "sparse", **ref.config()}])
        for step in range(4):
            keys, grads = batch(11, step, 3000, DIM, num_keys=5000)  # new and known keys
            np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
            c.push_sparse("emb", np.unique(keys), grads[:np.unique(keys).shape[0]])
            ref.push(np.unique(keys), grads[:np.unique(keys).shape[0]])
        st = c.stats()[0]["tables"]["emb"]
        assert st["rows"] == len(ref)
        np.testing.assert_array_equal(c.pull_sparse("emb", ref.keys()), ref.pull(ref.keys()))
        keys, _ = batch(12, 0, 3000, DIM, num_keys=10**9)  # split pull, mostly unseen keys
        np.testing.assert_array_equal(c.pull_sparse("emb", keys, create=False),
                                      ref.pull(keys, create=False))
        assert c.stats()[0]["tables"]["emb"]["rows"] == len(ref)


def test_prefetch_futures_and_queued_push_merging():
    ref = pyfleet.SparseTable(4, SGD(0.5), initializer=Constant(0.0), name="emb")
    with ServerGroup(2, 1) as g, Client(g.endpoints, timeout=20, max_queued_pushes=2) as c:
        c.create_tables([{"kind": "sparse", **ref.config()}])
        futs = [c.pull_sparse_async("emb", batch(1, s, 50, 4)[0]) for s in range(5)]
        for f in reversed(futs):
            np.testing.assert_array_equal(f.result(), np.zeros((50, 4), np.float32))
        pushes = [batch(2, s, 300, 4, num_keys=50, dyadic=True) for s in range(20)]
        futs = [c.push_sparse_async("emb", k, v) for k, v in pushes]
        c.flush()
        assert all(f.done() and f.exception() is None for f in futs)
        for k, v in pushes:
            ref.push(k, v)
        keys = ref.keys()
        np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
        merged = sum(s["counters"].get("op_push_sparse", 0) for s in c.stats())
        assert merged <= 2 * 20


def test_bad_requests_raise_remote_errors_and_value_errors():
    with ServerGroup(1, 1) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([{"kind": "sparse", "name": "emb", "dim": 4,
                          "optimizer": SGD(0.1).to_config(),
                          "initializer": Constant(0.0).to_config()}])
        with pytest.raises(pyfleet.errors.RemoteError, match="different config"):
            c.create_tables([{"kind": "sparse", "name": "emb", "dim": 5,
                              "optimizer": SGD(0.1).to_config(),
                              "initializer": Constant(0.0).to_config()}])
        k = np.array([1, 2], np.uint64)
        bad = np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]], np.float32)
        with pytest.raises(pyfleet.errors.RemoteError, match="NaN or Inf"):
            c.push_sparse("emb", k, bad)
        with pytest.raises(ValueError, match="uint64"):
            c.pull_sparse("emb", np.array([1, 2]))
        with pytest.raises(ValueError, match="shape"):
            c.push_sparse("emb", k, np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="no sparse table 'nope'"):
            c.pull_sparse("nope", k)
        np.testing.assert_array_equal(c.pull_sparse("emb", k), np.zeros((2, 4), np.float32))
        assert c.stats()[0]["counters"]["rejected_nonfinite"] == 1


def test_sync_one_worker_reproduces_single_process_training():
    ref = pyfleet.SparseTable(DIM, Adam(learning_rate=0.05), seed=3, name="emb")
    dense_ref = pyfleet.DenseTable(6, Adam(0.1), initial=np.linspace(-1, 1, 6, dtype=np.float32))
    with ServerGroup(2, 1, mode="sync") as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([{"kind": "sparse", **ref.config()},
                         {"kind": "dense", "name": "b", "shape": [6],
                          "optimizer": Adam(0.1).to_config(),
                          "initial": np.linspace(-1, 1, 6, dtype=np.float32).tolist()}],
                        placement=[("b", 0, 4, 0), ("b", 4, 6, 1)])
        for step in range(8):
            keys, grads = batch(0, step, 300, DIM, num_keys=200)
            keep = _no_triples(keys)
            keys, grads = keys[keep], grads[keep]
            np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
            np.testing.assert_array_equal(c.pull_dense("b"), dense_ref.pull())
            c.push_sparse("emb", keys, grads)
            c.push_dense("b", grads[:6, 0].copy())
            c.barrier()
            ref.push(keys, grads)
            dense_ref.push(grads[:6, 0].copy())
        np.testing.assert_array_equal(c.pull_sparse("emb", ref.keys()), ref.pull(ref.keys()))
        np.testing.assert_array_equal(c.pull_dense("b"), dense_ref.pull())


def test_shrink_through_the_service_matches_the_table():
    ref = pyfleet.SparseTable(4, SGD(0.1), name="emb")
    with ServerGroup(3, 1) as g, Client(g.endpoints, timeout=20) as c:
        c.create_tables([{"kind": "sparse", **ref.config()}])
        seen = np.arange(1, 1001, dtype=np.uint64)
        pushed = seen[::3].copy()
        c.pull_sparse("emb", seen)
        ref.pull(seen)
        c.push_sparse("emb", pushed, np.ones((pushed.shape[0], 4), np.float32))
        ref.push(pushed, np.ones((pushed.shape[0], 4), np.float32))
        dropped = sum(r["dropped"]["emb"] for r in c.shrink(max_unseen_passes=0))
        assert dropped == ref.shrink(max_unseen_passes=0) == 1000 - pushed.shape[0]
        assert sum(s["tables"]["emb"]["rows"] for s in c.stats()) == len(ref) == pushed.shape[0]
        np.testing.assert_array_equal(c.pull_sparse("emb", pushed), ref.pull(pushed))


def test_sync_two_workers_apply_the_average(tmp_path):
    steps, n, lr = 5, 64, 0.5
    cfg = {"kind": "sparse", "name": "emb", "dim": DIM, "optimizer": SGD(lr).to_config(),
           "initializer": Constant(0.25).to_config()}
    with ServerGroup(2, 2, mode="sync") as g:
        with Client(g.endpoints, timeout=20, worker_index=0) as c:
            c.create_tables([cfg])
            w = [start_worker("sync_steps", endpoints=g.endpoints, worker=i, steps=steps, n=n,
                              dim=DIM, table="emb", out=str(tmp_path / f"w{i}.npy"))
                 for i in range(2)]
            assert [p.wait(60) for p in w] == [0, 0]
            assert g.wait(30) == [0, 0]
    # numpy reference: each step, rows move by lr * (sum of both workers' grads) / 2
    rows = {}
    for step in range(steps):
        for i in range(2):
            keys, _ = batch(i, step, n, DIM, dyadic=True)
            pulled = np.load(tmp_path / f"w{i}.npy")[step]
            expect = np.stack([rows.get(k, np.full(DIM, 0.25, np.float32))
                               for k in keys.tolist()])
            np.testing.assert_array_equal(pulled, expect)
        total = {}
        for i in range(2):
            keys, grads = batch(i, step, n, DIM, dyadic=True)
            for k, gr in zip(keys.tolist(), grads):
                total[k] = total.get(k, 0) + gr
        for k, gsum in total.items():
            rows[k] = (rows.get(k, np.full(DIM, 0.25, np.float32))
                       - np.float32(lr) * (gsum / np.float32(2))).astype(np.float32)


def test_sync_pass_barrier_waits_for_a_worker_with_more_steps():
    """fleet.barrier_worker with unequal shares: the worker done first waits at a
    pass barrier, the other's steps go on alone (averaged over the workers that
    stepped), and the pass barrier opens only when both are done."""
    lr, dim = 0.5, 4
    cfg = {"kind": "sparse", "name": "emb", "dim": dim, "optimizer": SGD(lr).to_config(),
           "initializer": Constant(0.25).to_config()}
    keys = np.arange(8, dtype=np.uint64)
    steps = [2, 5]
    events, lock, errors, final = [], threading.Lock(), [], [None, None]

    def grad(i, s):
        return np.full((8, dim), 0.125 * (i + 1) * (s + 1), np.float32)

    def worker(i, c):
        try:
            for s in range(steps[i]):
                c.push_sparse("emb", keys, grad(i, s))
                c.barrier()
                with lock:
                    events.append((i, "step", s))
            c.barrier(kind="pass")
            with lock:
                events.append((i, "pass", None))
            final[i] = c.pull_sparse("emb", keys)
            c.stop_worker()
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    with ServerGroup(1, 2, mode="sync") as g, \
            Client(g.endpoints, timeout=20, worker_index=0) as c0, \
            Client(g.endpoints, timeout=20, worker_index=1) as c1:
        c0.create_tables([cfg])
        c1.create_tables([cfg])
        threads = [threading.Thread(target=worker, args=(i, c)) for i, c in enumerate((c0, c1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert g.wait(30) == [0]
    # worker 0 leaves its pass barrier only after worker 1's last step
    assert events.index((0, "pass", None)) > events.index((1, "step", 4))
    row = np.float32(0.25)
    for s in range(5):
        stepped = [i for i in range(2) if s < steps[i]]
        total = sum(grad(i, s)[0, 0] for i in stepped)
        row = np.float32(row - np.float32(lr) * (total / np.float32(len(stepped))))
    for i in range(2):  # both read the rows of all 5 steps after the pass barrier
        np.testing.assert_array_equal(final[i], np.full((8, dim), row, np.float32))


def test_async_two_worker_processes_match_reference():
    steps, n, lr = 20, 200, 0.25
    cfg = {"kind": "sparse", "name": "emb", "dim": DIM, "optimizer": SGD(lr).to_config(),
           "initializer": Constant(0.0).to_config()}
    with ServerGroup(2, 3) as g:  # workers 0 and 1 push, worker 2 (here) checks
        with Client(g.endpoints, timeout=20, worker_index=2) as c:
            c.create_tables([cfg])
            w = [start_worker("async_push", endpoints=g.endpoints, worker=i, steps=steps, n=n,
                              dim=DIM, table="emb") for i in range(2)]
            assert [p.wait(60) for p in w] == [0, 0]
            ref = pyfleet.SparseTable(DIM, SGD(lr), initializer=Constant(0.0))
            for i in range(2):
                for step in range(steps):
                    ref.push(*batch(i, step, n, DIM, dyadic=True))
            keys = ref.keys()
            # dyadic gradients and lr: every partial sum is exact, so Hogwild
            # reordering cannot change a single bit.
            np.testing.assert_array_equal(c.pull_sparse("emb", keys), ref.pull(keys))
            c.stop_worker()
        assert g.wait(30) == [0, 0]


def test_geo_worker_sends_deltas_every_k_steps():
    lr, k_steps = 0.25, 3
    cfg = {"kind": "sparse", "name": "emb", "dim": 4, "optimizer": SGD(lr).to_config(),
           "initializer": Constant(1.0).to_config()}
    with ServerGroup(2, 2, mode="geo") as g, \
            Client(g.endpoints, timeout=20, worker_index=0) as c0, \
            Client(g.endpoints, timeout=20, worker_index=1) as c1:
        c0.create_tables([cfg])
        geo = [GeoClient(c0, k_steps), GeoClient(c1, k_steps)]
        ref = {}  # numpy: server row = initial + sum of both workers' local changes
        local = [{}, {}]
        for step in range(2 * k_steps):
            for i, gc in enumerate(geo):
                keys, grads = batch(i, step, 30, 4, num_keys=40, dyadic=True)
                rows = gc.pull_sparse("emb", keys)
                for j, key in enumerate(keys.tolist()):
                    expect = ref.get(key, np.ones(4, np.float32)) + local[i].get(key, 0)
                    np.testing.assert_array_equal(rows[j], expect)
                gc.push_sparse("emb", keys, grads)
                for key, gr in zip(keys.tolist(), grads):
                    local[i][key] = local[i].get(key, 0) - np.float32(lr) * gr
            if (step + 1) % k_steps == 0:
                probe = np.array(sorted(set(local[0]) | set(local[1])), np.uint64)
                before = c0.pull_sparse("emb", probe)
                for gc in geo:
                    gc.step()
                for i in range(2):
                    for key, d in local[i].items():
                        ref[key] = ref.get(key, np.ones(4, np.float32)) + d
                    local[i] = {}
                after = c0.pull_sparse("emb", probe)
                assert not np.array_equal(before, after)
                np.testing.assert_array_equal(after, np.stack([ref[k] for k in probe.tolist()]))
            else:
                for gc in geo:
                    gc.step()
        # evaluation mid-interval: the local model's rows for keys it holds, the
        # servers' (initial) rows for the others; no row made anywhere
        keys, grads = batch(0, 99, 30, 4, num_keys=40, dyadic=True)
        geo[0].pull_sparse("emb", keys)
        geo[0].push_sparse("emb", keys, grads)
        unseen = np.array([10**15, 10**15 + 1], np.uint64)
        probe = np.concatenate([keys, unseen, keys[:3]])
        rows_before = sum(s["tables"]["emb"]["rows"] for s in c0.stats())
        copy_before = geo[0]._copies["emb"].keys.shape[0]
        got = geo[0].pull_sparse("emb", probe, create=False)
        n = keys.shape[0]
        np.testing.assert_array_equal(got[:n], geo[0].pull_sparse("emb", keys))
        np.testing.assert_array_equal(got[n + 2:], got[:3])
        np.testing.assert_array_equal(got[n:n + 2], np.ones((2, 4), np.float32))  # initial
        assert geo[0]._copies["emb"].keys.shape[0] == copy_before
        assert sum(s["tables"]["emb"]["rows"] for s in c0.stats()) == rows_before
        with pytest.raises(pyfleet.errors.RemoteError, match="geo-mode server takes deltas"):
            c0.push_sparse("emb", np.array([1], np.uint64), np.ones((1, 4), np.float32))

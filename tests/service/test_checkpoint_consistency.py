"""A checkpoint taken while async training goes on holds, for every row, a state
that existed: its weights, optimizer state and update count from one instant.

Every push is a gradient of ones on distinct keys, so a row pushed ``c`` times
has, with SGD(lr=1) from 0, weights ``-c``; with Adagrad from 0, accumulator
``c`` and weights ``-sum_k lr / (sqrt(k) + eps)``. A row torn by a save (weights
of one push, count or state of another) breaks these identities.

One pushing thread per table: two threads updating the same row at once is
Hogwild by design (an update of the weights or of the count may be lost), which
would break the identities without any save; the saves run concurrently.
"""

import os
import threading

import numpy as np
import pytest
from support.wait import wait_until

import pyfleet
from pyfleet.optimizer import SGD, Adagrad
from pyfleet.service.client import Client
from pyfleet.service.server import Server

pytestmark = pytest.mark.timeout(120)

DIM, N_KEYS, PUSH_ROWS = 8, 5000, 400
TABLES = [{"kind": "sparse", "name": "sgd", "dim": DIM, "optimizer": SGD(1.0).to_config(),
           "initializer": {"type": "Constant", "value": 0.0}, "seed": 1},
          {"kind": "sparse", "name": "ada", "dim": DIM,
           "optimizer": Adagrad(0.1, epsilon=1e-6).to_config(),
           "initializer": {"type": "Constant", "value": 0.0}, "seed": 2}]


def adagrad_weights(max_count, lr=0.1, eps=1e-6):
    k = np.arange(1, max_count + 1, dtype=np.float64)
    return np.concatenate(([0.0], -np.cumsum(lr / (np.sqrt(k) + eps))))


def check_rows(rows, name):
    """Assert every row of an export is a state some sequence of pushes produced."""
    c = rows["update_count"].astype(np.int64)
    w = rows["weights"]
    assert c.max() > 0
    if name == "sgd":
        np.testing.assert_array_equal(w, np.repeat(-c[:, None], DIM, 1).astype(np.float32))
    else:
        np.testing.assert_array_equal(rows["state"], np.repeat(c[:, None], DIM, 1)
                                      .astype(np.float32))
        want = adagrad_weights(int(c.max()))[c]
        # float32 accumulation vs float64 reference: far closer than one step apart
        np.testing.assert_allclose(w, np.repeat(want[:, None], DIM, 1), rtol=1e-4,
                                   atol=1e-5)


def _pusher(push, stop, seed, done, progress=None):
    rng = np.random.default_rng(seed)
    ones = np.ones((PUSH_ROWS, DIM), np.float32)
    n = 0
    while not stop.is_set():
        keys = rng.choice(N_KEYS, PUSH_ROWS, replace=False).astype(np.uint64) + np.uint64(1)
        push(keys, ones)
        n += 1
        if progress is not None:
            progress[seed] = n
    done.append(n)


def _await_pushes(progress, seeds, since, timeout=30):
    """Wait until every pusher in ``seeds`` has pushed twice more than in
    ``since``, so that consecutive saves see different states (a save may be
    faster than a push)."""
    wait_until(lambda: all(progress.get(s, 0) >= since.get(s, 0) + 2 for s in seeds),
               timeout, "two more pushes of every pusher", interval=0.001,
               detail=lambda: progress)
    return dict(progress)


def test_table_saves_during_pushes_hold_whole_rows(tmp_path):
    tables = {c["name"]: pyfleet.SparseTable.from_config(
        {k: v for k, v in c.items() if k != "kind"}) for c in TABLES}
    prime = np.arange(1, 11, dtype=np.uint64)
    for t in tables.values():
        t.push(prime, np.ones((10, DIM), np.float32))
    stop, done, progress, seen = threading.Event(), [], {}, {}
    threads = [threading.Thread(target=_pusher, args=(t.push, stop, i, done, progress))
               for i, t in enumerate(tables.values())]
    for t in threads:
        t.start()
    try:
        saved = []
        for i in range(6):
            seen = _await_pushes(progress, range(len(tables)), seen)
            for name, t in tables.items():
                f = tmp_path / f"{name}{i}.bin"
                t.save(f)
                saved.append((name, f))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert min(done) > 0
    counts = []
    for name, f in saved:
        fresh = pyfleet.SparseTable.from_config(
            {k: v for k, v in TABLES[name == "ada"].items() if k != "kind"})
        fresh.load(f)
        rows = fresh.export(with_state=True)
        check_rows(rows, name)
        counts.append(int(rows["update_count"].sum()))
    # the saves really happened while training went on
    assert len(set(counts)) > 2


def test_service_saves_during_async_pushes_hold_whole_rows(tmp_path):
    server = Server("127.0.0.1:0", 0, 1, 3, mode="async", tables=TABLES,
                    checkpoint_dir=tmp_path, handler_threads=2)
    st = threading.Thread(target=server.run, daemon=True)
    st.start()
    stop, done = threading.Event(), []
    clients = [Client([server.endpoint], worker_index=i, timeout=30) for i in range(3)]
    try:
        for cfg in TABLES:
            clients[2].push_sparse(cfg["name"], np.arange(1, 11, dtype=np.uint64),
                                   np.ones((10, DIM), np.float32))
        progress, seen = {}, {}
        threads = [threading.Thread(target=_pusher, args=(
            lambda k, g, c=clients[i], n=name: c.push_sparse(n, k, g), stop, 10 + i, done,
            progress)) for i, name in enumerate(["sgd", "ada"])]
        for t in threads:
            t.start()
        try:
            for i in range(4):
                seen = _await_pushes(progress, (10, 11), seen)
                clients[2].save(f"ck{i}")
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert min(done) > 0
        for c in clients:
            c.stop_worker()
    finally:
        for c in clients:
            c.close()
        server.stop()
        st.join(30)
    totals = set()
    for i in range(4):
        for cfg in TABLES:
            fresh = pyfleet.SparseTable.from_config(
                {k: v for k, v in cfg.items() if k != "kind"})
            fresh.load(os.path.join(tmp_path, f"ck{i}", f"{cfg['name']}.shard0-of-1.bin"))
            rows = fresh.export(with_state=True)
            check_rows(rows, cfg["name"])
            totals.add(int(rows["update_count"].sum()))
    assert len(totals) > 2, (totals, done)

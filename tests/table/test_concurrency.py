"""Many threads pulling and pushing one table at once (the GIL is released in every call)."""

import threading

import numpy as np

import pyfleet
from pyfleet.entry import CountFilterEntry
from pyfleet.optimizer import SGD, Adam


def run_threads(target, n):
    errors = []

    def wrapped(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


def test_stress_overlapping_and_disjoint_keys():
    table = pyfleet.SparseTable(8, Adam(learning_rate=0.01))
    shared = np.arange(2000, dtype=np.uint64)

    def work(i):
        rng = np.random.default_rng(i)
        own = np.arange(10**6 * (i + 1), 10**6 * (i + 1) + 5000, dtype=np.uint64)
        for step in range(60):
            ks = np.concatenate([rng.choice(shared, 500), rng.choice(own, 500)])
            rows = table.pull(ks)
            assert np.isfinite(rows).all()
            table.push(ks, rng.normal(0, 1, (len(ks), 8)).astype(np.float32))
            if step % 20 == 19:
                table.stats()
                table.keys()

    run_threads(work, 4)
    ks = table.keys()
    assert len(ks) == len(np.unique(ks)) == len(table)
    expected = set(range(2000))
    for i in range(4):
        rng = np.random.default_rng(i)
        for _ in range(60):
            rng.choice(np.arange(2000), 500)
            own_used = rng.choice(np.arange(5000), 500)  # same draws as the worker
            expected.update((10**6 * (i + 1) + own_used).tolist())
            rng.normal(0, 1, (1000, 8))
    assert set(ks.tolist()) <= expected
    assert set(range(2000)) <= set(ks.tolist())
    assert np.isfinite(table.export(with_state=True)["state"]).all()


def test_concurrent_sgd_pushes_to_disjoint_keys_are_exact():
    """Disjoint keys never race: every update must land."""
    table = pyfleet.SparseTable(4, SGD(learning_rate=1.0))

    def work(i):
        ks = np.arange(i * 1000, (i + 1) * 1000, dtype=np.uint64)
        table.pull(ks)
        for _ in range(50):
            table.push(ks, np.ones((1000, 4), np.float32))

    run_threads(work, 4)
    ks = np.arange(4000, dtype=np.uint64)
    np.testing.assert_allclose(table.pull(ks) - table.initial_values(ks), -50.0, atol=1e-4)


def test_concurrent_shrink_save_and_admission(tmp_path):
    table = pyfleet.SparseTable(4, SGD(0.1), entry=CountFilterEntry(2))
    stop = threading.Event()

    def trainer(i):
        rng = np.random.default_rng(i)
        while not stop.is_set():
            ks = rng.integers(0, 20000, 1000).astype(np.uint64)
            table.pull(ks)
            table.push(ks, np.ones((1000, 4), np.float32))

    def maintainer(_):
        try:
            for j in range(20):
                table.shrink(max_unseen_passes=1)
                table.save(tmp_path / f"t{j % 2}.bin")
        finally:
            stop.set()

    run_threads(lambda i: maintainer(i) if i == 0 else trainer(i), 3)
    ks = table.keys()
    assert len(ks) == len(np.unique(ks))
    copy = pyfleet.SparseTable(4, SGD(0.1))
    copy.load(tmp_path / "t1.bin")
    assert np.isfinite(copy.export()["weights"]).all()

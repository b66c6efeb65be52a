"""Save/load: bit-exact round trips, refusal of damaged or mismatched files, resharding, deltas."""

import os

import numpy as np
import pytest
from support.tables import snapshot, trained_table

import pyfleet
from pyfleet.optimizer import FTRL, SGD, Adagrad, Adam


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("opt", [SGD(0.1), Adagrad(0.1), Adam(0.01), FTRL(0.1, l1=0.01)], ids=repr)
def test_round_trip_is_bit_exact(tmp_path, opt):
    t, ks = trained_table(opt)
    path = tmp_path / "t.bin"
    assert t.save(path) == len(t)
    u = pyfleet.SparseTable(6, opt, seed=0)
    assert u.load(path) == len(t)
    assert_same(snapshot(t), snapshot(u))
    np.testing.assert_array_equal(t.pull(ks), u.pull(ks))
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_dense_round_trip(tmp_path):
    d = pyfleet.DenseTable(100, Adam(0.1), initial=np.arange(100, dtype=np.float32))
    d.push(np.ones(100, np.float32))
    d.save(tmp_path / "d.bin")
    e = pyfleet.DenseTable(100, Adam(0.1))
    e.load(tmp_path / "d.bin")
    np.testing.assert_array_equal(d.pull(), e.pull())
    np.testing.assert_array_equal(d.state(), e.state())
    with pytest.raises(ValueError, match="sparse"):
        pyfleet.SparseTable(6, Adam(0.1)).load(tmp_path / "d.bin")
    with pytest.raises(ValueError, match="100 weights"):
        pyfleet.DenseTable(99, Adam(0.1)).load(tmp_path / "d.bin")


def test_damaged_files_are_refused(tmp_path):
    t, _ = trained_table(n=500)
    path = tmp_path / "t.bin"
    t.save(path)
    raw = path.read_bytes()
    for name, data in {
        "flipped": raw[:1000] + bytes([raw[1000] ^ 1]) + raw[1001:],
        "truncated": raw[:-100],
        "short": raw[:50],
        "header": b"NOTPYFLT" + raw[8:],
    }.items():
        bad = tmp_path / f"{name}.bin"
        bad.write_bytes(data)
        u = pyfleet.SparseTable(6, Adam(0.01))
        with pytest.raises(RuntimeError, match=name):
            u.load(bad)
        assert len(u) == 0, name  # nothing half-loaded
    with pytest.raises(RuntimeError, match="missing.bin"):
        pyfleet.SparseTable(6, Adam(0.01)).load(tmp_path / "missing.bin")


def test_mismatched_table_is_refused(tmp_path):
    t, _ = trained_table(n=10)
    t.save(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="dim 6.*dim 5"):
        pyfleet.SparseTable(5, Adam(0.01)).load(tmp_path / "t.bin")
    with pytest.raises(ValueError, match="Adam.*Adagrad"):
        pyfleet.SparseTable(6, Adagrad(0.01)).load(tmp_path / "t.bin")


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_load_with_filter_reshards_every_key_exactly_once(tmp_path, servers):
    t, _ = trained_table(n=2000)
    t.save(tmp_path / "t.bin")
    full = snapshot(t)
    parts = [pyfleet.SparseTable(6, Adam(0.01)) for _ in range(servers)]
    for i, p in enumerate(parts):
        p.load(tmp_path / "t.bin", filter=(servers, i))
        assert (pyfleet.route(p.keys(), servers) == i).all()
    merged = np.concatenate([p.keys() for p in parts])
    assert len(merged) == len(np.unique(merged)) == len(t)
    got = {k: np.concatenate([p.export(with_state=True)[k] for p in parts]) for k in full}
    order = np.argsort(got["keys"])
    assert_same(full, {k: v[order] for k, v in got.items()})
    with pytest.raises(ValueError, match="filter"):
        t.load(tmp_path / "t.bin", filter=(2, 2))


def test_delta_saves_replay_to_the_full_state(tmp_path):
    rng = np.random.default_rng(1)
    t, ks = trained_table(n=1000)
    t.save(tmp_path / "base.bin")
    for i in range(3):
        sub = rng.choice(ks, 100)
        t.push(sub, rng.normal(0, 1, (100, 6)).astype(np.float32))
        t.pull(rng.integers(0, 2**64, 10, dtype=np.uint64))  # new rows
        if i == 1:
            t.shrink(max_unseen_passes=0)  # drops rows: the delta records them
        assert t.save(tmp_path / f"delta{i}.bin", delta=True) < len(t)
    restored = pyfleet.SparseTable(6, Adam(0.01))
    restored.load(tmp_path / "base.bin")
    for i in range(3):
        restored.load(tmp_path / f"delta{i}.bin")
    a, b = snapshot(t), snapshot(restored)
    assert_same({k: a[k] for k in ("keys", "weights", "state")},
                {k: b[k] for k in ("keys", "weights", "state")})


def test_failed_save_forces_a_full_save_before_a_delta(tmp_path):
    t, _ = trained_table(n=10)
    with pytest.raises(RuntimeError, match="cannot create"):
        t.save(tmp_path / "no-such-dir" / "t.bin")
    with pytest.raises(ValueError, match="full save first"):
        t.save(tmp_path / "d.bin", delta=True)
    t.save(tmp_path / "full.bin")
    t.save(tmp_path / "d.bin", delta=True)

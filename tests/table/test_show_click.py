"""Show/click counters (Paddle's CTR accessor) and the score-based shrink, from the
table through the service to `pyfleet train`."""

import json
import subprocess
import sys

import numpy as np
import pytest

import pyfleet
from pyfleet.optimizer import SGD


def keys(*ks):
    return np.array(ks, dtype=np.uint64)


def f32(*xs):
    return np.array(xs, dtype=np.float32)


def score(show, click):
    return 0.1 * (show - click) + click


def test_counters_accumulate_and_shrink_by_decayed_score():
    t = pyfleet.SparseTable(2, SGD(0.1))
    t.pull(keys(1, 2, 3))
    t.add_show_click(keys(1, 2, 1, 9), f32(10, 4, 10, 5), f32(1, 0, 2, 1))  # 9: no row
    e = t.export(keys(1, 2, 3))
    np.testing.assert_allclose(e["show"], [20, 4, 0])
    np.testing.assert_allclose(e["click"], [3, 0, 0])
    assert len(t) == 3
    # Scores after one decay of 0.5: key 1 -> 0.5 * score(20, 3), key 2 -> 0.2, key 3 -> 0.
    assert t.shrink(min_score=0.5, decay=0.5) == 2
    assert t.keys().tolist() == [1]
    np.testing.assert_allclose(t.export(keys(1))["show"], [10])
    expected = 0.5 * 0.5 * score(20, 3)
    assert t.shrink(min_score=expected - 1e-3, decay=0.5) == 0
    assert t.shrink(min_score=0.5 * expected + 1e-3, decay=0.5) == 1


def test_bad_counts_change_nothing():
    t = pyfleet.SparseTable(2, SGD(0.1))
    t.pull(keys(1, 2))
    for shows, clicks in ((f32(1, -1), f32(0, 0)), (f32(1, 1), f32(0, np.nan))):
        with pytest.raises(ValueError, match="show/click"):
            t.add_show_click(keys(1, 2), shows, clicks)
    np.testing.assert_array_equal(t.export()["show"], [0, 0])
    with pytest.raises(ValueError, match="shape"):
        t.add_show_click(keys(1, 2), f32(1), f32(1, 1))


def test_trainer_counts_match_a_python_reference():
    from pyfleet.data.readers import Batch
    from pyfleet.trainer import show_click_of
    # 3 instances, 2 slots; slot 0 has one id each, slot 1 a list per instance.
    slot0 = (keys(5, 6, 5), np.array([0, 1, 2, 3]))
    slot1 = (keys(7, 5, 7, 7), np.array([0, 2, 2, 4]))
    batch = Batch(np.array([1, 0, 1], np.float32), np.zeros((3, 0), np.float32),
                  [slot0, slot1], ("a", "b"))
    ids, shows, clicks = show_click_of(batch)
    ref = {}
    for row, label in enumerate([1, 0, 1]):
        for ks, off in (slot0, slot1):
            for k in ks[off[row]:off[row + 1]].tolist():
                s, c = ref.get(k, (0, 0))
                ref[k] = (s + 1, c + label)
    assert dict(zip(ids.tolist(), zip(shows.tolist(), clicks.tolist()))) == ref


@pytest.mark.slow
def test_through_the_service_equals_the_in_process_table():
    from support.service import ServerGroup

    from pyfleet.service.client import Client
    local = pyfleet.SparseTable(2, SGD(0.1), name="emb")
    config = {"kind": "sparse", **local.config()}
    rng = np.random.default_rng(0)
    ks = rng.integers(0, 2**64, 400, dtype=np.uint64)
    shows = rng.integers(0, 5, 400).astype(np.float32)
    clicks = np.minimum(shows, rng.integers(0, 2, 400)).astype(np.float32)
    group = ServerGroup(2, 1)
    try:
        with Client(group.endpoints, timeout=20) as c:
            c.create_tables([config])
            c.pull_sparse("emb", ks)
            local.pull(ks)
            c.push_show_click("emb", ks, shows, clicks)
            local.add_show_click(ks, shows, clicks)
            dropped = sum(r["dropped"]["emb"] for r in c.shrink(min_score=0.25, decay=0.9))
            assert dropped == local.shrink(min_score=0.25, decay=0.9) > 0
            c.stop_worker()
    finally:
        group.stop()


@pytest.mark.slow
def test_pyfleet_train_shrinks_rows_with_low_scores(tmp_path):
    def run(name, *extra):
        r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", "--rows", "8000",
                            "--workers", "1", "--run-dir", str(tmp_path / name), "--json",
                            *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    plain = run("plain")
    shrunk = run("shrunk", "--show-click", "--shrink-min-score", "0.3")
    before, after = (s["table_rows"]["SparseFeatFactors"] for s in (plain, shrunk))
    assert 0 < after < before  # ids seen in fewer than 3 instances were dropped
    assert shrunk["test_auc"] > 0.5

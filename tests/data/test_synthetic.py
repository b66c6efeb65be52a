"""The synthetic Criteo generator: determinism, round trip, labels that follow the truth."""

import json

import numpy as np
import pytest

from pyfleet.data import Dataset, feature_hash, synthetic


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = tmp_path_factory.mktemp("syn")
    return d, synthetic.generate(d, 6000, seed=5, test_fraction=0.25)


def test_same_seed_byte_identical_files(small, tmp_path):
    d, info = small
    again = synthetic.generate(tmp_path, 6000, seed=5, test_fraction=0.25)
    for key in ("train", "test"):
        with open(info[key], "rb") as a, open(again[key], "rb") as b:
            assert a.read() == b.read()
    assert again["truth_auc_test"] == info["truth_auc_test"]
    other = synthetic.generate(tmp_path / "other", 6000, seed=6, test_fraction=0.25)
    with open(info["train"], "rb") as a, open(other["train"], "rb") as b:
        assert a.read() != b.read()


def test_summary_and_truth_json(small):
    d, info = small
    assert (info["rows_train"], info["rows_test"]) == (4500, 1500)
    with open(d / "truth.json") as f:
        assert json.load(f) == info
    assert info["truth_auc_test"] > 0.7
    assert 0.15 < info["ctr_train"] < 0.35
    assert 0.0 < info["truth_logloss_test"] < 0.6


def test_round_trip_through_the_reader(small):
    d, info = small
    arr = synthetic.generate_arrays(6000, seed=5)
    ds = Dataset([info["train"], info["test"]], dense_transform="none", batch_size=999)
    # Sorted file list: test.tsv before train.tsv.
    order = np.r_[np.arange(4500, 6000), np.arange(4500)]
    labels = np.concatenate([b.labels for b in ds])
    dense = np.concatenate([b.dense for b in ds])
    ids = np.concatenate([b.ids_matrix() for b in ds])
    assert ds.stats()["malformed"] == 0 and labels.shape == (6000,)
    np.testing.assert_array_equal(labels, arr["labels"][order])
    want_dense = np.where(arr["dense_missing"], 0, arr["dense"])[order]
    np.testing.assert_array_equal(dense, want_dense.astype(np.float32))
    for j in (0, 7, 25):
        text = [b"" if m else f"{v:08x}".encode()
                for v, m in zip(arr["cat"][order, j], arr["cat_missing"][order, j])]
        np.testing.assert_array_equal(ids[:, j], [feature_hash(j, t) for t in text])
    assert (arr["dense"][:, 1] < 0).any() and arr["dense_missing"].any()
    assert arr["cat_missing"].any() and not arr["cat_missing"].all(axis=0).any()


def test_labels_follow_probabilities():
    arr = synthetic.generate_arrays(60_000, seed=11)
    y, p = arr["labels"].astype(np.float64), arr["prob"]
    n = y.shape[0]
    tol = 4 * np.sqrt(np.mean(p * (1 - p)) / n)
    assert abs(y.mean() - p.mean()) < tol
    assert 0.2 <= p.mean() <= 0.3
    # Calibration by decile of the true probability.
    edges = np.quantile(p, np.linspace(0, 1, 11))
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
    for k in range(10):
        sel = which == k
        tol_k = 4 * np.sqrt(np.mean(p[sel] * (1 - p[sel])) / sel.sum())
        assert abs(y[sel].mean() - p[sel].mean()) < tol_k, k
    assert synthetic.auc(y, p) > 0.7
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-arr["logit"])))


def test_interactions_carry_signal():
    # The truth is not additive: removing the pairwise terms changes the logit.
    truth = synthetic._truth(3, 0.25)
    assert len(truth.pairs) == 4
    rng = np.random.default_rng(0)
    b = synthetic._block(truth, rng, 20_000)
    saved = truth.pairs
    truth.pairs = []
    b2 = synthetic._block(truth, np.random.default_rng(0), 20_000)
    truth.pairs = saved
    assert np.std(b["logit"] - b2["logit"]) > 0.3


def test_arrays_are_deterministic_across_blocks():
    rows = synthetic.BLOCK_ROWS + 100  # two blocks
    a = synthetic.generate_arrays(rows, seed=2)
    b = synthetic.generate_arrays(rows, seed=2)
    assert a["labels"].shape == (rows,)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["dense"][:100], a["dense"][-100:])


def test_train_shards(tmp_path):
    one = synthetic.generate(tmp_path / "one", 3000, seed=1)
    many = synthetic.generate(tmp_path / "many", 3000, seed=1, train_shards=4)
    parts = sorted((tmp_path / "many" / "train").iterdir())
    assert [p.name for p in parts] == [f"part-{k:05d}.tsv" for k in range(4)]
    with open(one["train"], "rb") as f:
        assert b"".join(p.read_bytes() for p in parts) == f.read()
    ds = Dataset(many["train"], worker_index=1, worker_num=2)
    assert sum(len(b) for b in ds) == sum(
        p.read_bytes().count(b"\n") for p in parts[1::2])


def test_auc_and_logloss_helpers():
    assert synthetic.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert synthetic.auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.5)
    assert np.isnan(synthetic.auc([1, 1], [0.2, 0.3]))
    assert synthetic.logloss([1, 0], [0.5, 0.5]) == pytest.approx(np.log(2))


@pytest.mark.parametrize("kw", [{"rows": -1}, {"rows": 10, "test_fraction": 1.0},
                                {"rows": 10, "ctr": 0.0}, {"rows": 10, "train_shards": 0}])
def test_bad_arguments(tmp_path, kw):
    with pytest.raises(ValueError):
        synthetic.generate(tmp_path, **kw)


def test_zero_rows(tmp_path):
    info = synthetic.generate(tmp_path, 0)
    assert info["rows_train"] == 0 and np.isnan(info["truth_auc_test"])
    assert list(Dataset(info["train"])) == []


def reference_tsv(labels, dense, dense_missing, cat, cat_missing):
    out = []
    for i in range(labels.shape[0]):
        fields = [str(int(labels[i]))]
        fields += ["" if dense_missing[i, j] else str(int(dense[i, j])) for j in range(13)]
        fields += ["" if cat_missing[i, j] else f"{int(cat[i, j]):08x}" for j in range(26)]
        out.append("\t".join(fields) + "\n")
    return "".join(out).encode()


def test_format_tsv_matches_python_formatting():
    a = synthetic.generate_arrays(3000, seed=9)
    a["dense"][:4, 0] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -7]
    a["dense_missing"][:4, 0] = False
    a["cat"][:2, 0] = [0, 0xFFFFFFFF]
    a["cat_missing"][:2, 0] = False
    keys = ("labels", "dense", "dense_missing", "cat", "cat_missing")
    got = synthetic.format_tsv(*(a[k] for k in keys))
    assert got == reference_tsv(*(a[k] for k in keys))
    assert synthetic.format_tsv(*(a[k][:0] for k in keys)) == b""
    with pytest.raises(ValueError):
        synthetic.format_tsv(a["labels"], a["dense"][:, :12], a["dense_missing"], a["cat"],
                             a["cat_missing"])

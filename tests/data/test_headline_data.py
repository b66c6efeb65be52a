"""benchmarks/disk_tier/bench_headline.py's training file: the synthetic rows with some columns
unique per example, so a small file holds as many distinct ids as asked."""

import importlib.util

import numpy as np
import pytest
from support import REPO

from pyfleet.data import Dataset, feature_hash, synthetic


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_headline", REPO / "benchmarks" / "disk_tier" / "bench_headline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unique_columns_give_the_ids_asked_for(tmp_path):
    path = str(tmp_path / "train.tsv")
    info = _bench().write_data(path, ids=2001, unique_slots=20, seed=3)
    n = 101  # ceil(2001 / 20)
    assert info["examples"] == n and info["min_distinct_ids"] == n * 20
    ds = Dataset([path], dense_transform="none", batch_size=64)
    ids = np.concatenate([b.ids_matrix() for b in ds])
    labels = np.concatenate([b.labels for b in ds])
    assert ds.stats()["malformed"] == 0 and ids.shape == (n, synthetic.N_SLOTS)
    # the first 20 columns: the example's index, 8 hex digits, in every one of them
    for j in (0, 19):
        np.testing.assert_array_equal(ids[:, j], [feature_hash(j, f"{i:08x}") for i in range(n)])
    assert np.unique(ids[:, :20]).shape[0] == n * 20
    assert np.unique(ids).shape[0] >= 2001
    # the other columns and the labels: the synthetic set's rows of the same seed
    ref = synthetic.generate_arrays(n, seed=3)
    np.testing.assert_array_equal(labels, ref["labels"])
    for j in (20, 25):
        text = [b"" if m else f"{v:08x}".encode()
                for v, m in zip(ref["cat"][:, j], ref["cat_missing"][:, j])]
        np.testing.assert_array_equal(ids[:, j], [feature_hash(j, t) for t in text])


@pytest.mark.parametrize("slots", [0, synthetic.N_SLOTS + 1])
def test_bad_unique_slots(tmp_path, slots):
    with pytest.raises(ValueError, match="--unique-slots"):
        _bench().write_data(str(tmp_path / "t.tsv"), ids=100, unique_slots=slots)

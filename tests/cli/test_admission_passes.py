"""`pyfleet train --admission-count 2` without any shrink option: candidate
counts are forgotten at every pass end, so an id must be pulled twice within one pass
to become a row. Before, counts carried over and every id seen once per pass was
admitted in pass 2: the table held every id, as with no policy at all."""

import json
import subprocess
import sys

import numpy as np
import pytest
from support import DATA

from pyfleet.data import Dataset

pytestmark = pytest.mark.slow

TINY = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"


@pytest.mark.skipif(not TINY.exists(), reason="shared Criteo sample missing")
def test_admission_without_shrink_keeps_the_table_bounded(tmp_path):
    ids = np.concatenate([ids for b in Dataset(str(TINY), format="csv", batch_size=4096)
                          for ids, _ in b.sparse])
    keys, counts = np.unique(ids, return_counts=True)
    seen_twice = int((counts >= 2).sum())  # the most a pass can admit at count 2
    assert seen_twice < 0.6 * keys.shape[0]  # the sample has many one-off ids
    r = subprocess.run([sys.executable, "-m", "pyfleet.cli", "train", "--train", str(TINY),
                        "--epochs", "3", "--servers", "1", "--workers", "1",
                        "--batch-size", "100", "--admission-count", "2", "--json",
                        "--run-dir", str(tmp_path / "run")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = sum(json.loads(r.stdout)["table_rows"].values())
    assert 0 < rows <= seen_twice, (rows, seen_twice, keys.shape[0])

"""Admission (CountFilterEntry) + shrink keep a table's rows bounded on an endless
Zipf + one-off key stream, exactly as a plain reference of the documented rules says."""

import numpy as np

import pyfleet
from pyfleet.entry import CountFilterEntry
from pyfleet.optimizer import SGD

PASSES, BATCHES, ZIPF_PER_BATCH, ONE_OFF_PER_BATCH = 24, 5, 3000, 1000


def _stream(p, b):
    rng = np.random.default_rng([7, p, b])
    zipf = rng.zipf(1.1, ZIPF_PER_BATCH).astype(np.uint64) & np.uint64((1 << 40) - 1)
    start = (p * BATCHES + b) * ONE_OFF_PER_BATCH
    one_off = np.arange(start, start + ONE_OFF_PER_BATCH, dtype=np.uint64) | np.uint64(1 << 50)
    keys = np.concatenate([zipf, one_off])
    rng.shuffle(keys)
    return keys


class _Reference:
    """The rules of pyfleet.entry and SparseTable.shrink, on Python sets."""

    def __init__(self, count, max_unseen):
        self.count, self.max_unseen = count, max_unseen
        self.rows = {}          # key -> passes unseen
        self.candidates = {}    # key -> pull calls seen this pass
        self.pushed = set()

    def pull_push(self, keys):
        for k in set(keys.tolist()):       # a pull call counts a key once
            if k not in self.rows:
                c = self.candidates.get(k, 0) + 1
                if c < self.count:
                    self.candidates[k] = c
                    continue
                self.candidates.pop(k, None)
                self.rows[k] = 0
            self.pushed.add(k)             # the push reaches rows only

    def shrink(self):
        for k in list(self.rows):
            self.rows[k] = 0 if k in self.pushed else self.rows[k] + 1
            if self.rows[k] > self.max_unseen:
                del self.rows[k]
        self.pushed.clear()
        self.candidates.clear()


def test_admission_and_shrink_bound_the_rows_of_a_long_stream():
    table = pyfleet.SparseTable(4, SGD(0.1), seed=3, entry=CountFilterEntry(2))
    plain = pyfleet.SparseTable(4, SGD(0.1), seed=3)
    ref = _Reference(count=2, max_unseen=1)
    grads = np.full((ZIPF_PER_BATCH + ONE_OFF_PER_BATCH, 4), 0.5, np.float32)
    rows, plain_rows = [], []
    for p in range(PASSES):
        for b in range(BATCHES):
            keys = _stream(p, b)
            for t in (table, plain):
                t.pull(keys)
                t.push(keys, grads)
            ref.pull_push(keys)
        table.shrink(max_unseen_passes=1)
        ref.shrink()
        rows.append(len(table))
        plain_rows.append(len(plain))
        # exactly the reference's rows, not merely as many
        assert len(table) == len(ref.rows), p
        np.testing.assert_array_equal(np.sort(table.keys()),
                                      np.sort(np.fromiter(ref.rows, np.uint64)))
    # no policy: every distinct key stays (one-offs alone add 5000 rows a pass)
    assert plain_rows[-1] >= PASSES * BATCHES * ONE_OFF_PER_BATCH
    # policy: flat after the first passes, and a small share of what no policy keeps
    assert max(rows[PASSES // 2:]) <= 1.2 * max(rows[:PASSES // 2])
    assert rows[-1] < 0.1 * plain_rows[-1]
    # a one-off id never became a row
    assert not (table.keys() >= np.uint64(1 << 50)).any()
    # the rows that stay are trained rows (their pushes were applied)
    k = table.keys()[:50]
    assert (table.pull(k) != table.initial_values(k)).all(axis=1).all()

"""Which rows the disk tier keeps in RAM (spill_table.cc's CLOCK with use
counts): rows used step after step stay, a new hot set takes the place of
the old one within a few steps, and a step's rows are read back once, not
again for the push after its pull, also on a uniform stream where nearly
every row is cold."""

import numpy as np
import pytest

import pyfleet
from pyfleet.optimizer import SGD

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
DIM = 8


def table(tmp_path, rows):
    """A table of `rows` keys through a 4 MiB budget (a few thousand rows in
    RAM), and its keys; the fill leaves the last ones in RAM. Pulled again
    in small calls, so that RAM holds as many rows as the budget buys (the
    one large call's working memory held fewer)."""
    t = pyfleet.SparseTable(DIM, SGD(0.1), seed=1, memory_budget=4 << 20,
                            spill_dir=tmp_path / "spill")
    keys = np.arange(rows, dtype=np.uint64) * GOLDEN
    t.pull(keys)
    for s in range(0, rows, 2000):
        t.pull(keys[s:s + 2000])
    return t, keys


def reads(t):
    return t.stats()["spill_reads"]


def in_ram(t):
    return len(t) - t.stats()["spilled_rows"]


def step(t, keys, split=False):
    """A training step: pull the keys, push gradients to them; rows read
    (by the pull and by the push if split). The reads count a cleaner's too
    (spill_store.h), which runs after a call's rows went to disk."""
    r0 = reads(t)
    t.pull(keys)
    r1 = reads(t)
    t.push(keys, np.zeros((len(keys), DIM), np.float32))
    return (r1 - r0, reads(t) - r1) if split else reads(t) - r0


def test_a_new_hot_set_takes_the_old_ones_place(tmp_path):
    """A hot set used every step (with cold keys between) stays in RAM; when
    another hot set replaces it, the new one is in RAM within a few steps
    (the first reads it back; the old rows' counts run down as the queue
    passes them) and stays, and the old one leaves."""
    t, keys = table(tmp_path, 100_000)
    rng = np.random.default_rng(5)
    step(t, keys[:10])
    n = int(0.4 * in_ram(t))  # two hot sets do not fit together with the cold keys
    hot_a, hot_b, cold = keys[:n], keys[n:2 * n], keys[2 * n:]
    for _ in range(10):
        step(t, hot_a)
        step(t, rng.choice(cold, 500))
    assert step(t, hot_a) == 0
    first = []
    for _ in range(30):
        first.append(step(t, hot_b))
        step(t, rng.choice(cold, 500))
    assert first[0] > 0.9 * n, first  # B was on disk
    assert sum(first[1:5]) < 0.1 * n, first  # a few of its rows read again
    assert first[5:] == [0] * 25, first  # and then none
    assert step(t, hot_a) > 0.5 * n  # and A has left for it


@pytest.mark.parametrize("batch", [500, 2000])
def test_a_step_reads_each_row_back_once(tmp_path, batch):
    """Uniform keys, so that nearly every row of a step is on disk: the push
    after the pull reads nothing (it finds the rows the pull read back still
    in RAM), and rows read back in one step go before the old rows that are
    still used."""
    t, keys = table(tmp_path, 150_000)
    rng = np.random.default_rng(6)
    hot = keys[:int(0.3 * in_ram(t))]
    for _ in range(5):
        step(t, hot)
    for _ in range(20):
        pulled, pushed = step(t, rng.choice(keys[len(hot):], batch), split=True)
        assert pulled > 0.5 * batch and pushed == 0
        assert step(t, hot) == 0

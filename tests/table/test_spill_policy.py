"""Which rows the disk tier keeps in RAM (spill_evict.cc's CLOCK with use
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


def read_back(t):
    """Rows read back, not the cleaner's whole extents."""
    st = t.stats()
    return st["spill_reads"] - st["spill_clean_reads"]


def in_ram(t):
    return len(t) - t.stats()["spilled_rows"]


def step(t, keys, split=False):
    """A training step: pull the keys, push gradients to them; rows read
    (by the pull and by the push if split). The reads count a cleaner's too
    (internal/shard_log.h), which runs after a call's rows went to disk."""
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
    # Two hot sets do not fit together, even with no room for the cold keys
    # (which, new and used once, leave within two steps): at 0.4 of the RAM
    # each, both stayed in RAM beside the cold keys' two steps and A did
    # not have to leave (the hot steps' working memory takes ~15% of it).
    n = int(0.5 * in_ram(t))
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


@pytest.mark.parametrize("warm_share, period, stream_share, ahead",
                         [(0.55, 6, 0.07, False), (0.4, 4, 0.15, False), (0.4, 4, 0.15, True)])
def test_rows_used_every_few_steps_outlast_keys_used_once(tmp_path, warm_share, period,
                                                          stream_share, ahead):
    """Warm rows, each used every few steps, beside a stream of keys each
    used once (on disk before, never used again): once in RAM the warm rows
    stay, and the reads are the stream's keys. A warm row that left RAM
    comes back soon after (within a shard's rows of evictions: its spill
    record says when it left), so it skips probation and joins the CLOCK
    queue, where the stream's rows, which leave probation within two steps,
    cannot push it out. With CLOCK alone the stream's rows stayed a whole
    pass of the queue and took the warm rows' room (about 900 warm rows read
    back a step of 1,400 warm and 1,100 stream keys). With the stream at
    0.15 of the RAM a step, CLOCK's hand, moving with probation's victims,
    took warm rows read back and not used again yet, unless it spares them
    for 8 steps (without: 26,439 of 27,060 warm uses read back).

    `ahead`: the service's order, the next batch pulled before this one is
    pushed (pull t+1, push t), so a push comes three calls after its pull. A
    stream key pushed then is still a row used once and leaves from
    probation; when that push counted as a second use, every stream key was
    promoted to CLOCK's queue and pushed the warm rows out (56,439 rows read
    back beyond the stream's, the pushes' included, for 30,735 warm uses over
    the last 20 steps; 136 since)."""
    t, keys = table(tmp_path, 150_000)
    step(t, keys[-2000:])
    ram = in_ram(t)
    warm, stream = keys[:int(warm_share * ram)], keys[int(warm_share * ram):]
    per_step, steps = int(stream_share * ram), 60
    assert len(stream) >= (steps + 1) * per_step

    def batch(s):
        return np.concatenate([warm[s % period::period], stream[s * per_step:(s + 1) * per_step]])

    if ahead:
        t.pull(batch(0))
    warm_uses = warm_reads = 0
    for s in range(steps):
        pulled = batch(s + 1) if ahead else batch(s)  # its stream keys all read back
        pushed = batch(s)
        r0 = read_back(t)
        t.pull(pulled)
        t.push(pushed, np.zeros((len(pushed), DIM), np.float32))
        if s >= steps - 20:
            warm_reads += read_back(t) - r0 - per_step
            warm_uses += len(pulled) - per_step
    assert warm_uses > 18 * 1000
    assert warm_reads < 0.02 * warm_uses, (warm_reads, warm_uses)


def test_rows_back_soon_after_they_left_are_counted_as_ghost_hits(tmp_path):
    """stats()["spill_ghost_hits"]: a row read back within a shard's rows in
    RAM of evictions after it left skips probation and is counted; keys on
    disk since the fill (left long ago) are read back and not counted."""
    t, keys = table(tmp_path, 150_000)
    ram = in_ram(t)

    def counts():
        return read_back(t), t.stats()["spill_ghost_hits"]

    before = counts()
    t.pull(keys[:3000])  # on disk since the fill's first calls
    after = counts()
    assert after[0] - before[0] == 3000
    assert after[1] == before[1]
    a = keys[20_000:20_000 + int(0.6 * ram)]
    b = keys[40_000:40_000 + int(0.6 * ram)]
    t.pull(a)
    t.pull(b)  # evicts most of a: a's rows, unused since they came, go first
    before = counts()
    t.pull(a)
    after = counts()
    back = after[0] - before[0]
    assert back > 0.3 * len(a), back
    assert after[1] - before[1] == back


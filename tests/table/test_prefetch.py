"""SparseTable.prefetch(keys): the spilled rows among keys come back to RAM
as a pull would bring them, and nothing else changes: no row is made, no
value, count, admission counter or save content moves, and a pull after it
returns bit for bit what it would have. From another thread, while the
batch before is pulled and pushed, the table still ends bit for bit as the
all-in-RAM table given the same calls."""

import threading

import numpy as np
import pytest

import pyfleet
from pyfleet.entry import CountFilterEntry
from pyfleet.optimizer import Adam

OPT = Adam(learning_rate=0.01)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def table(tmp_path, budget=None, name="spill", **kw):
    if budget is None:
        return pyfleet.SparseTable(8, OPT, seed=3, **kw)
    if budget == "min":
        budget = pyfleet.SparseTable(8, OPT).min_memory_budget()
    return pyfleet.SparseTable(8, OPT, seed=3, memory_budget=budget,
                               spill_dir=tmp_path / name, **kw)


def zipf_batches(n, size, keys=20000, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        z = rng.zipf(1.2, size)
        z[z > keys] = rng.integers(1, keys + 1, int((z > keys).sum()))
        out.append((z - 1).astype(np.uint64) * GOLDEN)
    return out, rng


def state(t):
    e = t.export(with_state=True)
    o = np.argsort(e["keys"])
    return {k: v[o] for k, v in e.items()}


def assert_same(a, b):
    sa, sb = state(a), state(b)
    assert sa.keys() == sb.keys()
    for field in sa:
        assert np.array_equal(sa[field], sb[field]), field  # bit for bit


def test_prefetch_then_pull_equals_pull_alone(tmp_path):
    # 2.5 MiB: about 8.7k of the 20k rows in RAM, so a step's rows fit and
    # the prefetch's own eviction leaves the rows it read back.
    a, b = table(tmp_path, 5 << 19, "a"), table(tmp_path, 5 << 19, "b")
    ram = table(tmp_path)
    batches, rng = zipf_batches(40, 2000)
    for t in (a, b, ram):
        t.pull(np.arange(20000, dtype=np.uint64) * GOLDEN)  # every key has a row
    prefetched = a_reads = b_reads = 0
    for step, k in enumerate(batches):
        before = a.stats()
        a.prefetch(k)
        mid = a.stats()
        # Nothing but the tiers moved: no row, no call counted, and the
        # reads are the rows brought back (and the cleaner's, if it ran).
        assert len(a) == len(ram)
        for name in ("rows", "pull_calls", "push_calls", "inserted_rows", "candidates"):
            assert mid[name] == before[name], name
        assert mid["prefetch_calls"] == before["prefetch_calls"] + 1
        assert mid["spill_reads"] - before["spill_reads"] == \
            mid["prefetched_rows"] - before["prefetched_rows"] + \
            mid["spill_clean_reads"] - before["spill_clean_reads"]
        b0 = b.stats()["spill_reads"]
        pulled = a.pull(k)
        assert np.array_equal(pulled, b.pull(k))
        assert np.array_equal(pulled, ram.pull(k))
        if step > 0:  # (the first prefetch evicts what the fill left over its share)
            prefetched += mid["prefetched_rows"] - before["prefetched_rows"]
            a_reads += a.stats()["spill_reads"] - mid["spill_reads"]
            b_reads += b.stats()["spill_reads"] - b0
        g = rng.normal(0, 1, (len(k), 8)).astype(np.float32)
        for t in (a, b, ram):
            t.push(k, g)
    # The pulls after a prefetch found its rows in RAM: they read back a
    # few rows its own eviction sent out again (a shard's second pass),
    # where the pulls without one read back about as many as it brought in.
    assert prefetched > 3000
    assert a_reads <= prefetched // 100
    assert b_reads >= prefetched // 2
    assert_same(a, ram)
    assert_same(b, ram)


def test_prefetch_changes_no_value_count_or_save(tmp_path):
    t = table(tmp_path, "min")
    keys = np.arange(3000, dtype=np.uint64) * GOLDEN
    t.pull(keys)
    t.push(keys[::2], np.ones((1500, 8), np.float32))
    t.add_show_click(keys[::3], np.full(1000, 2, np.float32), np.ones(1000, np.float32))
    full = t.save(tmp_path / "full.bin")
    before, st = state(t), t.stats()
    assert st["spilled_rows"] > 2000  # most rows are on disk
    t.prefetch(keys[:1500])
    assert t.stats()["prefetched_rows"] > 500
    after = state(t)
    for field in before:
        assert np.array_equal(before[field], after[field]), field
    # Rows read back are not dirty: a delta save after it has nothing to write.
    assert t.save(tmp_path / "delta.bin", delta=True) == 0
    # And a full save holds the same rows, bit for bit.
    assert t.save(tmp_path / "again.bin") == full
    u, v = table(tmp_path), table(tmp_path)
    u.load(tmp_path / "full.bin")
    v.load(tmp_path / "again.bin")
    assert_same(u, v)


def test_absent_keys_are_not_created_or_counted(tmp_path):
    t = table(tmp_path, "min", entry=CountFilterEntry(2))
    k = np.arange(100, dtype=np.uint64)
    for _ in range(3):
        t.prefetch(k)
    assert len(t) == 0 and t.stats()["candidates"] == 0
    t.pull(k)  # the first pull the filter counts: still candidates, no rows
    assert len(t) == 0 and t.stats()["candidates"] == 100
    t.prefetch(k)
    t.pull(k)  # the second: admitted
    assert len(t) == 100
    s = table(tmp_path, "min", name="s2")
    s.prefetch(np.arange(10**6, 10**6 + 500, dtype=np.uint64))
    st = s.stats()
    assert len(s) == 0 and st["prefetched_rows"] == 0 and st["spill_reads"] == 0


def test_memory_bytes_counts_the_prefetch_s_working_memory(tmp_path):
    """The budget pays for a prefetch's buffer (about 24 bytes a key, kept
    by its thread for the next prefetch), and memory_bytes() says so: what
    the budget holds is what memory_bytes() reports. Rows all in RAM here,
    so nothing else moves between the readings."""
    n = 100_000
    t = table(tmp_path, budget=96 << 20)
    keys = np.arange(n, dtype=np.uint64) * GOLDEN
    t.pull(keys)
    t.pull(keys[:1])  # the misses' buffer of the first pull goes back
    t.prefetch(keys)
    big = t.memory_bytes()
    t.prefetch(keys[:1])  # a call of less than half gives the rest back
    small = t.memory_bytes()
    assert t.stats()["spilled_rows"] == 0
    assert 20 * n <= big - small <= 32 * n, (big - small) / n
    assert big <= 96 << 20


def test_prefetch_without_a_disk_tier_does_nothing(tmp_path):
    t = table(tmp_path)
    k = np.arange(1000, dtype=np.uint64)
    t.pull(k)
    st = t.stats()
    t.prefetch(k)
    t.prefetch(np.arange(5000, 6000, dtype=np.uint64))
    assert t.stats() == st and len(t) == 1000
    assert "prefetched_rows" not in st  # a disk tier's counter


@pytest.mark.parametrize("budget", [None, "min"])
def test_bad_keys_are_refused_by_name(tmp_path, budget):
    t = table(tmp_path, budget)
    t.prefetch(np.array([], dtype=np.uint64))  # empty is fine, as for pull
    for bad in ([1, 2, 3], np.arange(4, dtype=np.int64), np.arange(4, dtype=np.uint32),
                np.zeros((2, 2), dtype=np.uint64), np.float32(3)):
        with pytest.raises(ValueError, match="keys must be a 1-D numpy array of dtype uint64"):
            t.prefetch(bad)
        with pytest.raises(ValueError, match="keys must be a 1-D numpy array of dtype uint64"):
            t.pull(bad)
    assert len(t) == 0


@pytest.mark.parametrize("budget", ["min", 3 << 19])
def test_prefetch_of_the_next_batch_in_another_thread_is_exact(tmp_path, budget):
    # The order of a training loop that prefetches: batch t+1's rows are
    # read back while batch t is pulled, shown and pushed (and batch t+1's
    # show counts added, written in place on disk for its spilled rows,
    # while the prefetch may be reading them), now and then a shrink and a
    # save. Whatever the interleaving, the pulls and the final rows are bit
    # for bit the all-in-RAM table's given the same calls.
    spill, ram = table(tmp_path, budget), table(tmp_path)
    batches, rng = zipf_batches(61, 3000)
    errors = []

    def prefetch(k):
        try:
            spill.prefetch(k)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for step in range(60):
        k, nxt = batches[step], batches[step + 1]
        th = threading.Thread(target=prefetch, args=(nxt,))
        th.start()
        assert np.array_equal(spill.pull(k), ram.pull(k)), step
        shows = np.ones(len(nxt), np.float32)
        for t in (spill, ram):
            t.add_show_click(nxt, shows, shows * 0.5)
        g = rng.normal(0, 1, (len(k), 8)).astype(np.float32)
        for t in (spill, ram):
            t.push(k, g)
        if step % 20 == 19:
            for t in (spill, ram):
                t.shrink(max_unseen_passes=5)
            assert spill.save(tmp_path / "s.bin") == ram.save(tmp_path / "r.bin")
        th.join(timeout=60)
        assert not th.is_alive() and not errors
    st = spill.stats()
    assert st["prefetch_calls"] == 60 and st["prefetched_rows"] > 1000
    assert_same(spill, ram)

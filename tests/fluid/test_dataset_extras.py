"""InMemoryDataset extras, train_from_dataset's fetch_handler and
DataFeeder.decorate_reader: each takes effect or is refused by name."""

import logging

import numpy as np
import pytest

import pyfleet.fluid as fluid  # noqa: PLR0402 (the line Fluid users write)
from pyfleet.fluid import fetch_handler as fh_module
from pyfleet.optimizer import SGD

L = fluid.layers
N = 40


def _write(tmp_path, n=N, name="part-0"):
    rng = np.random.default_rng(1)
    lines = []
    for i in range(n):
        k = 1 + i % 3
        ids = " ".join(str(1000 + i * 10 + j) for j in range(k))
        lines.append(f"2 {i}.0 {rng.normal():.4f} {k} {ids} 1 {i % 2}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _network():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        x = L.data("x", [2])
        s = L.data("s", [1], dtype="int64", lod_level=1)
        y = L.data("y", [1], dtype="int64")
        e = L.sequence_pool(L.embedding(s, [10**6, 3], is_sparse=True, param_attr="T"), "sum")
        p = L.fc([x, e], 2, act="softmax")
        loss = L.mean(L.cross_entropy(p, y))
        SGD(0.05).minimize(loss)
    return main, startup, [x, s, y], loss


def _dataset(tmp_path, use_vars, **kw):
    ds = fluid.DatasetFactory().create_dataset("InMemoryDataset")
    ds.set_use_var(use_vars)
    ds.set_batch_size(kw.get("batch_size", 8))
    ds.set_filelist([_write(tmp_path)])
    return ds


def _rows(ds):
    """Per example: (x tuple, s ids tuple, y) in memory order."""
    cols, n = ds._memory
    vals, off = cols["s"]
    return [(tuple(cols["x"][i]), tuple(vals[off[i]:off[i + 1]].reshape(-1)),
             int(cols["y"][i][0])) for i in range(n)]


def test_preload_into_memory_then_wait(tmp_path):
    _m, _s, use, _l = _network()
    a = _dataset(tmp_path, use)
    a.load_into_memory()
    b = _dataset(tmp_path, use)
    b.preload_into_memory()
    with pytest.raises(ValueError, match="wait_preload_done"):
        b.local_shuffle()
    b.wait_preload_done()
    assert _rows(a) == _rows(b) and b.get_memory_data_size() == N
    with pytest.raises(ValueError, match="no preload_into_memory"):
        b.wait_preload_done()
    bad = _dataset(tmp_path, use)
    bad.set_filelist([str(tmp_path / "missing")])
    bad.preload_into_memory()
    with pytest.raises(ValueError, match="missing"):
        bad.wait_preload_done()


def test_shuffles_keep_examples_whole(tmp_path, caplog):
    _m, _s, use, _l = _network()
    ds = _dataset(tmp_path, use)
    ds.load_into_memory()
    before = _rows(ds)
    ds.local_shuffle()
    after = _rows(ds)
    assert after != before and sorted(after) == sorted(before)
    ds.global_shuffle()   # no fleet: one process, a local shuffle
    assert sorted(_rows(ds)) == sorted(before) and _rows(ds) != after

    class TwoWorkers:
        def worker_num(self):
            return 2
    with caplog.at_level(logging.WARNING, logger="pyfleet.fluid.dataset"):
        ds.global_shuffle(TwoWorkers())
    assert "each worker's own examples" in caplog.text
    assert sorted(_rows(ds)) == sorted(before)


def test_slots_shuffle_moves_only_the_named_slot(tmp_path):
    _m, _s, use, _l = _network()
    ds = _dataset(tmp_path, use)
    ds.load_into_memory()
    with pytest.raises(ValueError, match="set_fea_eval"):
        ds.slots_shuffle(["s"])
    ds.set_fea_eval(1000, True)
    before = _rows(ds)
    ds.slots_shuffle(["s"])
    after = _rows(ds)
    assert [(r[0], r[2]) for r in after] == [(r[0], r[2]) for r in before]
    assert [r[1] for r in after] != [r[1] for r in before]
    assert sorted(r[1] for r in after) == sorted(r[1] for r in before)
    with pytest.raises(ValueError, match="not variables"):
        ds.slots_shuffle(["nope"])


def test_slots_shuffle_draws_from_a_candidate_pool(tmp_path):
    _m, _s, use, _l = _network()
    ds = _dataset(tmp_path, use)
    ds.load_into_memory()
    ds.set_fea_eval(5)
    before = {r[0]: r for r in _rows(ds)}
    ds.slots_shuffle(["x"])
    xs = {r[0] for r in _rows(ds)}
    assert len(xs) <= 5 and xs <= set(before)
    assert [r[1] for r in _rows(ds)] == [r[1] for r in before.values()]


def test_refused_and_recorded_settings(tmp_path):
    _m, _s, use, _l = _network()
    ds = _dataset(tmp_path, use)
    ds.set_queue_num(4)
    assert ds.queue_num == 4
    with pytest.raises(ValueError, match="queue_num"):
        ds.set_queue_num(0)
    with pytest.raises(ValueError, match="set_merge_by_lineid"):
        ds.set_merge_by_lineid()
    with pytest.raises(ValueError, match="set_parse_ins_id"):
        ds.set_parse_ins_id(True)
    ds.set_parse_ins_id(False)
    with pytest.raises(ValueError, match="record_candidate_size"):
        ds.set_fea_eval(0)
    ds.load_into_memory()
    ds.release_memory()
    assert ds.get_memory_data_size() == 0
    main, startup, _use, loss = _network()
    exe = fluid.Executor()
    exe.run(startup)
    with pytest.raises(ValueError, match="load_into_memory"):
        exe.train_from_dataset(main, ds, fetch_list=[loss])


def test_fetch_handler_gets_the_watched_values_every_period(tmp_path, monkeypatch):
    main, startup, use, loss = _network()
    ds = _dataset(tmp_path, use, batch_size=4)   # 10 batches
    ds.load_into_memory()
    clock = iter(range(1000))
    monkeypatch.setattr(fh_module.time, "monotonic", lambda: float(next(clock)))
    seen = []

    class Handler(fluid.executor.FetchHandler):
        def handler(self, res_dict):
            seen.append({k: np.array(v) for k, v in res_dict.items()})

    block = main.global_block()
    exe = fluid.Executor()
    exe.run(startup)
    last = exe.train_from_dataset(main, ds, fetch_list=[loss], print_period=0,
                                  fetch_handler=Handler({"loss": loss, "w": "fc_0.w_0"},
                                                        period_secs=2))
    # The clock reads 0 at the start, then 1, 2, ... after each batch: every 2nd batch.
    assert len(seen) == 5
    assert set(seen[0]) == {"loss", "w"} and seen[0]["w"].shape == block.var("fc_0.w_0").shape
    np.testing.assert_allclose(seen[-1]["loss"], last[0])
    with pytest.raises(ValueError, match="var_dict"):
        fluid.executor.FetchHandler(None)
    with pytest.raises(ValueError, match="not a variable"):
        exe.train_from_dataset(main, ds, fetch_handler=fluid.executor.FetchHandler({"a": "zz"}))


def test_fetch_handler_default_prints(tmp_path, capsys, monkeypatch):
    main, startup, use, loss = _network()
    ds = _dataset(tmp_path, use, batch_size=20)
    ds.load_into_memory()
    clock = iter(range(1000))
    monkeypatch.setattr(fh_module.time, "monotonic", lambda: float(next(clock)))
    exe = fluid.Executor()
    exe.run(startup)
    exe.train_from_dataset(main, ds, fetch_handler=fluid.executor.FetchHandler(
        {"cost": loss}, period_secs=1))
    assert capsys.readouterr().out.count("cost[0]: ") == 2


def test_decorate_reader(tmp_path):
    main, startup, use, loss = _network()
    samples = [([float(i), 1.0], [5 + i, 7], [i % 2]) for i in range(12)]
    feeder = fluid.DataFeeder(use, fluid.CPUPlace())
    batched = fluid.batch(lambda: iter(samples), 4)
    single = list(feeder.decorate_reader(batched, multi_devices=False)())
    assert len(single) == 3
    want = feeder.feed(samples[:4])
    np.testing.assert_array_equal(single[0]["x"], want["x"])
    multi = list(feeder.decorate_reader(batched, multi_devices=True, num_places=1)())
    assert all(isinstance(m, list) and len(m) == 1 for m in multi)
    exe = fluid.Executor()
    exe.run(startup)
    a = exe.run(main.clone(for_test=True), feed=multi[0], fetch_list=[loss])[0]
    b = exe.run(main.clone(for_test=True), feed=single[0], fetch_list=[loss])[0]
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="num_places=2"):
        feeder.decorate_reader(batched, multi_devices=True, num_places=2)

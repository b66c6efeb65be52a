"""The py_reader era: fluid.layers.py_reader / read_file / double_buffer,
start/reset/EOFException, DataLoader.from_generator, paddle.reader's
decorators and paddle.batch, CompiledProgram with strategies."""

import threading

import numpy as np
import pytest

import pyfleet as paddle
from pyfleet import fluid

L = fluid.layers


def _samples(n=40, seed=0):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(n, 4)).astype(np.float32)
    ys = (xs[:, 0] + 0.5 * xs[:, 1] > 0).astype(np.int64)
    return [(xs[i], [int(i % 7)], [int(ys[i])]) for i in range(n)]


def _build():
    main, startup = fluid.Program(), fluid.Program()
    with fluid.program_guard(main, startup), fluid.unique_name.guard():
        reader = L.py_reader(capacity=8, shapes=[[-1, 4], [-1, 1], [-1, 1]],
                             dtypes=["float32", "int64", "int64"], lod_levels=[0, 1, 0],
                             name="train_reader", use_double_buffer=True)
        reader = L.double_buffer(reader)
        x, ids, label = L.read_file(reader)
        emb = L.sequence_pool(L.embedding(ids, [10, 2], is_sparse=True), "sum")
        prob = L.fc(L.concat([x, emb], axis=1), 2, act="softmax")
        avg_cost = L.mean(L.cross_entropy(prob, label))
        fluid.optimizer.SGD(0.2).minimize(avg_cost)
    return main, startup, reader, avg_cost, (x, ids, label)


def test_py_reader_start_eof_reset_trains_like_feeding():
    main, startup, reader, avg_cost, feed_vars = _build()
    assert [v.lod_level for v in feed_vars] == [0, 1, 0]
    data = _samples()
    reader.decorate_paddle_reader(paddle.batch(lambda: iter(data), batch_size=8))
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    compiled = fluid.compiler.CompiledProgram(main).with_data_parallel(
        loss_name=avg_cost.name, build_strategy=fluid.BuildStrategy(),
        exec_strategy=fluid.ExecutionStrategy())
    losses = []
    for _ in range(2):
        reader.start()
        steps = 0
        try:
            while True:
                (loss,) = exe.run(compiled, fetch_list=[avg_cost])
                losses.append(float(loss))
                steps += 1
        except fluid.core.EOFException:
            reader.reset()
        assert steps == 5
    # the same network fed by hand: the same losses
    main2, startup2, _, avg2, (x, ids, label) = _build()
    exe2 = fluid.Executor()
    exe2.run(startup2)
    feeder = fluid.DataFeeder([x, ids, label], fluid.CPUPlace(), program=main2)
    want = []
    for _ in range(2):
        for b in paddle.batch(lambda: iter(data), 8)():
            want.append(float(exe2.run(main2, feed=feeder.feed(b), fetch_list=[avg2])[0]))
    np.testing.assert_allclose(losses, want, rtol=1e-6)
    assert losses[-1] < losses[0]


def test_sample_list_and_batch_generators_and_data_loader():
    main, startup, reader, avg_cost, (x, ids, label) = _build()
    data = _samples(16)
    reader.decorate_sample_list_generator(paddle.batch(lambda: iter(data), 4))
    exe = fluid.Executor()
    exe.run(startup)
    reader.start()
    exe.run(main, fetch_list=[avg_cost])
    with pytest.raises(ValueError, match="already started"):
        reader.start()
    reader.reset()
    with pytest.raises(ValueError, match="not iterable"):
        next(iter(reader()))

    loader = fluid.io.DataLoader.from_generator(feed_list=[x, ids, label], capacity=4,
                                                iterable=True)

    def batches():
        for i in range(0, 16, 4):
            part = data[i:i + 4]
            yield (np.stack([p[0] for p in part]),
                   (np.array([p[1][0] for p in part], np.int64), np.arange(5)),
                   np.array([p[2] for p in part], np.int64))
    loader.set_batch_generator(batches)
    n = sum(1 for feed in loader() if exe.run(main, feed=feed, fetch_list=[avg_cost]))
    assert n == 4
    with pytest.raises(ValueError, match="use_multiprocess"):
        fluid.io.DataLoader.from_generator(feed_list=[x], use_multiprocess=True)


def test_strategies_record_known_fields_and_refuse_the_rest():
    bs = fluid.BuildStrategy()
    bs.reduce_strategy = fluid.BuildStrategy.ReduceStrategy.Reduce
    bs.memory_optimize = True
    es = fluid.ExecutionStrategy()
    es.num_threads = 4
    with pytest.raises(AttributeError, match="no field 'num_thread'"):
        es.num_thread = 4
    main, _, _, avg_cost, _ = _build()
    bs.gradient_scale_strategy = fluid.BuildStrategy.GradientScaleStrategy.Customized
    with pytest.raises(ValueError, match="Customized"):
        fluid.compiler.CompiledProgram(main).with_data_parallel(avg_cost.name, bs, es)
    with pytest.raises(ValueError, match="2 places"):
        fluid.CompiledProgram(main).with_data_parallel(
            avg_cost.name, places=[fluid.CPUPlace(), fluid.CPUPlace()])
    with pytest.raises(ValueError, match="loss_name 'nope'"):
        fluid.CompiledProgram(main).with_data_parallel(loss_name="nope")


def test_paddle_reader_decorators():
    def r():
        return iter(range(10))
    out = list(paddle.reader.shuffle(r, buf_size=4)())
    assert sorted(out) == list(range(10))
    assert sorted(out[:4]) == [0, 1, 2, 3]   # shuffled within windows
    assert list(paddle.reader.buffered(r, 3)()) == list(range(10))
    assert list(paddle.reader.firstn(r, 3)()) == [0, 1, 2]
    assert list(paddle.reader.chain(r, lambda: iter("ab"))()) == list(range(10)) + ["a", "b"]
    assert list(paddle.reader.map_readers(lambda a, b: a * b, r, r)()) == \
        [i * i for i in range(10)]
    assert list(paddle.reader.compose(lambda: iter([1, 2]),
                                      lambda: iter([(3, 4), (5, 6)]))()) == \
        [(1, 3, 4), (2, 5, 6)]
    with pytest.raises(paddle.reader.ComposeNotAligned):
        list(paddle.reader.compose(r, lambda: iter([1]))())
    assert list(paddle.reader.compose(r, lambda: iter([1]), check_alignment=False)()) == \
        [(0, 1)]
    assert list(paddle.reader.xmap_readers(lambda v: v * 2, r, 3, 4, order=True)()) == \
        [2 * i for i in range(10)]
    assert sorted(paddle.reader.xmap_readers(lambda v: v + 1, r, 2, 2)()) == \
        list(range(1, 11))
    calls = []

    def counted():
        calls.append(1)
        return iter([1, 2])
    c = paddle.reader.cache(counted)
    assert list(c()) == [1, 2] and list(c()) == [1, 2] and len(calls) == 1

    def broken():
        yield 1
        raise RuntimeError("bad file")
    with pytest.raises(RuntimeError, match="bad file"):
        list(paddle.reader.buffered(broken, 2)())

    def bad_map(v):
        raise KeyError("mapper failed")
    with pytest.raises(KeyError, match="mapper failed"):
        list(paddle.reader.xmap_readers(bad_map, r, 2, 2)())
    assert threading.active_count() < 50

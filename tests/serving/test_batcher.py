"""The server's micro-batcher in one process, driven request by request (no HTTP,
no clock): requests queued while a step runs make the next step together, a step
never exceeds --max-batch-rows (a request larger than it is a step alone), a
request still being received is waited for, and every request gets its own rows'
answers in order."""

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("httptools")

from pyfleet.data.readers import Batch  # noqa: E402
from pyfleet.serving.app import ServeOptions, Server  # noqa: E402
from pyfleet.serving.rows import Pending  # noqa: E402


class StepModel:
    """A version whose prediction of a row is its dense value; records each step's
    rows and can hold a step until released (to queue requests meanwhile)."""

    name, digest, dirname, n_dense, n_slots = "fake@0", "0", "/nonexistent", 1, 1

    def __init__(self):
        self.steps = []
        self.hold = None  # a threading.Event the next step waits on

    def predict(self, batch):
        if self.hold is not None:
            hold, self.hold = self.hold, None
            assert hold.wait(60), "the test never released the held step"
        self.steps.append(len(batch))
        return batch.dense[:, 0].astype(np.float64)


def _rows(first, n):
    """A Pending of ``n`` rows whose dense values are first, first+1, ..."""
    dense = np.arange(first, first + n, dtype=np.float32).reshape(n, 1)
    batch = Batch(np.zeros(n, np.float32), dense,
                  [(np.zeros(n, np.uint64), np.arange(n + 1, dtype=np.int64))], ("C1",))
    return Pending("batch", batch, n)


async def _until(predicate):
    for _ in range(100_000):  # the loop turns until the batcher got there
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the batcher never reached the expected state")


def _server(**options):
    server = Server(ServeOptions(**options))
    model = StepModel()
    server.swap(model)
    return server, model


async def _serve(server, work):
    batcher = asyncio.get_running_loop().create_task(server._batch_loop())
    try:
        return await work()
    finally:
        batcher.cancel()
        server._model_thread.shutdown(wait=True)


def _submit(server, pending):
    fut = asyncio.get_running_loop().create_future()
    server._enqueue((pending, fut))
    return fut


async def _first_step_held(server, model):
    """A one-row request whose step runs and is held: ``(its future, the release)``."""
    release = threading.Event()
    model.hold = release
    first = _submit(server, _rows(0, 1))
    await _until(lambda: not server._pending)  # the first step is running, held
    return first, release


def test_requests_queued_during_a_step_make_the_next_step_and_get_their_own_rows():
    server, model = _server(max_batch_rows=8, batch_wait=0)

    async def work():
        first, release = await _first_step_held(server, model)
        sizes = (1, 3, 2, 4, 1)  # 11 rows: a step of 1+3+2 (8 would be exceeded by 4)
        starts = np.cumsum((100,) + sizes[:-1])
        futs = [_submit(server, _rows(int(a), n)) for a, n in zip(starts, sizes)]
        release.set()
        answers = await asyncio.gather(first, *futs)
        return answers, starts, sizes

    answers, starts, sizes = asyncio.run(_serve(server, work))
    assert model.steps == [1, 6, 5]
    np.testing.assert_array_equal(answers[0][0], [0.0])
    for (prob, version), a, n in zip(answers[1:], starts, sizes):
        np.testing.assert_array_equal(prob, np.arange(a, a + n, dtype=np.float64))
        assert version is model
    assert server.metrics.rows == 12
    assert sum(server.metrics.batch_rows.counts) == 3


def test_a_request_larger_than_max_batch_rows_is_a_step_of_its_own():
    server, model = _server(max_batch_rows=4, batch_wait=0)

    async def work():
        first, release = await _first_step_held(server, model)
        futs = [_submit(server, _rows(10, 2)), _submit(server, _rows(20, 9)),
                _submit(server, _rows(40, 1))]
        release.set()
        return await asyncio.gather(first, *futs)

    answers = asyncio.run(_serve(server, work))
    assert model.steps == [1, 2, 9, 1]
    np.testing.assert_array_equal(answers[2][0], np.arange(20, 29, dtype=np.float64))


def test_a_step_waits_for_a_request_still_being_received():
    server, model = _server(max_batch_rows=64, batch_wait=1.0)

    async def work():
        server._waiting_bodies = 1  # one more request's body is on its way
        first = _submit(server, _rows(0, 1))
        await _until(lambda: server._wake is not None)  # the batcher waits for it
        # (even past its deadline the batcher gathers what is queued before it resumes)
        assert model.steps == []
        server._waiting_bodies = 0
        second = _submit(server, _rows(5, 2))
        return await asyncio.gather(first, second)

    answers = asyncio.run(_serve(server, work))
    assert model.steps == [3]
    np.testing.assert_array_equal(answers[1][0], [5.0, 6.0])


def test_without_requests_being_received_a_lone_request_does_not_wait():
    server, model = _server(max_batch_rows=64, batch_wait=1.0)

    async def work():
        fut = _submit(server, _rows(7, 1))
        return await fut

    prob, _ = asyncio.run(_serve(server, work))
    assert model.steps == [1] and prob.tolist() == [7.0]


def test_a_step_waits_for_the_requests_of_the_other_open_connections():
    server, model = _server(max_batch_rows=64, batch_wait=1.0)
    server._open_connections = lambda: 3  # three clients, one request at a time each

    async def work():
        def waiting():
            return not server._pending and server._wake is not None \
                and not server._wake.done()
        first = _submit(server, _rows(0, 1))
        await _until(waiting)  # waits: 1 request of 3 clients
        second = _submit(server, _rows(1, 1))
        await _until(waiting)  # still waits: 2 of 3
        assert model.steps == []
        third = _submit(server, _rows(2, 1))
        return await asyncio.gather(first, second, third)

    answers = asyncio.run(_serve(server, work))
    assert model.steps == [3]
    assert [a[0].tolist() for a in answers] == [[0.0], [1.0], [2.0]]

"""Gradients that cannot be applied: a sync step whose summed gradient
overflows, and a finite but huge async gradient that would freeze Adam.

The rule (docs/service.md, "Training modes"): a gradient value beyond
+-1e18 (``MAX_UPDATE``), NaN or Inf is refused. In async mode the push is
refused and nothing of it applied; in sync mode each push is checked for
NaN/Inf on arrival and the step's averaged gradient against the rule before
anything is applied, and a refused step is answered with its error at every
worker waiting at the barrier, its buffers dropped. Real server processes on
127.0.0.1; every wait is bounded.
"""

import threading

import numpy as np
import pytest
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.optimizer import SGD, Adam
from pyfleet.service.client import Client
from pyfleet.table import DenseTable, SparseTable

pytestmark = [pytest.mark.timeout(120)]

KEY = np.array([12345], dtype=np.uint64)


def _config(name, opt, dim=4):
    return {**SparseTable(dim, opt).config(), "kind": "sparse", "name": name}


def _step(clients, grads, errors):
    """Every client pushes its gradient for KEY, then waits at the barrier (in threads)."""
    def run(c, g):
        try:
            c.push_sparse("emb", KEY, np.full((1, 4), g, dtype=np.float32))
            c.barrier()
        except RemoteError as e:
            errors[c.worker_index] = str(e)
    ts = [threading.Thread(target=run, args=(c, g)) for c, g in zip(clients, grads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts)


def test_a_sync_step_whose_sum_overflows_is_refused_at_every_worker_and_dropped():
    with ServerGroup(1, 2, mode="sync", heartbeat_timeout=5, barrier_timeout=60) as g:
        clients = [Client(g.endpoints, worker_index=w, timeout=30) for w in range(2)]
        try:
            clients[0].create_tables([_config("emb", SGD(0.5))])
            clients[1].create_tables([_config("emb", SGD(0.5))])
            before = clients[0].pull_sparse("emb", KEY).copy()
            errors = {}
            _step(clients, [3e38, 3e38], errors)  # finite each, Inf when summed
            assert sorted(errors) == [0, 1], errors
            for text in errors.values():
                assert "refused step" in text and "overflow when summed" in text
                assert "did not reach the barrier" not in text
            np.testing.assert_array_equal(clients[0].pull_sparse("emb", KEY), before)
            # the refused step's buffers are gone: the next step applies only its own
            errors = {}
            _step(clients, [1.0, 3.0], errors)
            assert errors == {}
            np.testing.assert_allclose(clients[1].pull_sparse("emb", KEY),
                                       before - np.float32(0.5) * np.float32(2.0), rtol=1e-6)
            for c in clients:
                c.stop_worker()
        finally:
            for c in clients:
                c.close()


def test_a_huge_async_gradient_is_refused_and_adam_keeps_learning():
    with ServerGroup(1, 1, mode="async") as g:
        with Client(g.endpoints, worker_index=0, timeout=30) as c:
            c.create_tables([_config("emb", Adam(learning_rate=0.01))])
            w0 = c.pull_sparse("emb", KEY).copy()
            with pytest.raises(RemoteError, match=r"beyond \+-1e\+18"):
                c.push_sparse("emb", KEY, np.full((1, 4), 3e38, dtype=np.float32))
            with pytest.raises(RemoteError):  # flush() reports it too, once
                c.flush()
            np.testing.assert_array_equal(c.pull_sparse("emb", KEY), w0)
            # Adam's second moment stayed finite: a unit gradient moves the row
            # by about the learning rate (Adam's first step), as numpy says.
            c.push_sparse("emb", KEY, np.ones((1, 4), dtype=np.float32))
            np.testing.assert_allclose(c.pull_sparse("emb", KEY), w0 - 0.01, atol=1e-4)
            c.stop_worker()


@pytest.mark.parametrize("value", [3e38, -2e18, np.inf, np.nan])
def test_tables_refuse_gradients_beyond_the_rule(value):
    t = SparseTable(4, Adam(learning_rate=0.01))
    w0 = t.pull(KEY).copy()
    with pytest.raises(ValueError, match="no row was changed"):
        t.push(KEY, np.full((1, 4), value, dtype=np.float32))
    np.testing.assert_array_equal(t.pull(KEY), w0)
    d = DenseTable(3, Adam(learning_rate=0.01))
    with pytest.raises(ValueError, match="nothing was changed"):
        d.push(np.array([0.0, value, 0.0], dtype=np.float32))
    t.push(KEY, np.full((1, 4), 1e18, dtype=np.float32))  # the bound itself is accepted
    assert np.isfinite(t.export(KEY, with_state=True)["state"]).all()

"""A push retried after a timeout is applied at most once.

The server is stopped (SIGSTOP) right after the client sends a push, past
the client's timeout: the client sends the same request (same request id)
again on a new socket; once the server continues (SIGCONT) both copies reach
it, and it applies one. Real server process on 127.0.0.1; bounded waits.
"""

import signal
import threading

import numpy as np
import pytest
from support.service import ServerGroup
from support.wait import LogWatch

from pyfleet.optimizer import SGD
from pyfleet.service.client import Client
from pyfleet.service.dedup import RecentRequests
from pyfleet.table import SparseTable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KEYS = np.arange(1, 9, dtype=np.uint64)


@pytest.mark.parametrize("dense", [False, True])
def test_a_retried_push_is_applied_once(dense):
    with ServerGroup(1, 1, mode="async") as g:
        with Client(g.endpoints, worker_index=0, timeout=1.0, heartbeat_interval=0,
                    push_retries=3) as c:
            c.create_tables([{**SparseTable(2, SGD(1.0)).config(), "kind": "sparse",
                              "name": "emb"},
                             {"kind": "dense", "name": "w", "shape": [8],
                              "optimizer": SGD(1.0).to_config()}])
            before = c.pull_dense("w") if dense else c.pull_sparse("emb", KEYS).copy()
            grads = np.ones((8,) if dense else (8, 2), dtype=np.float32)
            errors, go, ready = [], threading.Event(), threading.Event()

            def push(g):
                if dense:
                    c.push_dense("w", g)
                else:
                    c.push_sparse("emb", KEYS, g)

            def run():
                push(np.zeros_like(grads))  # this thread's sockets are connected
                ready.set()
                go.wait(30)
                try:
                    push(grads)
                except Exception as e:  # reported below
                    errors.append(e)
            t = threading.Thread(target=run)
            t.start()
            assert ready.wait(30)
            g.procs[0].send_signal(signal.SIGSTOP)
            with LogWatch("pyfleet.client") as watch:
                go.set()  # past the client's timeout, the push is sent again
                watch.wait_for("sending it again", 30)
            g.procs[0].send_signal(signal.SIGCONT)
            t.join(30)
            assert not t.is_alive() and errors == []
            after = c.pull_dense("w") if dense else c.pull_sparse("emb", KEYS)
            np.testing.assert_array_equal(after, before - grads)  # once, not twice
            counters = c.stats()[0]["counters"]
            assert counters.get("duplicate_pushes") == 1, counters
            c.stop_worker()


def test_recent_requests_are_bounded_and_forget_refused_ones():
    r = RecentRequests(senders=2, per_sender=3)
    assert r.first(1, 10) and not r.first(1, 10)
    assert r.first(0, 10)                      # another sender's id 10
    assert r.first(7, 11) and not r.first(0, 11)  # unknown senders share bucket 0
    for rid in (20, 21, 22):
        assert r.first(1, rid)
    assert r.first(1, 10)                      # pushed out by 3 newer ids
    r.forget(1, 21)
    assert r.first(1, 21)                      # a refused push may be retried
    assert r.first(1, 0) and r.first(1, 0)     # id 0 is never remembered

"""Who may push, and how much a sync step may buffer for one worker.

The attacks: a raw peer's sync-mode push carrying a worker index beyond
``worker_num`` skipped the owner check and joined the real worker's step (a row
moved from the real worker's zeros to -1000); an anonymous push (worker index
0 in the header) changed the model in async mode; 300 pushes in one sync step
grew the server by 228 MiB. Now a push must name a worker of the job, and the
bytes one worker buffers in one step are bounded (``max_step_bytes``).
"""

import numpy as np
import pytest
import zmq
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op

pytestmark = pytest.mark.timeout(120)

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 1.0},
          "initializer": {"type": "Constant", "value": 0.0}, "seed": 0}
DENSE = {"kind": "dense", "name": "w", "shape": [8],
         "optimizer": {"type": "SGD", "learning_rate": 1.0},
         "initial": {"type": "Constant", "value": 0.0}, "seed": 0}


def _raw(endpoint):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect("tcp://" + endpoint)
    return sock


def _send(sock, frames):
    sock.send_multipart([f.tobytes() if isinstance(f, np.ndarray) else bytes(f)
                         for f in frames])
    assert sock.poll(10_000), "no answer"
    reply = sock.recv_multipart()
    return P.unpack_header(reply[0]), P.parse_json(reply[-1]) if len(reply) > 1 else {}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("worker", [None, 1, 7, 0xFFFFFFFE])
def test_a_push_naming_no_worker_of_the_job_is_refused_and_changes_nothing(mode, worker):
    keys = np.array([1, 2, 3], np.uint64)
    with ServerGroup(1, 1, mode=mode, heartbeat_timeout=30) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE, DENSE])
        ids = c._ids[0]
        spoof = _raw(g.endpoints[0])
        try:
            rid = 0x5EED << 24
            for frames in (P.request(Op.PUSH_SPARSE, rid | 1, table=ids["emb"], keys=keys,
                                     values=np.full((3, 4), 1000.0, np.float32), dim=4,
                                     worker=worker),
                           P.request(Op.PUSH_DENSE, rid | 2, table=ids["w[0:8]"],
                                     values=np.full(8, 1000.0, np.float32), dim=1,
                                     worker=worker),
                           P.dense_many_request(Op.PUSH_DENSE_MANY, rid | 3, [ids["w[0:8]"]],
                                                [np.full(8, 1000.0, np.float32)],
                                                worker=worker)):
                h, body = _send(spoof, frames)
                assert h.status == P.Status.ERROR, f"the push of worker {worker} was taken"
                what = "names no worker" if worker is None else f"worker index {worker}"
                assert what in body["error"] and "worker_num=1" in body["error"], body
        finally:
            spoof.close(0)
        # the real worker's step: zero gradients, so nothing may move
        c.push_sparse("emb", keys, np.zeros((3, 4), np.float32))
        c.push_dense("w", np.zeros(8, np.float32))
        if mode == "sync":
            c.barrier()
        np.testing.assert_array_equal(c.pull_sparse("emb", keys), np.zeros((3, 4), np.float32))
        np.testing.assert_array_equal(c.pull_dense("w"), np.zeros(8, np.float32))
        c.stop_worker()


def test_what_one_worker_buffers_in_a_sync_step_is_bounded():
    # 1.5 MiB of sparse gradient a push (64k keys: 512 KiB of keys, 1 MiB of values)
    n = 1 << 16
    keys = np.arange(1, n + 1, dtype=np.uint64)
    grads = np.full((n, 4), 1.0, np.float32)
    per_push = keys.nbytes + grads.nbytes
    with ServerGroup(1, 1, mode="sync", heartbeat_timeout=30,
                     extra_args=["--max-step-bytes", 8 * per_push]) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        before = c.stats()[0]["rss_bytes"]
        refused = None
        for i in range(40):   # unbounded, this held 60 MiB until the barrier
            try:
                c.push_sparse("emb", keys, grads)
            except RemoteError as e:
                refused = (i, str(e))
                break
        assert refused is not None, "40 pushes of 1.5 MiB in one step were all buffered"
        assert refused[0] == 8 and "max_step_bytes" in refused[1], refused
        assert c.stats()[0]["rss_bytes"] - before < 24 << 20
        with pytest.raises(RemoteError, match="max_step_bytes"):
            c.flush()  # the client reports a push error once more at the next flush
        c.barrier()  # the 8 buffered pushes apply: 8 x -1 per row (SGD, lr 1, one worker)
        np.testing.assert_array_equal(c.pull_sparse("emb", keys[:5]),
                                      np.full((5, 4), -8.0, np.float32))
        # the next step has the whole budget again
        c.push_sparse("emb", keys, grads)
        c.barrier()
        np.testing.assert_array_equal(c.pull_sparse("emb", keys[:5]),
                                      np.full((5, 4), -9.0, np.float32))
        c.stop_worker()


def test_dense_pushes_of_one_worker_in_one_sync_step_add_up_in_place():
    with ServerGroup(1, 1, mode="sync", heartbeat_timeout=30) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([DENSE])
        for _ in range(3):
            c.push_dense("w", np.full(8, 0.5, np.float32))
        c.flush()
        c.barrier()
        np.testing.assert_array_equal(c.pull_dense("w"), np.full(8, -1.5, np.float32))
        c.stop_worker()

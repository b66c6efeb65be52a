"""A server that exits after the last STOP_WORKER sends every reply it still
holds: one parked in the backlog of a peer whose queue was full (an async
worker that reads its acks late) included, so that worker's STOP_WORKER is
answered instead of timing out. A real ``python -m pyfleet.server`` process."""


import pytest
import zmq
from support.service import ServerGroup
from support.wait import wait_for_counter

from pyfleet.service import protocol as P
from pyfleet.service.client import Client
from pyfleet.service.protocol import Op

pytestmark = pytest.mark.timeout(300)

FLOATS = 1 << 15   # 128 KiB a PULL_DENSE reply
DENSE = {"kind": "dense", "name": "big", "shape": [FLOATS],
         "optimizer": {"type": "SGD", "learning_rate": 0.1}}


def test_the_stop_worker_reply_parked_behind_unread_replies_arrives():
    with ServerGroup(1, 1) as g:
        with Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
            c.create_tables([DENSE])
            tid = c._ids[0][f"big[0:{FLOATS}]"]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVHWM, 1)          # reads nothing until the end: the
        sock.setsockopt(zmq.RCVBUF, 1 << 16)    # server's queue for it fills, then its backlog
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect("tcp://" + g.endpoints[0])
        try:
            pulls = 60
            for i in range(pulls):
                sock.send_multipart([bytes(f) for f in P.request(Op.PULL_DENSE, i + 1,
                                                                 table=tid, worker=0)])
            with Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
                wait_for_counter(c, "op_pull_dense", pulls)  # answered (and parked)
            stop_id = pulls + 1
            sock.send_multipart([bytes(f) for f in P.request(
                Op.STOP_WORKER, stop_id, payload={"worker": 0}, worker=0)])
            seen = set()        # read as a worker waiting for its STOP_WORKER answer does
            while stop_id not in seen and sock.poll(15_000):
                seen.add(P.unpack_header(sock.recv_multipart()[0]).request)
            assert stop_id in seen, f"STOP_WORKER unanswered; replies seen: {sorted(seen)}"
            assert g.procs[0].wait(60) == 0          # every worker stopped: it exited
        finally:
            sock.close()

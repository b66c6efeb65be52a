"""A long call (a save: ten times the request timeout) to a server that was
killed fails once that server has answered no heartbeat for the request
timeout, whether the request reached the socket or could not even be queued
(the dead peer's connection gone): never only at the save's own deadline.
Real server processes on 127.0.0.1."""

import time

import pytest
from support.service import ServerGroup
from support.wait import wait_until

from pyfleet.errors import PeerTimeout
from pyfleet.optimizer import SGD
from pyfleet.service.client import Client
from pyfleet.table import SparseTable

pytestmark = [pytest.mark.timeout(120)]


def test_a_save_to_a_killed_server_fails_on_its_silence_not_the_saves_deadline(tmp_path):
    group = ServerGroup(2, workers=1, checkpoint_dir=tmp_path, heartbeat_timeout=1.5)
    try:
        with Client(group.endpoints, worker_index=0, timeout=1.0) as c:
            c.create_tables([{**SparseTable(4, SGD(0.1)).config(), "kind": "sparse",
                              "name": "emb"}])
            c.save("before")   # both alive: saved
            group.kill(1)
            # the client's heartbeats to it stop being answered: the silence it is judged by
            wait_until(lambda: c._conn.silent_error(1, time.monotonic()) is not None, 30,
                       "server 1's silence")
            t0 = time.monotonic()
            with pytest.raises(PeerTimeout, match=r"server 1 .*answered no heartbeat"):
                c.save("after")    # its deadline: 10 s
            print(f"\nsave to a killed server failed after {time.monotonic() - t0:.2f} s "
                  f"(its deadline 10 s)")
    finally:
        group.stop()

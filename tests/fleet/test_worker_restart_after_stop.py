"""A worker that called fleet.stop_worker() and then init_worker() again, outside
zero-edit mode: pyfleet's own default ends the job once every worker has stopped
(the servers' run_server returns), so the second init_worker fails within
connect_timeout with a PeerTimeout that says why and names the way to stop and
start again (``stop_worker(may_return=True)``, Fluid's lifecycle, the default in
zero-edit mode: tests/fleet/test_stop_and_train_again.py)."""

import threading

import numpy as np
import pytest
from support.fluid import fc_fleet

from pyfleet import fluid
from pyfleet.distributed.role_maker import Role
from pyfleet.errors import PeerTimeout
from pyfleet.launch import free_ports


@pytest.mark.timeout(120)
def test_init_worker_after_stop_worker_says_the_servers_ended_the_job(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    server, _ = fc_fleet(Role.SERVER, ep)
    server.init_server()
    t = threading.Thread(target=server.run_server, daemon=True)
    t.start()
    worker, loss = fc_fleet(Role.WORKER, ep, connect_timeout=2.0)
    worker.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(worker.startup_program)
    feed = {"x": np.ones((8, 4), "float32"), "y": np.zeros((8, 1), "float32")}
    (first,) = exe.run(worker.main_program, feed=feed, fetch_list=[loss])
    assert np.isfinite(np.asarray(first)).all()
    worker.stop_worker()
    t.join(30)
    assert not t.is_alive()                       # every worker stopped: the server ended
    with pytest.raises(PeerTimeout, match=r"called fleet.stop_worker\(\) before.*may_return=True"):
        worker.init_worker()


@pytest.mark.timeout(120)
def test_stop_worker_may_return_keeps_the_server_and_init_worker_starts_again(monkeypatch,
                                                                               tmp_path):
    monkeypatch.chdir(tmp_path)
    ep = f"127.0.0.1:{free_ports(1)[0]}"
    server, _ = fc_fleet(Role.SERVER, ep)
    server.init_server()
    served = server._server
    t = threading.Thread(target=server.run_server, daemon=True)
    t.start()
    worker, loss = fc_fleet(Role.WORKER, ep, connect_timeout=5.0)
    exe = fluid.Executor(fluid.CPUPlace())
    x = np.random.RandomState(0).rand(8, 4).astype("float32")
    feed = {"x": x, "y": x.sum(axis=1, keepdims=True)}
    worker.init_worker()
    exe.run(worker.startup_program)
    first = [float(np.asarray(exe.run(worker.main_program, feed=feed, fetch_list=[loss])[0]).mean())
             for _ in range(3)]
    worker.stop_worker(may_return=True)
    with served._lock:                    # stopped, staying: the server serves on
        assert served.barriers.stopped == {0} and served.barriers.staying == {0}
    assert t.is_alive() and not served._done.is_set()
    worker.init_worker()                  # the same worker starts again
    assert served.barriers.stopped == set()
    (again,) = exe.run(worker.main_program, feed=feed, fetch_list=[loss])
    assert float(np.asarray(again).mean()) < first[-1]  # from the parameters the server kept
    worker.stop_worker()                  # stopped for good: the job ends
    t.join(30)
    assert not t.is_alive()

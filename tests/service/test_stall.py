"""A server that stalls is not a server whose workers died.

A server stopped (SIGSTOP) for longer than its heartbeat timeout, then
continued (SIGCONT), must go on serving the job: the time it was stopped is
its own silence, not the workers', and the heartbeats waiting in its socket
are read before anyone's liveness is judged. Real processes on 127.0.0.1;
every wait is bounded.
"""

import json
import signal
import subprocess
import sys
import time

import pytest
from support import REPO
from support.service import ServerGroup

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HB = 1.5  # the servers' heartbeat timeout; the stall lasts longer

# A worker of `steps` steps of `mode`, pausing a little each step so the job
# is still running when the server is stopped.
_WORKER = """
import sys, time, json
sys.path.insert(0, {support!r})
from pyfleet.service.client import Client
from support.service import batch
from pyfleet.optimizer import SGD
from pyfleet.table import SparseTable
endpoints, worker, mode, steps = json.loads(sys.argv[1])
with Client(endpoints, worker_index=worker, timeout=30) as c:
    c.create_tables([{{**SparseTable(4, SGD(0.1)).config(), "kind": "sparse",
                      "name": "emb"}}])
    for step in range(steps):
        keys, grads = batch(worker, step, 64, 4, dyadic=True)
        c.pull_sparse("emb", keys)
        c.push_sparse("emb", keys, grads)
        if mode == "sync":
            c.barrier()
        time.sleep(0.05)
    c.stop_worker()
print("worker done", flush=True)
"""


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_stopped_then_continued_server_finishes_the_job(mode, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(support=str(REPO / "tests")))
    with ServerGroup(1, 2, mode=mode, heartbeat_timeout=HB, barrier_timeout=120) as g:
        steps = 120
        workers = [subprocess.Popen([sys.executable, str(script),
                                     json.dumps([g.endpoints, w, mode, steps])],
                                    stdout=subprocess.PIPE, text=True) for w in range(2)]
        try:
            time.sleep(1.5)  # the job is under way
            assert all(p.poll() is None for p in workers), "the job ended before the stall"
            g.procs[0].send_signal(signal.SIGSTOP)
            time.sleep(3 * HB)  # longer than the heartbeat timeout
            g.procs[0].send_signal(signal.SIGCONT)
            outs = [p.communicate(timeout=120)[0] for p in workers]
            codes = [p.returncode for p in workers]
            assert codes == [0, 0], (codes, outs)
            assert all("worker done" in o for o in outs)
            # every worker stopped: the server exits 0 (not 1, "gives up")
            assert g.wait(30) == [0]
        finally:
            for p in workers:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

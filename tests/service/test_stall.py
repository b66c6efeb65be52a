"""A server that stalls is not a server whose workers died.

A server stopped (SIGSTOP) for longer than its heartbeat timeout, then
continued (SIGCONT), must go on serving the job: the time it was stopped is
its own silence, not the workers', and the heartbeats waiting in its socket
are read before anyone's liveness is judged. Real processes on 127.0.0.1;
every wait is bounded.

The stop comes while the workers are quiet (a long step computed locally:
only their heartbeats go out, and those sent while the server is stopped
are not all delivered), which is when the old server failed the job on
resuming: it judged liveness before reading its socket and counted its own
stall as the workers' silence. In sync mode, with one worker waiting at the
step barrier for two quiet ones, that judgement failed the barrier every
time (`worker(s) [0, 1] sent nothing for more than 1.5 s`); in async mode,
with both workers quiet, it gave up about every other run (`no worker is
left to serve`), exiting 1 under the live workers.
"""

import json
import signal
import subprocess
import sys
import time

import pytest
from support import REPO
from support.service import ServerGroup
from support.wait import wait_for_counter

from pyfleet.service.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HB = 1.5            # the servers' heartbeat timeout (the clients beat every HB / 3)
STALL = 3 * HB      # the server is stopped this long
QUIET = STALL + HB  # a quiet worker computes this long: it outlasts the stall
QUIET_STEP = 20

# A worker of `steps` steps of `mode`. Workers in `quiet` spend QUIET seconds
# computing after pushing step QUIET_STEP (saying "quiet" first); the others
# say "barrier" before that step's barrier (sync) and wait there.
_WORKER = """
import sys, time, json
sys.path.insert(0, {support!r})
from pyfleet.service.client import Client
from support.service import batch
from pyfleet.optimizer import SGD
from pyfleet.table import SparseTable
endpoints, worker, workers, mode, steps, quiet, quiet_step, quiet_s = json.loads(sys.argv[1])
with Client(endpoints, worker_index=worker, timeout=60) as c:
    c.create_tables([{{**SparseTable(4, SGD(0.1)).config(), "kind": "sparse",
                      "name": "emb"}}])
    for step in range(steps):
        keys, grads = batch(worker, step, 64, 4, dyadic=True)
        c.pull_sparse("emb", keys)
        c.push_sparse("emb", keys, grads)
        if step == quiet_step:
            c.flush()
            if worker in quiet:
                print("quiet", flush=True)
                time.sleep(quiet_s)  # the quiet step under test: computing, only heartbeats
            else:
                print("barrier", flush=True)
        if mode == "sync":
            c.barrier()
        time.sleep(0.02)  # paces the steps: the load, not a wait
    c.stop_worker()
print("worker done", flush=True)
"""


@pytest.mark.parametrize("mode,workers,quiet", [
    ("async", 2, [0, 1]),      # every worker quiet
    ("sync", 3, [0, 1]),       # worker 2 waits at the barrier for two quiet ones
])
def test_a_stopped_then_continued_server_finishes_the_job(mode, workers, quiet, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(support=str(REPO / "tests")))
    steps = 40
    with ServerGroup(1, workers, mode=mode, heartbeat_timeout=HB, barrier_timeout=120) as g:
        procs = [subprocess.Popen(
            [sys.executable, str(script),
             json.dumps([g.endpoints, w, workers, mode, steps, quiet, QUIET_STEP, QUIET])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for w in range(workers)]
        try:
            for w, p in enumerate(procs):  # every worker at step QUIET_STEP
                line = p.stdout.readline().strip()
                assert line == ("quiet" if w in quiet else "barrier"), (
                    w, line, p.stderr.read() if p.poll() is not None else "")
            if mode == "sync":  # the barrier requests said "barrier" reached the server
                barriers = workers * QUIET_STEP + workers - len(quiet)
                with Client(g.endpoints, timeout=30, heartbeat_interval=0) as c:
                    wait_for_counter(c, "op_barrier", barriers, 60)
            assert all(p.poll() is None for p in procs), "the job ended before the stall"
            g.procs[0].send_signal(signal.SIGSTOP)
            time.sleep(STALL)  # the stall under test: longer than the heartbeat timeout
            g.procs[0].send_signal(signal.SIGCONT)
            outs = [p.communicate(timeout=120) for p in procs]
            codes = [p.returncode for p in procs]
            assert codes == [0] * workers, (codes, [e[-2000:] for _, e in outs])
            assert all("worker done" in o for o, _ in outs)
            # every worker stopped: the server exits 0 (not 1, "gives up")
            assert g.wait(30) == [0]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)

"""A collective job whose ranks run on two hosts made of network namespaces
(tests/support/netns.py): mpirun, started on host 1, reaches host 2 through an ssh
stand-in that enters its namespace. A rank stopped (SIGSTOP) or stalled on the other
host is named by the rank that waits for it, within the stall bound
(``PYFLEET_COLLECTIVE_TIMEOUT``).

Skipped, with the reason, where the kernel or the user cannot make namespaces.
"""

import os
import subprocess
import sys
import time

import pytest
from support.mpi import mpi_env
from support.netns import mpi_hosts

from pyfleet.launch.collective import find_mpiexec

pytestmark = [pytest.mark.slow, pytest.mark.mpi, pytest.mark.timeout(300)]


@pytest.fixture
def hosts(tmp_path):
    with mpi_hosts(2, tmp_path) as h:
        yield h


@pytest.mark.parametrize("how, named", [
    ("--sigstop-at", "rank 1 did not answer (stopped, or its machine unreachable)"),
    ("--stall-at", "rank 1 stalled: it never reached this collective"),
])
def test_a_rank_stalled_on_another_host_is_named(hosts, tmp_path, how, named):
    # The attack: SIGSTOP (or stall) the rank on the second host. The ranks of one
    # machine see each other's progress in shared memory only: the waiting rank said
    # "a rank on another machine died or stalled". Now it asks the other machines' ranks.
    env = mpi_env({"PYFLEET_COLLECTIVE_TIMEOUT": "5"})
    for k in ("OMPI_MCA_btl", "OMPI_MCA_btl_vader_single_copy_mechanism",
              "OMPI_MCA_oob_tcp_if_include"):   # loopback-only settings: these hosts talk TCP
        env.pop(k)
    out = tmp_path / "out"
    out.mkdir()
    a, b = hosts.addrs
    argv = [find_mpiexec(), "--host", f"{a}:1,{b}:1", "-np", 2, "--bind-to", "none",
            *[x for k in ("PATH", "PYTHONPATH", "PYFLEET_COLLECTIVE_TIMEOUT",
                          "OPENBLAS_NUM_THREADS") for x in ("-x", k)],
            sys.executable, "-m", "support.collective_job", "collective", out,
            "--steps", 6, "--batch", 8, how, 2]
    t0 = time.monotonic()
    # the stalled rank sleeps 600 s: the 150 s bound here is the job's own stall bound
    r = subprocess.run(hosts.on(0, argv), env=hosts.mpi_env(env), cwd=tmp_path,
                       capture_output=True, text=True, timeout=150)
    took = time.monotonic() - t0
    text = r.stdout + r.stderr
    assert r.returncode != 0, text[-3000:]
    assert hosts.launches() == [b]      # rank 1 ran on the other host
    assert "rank 0 of 2 waited more than 5 s in the dense all-reduce of step 2: " + named \
        in text, text[-3000:]
    assert not os.listdir(out)          # nobody finished
    print(f"{how[2:]} rank on another host: job ended after {took:.1f} s")

"""``python -m pyfleet.launch --mode hybrid``: the servers start as in any mode, the workers
as one ``mpiexec`` job (real processes on 127.0.0.1, bounded by timeouts). The script is a
plain Fleet script: the launcher's mode makes it hybrid, each worker takes its MPI rank as
index, the dense replicas stay identical and the servers hold only the sparse table."""

import json
import os
import shutil
import subprocess
import sys

from support import REPO
from support.mpi import MPI_MARKS

pytestmark = MPI_MARKS

SCRIPT = REPO / "tests" / "support" / "hybrid_script.py"
OPEN_MPI = shutil.which("mpirun") is not None and "Open MPI" in subprocess.run(
    ["mpirun", "--version"], capture_output=True, text=True, timeout=30, check=False).stdout


def launch(tmp_path, *args, timeout=150):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYFLEET_", "PADDLE_", "OMPI_", "PMI", "TRAINING_ROLE"))}
    env.update({"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "OMPI_MCA_oob_tcp_if_include": "lo", "OMP_NUM_THREADS": "1"})
    return subprocess.run([sys.executable, "-m", "pyfleet.launch", *args],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path, check=False)


def test_hybrid_launch_starts_the_servers_and_one_mpi_job_of_workers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = launch(tmp_path, "--mode", "hybrid", "--servers", "1", "--workers", "2",
               "--timeout", "120", "--log-dir", str(tmp_path / "logs"), str(SCRIPT), str(out),
               "--steps", "12")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "1 server(s) at 127.0.0.1:" in r.stderr and "2 worker(s) as one MPI job" in r.stderr
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["server.0.log",
                                                                      "workers.log"]
    got = [json.loads((out / f"worker{i}.json").read_text()) for i in range(2)]
    for i, info in enumerate(got):
        assert (info["index"], info["num"], info["rank"]) == (i, 2, i)
        assert (info["mode"], info["sparse_mode"]) == ("hybrid", "sync")
        if OPEN_MPI:   # waiting ranks leave the cores to the others
            assert info["yield_when_idle"] == "1"
        assert info["checksum"] == got[0]["checksum"] and len(info["checksum"]) == 4
        assert info["losses"][-1] < 0.7 * info["losses"][0], info["losses"]
        for s in info["stats"]:   # the servers run the sparse side and hold no dense table
            assert s["mode"] == "sync"
            assert list(s["tables"]) == ["emb"], s["tables"]


def test_a_killed_worker_rank_ends_the_hybrid_job(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = launch(tmp_path, "--mode", "hybrid", "--servers", "1", "--workers", "2",
               "--timeout", "120", str(SCRIPT), str(out), "--steps", "50", "--die-at", "3")
    # mpiexec ends on the dead rank (naming it), not the launcher's --timeout (124)
    assert r.returncode not in (0, 124), r.stderr[-3000:]
    assert "rank 1" in r.stdout + r.stderr and "signal 9" in r.stdout + r.stderr
    assert "workers exited with code" in r.stderr, r.stderr[-3000:]
    assert "stopping the other roles" in r.stderr
    assert not list(out.iterdir())


def test_hybrid_launch_across_hosts_refuses_a_first_host_that_is_not_this_machine(tmp_path):
    # the servers run beside the launcher, on the first host: "a" is no address of this one
    r = launch(tmp_path, "--mode", "hybrid", "--hosts", "a,b", "--workers", "2", str(SCRIPT),
               "x", timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "on the first host (a), and this machine cannot listen there" in r.stderr
    assert "start it on a" in r.stderr
    assert not (tmp_path / "x").exists()

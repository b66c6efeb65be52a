"""Collective mode under a real ``mpirun`` (Open MPI from the package index), ranks on
127.0.0.1: the 2-rank job equals one process training on both halves, replicas stay
bit-identical, checkpoints cross between collective and parameter-server jobs, a
killed rank ends the job, and ranks with different programs are named."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from support import REPO
from support.mpi import MPI_MARKS, mpi_env

pytestmark = MPI_MARKS

STEPS, BATCH = 6, 8



def run_job(out, np_=2, *args, timeout=120, extra_env=None):
    out.mkdir(exist_ok=True)
    cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--allow-run-as-root",
           sys.executable, "-m", "support.collective_job", "collective", str(out),
           "--steps", str(STEPS), "--batch", str(BATCH), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=mpi_env(extra_env), check=False, cwd=out)


def run_single(out, ranks=2):
    out.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "support.collective_job", "single", str(out),
                        "--steps", str(STEPS), "--batch", str(BATCH), "--ranks", str(ranks)],
                       capture_output=True, text=True, timeout=120, env=mpi_env(), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return np.load(out / "single.npz")


def ranks(out, n):
    return [(np.load(out / f"rank{r}.npz"), json.loads((out / f"rank{r}.json").read_text()))
            for r in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_n_ranks_equal_one_process_with_the_whole_batch(tmp_path, n):
    res = run_job(tmp_path / "c", n)
    assert res.returncode == 0, res.stdout + res.stderr
    got = ranks(tmp_path / "c", n)
    ref = run_single(tmp_path / "s", n)
    # Step for step: the mean of the ranks' losses (each over its slice) is the
    # single process's loss over the whole batch, with the same parameters.
    mean_loss = np.mean([a["losses"] for a, _ in got], axis=0)
    np.testing.assert_allclose(mean_loss, ref["losses"], rtol=1e-5, atol=1e-6)
    a0 = got[0][0]
    for key in ref.files:
        if key == "losses":
            continue
        np.testing.assert_allclose(a0[key].astype(np.float64), ref[key].astype(np.float64),
                                   rtol=1e-4, atol=1e-6, err_msg=key)
    # Every key any rank saw is in every replica (most were seen by one rank only).
    assert len(a0["emb.keys"]) == len(ref["emb.keys"]) > 100
    # Replicas bit-identical: values, optimizer state and metadata.
    for a, info in got[1:]:
        assert info["checksum"] == got[0][1]["checksum"]
        for key in a0.files:
            if key != "losses":
                assert np.array_equal(a[key], a0[key]), key
    infos = [info for _, info in got]
    assert [i["rank"] for i in infos] == list(range(n))
    assert all(i["size"] == n for i in infos)
    assert [i["first"] for i in infos] == [True] + [False] * (n - 1)
    assert infos[0]["endpoints"] == infos[-1]["endpoints"] and len(infos[0]["endpoints"]) == n


def test_mismatched_programs_are_named_at_the_first_step(tmp_path):
    res = run_job(tmp_path / "c", 2, "--mismatch", timeout=120)
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "ranks build different programs" in text, text[-3000:]
    assert "'fc_0.w_0' is a dense parameter of shape [8, 4] on rank 0" in text, text[-3000:]
    assert "shape [8, 5] on rank 1" in text, text[-3000:]


def test_a_killed_rank_ends_the_job_naming_it(tmp_path):
    t0 = time.monotonic()
    res = run_job(tmp_path / "c", 3, "--die-at", "2", timeout=120,
                  extra_env={"PYFLEET_COLLECTIVE_TIMEOUT": "30"})
    took = time.monotonic() - t0
    assert res.returncode != 0
    text = res.stdout + res.stderr
    # Open MPI's launcher names the rank that died (the last one, rank 2).
    assert "rank 2" in text and ("signal 9" in text or "Killed" in text), text[-3000:]
    print(f"killed rank: job ended after {took:.1f} s")
    assert not list((tmp_path / "c").glob("rank*.json"))  # nobody finished


@pytest.mark.parametrize("how", ["--stall-at", "--sigstop-at"])
def test_a_stalled_rank_is_named_and_ends_the_job_within_the_stall_bound(tmp_path, how):
    # The attack: SIGSTOP one rank (or one that sleeps). The job used to wait 300 s and
    # name only a waiting rank; the bound is now 60 s by default (--collective-timeout)
    # and the rank that stalled is named.
    from pyfleet.distributed.mpi_group import DEFAULT_TIMEOUT
    assert DEFAULT_TIMEOUT == 60.0
    t0 = time.monotonic()
    res = run_job(tmp_path / "c", 3, how, "2", timeout=120,
                  extra_env={"PYFLEET_COLLECTIVE_TIMEOUT": "3"})
    took = time.monotonic() - t0
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert "waited more than 3 s in the dense all-reduce of step 2: rank 2 stalled: it " \
           "never reached this collective" in text, text[-3000:]
    # (run_job's 120 s timeout, far below the stalled rank's 600 s sleep, bounds it)
    print(f"{how[2:]} rank: job ended after {took:.1f} s")


def test_not_under_mpi_is_one_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "support.collective_job", "collective",
                        str(tmp_path)], capture_output=True, text=True, timeout=60,
                       env=mpi_env(), check=False)
    assert r.returncode != 0
    assert "not started by an MPI launcher" in r.stderr
    assert "pyfleet.launch --collective" in r.stderr and "mpirun -np N" in r.stderr


@pytest.mark.parametrize("entry", [["-m", "pyfleet.launch"], ["-c", "from pyfleet.launch import "
                                   "main; import sys; sys.exit(main())"]])
def test_launcher_starts_the_ranks_with_mpiexec(tmp_path, entry):
    out = tmp_path / "c"
    out.mkdir()
    script = REPO / "tests" / "support" / "collective_job.py"
    r = subprocess.run([sys.executable, *entry, "--collective", "--workers", "2",
                        "--timeout", "100", str(script), "collective", str(out),
                        "--steps", "2"], capture_output=True, text=True, timeout=120,
                       env=mpi_env(), check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    infos = [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]
    assert [(i["rank"], i["size"]) for i in infos] == [(0, 2), (1, 2)]
    assert infos[0]["checksum"] == infos[1]["checksum"]


def test_launcher_refuses_server_options_with_collective(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pyfleet.launch", "--collective", "--servers",
                        "2", "x.py"], capture_output=True, text=True, timeout=60,
                       env=mpi_env(), check=False)
    assert r.returncode == 2 and "--servers does not apply to --collective" in r.stderr

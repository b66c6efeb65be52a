"""Self-healing ``pyfleet train --mode collective|hybrid``: in-pass checkpoints
(``--checkpoint-steps``) and ``--max-restarts`` restart the whole MPI job (and, in hybrid,
the servers) from the latest checkpoint at its recorded step, with no person; the healed
job trains every example once and ends with the test AUC of an undisturbed run.

The attack: a rank SIGKILLed in the middle of a pass. These options used to be refused
for MPI jobs, so a rank's death ended the job and a person had to ``--resume`` it."""

import json
import os
import signal
import subprocess
import sys

import pytest
from support.mpi import MPI_MARKS, mpi_env
from support.procs import trainer_pid
from support.wait import wait_until

pytestmark = [*MPI_MARKS, pytest.mark.timeout(600)]

DEADLINE = 400


def _train(tmp_path, run, mode):
    servers = ["--servers", "1"] if mode == "hybrid" else []
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--mode", mode, "--rows", "60000",
           "--batch-size", "128", "--layers", "32,16", "--embedding-dim", "8", "--workers",
           "2", *servers, "--run-dir", str(tmp_path / run), "--cache-dir",
           str(tmp_path.parent / "heal-mpi-cache"), "--quiet", "--json", "--timeout",
           str(DEADLINE - 30), "--checkpoint-steps", "20", "--max-restarts", "2",
           "--seed", "1"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path), env=mpi_env())


def _rank_pid(run_dir, rank):
    """The pid of MPI rank ``rank`` of the job training into ``run_dir``, or None."""
    return trainer_pid(run_dir, f"OMPI_COMM_WORLD_RANK={rank}")


def _summary(proc):
    out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err[-4000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _killing_rank_1(tmp_path, run, mode):
    proc = _train(tmp_path, run, mode)
    run_dir = str(tmp_path / run)
    manifest = os.path.join(run_dir, "checkpoint", "MANIFEST.json")

    def rank_1():  # once the first in-pass checkpoint is committed
        assert proc.poll() is None, "the job ended before the kill: " + proc.stderr.read()
        return os.path.exists(manifest) and _rank_pid(run_dir, 1)

    os.kill(wait_until(rank_1, DEADLINE, "rank 1 to kill"), signal.SIGKILL)
    return _summary(proc)


def test_a_collective_job_heals_from_a_killed_rank_with_the_model_of_an_undisturbed_run(
        tmp_path):
    healed, err = _killing_rank_1(tmp_path, "healed", "collective")
    assert [r["role"] for r in healed["restarts"]] == ["workers"], healed["restarts"]
    assert "restarting the whole job (restart 1 of at most 2" in err
    calm, _ = _summary(_train(tmp_path, "calm", "collective"))
    assert calm["restarts"] == []
    assert healed["train_examples"] == calm["train_examples"] > 0  # every example once
    assert abs(healed["test_auc"] - calm["test_auc"]) <= 0.002, (healed["test_auc"],
                                                                  calm["test_auc"])


def test_a_hybrid_job_heals_its_ranks_and_servers_from_one_checkpoint(tmp_path):
    healed, err = _killing_rank_1(tmp_path, "healed", "hybrid")
    assert [r["role"] for r in healed["restarts"]] == ["workers"], healed["restarts"]
    assert healed["train_examples"] == 54000   # 60,000 rows less the 10% held out
    assert healed["test_auc"] > 0.7

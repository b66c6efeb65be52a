"""``pyfleet train --mode hybrid|collective``: the options these MPI jobs take, checked
before anything is written (docs/collective.md)."""

import importlib.util
import sys

from pyfleet._extras import install_hint
from pyfleet.launch.collective import find_mpiexec

MPI_MODES = ("hybrid", "collective")

# Options that need the servers' tables (collective mode has no server).
_SERVER_ONLY = (("admission_count", "--admission-count"), ("show_click", "--show-click"),
                ("shrink_min_score", "--shrink-min-score"),
                ("shrink_unseen_passes", "--shrink-unseen-passes"),
                ("curve_dir", "--curve-dir"))
# Options whose restart and in-pass checkpoint machinery is not wired to MPI workers yet.
_NOT_YET = (("checkpoint_steps", "--checkpoint-steps"),
            ("checkpoint_every", "--checkpoint-every"), ("max_restarts", "--max-restarts"))


def check_mode_options(args, explicit):
    """Refuse, by name, what the chosen ``--mode`` cannot do; for ``collective`` set
    ``args.servers`` to 0. ``explicit``: the dests given on the command line."""
    if args.sparse_mode is not None and args.mode != "hybrid":
        raise SystemExit(f"pyfleet train: --sparse-mode is the servers' side of --mode "
                         f"hybrid, not of --mode {args.mode} (set --mode itself)")
    if args.mode not in MPI_MODES:
        return
    for dest, flag in _NOT_YET:
        if getattr(args, dest, None):
            raise SystemExit(f"pyfleet train: {flag} is not available with --mode {args.mode} "
                             f"yet (checkpoints are written at pass ends)")
    if args.mode == "collective":
        if "servers" in explicit and args.servers != 0:
            raise SystemExit("pyfleet train: --mode collective has no server: drop "
                             "--servers (every worker holds the whole model)")
        for dest, flag in _SERVER_ONLY:
            if getattr(args, dest, None):
                raise SystemExit(f"pyfleet train: {flag} acts on the servers' tables and "
                                 f"--mode collective has no server")
        args.servers = 0
    if find_mpiexec() is None:
        raise SystemExit(f"pyfleet train: --mode {args.mode} starts the workers as one MPI "
                         f"job and there is no mpiexec beside {sys.executable} nor on PATH: "
                         f"{install_hint('mpi')}")
    if importlib.util.find_spec("mpi4py") is None:
        raise SystemExit(f"pyfleet train: --mode {args.mode} needs mpi4py: "
                         f"{install_hint('mpi')}")

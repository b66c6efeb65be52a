"""``pyfleet train --mode hybrid|collective``: the options these MPI jobs take, checked
before anything is written (docs/collective.md)."""

import importlib.util
import os
import sys

from pyfleet._extras import install_hint
from pyfleet.launch.collective import find_mpiexec

MPI_MODES = ("hybrid", "collective")

# Options that need the servers' tables (collective mode has no server).
_SERVER_ONLY = (("admission_count", "--admission-count"), ("show_click", "--show-click"),
                ("shrink_min_score", "--shrink-min-score"),
                ("shrink_unseen_passes", "--shrink-unseen-passes"),
                ("curve_dir", "--curve-dir"))


def check_mode_options(args, explicit):
    """Refuse, by name, what the chosen ``--mode`` cannot do; for ``collective`` set
    ``args.servers`` to 0. ``explicit``: the dests given on the command line."""
    if args.sparse_mode is not None and args.mode != "hybrid":
        raise SystemExit(f"pyfleet train: --sparse-mode is the servers' side of --mode "
                         f"hybrid, not of --mode {args.mode} (set --mode itself)")
    timeout = getattr(args, "collective_timeout", None)
    if timeout is not None and not (timeout > 0 and args.mode in MPI_MODES):
        raise SystemExit(f"pyfleet train: --collective-timeout {timeout:g}: a number of "
                         f"seconds > 0, for --mode collective or hybrid (this job is "
                         f"{args.mode})")
    if args.mode not in MPI_MODES:
        return
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


def check_scale_out_options(args):
    """Check --hosts/--hostfile/--port and --emit-k8s with every other option; the hosts
    (None: this machine)."""
    from pyfleet.errors import ConfigError
    from pyfleet.launch.collective import find_mpiexec
    from pyfleet.launch.hosts import host_list
    many = args.hosts is not None or args.hostfile is not None
    if args.port is not None and not many:
        raise SystemExit("pyfleet train: --port is the servers' first port with --hosts")
    if args.image is not None and args.emit_k8s is None:
        raise SystemExit("pyfleet train: --image is the container image of --emit-k8s")
    if args.emit_k8s is not None and args.resume:
        raise SystemExit("pyfleet train: --emit-k8s writes a new job; --resume continues a "
                         "run here (on the cluster, apply the job again with its volume)")
    if args.emit_k8s is not None and many:
        raise SystemExit("pyfleet train: --emit-k8s writes a Kubernetes job (its pods are "
                         "the hosts): drop --hosts/--hostfile")
    if args.emit_k8s is not None and args.mode in ("hybrid", "collective"):
        raise SystemExit(f"pyfleet train: --emit-k8s writes parameter-server jobs (sync, "
                         f"async, geo); --mode {args.mode} runs under the MPI Operator "
                         f"(examples/k8s/pyfleet-mpijob.yaml)")
    if not many:
        return None
    if args.mode == "collective" and args.port is not None:
        raise SystemExit("pyfleet train: --port is the servers' first port with --hosts, and "
                         "--mode collective has no server")
    if args.port is not None and not 1024 <= args.port <= 65535 - args.servers:
        raise SystemExit(f"pyfleet train: --port must be in 1024..{65535 - args.servers} "
                         f"(server i listens on PORT+i), got {args.port}")
    try:
        names = host_list(args.hosts, args.hostfile)
    except ConfigError as e:
        raise SystemExit(f"pyfleet train: {e}") from None
    if args.mode == "hybrid":
        _check_servers_here(names[0])
    if find_mpiexec() is None:
        from pyfleet._extras import install_hint
        raise SystemExit(f"pyfleet train: --hosts starts the job through mpirun and there "
                         f"is none beside {sys.executable} nor on PATH: "
                         f"{install_hint('mpi')}")
    return names


def _check_servers_here(host):
    """A hybrid job's servers run beside ``pyfleet train``, on the first host: refused
    by name when this machine has no address ``host``."""
    import socket
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as s:
            s.bind((host, 0))
    except OSError as e:
        raise SystemExit(f"pyfleet train: --mode hybrid --hosts runs the servers beside "
                         f"pyfleet train, on the first host ({host}), and this machine "
                         f"cannot listen there ({e.strerror or e}): start it on {host}") \
            from None


def check_tables_start(job):
    """With --memory-budget: build each sparse table of the job here as a server would
    (its share of the budget, a disk tier in --spill-dir), so that a budget below the
    table's minimum or a spill directory the tables cannot write is refused before the
    cluster starts, not by every server after it did."""
    if job.get("memory_budget") is None:
        return
    from pyfleet.table import SparseTable
    from pyfleet.trainer.job import tables_of
    spill = job.get("spill_dir")
    if spill is not None and not os.path.isdir(spill):
        try:  # the servers make it too; making it here shows it can be made
            os.makedirs(spill, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"pyfleet train: --spill-dir {spill}: cannot create it: "
                             f"{e.strerror}") from None
    for cfg in tables_of(job):
        if cfg.get("kind") != "sparse":
            continue
        try:
            table = SparseTable.from_config({k: v for k, v in cfg.items() if k != "kind"})
        except (OSError, ValueError, RuntimeError) as e:
            share = "" if cfg.get("memory_budget") == job["memory_budget"] else (
                f" (its share of --memory-budget: {cfg.get('memory_budget'):,} bytes)")
            raise SystemExit(f"pyfleet train: the sparse table {cfg['name']!r} cannot start "
                             f"with --memory-budget {job['memory_budget']:,} and --spill-dir "
                             f"{spill}{share}: {e}") from None
        del table

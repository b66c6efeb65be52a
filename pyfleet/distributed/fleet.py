"""Fleet: PaddlePaddle Fluid 1.5's parameter-server Fleet API over pyfleet's service.

``from pyfleet import fleet`` gives the module-level singleton, used as in Paddle::

    fleet.init(role_maker)                        # role resolved once, validated, frozen
    optimizer = fleet.distributed_optimizer(Adam(learning_rate=0.001), config)
    optimizer.minimize(avg_cost)                  # tables and dense placement decided here
    if fleet.is_server():
        fleet.init_server(model_dir)              # create this server's shards; maybe load
        fleet.run_server()                        # serve until every worker stopped
    elif fleet.is_worker():
        fleet.init_worker()                       # connect (waiting for servers), create tables
        exe.run(fleet.startup_program)
        ... exe.run(fleet.main_program, feed=..., fetch_list=...)
        fleet.save_persistables(exe, dirname)     # every server saves its shards, in parallel
        fleet.stop_worker()

Where things live: every sparse embedding table (an ``embedding`` with
``is_distributed=True``/``is_sparse=True``, named by its ``param_attr``) is
sharded over all servers by ``pyfleet.route(key, S)``; every dense parameter
is placed by ``DistributeTranspilerConfig.split_method`` (cut into blocks by
``slice_var_up``), the same placement computed on every process. Every process
of a job must build the same program (as in Paddle).

Checkpoint paths: servers write under their checkpoint root, which is
``$PYFLEET_CHECKPOINT_DIR`` or, unset, the directory the process started in
(the launcher starts every role in the same one). ``dirname`` may be relative
to it or an absolute path inside it; a path outside it is refused, so no
request from the network can write elsewhere.
"""

import atexit
import logging
import os
import sys

from pyfleet import _malloc
from pyfleet import config as _config
from pyfleet.distributed import hybrid, remote_paths, worker_return
from pyfleet.distributed.checkpoint_paths import (
    checkpoint_root,
    load_model_dir,
    relative_to_root,
)
from pyfleet.distributed.fleet_base import FleetBase
from pyfleet.distributed.fleet_saves import check_executor, checked_meta, delta_base
from pyfleet.distributed.remote_backend import NoServers, RemoteBackend
from pyfleet.distributed.role_maker import default_role_maker
from pyfleet.distributed.strategy import DistributedStrategy, job_config
from pyfleet.distributed.tables import server_table_configs, servers_regularize, table_configs
from pyfleet.entry import Entry
from pyfleet.errors import ConfigError, PeerTimeout, PyfleetError
from pyfleet.fluid import inference
from pyfleet.fluid.framework import default_startup_program
from pyfleet.fluid.io import check_local_path, load_scope_state, save_scope_state
from pyfleet.fluid.optimizer import minimize
from pyfleet.optimizer import Optimizer
from pyfleet.service import checkpoint as _checkpoint
from pyfleet.service.auth import client_options_from_env, server_options_from_env
from pyfleet.service.client import Client
from pyfleet.service.server import Server
from pyfleet.table import STORAGE_TYPES, check_spill_options

__all__ = [
    "MANIFEST_NAME",
    "DistributedOptimizer",
    "Fleet",
    "RemoteBackend",
    "checkpoint_root",
    "fleet",
    "server_table_configs",
    "table_configs",
]

_log = logging.getLogger("pyfleet.fleet")

MANIFEST_NAME = _checkpoint.MANIFEST_NAME
MANIFEST_VERSION = _checkpoint.MANIFEST_VERSION


class DistributedOptimizer:
    """``fleet.distributed_optimizer(optimizer, strategy)``: ``minimize`` builds the
    program as usual and decides where every parameter lives."""

    def __init__(self, fleet_, optimizer, strategy):
        self._fleet = fleet_
        self._optimizer = optimizer
        self._strategy = strategy

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        result = minimize(self._optimizer, loss, startup_program=startup_program,
                          parameter_list=parameter_list, no_grad_set=no_grad_set)
        self._fleet._set_program(loss.block.program,
                                 startup_program or default_startup_program(),
                                 self._strategy, getattr(self, "_sparse_entry", None),
                                 getattr(self, "_sparse_storage", "fp32"),
                                 getattr(self, "_sparse_spill", (None, None)))
        return result


class TranspilerOptimizer(DistributedOptimizer):
    """Fluid's class of the same name, built directly: ``TranspilerOptimizer(optimizer,
    strategy=None)`` wraps ``optimizer`` for the process's :data:`fleet`, as
    ``fleet.distributed_optimizer`` does, with Fluid's checks (a pyfleet optimizer
    rule; a ``DistributeTranspilerConfig``, a :class:`StrategyFactory` strategy or
    None) and Fluid's ``minimize(loss, scopes=None, startup_program=None, ...)``."""

    def __init__(self, optimizer, strategy=None):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an instance of Optimizer, got {optimizer!r}")
        if strategy is not None and not isinstance(
                strategy, (_config.DistributeTranspilerConfig, DistributedStrategy)):
            raise TypeError(f"strategy must be an instance of DistributeTranspilerConfig, "
                            f"SyncStrategy, AsyncStrategy or GeoStrategy, got {strategy!r}")
        super().__init__(fleet, optimizer, job_config(strategy))

    def minimize(self, loss, scopes=None, startup_program=None, parameter_list=None,
                 no_grad_set=None):
        if isinstance(loss, list):
            raise TypeError("TranspilerOptimizer.minimize takes one loss, not a list")
        if isinstance(startup_program, list):
            raise TypeError("TranspilerOptimizer.minimize takes one startup program, "
                            "not a list")
        if not hasattr(loss, "block"):
            raise TypeError(f"loss must be a Variable of the program, got {loss!r}")
        return super().minimize(loss, startup_program, parameter_list, no_grad_set)


class Fleet(FleetBase):
    """The parameter-server Fleet (one per process: use :data:`fleet`)."""

    def __init__(self):
        super().__init__()
        self._server = None
        self._client = None
        self._backend = None
        self._placement = None
        self._last_save = None  # (abs dir, head id) of this worker's last committed save
        self._staying = None    # the client of a worker stopped with may_return
        self._hdfs_config = None

    def init(self, role_maker=None):
        """Resolve this process's role once (default: MPI under mpirun, else the
        environment contract of docs/fleet.md, else a ConfigError saying what to set).
        The process keeps its freed buffers mapped from here on (a training role's
        step reuses the same few MB every batch: :mod:`pyfleet._malloc`)."""
        if role_maker is None:
            role_maker = default_role_maker()
        self._check_role_maker(role_maker)
        role_maker.generate_role()
        self._role = role_maker
        _malloc.keep_freed_memory(_malloc.SERVER if role_maker.is_server() else _malloc.WORKER)

    def set_hdfs_config(self, fs_name=None, fs_ugi=None, **kwargs):
        """Fluid's HDFS settings (``fleet._hdfs_config``): the ``hadoop fs -D`` options of
        saves and loads at ``hdfs:``/``afs:`` paths (:mod:`pyfleet.distributed.remote_paths`;
        other Hadoop settings as keyword arguments)."""
        self._hdfs_config = {"fs_name": fs_name, "fs_ugi": fs_ugi, **kwargs}

    # ------------------------------------------------------------- programs
    def distributed_optimizer(self, optimizer, strategy=None, sparse_entry=None,
                              sparse_storage="fp32", sparse_memory_budget=None,
                              sparse_spill_dir=None):
        """Wrap ``optimizer`` with a :class:`DistributeTranspilerConfig` (default one if None).

        ``sparse_entry`` (a pyfleet extension): an admission policy from
        :mod:`pyfleet.entry` (e.g. ``CountFilterEntry(2)``) given to every
        sparse table; None admits every key on first sight (Fluid 1.5).
        ``sparse_storage`` (a pyfleet extension): how every sparse table holds
        its rows, ``"fp32"``, ``"fp16"``, ``"bf16"``, or with Adam/Adagrad
        ``"fp16_q8"``/``"bf16_q8"`` (8-bit optimizer state; see
        :class:`pyfleet.SparseTable`'s ``storage``; docs/storage.md).
        ``sparse_memory_budget`` (bytes) and ``sparse_spill_dir`` (pyfleet
        extensions, both or neither): a disk tier on every server, the budget
        split evenly among the program's sparse tables, ``sparse_spill_dir``
        a directory on the servers' machines (docs/disk_tier.md)."""
        check_spill_options(sparse_memory_budget, sparse_spill_dir, "sparse_")
        if sparse_storage not in STORAGE_TYPES:
            raise ValueError(f"sparse_storage must be one of {', '.join(STORAGE_TYPES)}, "
                             f"got {sparse_storage!r}")
        if sparse_entry is not None and not isinstance(sparse_entry, Entry):
            raise ValueError(f"sparse_entry must be a pyfleet.entry policy or None, "
                             f"got {sparse_entry!r}")
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
        opt = DistributedOptimizer(self, optimizer, job_config(strategy))
        opt._sparse_entry = sparse_entry
        opt._sparse_storage = sparse_storage
        opt._sparse_spill = (sparse_memory_budget, sparse_spill_dir)
        return opt

    def _set_program(self, main, startup, strategy, sparse_entry=None, sparse_storage="fp32",
                     sparse_spill=(None, None)):
        self.main_program, self.startup_program, self._strategy = main, startup, strategy
        self._spill_root = sparse_spill[1]  # the operator's: where peers' disk tiers may go
        startup._after_run = [self._restore_scope_state]
        if self._client is None:  # workers: the first run that needs the servers connects
            self._set_backend(NoServers(
                "this fleet program's parameters live on the servers: call "
                "fleet.init_worker() (on a worker) before running fleet.main_program",
                connect=self._connect_on_first_use))
        self._tables, dense_shapes = table_configs(main, sparse_entry, sparse_storage,
                                                   servers_regularize(strategy), *sparse_spill)
        self._placement = [  # hybrid: the servers hold no dense parameter
            (b.name, b.start, b.end, b.server_index)
            for b in _config.place_dense(dense_shapes, self.server_num(), strategy)
            if not strategy.hybrid]

    def _transpile(self, config):
        """Fluid's internal step of ``minimize``: a config or strategy of the wrong type is
        Fluid's TypeError; a right one is refused by name (pyfleet places the program
        in ``distributed_optimizer(...).minimize()``, which takes the config)."""
        if not isinstance(config, (_config.DistributeTranspilerConfig, DistributedStrategy)):
            raise TypeError(f"config must be an instance of DistributeTranspilerConfig, "
                            f"SyncStrategy, AsyncStrategy or GeoStrategy, got {config!r}")
        raise ConfigError("fleet._transpile(config) is Fluid's internal step of minimize(): "
                          "give the config to fleet.distributed_optimizer(optimizer, config)")

    # --------------------------------------------------------------- server
    def init_server(self, model_dir=None, **kwargs):
        """Create this server's shard of every table; with ``model_dir``, load the
        parameters saved there (by any number of servers): a directory of
        :meth:`save_persistables` (its chain of full + delta saves is replayed, every file
        checked against the manifest's sha256 first), or a list of them, a base then its
        deltas in order. A relative ``model_dir`` is taken from the checkpoint root
        (``PYFLEET_CHECKPOINT_DIR``); the load is this process's own, so it may be outside
        that root, to which only the saves and loads workers request are confined. A
        damaged or incomplete checkpoint is a ValueError naming the file; one of another
        model (a table it lacks, or holds with another dim or shape) a ValueError naming
        the table and both forms. ``PYFLEET_RESTORE_DIR`` (a restarted job,
        docs/operations.md), once it holds a manifest, is loaded instead. An empty
        ``model_dir`` (``""``: PaddleRec's default) loads nothing, as in Fluid."""
        model_dir = model_dir if isinstance(model_dir, os.PathLike) or model_dir else None
        restore = os.environ.get("PYFLEET_RESTORE_DIR")
        if restore and os.path.exists(os.path.join(restore, MANIFEST_NAME)):
            model_dir = os.path.abspath(restore)
        for d in model_dir if isinstance(model_dir, (list, tuple)) else [model_dir]:
            if d is not None:
                check_local_path(d, "model_dir")
        role = self._role_maker()
        if not role.is_server():
            raise ConfigError("fleet.init_server() called on a worker")
        self._require_program("init_server")
        rt = self._strategy.runtime
        kwargs = {**server_options_from_env(), **kwargs}  # CURVE keys: docs/operations.md
        self._server = Server(role.current_endpoint(), role.server_index(), role.server_num(),
                              role.worker_num(), mode=self._strategy.sparse_mode,
                              tables=server_table_configs(self._tables, self._placement,
                                                          role.server_index()),
                              heartbeat_timeout=rt.heartbeat_timeout,
                              barrier_timeout=rt.barrier_timeout,
                              checkpoint_dir=checkpoint_root(),
                              spill_root=self._spill_root, **kwargs)
        if model_dir is not None:
            try:
                rows = load_model_dir(self._server, model_dir, self._tables)
            except BaseException:
                self._server.close()  # its port too: a corrected init_server may bind it
                self._server = None
                raise
            _log.info("server %d: loaded %s from %s", role.server_index(),
                      ", ".join(f"{t} {n} {'values' if '[' in t else 'rows'}"
                                for t, n in sorted(rows.items())), model_dir)

    def run_server(self):
        """Serve until every worker called ``stop_worker`` (then return). Raises
        PyfleetError naming the worker(s) when the workers that did not stop
        died instead (silent past the heartbeat timeout): the process then
        exits non-zero, so a launcher sees the job failed."""
        if self._server is None:
            raise ConfigError("call fleet.init_server() before fleet.run_server()")
        server = self._server
        try:
            server.run()
        finally:
            self._server = None
            self._served = True
        if server.failure is not None:
            raise PyfleetError(server.failure)

    # --------------------------------------------------------------- worker
    def init_worker(self):
        """Connect to every server (waiting up to ``runtime.connect_timeout`` for
        them to come up), create the tables, and point the programs at them.

        Optional, as in Fluid's sync mode: the first run of the fleet's program
        that reads a parameter calls it. A worker process that ends normally
        without :meth:`stop_worker` stops at exit (an ``atexit`` hook), so
        scripts of the era that never call it end their job cleanly; one that
        ends with an uncaught exception does not: the servers see it fail."""
        role = self._role_maker()
        if not role.is_worker():
            raise ConfigError("fleet.init_worker() called on a server")
        self._require_program("init_worker")
        if self._client is not None:  # connected already (by a first run): nothing to do
            return
        _install_exit_hook(self)
        rt = self._strategy.runtime
        retries = _config.rpc_retry_times()  # Fluid's FLAGS_rpc_retry_times, when set
        options = client_options_from_env()
        if retries is not None:
            options["push_retries"] = retries
        staying, self._staying = self._staying, None
        try:
            self._client = worker_return.rejoin(staying) if staying is not None else Client(
                role.server_endpoints(), worker_index=role.worker_index(),
                timeout=rt.request_timeout, connect_deadline=rt.connect_timeout, **options)
        except PeerTimeout as exc:
            if staying is not None or not getattr(self, "_stopped", False):
                raise
            raise PeerTimeout(f"{exc}. This worker called fleet.stop_worker() before: the "
                              f"servers end the job once every worker has stopped, so they "
                              f"may be gone; to start again, stop with "
                              f"fleet.stop_worker(may_return=True)") from exc
        if self._strategy.hybrid:  # dense replicas all-reduced among the workers' MPI job
            group = hybrid.open_group(role)
            self._client.create_tables(hybrid.sparse_only(self._tables), [])
            self._backend = hybrid.HybridBackend(self._client, self._strategy, group)
        else:
            self._client.create_tables(self._tables, self._placement)
            self._backend = RemoteBackend(self._client, self._strategy.mode,
                                          self._strategy.geo_k_steps, fleet=self,
                                          tables=self._tables)
        self._set_backend(self._backend)

    def _set_backend(self, backend):
        self.main_program.set_backend(backend)
        self.startup_program.set_backend(backend)

    def _require_worker(self, what):
        if self._client is None:
            raise ConfigError(f"{what} needs fleet.init_worker() first")
        return self._client

    def _connect_on_first_use(self):
        _log.info("fleet.init_worker() was not called: connecting to the servers at the "
                  "first run of the fleet's program (as Fluid's sync mode does)")
        self.init_worker()
        return self._backend

    def _stop_at_exit(self):
        staying, self._staying = self._staying, None
        if staying is not None:  # stopped and may have returned: now it will not
            worker_return.leave(staying)
        if self._client is None or _exit_state["uncaught"]:
            return
        try:
            self.stop_worker()
        except Exception as e:  # noqa: BLE001 (at exit: report, the process ends anyway)
            _log.warning("fleet.stop_worker() at exit failed: %s", e)

    def stop_worker(self, may_return=None):
        """Send what is pending, tell every server this worker is done, disconnect. On a
        server whose run_server() returned (PaddleRec's terminal pass calls it) there is
        nothing left to stop: it returns (a Fluid server has no communicator to stop).
        ``may_return=True`` (Fluid's lifecycle; the default in zero-edit mode): this
        process may call init_worker() and train again, and the servers serve while it
        lives (:mod:`pyfleet.distributed.worker_return`)."""
        if self._client is None and getattr(self, "_served", False):
            return
        client = self._require_worker("stop_worker")
        stay = worker_return.may_return(may_return)
        try:
            self._backend.finish()
            client.stop_worker(may_return=stay)
            if stay:
                self._staying, client = client, None
        finally:
            if client is not None:
                client.close()
            self._client = None
            self._stopped = True
            self._set_backend(NoServers(
                "fleet.stop_worker() was called: this worker is no longer connected to the "
                "servers"))

    def flush(self):
        """Send what this worker holds (async pushes, geo deltas); wait until applied."""
        self._require_worker("flush")
        self._backend.finish()

    def barrier_worker(self):
        """Wait for every worker (a server-side barrier), once this worker's own
        pushes are applied. In sync mode a worker waiting here takes no part
        in the others' step barriers (their steps average the gradients of
        the workers still training): with fewer batches than the others, a
        worker waits for them to finish the pass."""
        client = self._require_worker("barrier_worker")
        self._backend._wait_dense_push()
        client.barrier(kind="pass")

    def save_persistables(self, executor=None, dirname=None, main_program=None, mode="full",
                          meta=None):
        """Every server saves its shard of every table (with optimizer state) and
        its dense blocks into a new generation directory under ``dirname``, in
        parallel; then ``dirname/MANIFEST.json`` (per-file sha256, sizes and row
        counts, server count) is replaced atomically, the commit point: a crash
        before it leaves the previous checkpoint in ``dirname`` loadable (see
        :mod:`pyfleet.service.checkpoint` and docs/operations.md).

        ``mode="delta"`` writes only sparse rows changed since this worker's
        previous save (and dense blocks whole); into the same ``dirname`` it
        extends the chain, elsewhere it starts one to be loaded after its base.
        Without a committed previous save in this process (first save, or the
        previous one failed) a delta is written as a full save. Call it from
        one worker (normally worker 0).

        ``meta``: a JSON object of the caller's own (for example the pass just
        finished), kept as the manifest's ``"meta"``, committed with the
        parameters it describes. The calling worker writes its persistable
        scope state (auc counters) as ``<name>.state.npy`` into the new
        generation, committed with it (``fluid.io.load_persistables`` and
        :meth:`load_persistables` read it back). Returns the manifest."""
        check_executor(executor, main_program, "save_persistables")
        if dirname is None:
            raise ValueError("save_persistables needs dirname")
        check_local_path(dirname, "dirname")
        client = self._require_worker("save_persistables")
        meta = checked_meta(meta)
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        rel, path = relative_to_root(dirname)
        self._backend.finish()
        mode, previous, parent = delta_base(mode, self._last_save, path)
        os.makedirs(path, exist_ok=True)
        gen = _checkpoint.new_generation(path, mode)
        self._last_save = None  # a failed save leaves the servers' delta base unknown
        replies, placement = client.save(os.path.join(rel, gen), mode=mode), self._placement
        if self._strategy.hybrid:  # the dense replicas, as the files of one more server
            replies, placement = hybrid.save_dense(self._backend, self._tables, path, gen,
                                                   replies)
        manifest = _checkpoint.build_manifest(previous, gen, mode, replies, self._tables,
                                              placement, parent, meta)
        # This worker's persistable scope state (auc counters), as Fluid's
        # save_persistables on a trainer writes it, into the new generation: a
        # save cut short before its commit leaves the committed one's untouched.
        if save_scope_state(os.path.join(path, gen), main_program or self.main_program):
            manifest["state_worker"] = self.worker_index()   # whose counters they are
            manifest["state_dir"] = gen
        _checkpoint.commit(path, manifest)
        self._last_save = (path, manifest["id"])
        return manifest

    def save_inference_model(self, executor, dirname, feeded_var_names, target_vars,
                             main_program=None, export_for_deployment=True):
        """A self-contained prediction directory: the network, the dense weights
        and every embedding row (optimizer state dropped), gathered from the
        servers. ``pyfleet.fluid.inference.load(dirname)`` predicts from it."""
        check_executor(executor, main_program, "save_inference_model")
        client = self._require_worker("save_inference_model")
        self._backend.finish()
        program = main_program or self.main_program
        return inference.save(check_local_path(dirname, "dirname"), program,
                              feeded_var_names, target_vars,
                              hybrid.HybridSource(client, self._tables, self._backend)
                              if self._strategy.hybrid
                              else inference.RemoteSource(client, self._tables))

    def push_show_click(self, keys, shows, clicks, tables=None):
        """Add show/click counts of ``keys`` to every sparse table (or those named
        in ``tables``): what ``shrink(min_score=...)`` scores rows by."""
        client = self._require_worker("push_show_click")
        names = tables or [c["name"] for c in self._tables if c["kind"] == "sparse"]
        for name in names:
            client.push_show_click(name, keys, shows, clicks)

    def shrink(self, max_unseen_passes=None, min_score=None, decay=None,
               min_update_count=None):
        """End a pass on every server's sparse tables (see ``SparseTable.shrink``);
        returns each server's rows dropped per table."""
        return self._require_worker("shrink").shrink(
            max_unseen_passes=max_unseen_passes, min_update_count=min_update_count,
            min_score=min_score, decay=decay)

    def _restore_scope_state(self):
        """After the startup program, on the worker whose auc counters the
        checkpoint of a restarted job (``PYFLEET_RESTORE_DIR``) holds: those
        counters, so its running AUC goes on as if undisturbed."""
        restore = os.environ.get("PYFLEET_RESTORE_DIR")
        if not restore or not self._role_maker().is_worker():
            return
        m = _checkpoint.read_manifest(restore)
        if m is not None and m.get("state_worker") == self.worker_index():
            load_scope_state(_checkpoint.state_dir(restore, m), self.main_program)

    def load_persistables(self, executor=None, dirname=None, main_program=None):
        """A worker's part of loading checkpoint ``dirname`` (relative to the
        checkpoint root), after the startup program: the persistable scope
        state (auc counters) :meth:`save_persistables` wrote, and in hybrid
        mode the dense parameters into this worker's replicas (returning
        what :func:`hybrid.load_dense` does; else the state names read). The
        servers load the tables and dense blocks with ``init_server(dirname)``."""
        self._require_worker("load_persistables")
        if dirname is None:
            raise ValueError("load_persistables needs dirname")
        path = relative_to_root(dirname)[1]
        manifest = _checkpoint.read_manifest(path)
        if manifest is None:
            raise ValueError(f"dirname {os.fspath(dirname)!r} has no {MANIFEST_NAME}: not a "
                             f"fleet checkpoint, or an incomplete save")
        names = load_scope_state(_checkpoint.state_dir(path, manifest),
                                 main_program or self.main_program)
        if not self._strategy.hybrid:
            return names
        return hybrid.load_dense(self._backend, self._tables, dirname, checkpoint_root())

    def stats(self):
        """Every server's counters and table stats (workers only)."""
        return self._require_worker("stats").stats()


_exit_state = {"hooked": set(), "uncaught": False}


def _install_exit_hook(fleet_):
    """Stop ``fleet_``'s worker at a normal interpreter exit; an uncaught
    exception (seen through ``sys.excepthook``) leaves it unstopped."""
    if not _exit_state["hooked"]:
        previous = sys.excepthook

        def hook(*exc_info):
            _exit_state["uncaught"] = True
            previous(*exc_info)
        sys.excepthook = hook
    if id(fleet_) not in _exit_state["hooked"]:
        _exit_state["hooked"].add(id(fleet_))
        atexit.register(fleet_._stop_at_exit)


remote_paths.install(Fleet, checkpoint_root)   # saves and loads at hdfs:/afs: paths
fleet = Fleet()

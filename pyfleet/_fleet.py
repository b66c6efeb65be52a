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

import collections
import json
import os

import numpy as np

from pyfleet import _checkpoint
from pyfleet import config as _config
from pyfleet.errors import ConfigError, RemoteError
from pyfleet.fluid.backend import Backend

__all__ = ["Fleet", "DistributedOptimizer", "RemoteBackend", "fleet", "checkpoint_root",
           "MANIFEST_NAME"]

MANIFEST_NAME = _checkpoint.MANIFEST_NAME
MANIFEST_VERSION = _checkpoint.MANIFEST_VERSION


def checkpoint_root():
    """The directory every save/load path is confined to (see the module doc)."""
    return os.path.realpath(os.environ.get("PYFLEET_CHECKPOINT_DIR") or os.getcwd())


def _relative_to_root(dirname):
    root = checkpoint_root()
    path = os.path.realpath(os.path.join(root, os.fspath(dirname)))
    if os.path.commonpath([path, root]) != root or path == root:
        raise ValueError(f"checkpoint directory {os.fspath(dirname)!r} must be inside the "
                         f"checkpoint root {root} (set PYFLEET_CHECKPOINT_DIR to change it)")
    return os.path.relpath(path, root), path


class _NoServers(Backend):
    """The backend of the fleet's programs on a worker before ``init_worker``
    (or after ``stop_worker``): the startup program may run (tables are
    created by ``init_worker``), anything that would read or write a
    parameter raises ConfigError: silently training a local model instead
    of the servers' is worse than failing."""

    def __init__(self, why):
        self.why = why

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        pass

    def create_dense(self, name, initial_value, optimizer):
        pass

    def _refuse(self, *args, **kwargs):
        raise ConfigError(self.why)

    pull_sparse = push_sparse = pull_dense = push_dense = pull_dense_many = _refuse
    push_dense_many = set_dense = save = load = prefetch_sparse = _refuse


class RemoteBackend(Backend):
    """The executor's parameters, held by the servers (see :mod:`pyfleet.fluid.backend`).

    - async: sparse pushes go out in the background (merged while queued),
      and each step's dense push, followed by a pull of the dense values,
      travels in the background during the next step; every push is applied
      on arrival. By default (``dense_staleness = 0``) a step waits for that
      push and pull of the step before, so it reads its own last update. With
      ``dense_staleness = 1`` a step reads the values pulled after its push of
      two steps before and no dense round trip waits in the step (the delay
      of Fluid's async communicator's separate send and receive threads); it
      trains measurably worse early on (test AUC -0.006 after 90k examples of
      the synthetic set), so it is an opt-in.
    - sync: pushes are buffered by the servers; :meth:`step_end` is the
      barrier (after flushing this worker's dense and sparse pushes, sent in
      the background meanwhile) after which the averaged update is applied, so
      the next pull sees every worker's step. Right after the barrier the
      next step's dense values and its prefetched sparse keys
      (:meth:`prefetch_sparse`) are pulled in the background: between two
      barriers the servers' values do not change, so these are exactly what
      the next step's pulls would read.
    - geo: sparse rows train on a local copy; deltas every ``geo_k_steps``.

    Tables are created by :meth:`Fleet.init_worker` from the program, so the
    startup program's ``create_*`` calls only check that the table exists.
    """

    def __init__(self, client, mode, geo_k_steps=100):
        self.client = client
        self.mode = mode
        self.geo = None
        if mode == "geo":
            from pyfleet.client import GeoClient
            self.geo = GeoClient(client, geo_k_steps)
        self._sparse = self.geo or client
        self._dense_pusher = None
        # {name: value} dicts, keys in the order asked for:
        self._dense_push = None   # future of the values pulled after the push
        self._dense_ready = None  # values the next pull_dense_many may take
        self.dense_staleness = 0
        self._prefetched = {}     # table -> deque of (unique keys, PullFuture), oldest first
        self._sync_push = None    # sync: future of this step's dense push
        self._sync_keys = []      # sync: (table, keys) to pull after the next barrier
        self._dense_names = None  # the names of the last pull_dense_many

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        self.client.sparse_dim(name)  # raises if init_worker did not create it

    def create_dense(self, name, initial_value, optimizer):
        self.client.dense_shape(name)

    def pull_sparse(self, name, keys, create=True):
        if not create:  # evaluation: never prefetched, rows not made
            if self.geo is not None:
                return self.geo.pull_sparse(name, keys, create=False)
            return self.client.pull_sparse(name, keys, unique=True, create=False)
        queue = self._prefetched.get(name)
        for i, (ahead, _) in enumerate(queue or ()):
            if ahead.shape == keys.shape and np.array_equal(ahead, keys):
                for _ in range(i):  # prefetches never asked for: consume their replies
                    queue.popleft()[1].result()
                return queue.popleft()[1].result()
        for i, (table, ahead) in enumerate(self._sync_keys):
            if table == name and ahead.shape == keys.shape and np.array_equal(ahead, keys):
                del self._sync_keys[:i + 1]   # pulled now: not again after the barrier
                break
        if self.geo is not None:
            return self.geo.pull_sparse(name, keys)
        return self.client.pull_sparse(name, keys, unique=True)

    def prefetch_sparse(self, name, keys):
        """Async mode: start pulling the rows of ``keys`` (the sorted unique ids the
        executor will ask for in the next step) now, so the round trip overlaps
        this step's compute; the next :meth:`pull_sparse` of exactly these keys
        takes them (at most two wait per table; one older than the keys asked
        for is dropped). The rows may then miss this worker's last step of updates
        (one more step of the staleness async training already has). No-op in
        geo mode, whose pulls read the local copy. In sync mode the pull starts
        right after the next step's barrier (see the class doc)."""
        if self.mode == "sync":
            self._sync_keys.append((name, keys))
            del self._sync_keys[:-4]   # a caller prefetching feeds it never runs
            return
        if self.mode != "async":
            return
        queue = self._prefetched.setdefault(name, collections.deque())
        while len(queue) >= 2:
            queue.popleft()[1].result()
        queue.append((keys, self.client.pull_sparse_async(name, keys, unique=True)))

    def push_sparse(self, name, keys, grads):
        # Sync too: the push travels while the dense push is sent, and step_end's
        # barrier flushes it (raising its error) before the servers apply the step.
        # The executor hands over distinct keys and fresh gradient sums it
        # never touches again (see pyfleet.fluid.backend): no copy, no dedup.
        if self.mode in ("async", "sync"):
            self.client.push_sparse_async(name, keys, grads, unique=True, copy=False)
        else:
            self._sparse.push_sparse(name, keys, grads)

    def pull_dense(self, name):
        return self.client.pull_dense(name)

    def push_dense(self, name, grad):
        self.client.push_dense(name, grad)

    def pull_dense_many(self, names):
        names = list(names)
        self._dense_names = names
        if self.dense_staleness:
            ready, self._dense_ready = self._dense_ready, None
            if ready is not None and list(ready) == names:
                return ready
        elif self._dense_push is not None:
            pending, self._dense_push = self._dense_push, None
            values = pending.result()
            if list(values) == names:
                return values
        return self.client.pull_dense_many(names)

    def _background(self, fn, *args):
        if self._dense_pusher is None:
            from concurrent.futures import ThreadPoolExecutor
            self._dense_pusher = ThreadPoolExecutor(1, thread_name_prefix="pyfleet-dense-push")
        return self._dense_pusher.submit(fn, *args)

    def push_dense_many(self, grads):
        if self.mode == "sync":
            # Travels while the sparse gradients are summed; step_end waits for it.
            self._wait_sync_push()
            self._sync_push = self._background(self.client.push_dense_many, dict(grads))
            return
        if self.mode != "async":
            self.client.push_dense_many(grads)
            return
        # Async (as Fluid's async communicator): the step's dense push, answered
        # with the values after it (one round trip per server), travels while
        # this worker computes (see dense_staleness). One at a time. Sent from
        # this thread; the reply waits in its sockets until asked for: no
        # thread hand-off (measured: 0.7 ms a step of queueing and wake-ups).
        pending, self._dense_push = self._dense_push, None
        if pending is not None:
            ready = pending.result()  # re-raises its error in this thread
            self._dense_ready = ready if self.dense_staleness else None
        self._dense_push = self.client.push_pull_dense_many_async(grads)

    def _wait_sync_push(self):
        pending, self._sync_push = self._sync_push, None
        if pending is not None:
            pending.result()  # re-raises the push's error in the training thread

    def _wait_dense_push(self):
        self._wait_sync_push()
        self._dense_ready = None  # a pull older than whatever comes next
        pending, self._dense_push = self._dense_push, None
        if pending is not None:
            pending.result()  # re-raises the push's error in the training thread

    def step_end(self):
        if self.mode == "sync":
            # A push the servers refused (a NaN gradient, say) is raised after
            # the step's barrier, not instead of it: the other workers' step
            # completes without this worker's gradients, and this worker stays
            # in step with them (skipping the barrier would pair its next step
            # with their current one). Every error of the step is taken here,
            # so none resurfaces at the next step.
            refused = []
            for wait in (self._wait_sync_push, self.client.flush):
                try:
                    wait()
                except RemoteError as e:
                    refused.append(e)
            self.client.barrier(flush=False)
            # The values the next step reads are final now: fetch them meanwhile.
            if self._dense_names and not self.dense_staleness:
                self._dense_push = self._background(self.client.pull_dense_many, self._dense_names)
            keys, self._sync_keys = self._sync_keys, []
            for name, k in keys:
                queue = self._prefetched.setdefault(name, collections.deque())
                while len(queue) >= 2:
                    queue.popleft()[1].result()
                queue.append((k, self.client.pull_sparse_async(name, k, unique=True)))
            if refused:
                raise refused[0]
        elif self.geo is not None:
            self.geo.step()

    def save(self, dirname, params):
        raise ConfigError("the parameters of a fleet program live on the servers: save them "
                          "with fleet.save_persistables(exe, dirname) (a checkpoint) or "
                          "fleet.save_inference_model(exe, dirname, feeds, targets), not "
                          "fluid.io's save functions")

    def load(self, dirname, params):
        raise ConfigError("the parameters of a fleet program live on the servers: load a "
                          "checkpoint with fleet.init_server(model_dir) on the servers, not "
                          "fluid.io's load functions")

    def finish(self):
        """Send what is still local or queued (geo deltas, async pushes)."""
        self._wait_dense_push()
        if self.geo is not None:
            self.geo.sync()
        self.client.flush()


class DistributedOptimizer:
    """``fleet.distributed_optimizer(optimizer, strategy)``: ``minimize`` builds the
    program as usual and decides where every parameter lives."""

    def __init__(self, fleet_, optimizer, strategy):
        self._fleet = fleet_
        self._optimizer = optimizer
        self._strategy = strategy

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        from pyfleet.fluid import framework
        result = framework.minimize(self._optimizer, loss, startup_program=startup_program,
                                    parameter_list=parameter_list, no_grad_set=no_grad_set)
        self._fleet._set_program(loss.block.program,
                                 startup_program or framework.default_startup_program(),
                                 self._strategy, getattr(self, "_sparse_entry", None))
        return result


class Fleet:
    """The parameter-server Fleet (one per process: use :data:`fleet`)."""

    def __init__(self):
        self._role = None
        self._strategy = None
        self._server = None
        self._client = None
        self._backend = None
        self._tables = None
        self._placement = None
        self.main_program = None
        self.startup_program = None
        self._last_save = None  # (abs dir, head id) of this worker's last committed save

    # ----------------------------------------------------------------- roles
    def init(self, role_maker=None):
        """Resolve this process's role once (default: MPI under mpirun, else the
        environment contract of docs/fleet.md, else a ConfigError saying what to set)."""
        from pyfleet.role_maker import RoleMakerBase, default_role_maker
        if role_maker is None:
            role_maker = default_role_maker()
        if not isinstance(role_maker, RoleMakerBase):
            raise ConfigError(f"role_maker must be a pyfleet.role_maker role maker, "
                              f"got {role_maker!r}")
        role_maker.generate_role()
        self._role = role_maker

    def _role_maker(self):
        if self._role is None:
            raise ConfigError("call fleet.init(role_maker) first")
        return self._role

    def is_worker(self):
        return self._role_maker().is_worker()

    def is_server(self):
        return self._role_maker().is_server()

    def is_first_worker(self):
        return self._role_maker().is_first_worker()

    def worker_index(self):
        return self._role_maker().worker_index()

    def server_index(self):
        return self._role_maker().server_index()

    def worker_num(self):
        return self._role_maker().worker_num()

    def server_num(self):
        return self._role_maker().server_num()

    def server_endpoints(self, to_string=False):
        eps = self._role_maker().server_endpoints()
        return ",".join(eps) if to_string else list(eps)

    # ------------------------------------------------------------- programs
    def distributed_optimizer(self, optimizer, strategy=None, sparse_entry=None):
        """Wrap ``optimizer`` with a :class:`DistributeTranspilerConfig` (default one if None).

        ``sparse_entry`` (a pyfleet extension): an admission policy from
        :mod:`pyfleet.entry` (e.g. ``CountFilterEntry(2)``) given to every
        sparse table; None admits every key on first sight (Fluid 1.5)."""
        from pyfleet.entry import Entry
        from pyfleet.optimizer import Optimizer
        if sparse_entry is not None and not isinstance(sparse_entry, Entry):
            raise ValueError(f"sparse_entry must be a pyfleet.entry policy or None, "
                             f"got {sparse_entry!r}")
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
        if strategy is None:
            strategy = _config.DistributeTranspilerConfig()
        if not isinstance(strategy, _config.DistributeTranspilerConfig):
            raise ValueError(f"strategy must be a DistributeTranspilerConfig, got {strategy!r}")
        opt = DistributedOptimizer(self, optimizer, strategy)
        opt._sparse_entry = sparse_entry
        return opt

    def _set_program(self, main, startup, strategy, sparse_entry=None):
        self.main_program, self.startup_program, self._strategy = main, startup, strategy
        if self._client is None:  # workers: until init_worker, no parameter to train
            main._backend = startup._backend = _NoServers(
                "this fleet program's parameters live on the servers: call "
                "fleet.init_worker() (on a worker) before running fleet.main_program")
        self._tables, dense_shapes = table_configs(main, sparse_entry)
        self._placement = [
            (b.name, b.start, b.end, b.server_index)
            for b in _config.place_dense(dense_shapes, self.server_num(), strategy)]

    def _require_program(self, what):
        if self._tables is None:
            raise ConfigError(f"{what} needs the program: call "
                              "fleet.distributed_optimizer(...).minimize(loss) first")

    # --------------------------------------------------------------- server
    def init_server(self, model_dir=None, **kwargs):
        """Create this server's shard of every table; with ``model_dir``, load
        the parameters saved there (by any number of servers): a directory of
        :meth:`save_persistables` (its chain of full + delta saves is replayed,
        every file checked against the manifest's sha256 first), or a list of
        them, a base then its deltas in order. A relative ``model_dir`` is
        taken from the checkpoint root (``PYFLEET_CHECKPOINT_DIR``); the load
        is this process's own, so it may be outside that root, to which only
        the saves and loads workers request are confined. A damaged or
        incomplete checkpoint is a ValueError naming the file; one of another
        model (a table it lacks, or holds with another dim or shape) a
        ValueError naming the table and both forms."""
        from pyfleet.auth import server_options_from_env
        from pyfleet.server import Server
        role = self._role_maker()
        if not role.is_server():
            raise ConfigError("fleet.init_server() called on a worker")
        self._require_program("init_server")
        rt = self._strategy.runtime
        kwargs = {**server_options_from_env(), **kwargs}  # CURVE keys: docs/operations.md
        self._server = Server(role.current_endpoint(), role.server_index(), role.server_num(),
                              role.worker_num(), mode=self._strategy.mode,
                              tables=server_table_configs(self._tables, self._placement,
                                                          role.server_index()),
                              heartbeat_timeout=rt.heartbeat_timeout,
                              barrier_timeout=rt.barrier_timeout,
                              checkpoint_dir=checkpoint_root(), **kwargs)
        if model_dir is not None:
            dirs = model_dir if isinstance(model_dir, (list, tuple)) else [model_dir]
            paths = [os.path.realpath(os.path.join(checkpoint_root(), os.fspath(d)))
                     for d in dirs]
            for path, d in zip(paths, dirs):
                m = _checkpoint.read_manifest(path)
                if m is None:
                    raise ValueError(f"model_dir {os.fspath(d)!r} has no {MANIFEST_NAME}: an "
                                     f"incomplete save, or not a fleet checkpoint")
                _checkpoint.check_tables(m.get("tables") or [], self._tables, os.fspath(d))
            # Loaded relative to the deepest directory holding them all.
            base = os.path.commonpath([os.path.dirname(p) for p in paths])
            rels = [os.path.relpath(p, base) for p in paths]
            self._server.load_checkpoint(rels if isinstance(model_dir, (list, tuple))
                                         else rels[0], root=base)

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
        if server.failure is not None:
            from pyfleet.errors import PyfleetError
            raise PyfleetError(server.failure)

    # --------------------------------------------------------------- worker
    def init_worker(self):
        """Connect to every server (waiting up to ``runtime.connect_timeout`` for
        them to come up), create the tables, and point the programs at them."""
        from pyfleet.auth import client_options_from_env
        from pyfleet.client import Client
        role = self._role_maker()
        if not role.is_worker():
            raise ConfigError("fleet.init_worker() called on a server")
        self._require_program("init_worker")
        rt = self._strategy.runtime
        self._client = Client(role.server_endpoints(), worker_index=role.worker_index(),
                              timeout=rt.request_timeout, connect_deadline=rt.connect_timeout,
                              **client_options_from_env())
        self._client.create_tables(self._tables, self._placement)
        self._backend = RemoteBackend(self._client, self._strategy.mode,
                                      self._strategy.geo_k_steps)
        self.main_program._backend = self._backend
        self.startup_program._backend = self._backend

    def _require_worker(self, what):
        if self._client is None:
            raise ConfigError(f"{what} needs fleet.init_worker() first")
        return self._client

    def stop_worker(self):
        """Send what is pending, tell every server this worker is done, disconnect."""
        client = self._require_worker("stop_worker")
        try:
            self._backend.finish()
            client.stop_worker()
        finally:
            client.close()
            self._client = None
            self.main_program._backend = self.startup_program._backend = _NoServers(
                "fleet.stop_worker() was called: this worker is no longer connected to the "
                "servers")

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
        :mod:`pyfleet._checkpoint` and docs/operations.md).

        ``mode="delta"`` writes only sparse rows changed since this worker's
        previous save (and dense blocks whole); into the same ``dirname`` it
        extends the chain, elsewhere it starts one to be loaded after its base.
        Without a committed previous save in this process (first save, or the
        previous one failed) a delta is written as a full save. Call it from
        one worker (normally worker 0).

        ``meta``: a JSON object of the caller's own (for example the pass just
        finished), kept as the manifest's ``"meta"``, committed with the
        parameters it describes. Returns the manifest."""
        client = self._require_worker("save_persistables")
        if dirname is None:
            raise ValueError("save_persistables needs dirname")
        if meta is not None:
            if not isinstance(meta, dict):
                raise ValueError(f"meta must be a dict (a JSON object), got {type(meta).__name__}")
            try:
                meta = json.loads(json.dumps(meta, allow_nan=False))
            except (TypeError, ValueError) as e:
                raise ValueError(f"meta must be JSON-serializable: {e}") from None
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        rel, path = _relative_to_root(dirname)
        self._backend.finish()
        previous = parent = None
        if mode == "delta":
            if self._last_save is None:
                mode = "full"
            else:
                last_dir, last_id = self._last_save
                parent = last_id
                if last_dir == path:
                    previous = _checkpoint.read_manifest(path)
                    if previous is None or previous["id"] != last_id:
                        mode, previous, parent = "full", None, None
        os.makedirs(path, exist_ok=True)
        gen = _checkpoint.new_generation(path, mode)
        self._last_save = None  # a failed save leaves the servers' delta base unknown
        replies = client.save(os.path.join(rel, gen), mode=mode)
        manifest = _checkpoint.build_manifest(previous, gen, mode, replies, self._tables,
                                              self._placement, parent, meta)
        _checkpoint.commit(path, manifest)
        self._last_save = (path, manifest["id"])
        return manifest

    def save_inference_model(self, executor, dirname, feeded_var_names, target_vars,
                             main_program=None, export_for_deployment=True):
        """A self-contained prediction directory: the network, the dense weights
        and every embedding row (optimizer state dropped), gathered from the
        servers. ``pyfleet.inference.load(dirname)`` predicts from it."""
        from pyfleet import inference
        client = self._require_worker("save_inference_model")
        self._backend.finish()
        program = main_program or self.main_program
        return inference.save(dirname, program, feeded_var_names, target_vars,
                              inference.RemoteSource(client, self._tables))

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

    def stats(self):
        """Every server's counters and table stats (workers only)."""
        return self._require_worker("stats").stats()


def table_configs(program, sparse_entry=None):
    """``(configs, dense_shapes)`` of a minimized program: a create_tables
    config per sparse table and dense parameter, and ``[(name, shape)]`` of the
    dense ones in program order (the order placement depends on).
    ``sparse_entry``: the admission policy of every sparse table (None: none)."""
    entry = None if sparse_entry is None else sparse_entry.to_config()
    opt = program._optimizer
    if opt is None:
        raise ConfigError("the program has no optimizer: call minimize(loss) first")
    configs, dense = [], []
    for p in program.all_parameters():
        popt = p.optimizer or opt
        if p.is_sparse_table:
            configs.append({"kind": "sparse", "name": p.name, "dim": p.dim,
                            "optimizer": popt.to_config(),
                            "initializer": p.initializer.to_config(), "seed": p.seed,
                            "entry": entry})
        else:
            shape = [int(s) for s in p.shape]
            configs.append({"kind": "dense", "name": p.name, "shape": shape,
                            "optimizer": popt.to_config(),
                            "initial": p.initializer.to_config(), "seed": p.seed})
            dense.append((p.name, shape))
    return configs, dense


def server_table_configs(configs, placement, server_index):
    """The configs server ``server_index`` holds: every sparse table, and its
    dense blocks (as ``pyfleet.client.Client.create_tables`` sends them)."""
    out = []
    for cfg in configs:
        if cfg["kind"] == "sparse":
            out.append(cfg)
            continue
        for name, start, end, s in placement:
            if name == cfg["name"] and s == server_index:
                out.append({**cfg, "start": start, "end": end})
    return out


fleet = Fleet()

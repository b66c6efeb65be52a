"""The worker side of a Fleet job's parameters: the executor's backend over the servers.

:class:`RemoteBackend` implements :class:`pyfleet.fluid.backend.Backend` with a
connected :class:`pyfleet.service.client.Client` (and, in geo mode, a
:class:`pyfleet.service.geo.GeoClient`); :class:`NoServers` is the backend of a
worker's programs while no server is connected. :class:`pyfleet.distributed.fleet.Fleet`
sets them on its programs.
"""

import collections
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pyfleet.distributed.checkpoint_paths import relative_to_root
from pyfleet.errors import ConfigError, RemoteError
from pyfleet.fluid.backend import Backend
from pyfleet.fluid.inference import RemoteSource
from pyfleet.service.geo import GeoClient

__all__ = ["NoServers", "RemoteBackend"]

_SAVE_ON_SERVERS = ("the parameters of a fleet program live on the servers: save them "
                    "with fleet.save_persistables(exe, dirname) (a checkpoint) or "
                    "fleet.save_inference_model(exe, dirname, feeds, targets), not "
                    "fluid.io's save functions")


class NoServers(Backend):
    """The backend of the fleet's programs on a worker before ``init_worker``
    (or after ``stop_worker``): the startup program may run (tables are
    created by ``init_worker``). Anything that would read or write a
    parameter either connects (``connect``, given before ``init_worker``:
    Fluid needed ``init_worker`` only to start the async communicator, so a
    script that skips it still trains, through the servers) and hands the
    call to the connected backend, or (``connect=None``, after
    ``stop_worker``) raises ConfigError: silently training a local model
    instead of the servers' is worse than failing."""

    def __init__(self, why, connect=None):
        self.why = why
        self._connect = connect
        self._target = None

    def create_sparse(self, name, dim, optimizer, initializer, seed):
        pass

    def create_dense(self, name, initial_value, optimizer):
        pass

    @property
    def applies_regularizers(self):
        """The connected backend's answer: a step that connected at its first
        pull pushes through it (its servers may apply the regularizers)."""
        return getattr(self._target, "applies_regularizers", False)

    def _backend(self):
        if self._target is None:
            if self._connect is None:
                raise ConfigError(self.why)
            self._target = self._connect()
        return self._target

    def _forward(name):
        def call(self, *args, **kwargs):
            return getattr(self._backend(), name)(*args, **kwargs)
        call.__name__ = name
        return call

    pull_sparse = _forward("pull_sparse")
    push_sparse = _forward("push_sparse")
    pull_dense = _forward("pull_dense")
    push_dense = _forward("push_dense")
    pull_dense_many = _forward("pull_dense_many")
    push_dense_many = _forward("push_dense_many")
    set_dense = _forward("set_dense")
    save = _forward("save")
    load = _forward("load")
    prefetch_sparse = _forward("prefetch_sparse")
    inference_source = _forward("inference_source")
    del _forward

    def step_end(self):
        if self._target is not None:  # a step that connected: its barrier
            self._target.step_end()


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

    @property
    def applies_regularizers(self):
        """The kinds of table whose regularizers the servers apply. Sync and
        async: every kind; the servers' tables add the decay to the rows a
        push touches (on the step's merged gradient in sync mode), as Fluid's
        servers do, so the worker adds none (it still clips). Geo: none; the
        worker's local copy trains, so the worker regularizes. Must agree
        with ``pyfleet.distributed.tables.servers_regularize``."""
        return frozenset() if self.mode == "geo" else frozenset({"sparse", "dense"})

    def __init__(self, client, mode, geo_k_steps=100, fleet=None, tables=None):
        self.client = client
        self.fleet = fleet      # fluid.io's saves of a fleet program go through it
        self.tables = tables    # create_tables configs (for an inference model's rows)
        self.mode = mode
        self.geo = None
        if mode == "geo":
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
        """``fluid.io.save_persistables``/``save_params`` of a fleet program: as in
        Fluid, where Fleet's save is these functions on the worker, the servers
        save every table (``fleet.save_persistables``: a checkpoint directory
        that fluid.io's loaders read into a local program too). Returns True:
        that save wrote the worker's auc counters beside its manifest already."""
        if self.fleet is None:
            raise ConfigError(_SAVE_ON_SERVERS)
        self.fleet.save_persistables(None, dirname)
        return True

    def save_dir(self, dirname):
        """``dirname`` as the servers resolve it (relative: under the checkpoint
        root, ``$PYFLEET_CHECKPOINT_DIR`` or the start directory), so the worker's
        auc counters land beside the manifest, not under the working directory."""
        return relative_to_root(dirname)[1] if self.fleet is not None else dirname

    def inference_source(self):
        """The servers' parameters for ``fluid.io.save_inference_model`` (what
        ``fleet.save_inference_model`` writes), after every pending push."""
        if self.tables is None:
            raise ConfigError(_SAVE_ON_SERVERS)
        self.finish()
        return RemoteSource(self.client, self.tables)

    def load(self, dirname, params):
        raise ConfigError("the parameters of a fleet program live on the servers: load a "
                          "checkpoint with fleet.init_server(model_dir) on the servers (or "
                          "with fluid.io.load_persistables into a local program, to "
                          "evaluate without servers), not into a worker's fleet program")

    def finish(self):
        """Send what is still local or queued (geo deltas, async pushes)."""
        self._wait_dense_push()
        if self.geo is not None:
            self.geo.sync()
        self.client.flush()

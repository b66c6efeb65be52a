"""Hybrid mode: sparse tables on the servers, dense parameters all-reduced among the workers.

Selected by ``DistributeTranspilerConfig().mode = "hybrid"`` (or ``$PYFLEET_MODE=hybrid``,
the launcher's ``--mode hybrid``); the parameter-server :class:`~pyfleet.distributed.fleet.Fleet`
then uses the helpers here:

- the servers run ``config.sparse_mode`` (sync, async or geo: the mode the config
  had before ``mode = "hybrid"``, changed with ``sync_mode``/``geo_sgd_mode``) and are
  sent the sparse tables only: they hold no dense parameter;
- the workers are one MPI job (rank = worker index, size = worker count); each holds a
  replica of every dense parameter (:class:`HybridBackend`). Per step the dense
  gradients are fused into one float32 buffer, averaged with **one** ``Allreduce``
  and applied by every rank with the same optimizer rule, so the replicas stay
  bit-identical; at the first step every rank checks that all ranks have the same
  dense parameters and takes rank 0's values (see
  :class:`pyfleet.distributed.collective_backend.FusedDense`). Sparse pulls and
  pushes go to the servers exactly as in the mode the servers run.
- checkpoints (:func:`save_dense`, :func:`load_dense`): ``fleet.save_persistables``
  writes the servers' sparse shards and, from the saving worker, the dense
  parameters into the same generation, as the files of one more server
  (``server<S>-of-<S+1>.json``): the checkpoint loads into a parameter-server job
  (``init_server(model_dir)``, dense blocks assembled from the saved ones) and into
  a hybrid job (servers: ``init_server(model_dir)``, which skips the dense files;
  workers: ``fleet.load_persistables(exe, model_dir)`` after the startup program).

With ``sparse_mode = "sync"``, ``W`` workers of batch ``B`` train as one process of
batch ``W*B`` (the servers average the sparse gradients over the workers, the
all-reduce the dense ones), up to float rounding.
"""

import os

from pyfleet.distributed.collective_backend import FusedDense, checkpoint_registry
from pyfleet.distributed.mpi_group import MPIGroup
from pyfleet.distributed.remote_backend import RemoteBackend
from pyfleet.errors import ConfigError
from pyfleet.fluid.backend import LocalBackend
from pyfleet.fluid.inference import RemoteSource
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["HybridBackend", "HybridSource", "load_dense", "open_group", "save_dense",
           "sparse_only"]

HYBRID_LAUNCH = ("start the workers of a hybrid job as one MPI job: `python -m pyfleet.launch "
                 "--mode hybrid --servers S --workers W script.py`, or the servers yourself "
                 "and `mpirun -np W python script.py` with PYFLEET_ROLE=worker and the "
                 "servers' endpoints in the environment (docs/collective.md)")


def open_group(role):
    """The workers' :class:`MPIGroup`; ConfigError unless this process is MPI rank
    ``worker_index`` of ``worker_num`` ranks."""
    try:
        group = MPIGroup()
    except ConfigError:
        raise ConfigError(f"a hybrid worker runs under MPI and this process was not started "
                          f"by an MPI launcher: {HYBRID_LAUNCH}") from None
    if (group.rank, group.size) != (role.worker_index(), role.worker_num()):
        raise ConfigError(f"hybrid mode: this worker is worker {role.worker_index()} of "
                          f"{role.worker_num()} but MPI rank {group.rank} of {group.size}: "
                          f"the workers must be exactly the ranks of one MPI job, in order "
                          f"(unset PYFLEET_WORKER_INDEX to take the rank); {HYBRID_LAUNCH}")
    return group


def sparse_only(tables):
    """The table configs the servers of a hybrid job hold: the sparse ones."""
    return [c for c in tables if c["kind"] == "sparse"]


class HybridBackend(FusedDense, RemoteBackend):
    """Sparse tables through the servers (:class:`RemoteBackend` in
    ``config.sparse_mode``), dense parameters local and all-reduced over ``group``."""

    broadcast_dense = True

    @property
    def applies_regularizers(self):
        """The servers decay the sparse rows a push touches (sync and async,
        as in a parameter-server job); the worker decays its dense replicas'
        gradients before the all-reduce, which averages W equal decays into
        one (the replicas are bit-identical). Geo: the worker decays both.
        Must agree with ``pyfleet.distributed.tables.servers_regularize``."""
        return frozenset() if self.mode == "geo" else frozenset({"sparse"})

    def __init__(self, client, config, group):
        RemoteBackend.__init__(self, client, config.sparse_mode, config.geo_k_steps)
        self.group = group
        self.local = LocalBackend()       # the dense replicas (its sparse dict stays empty)
        self.dense = self.local.dense
        self._dense_grads = {}
        self._layout = None
        self._buf = None

    def create_dense(self, name, initial_value, optimizer):
        self.local.create_dense(name, initial_value, optimizer)

    def pull_dense(self, name):
        return self.local.pull_dense(name)

    def pull_dense_many(self, names):
        return {n: self.local.pull_dense(n) for n in names}

    def push_dense(self, name, grad):
        self._dense_grads[name] = grad

    def push_dense_many(self, grads):
        self._dense_grads.update(grads)

    def set_dense(self, name, value):
        self.local.set_dense(name, value)

    def signature(self):
        return {n: f"a dense parameter of shape {list(t.shape)}" for n, t in self.dense.items()}

    def step_end(self):
        # The dense all-reduce runs while the step's sparse pushes travel; then the
        # servers' step (sync: the barrier; geo: the local step count).
        names, shapes, offsets, total, _ = self._fused_layout()
        try:
            if names:
                self._dense_step(names, shapes, offsets, total)
        finally:
            self._dense_grads = {}
            self.group.step += 1
        RemoteBackend.step_end(self)


class HybridSource(RemoteSource):
    """The inference source of a hybrid worker: sparse rows from the servers,
    dense values from this worker's replicas."""

    def __init__(self, client, table_configs, backend):
        super().__init__(client, table_configs)
        self.backend = backend

    def dense(self, name):
        return self.backend.pull_dense(name)


def save_dense(backend, tables, path, gen, replies):
    """Write ``backend``'s dense replicas into generation ``gen`` of checkpoint
    directory ``path`` (after the servers wrote theirs: ``replies``) as the
    files of server ``S`` of ``S + 1``. Returns ``(replies + [this one],
    placement of the dense parameters)`` for the manifest."""
    dense = [c for c in tables if c["kind"] == "dense"]
    registry = checkpoint_registry(backend.local, dense)
    registry.server_index = registry.server_num = len(replies)
    registry.server_num += 1
    reply = _checkpoint.save_server(registry, path, gen)
    placement = [(e.name, e.start, e.end, len(replies)) for e in registry.entries.values()]
    return [*replies, reply], placement


def load_dense(backend, tables, dirname, root="."):
    """Load the dense parameters of checkpoint ``dirname`` (any fleet checkpoint:
    hybrid, parameter-server with any number of servers, collective; a list: a
    base then its deltas; relative to ``root``) into ``backend``'s replicas."""
    dirs = dirname if isinstance(dirname, (list, tuple)) else [dirname]
    paths = [os.path.realpath(os.path.join(root, os.fspath(d))) for d in dirs]
    for p in paths:
        m = _checkpoint.read_manifest(p)
        if m is None:
            raise ValueError(f"{p} has no {_checkpoint.MANIFEST_NAME}: not a fleet "
                             f"checkpoint, or an incomplete save")
        _checkpoint.check_tables(m.get("tables") or [], tables, p)
    registry = checkpoint_registry(backend.local, [c for c in tables if c["kind"] == "dense"])
    base = os.path.commonpath([os.path.dirname(p) for p in paths])
    rels = [os.path.relpath(p, base) for p in paths]
    return _checkpoint.load_server(registry, base,
                                   rels if isinstance(dirname, (list, tuple)) else rels[0])

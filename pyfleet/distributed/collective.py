"""Collective mode: Fluid 1.5/1.6's ``incubate.fleet.collective`` over MPI.

Every rank (an MPI process) is a worker holding the whole model; each step's
gradients are averaged over the ranks (see
:mod:`pyfleet.distributed.collective_backend`), so no server exists::

    from pyfleet.fluid.incubate.fleet.collective import fleet, DistributedStrategy
    from pyfleet.fluid.incubate.fleet.base import role_maker

    fleet.init(role_maker.PaddleCloudRoleMaker(is_collective=True))   # or fleet.init()
    optimizer = fleet.distributed_optimizer(Adam(learning_rate=0.001), DistributedStrategy())
    optimizer.minimize(avg_cost)
    exe.run(fleet.startup_program)
    for data in reader():
        exe.run(fleet.main_program, feed=..., fetch_list=[...])
    fleet.save_persistables(exe, dirname)         # rank 0 writes; a fleet checkpoint

Start it with ``python -m pyfleet.launch --collective --workers N script.py``
or ``mpirun -np N python script.py``; without an MPI launch ``fleet.init``
raises a ConfigError saying so. As in Fluid, ``init_worker``, ``init_server``,
``run_server`` and ``stop_worker`` only warn in collective mode.
"""

import logging
import os

from pyfleet import _malloc
from pyfleet.distributed.collective_backend import CollectiveBackend, checkpoint_registry
from pyfleet.distributed.fleet import table_configs
from pyfleet.distributed.fleet_base import FleetBase
from pyfleet.distributed.mpi_group import MPIGroup
from pyfleet.distributed.role_maker import PaddleCloudRoleMaker
from pyfleet.errors import ConfigError
from pyfleet.fluid import inference
from pyfleet.fluid.backend import LocalSource
from pyfleet.fluid.framework import default_startup_program
from pyfleet.fluid.optimizer import minimize
from pyfleet.optimizer import Optimizer
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["Collective", "CollectiveOptimizer", "DistributedStrategy", "fleet"]

_log = logging.getLogger("pyfleet.collective")


class DistributedStrategy:
    """Fluid's collective ``DistributedStrategy``: every field is accepted, and
    each either takes effect or is refused by name at ``minimize``:

    - ``mode`` (``"nccl2"`` | ``"collective"``) and ``collective_mode``
      (None | ``"grad_allreduce"``): both mean one gradient all-reduce per step,
      which is what pyfleet does (over MPI instead of NCCL).
    - ``fuse_all_reduce_ops`` (True): pyfleet always fuses every dense gradient into
      one buffer; False is refused.
    - ``nccl_comm_num`` (1), ``use_hierarchical_allreduce`` (False),
      ``hierarchical_allreduce_inter_nranks`` (0): NCCL's communicator knobs; MPI
      picks its own algorithms, so only the defaults are accepted.
    - ``use_local_sgd``, ``collective_mode = "local_sgd"``, ``use_dist_fc``,
      ``use_amp``, ``forward_recompute``: GPU or not implemented; refused when set.
    - ``exec_strategy``, ``amp_loss_scaling``, ``dist_fc_config``,
      ``recompute_checkpoints``: kept, used by nothing (they only configure the
      refused features or Fluid's GPU executor).
    """

    def __init__(self):
        self.mode = "nccl2"
        self.collective_mode = None
        self.use_local_sgd = False
        self.use_dist_fc = False
        self.dist_fc_config = None
        self.nccl_comm_num = 1
        self.use_hierarchical_allreduce = False
        self.hierarchical_allreduce_inter_nranks = 0
        self.forward_recompute = False
        self.recompute_checkpoints = []
        self.use_amp = False
        self.amp_loss_scaling = 2 ** 15
        self.fuse_all_reduce_ops = True
        self.exec_strategy = None

    def check(self):
        """Raise ConfigError naming the first field pyfleet cannot honour."""
        if self.mode not in ("nccl2", "collective"):
            raise ConfigError(f"DistributedStrategy.mode must be 'nccl2' or 'collective', "
                              f"got {self.mode!r}")
        if self.collective_mode not in (None, "grad_allreduce"):
            raise ConfigError(f"DistributedStrategy.collective_mode={self.collective_mode!r} "
                              f"is not supported: pyfleet all-reduces the gradients every "
                              f"step ('grad_allreduce'); local SGD is not implemented")
        refused = {"use_local_sgd": "local SGD is not implemented",
                   "use_dist_fc": "distributed fc is a GPU model-parallel feature",
                   "use_amp": "mixed precision is a GPU feature",
                   "forward_recompute": "recomputation is not implemented",
                   "use_hierarchical_allreduce": "MPI chooses its own all-reduce algorithm"}
        for field, why in refused.items():
            if getattr(self, field):
                raise ConfigError(f"DistributedStrategy.{field}=True is not supported by "
                                  f"pyfleet's collective mode: {why}")
        if self.nccl_comm_num != 1:
            raise ConfigError(f"DistributedStrategy.nccl_comm_num={self.nccl_comm_num!r}: "
                              f"pyfleet uses one MPI communicator; leave it at 1")
        if not self.fuse_all_reduce_ops:
            raise ConfigError("DistributedStrategy.fuse_all_reduce_ops=False is not "
                              "supported: pyfleet always fuses the dense gradients into one "
                              "all-reduce per step")


class CollectiveOptimizer:
    """``fleet.distributed_optimizer(optimizer, strategy)`` in collective mode."""

    def __init__(self, optimizer, strategy=None, fleet_=None):
        if not isinstance(optimizer, Optimizer):
            raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
        strategy = DistributedStrategy() if strategy is None else strategy
        if not isinstance(strategy, DistributedStrategy):
            raise ValueError(f"strategy must be a collective DistributedStrategy, got "
                             f"{strategy!r} (a DistributeTranspilerConfig is for the "
                             f"parameter-server fleet)")
        strategy.check()
        self._optimizer = optimizer
        self._strategy = strategy
        self._fleet = fleet if fleet_ is None else fleet_

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        result = minimize(self._optimizer, loss, startup_program=startup_program,
                          parameter_list=parameter_list, no_grad_set=no_grad_set)
        self._fleet._set_program(loss.block.program,
                                 startup_program or default_startup_program(), self._strategy)
        return result


class Collective(FleetBase):
    """The collective Fleet (one per process: use :data:`fleet`)."""

    _NO_ROLE = ("call fleet.init() first (collective mode: under mpirun or "
                "python -m pyfleet.launch --collective)")

    def __init__(self):
        super().__init__()
        self._group = None
        self._backend = None

    def init(self, role_maker=None):
        """This rank's role from MPI (``PaddleCloudRoleMaker(is_collective=True)``
        by default); a ConfigError saying how to start the job when this
        process was not started by an MPI launcher. Freed buffers stay mapped
        from here on, as in the parameter-server Fleet (:mod:`pyfleet._malloc`)."""
        _malloc.keep_freed_memory()
        if role_maker is None:
            role_maker = PaddleCloudRoleMaker(is_collective=True)
        self._check_role_maker(role_maker)
        if not role_maker.info.collective:
            raise ConfigError(f"collective fleet.init() needs "
                              f"PaddleCloudRoleMaker(is_collective=True), got "
                              f"{type(role_maker).__name__} (a parameter-server role)")
        group = MPIGroup()
        info = role_maker.info
        if (info.index, info.worker_num) != (group.rank, group.size):
            raise ConfigError(f"{type(role_maker).__name__} says worker {info.index} of "
                              f"{info.worker_num}, but this process is MPI rank {group.rank} "
                              f"of {group.size}: collective mode all-reduces among the MPI "
                              f"ranks, so start one rank per worker in that order")
        self._role = role_maker
        self._group = group
        self._backend = CollectiveBackend(self._group)
        self._hosts = None

    # No server in collective mode: the server queries answer for none.
    def is_server(self):
        self._role_maker()
        return False

    def server_num(self):
        self._role_maker()
        return 0

    def server_index(self):
        raise ConfigError("collective mode has no servers: server_index() does not apply")

    def server_endpoints(self, to_string=False):
        self._role_maker()
        return "" if to_string else []

    def worker_endpoints(self, to_string=False):
        """Each rank's host (MPI's processor name), in rank order: MPI owns the
        transport, so there is no port of pyfleet's (Fluid lists ``ip:port``)."""
        self._role_maker()
        if self._hosts is None:
            raw = self._group.allgather_bytes(self._group.MPI.Get_processor_name().encode(),
                                              "worker_endpoints")
            self._hosts = [h.decode() for h in raw]
        return ",".join(self._hosts) if to_string else list(self._hosts)

    def barrier_worker(self):
        self._role_maker()
        self._group.barrier("barrier_worker")

    # Fluid's collective Fleet warns and does nothing for these.
    def init_worker(self):
        _log.warning("You should not call 'init_worker' method for collective mode.")

    def run_worker(self, main_programs=None, scopes=None):
        _log.warning("You should not call 'run_worker' method for collective mode.")

    def init_server(self, model_dir=None):
        _log.warning("You should not call 'init_server' method for collective mode.")

    def run_server(self):
        _log.warning("You should not call 'run_server' method for collective mode.")

    def stop_worker(self):
        _log.warning("You should not call 'stop_worker' method for collective mode.")

    # ------------------------------------------------------------- programs
    def distributed_optimizer(self, optimizer, strategy=None):
        self._role_maker()
        return CollectiveOptimizer(optimizer, strategy, self)

    def _set_program(self, main, startup, strategy):
        self.main_program, self.startup_program, self._strategy = main, startup, strategy
        self._tables, _ = table_configs(main)
        main.set_backend(self._backend)
        startup.set_backend(self._backend)

    @property
    def backend(self):
        """This rank's :class:`CollectiveBackend` (its tables; ``checksum()``)."""
        return self._backend

    # ---------------------------------------------------------- checkpoints
    def save_persistables(self, executor=None, dirname=None, main_program=None, meta=None,
                          mode="full"):
        """Rank 0 writes every parameter (sparse rows with optimizer state, dense
        values with theirs) as a checkpoint of one parameter server (the format
        of :mod:`pyfleet.service.checkpoint`): a parameter-server job loads it
        with ``fleet.init_server(dirname)`` on any number of servers, and this
        mode loads a parameter-server checkpoint with :meth:`load_persistables`.
        Other ranks write nothing (their replicas are identical). Returns the
        manifest on rank 0, None elsewhere. ``mode="delta"`` is written full (a
        replica keeps no record of the rows changed since a save)."""
        if mode not in ("full", "delta"):
            raise ValueError(f"mode must be 'full' or 'delta', got {mode!r}")
        self._require_program("save_persistables")
        if dirname is None:
            raise ValueError("save_persistables needs dirname")
        if self._group.rank != 0:
            self._group.allow_save()  # the next collective waits for rank 0's writing
            return None
        path = os.path.realpath(os.fspath(dirname))
        os.makedirs(path, exist_ok=True)
        gen = _checkpoint.new_generation(path, "full")
        registry = checkpoint_registry(self._backend, self._tables)
        reply = _checkpoint.save_server(registry, path, gen)
        placement = [(e.name, e.start, e.end, 0) for e in registry.entries.values()
                     if e.kind == "dense"]
        manifest = _checkpoint.build_manifest(None, gen, "full", [reply], self._tables,
                                              placement, None, meta)
        _checkpoint.commit(path, manifest)
        return manifest

    def load_persistables(self, executor=None, dirname=None, main_program=None):
        """Every rank reads checkpoint ``dirname`` (of this mode, or of a
        parameter-server job with any number of servers; a list: a base then its
        deltas) into its replica; the tables are replaced, not merged. Run the
        startup program first. ``dirname`` must be readable on every rank."""
        self._require_program("load_persistables")
        dirs = dirname if isinstance(dirname, (list, tuple)) else [dirname]
        paths = [os.path.realpath(os.fspath(d)) for d in dirs]
        for p in paths:
            m = _checkpoint.read_manifest(p)
            if m is None:
                raise ValueError(f"{p} has no {_checkpoint.MANIFEST_NAME}: not a fleet "
                                 f"checkpoint, or an incomplete save")
            _checkpoint.check_tables(m.get("tables") or [], self._tables, p)
        b = self._backend
        for cfg in self._tables:  # a checkpoint replaces a table, as in Fluid
            if cfg["kind"] == "sparse":
                old = b._sparse(cfg["name"])
                b.create_sparse(cfg["name"], old.dim, old.optimizer, old.initializer, old.seed)
        base = os.path.commonpath([os.path.dirname(p) for p in paths])
        rels = [os.path.relpath(p, base) for p in paths]
        registry = checkpoint_registry(b, self._tables)
        _checkpoint.load_server(registry, base,
                                rels if isinstance(dirname, (list, tuple)) else rels[0])

    def save_inference_model(self, executor, dirname, feeded_var_names=None, target_vars=None,
                             main_program=None, export_for_deployment=True):
        """Rank 0 writes the prediction directory (as in parameter-server mode:
        ``pyfleet.fluid.inference.load(dirname)`` predicts from it); other ranks
        write nothing and return None."""
        self._require_program("save_inference_model")
        if self._group.rank != 0:
            return None
        return inference.save(dirname, main_program or self.main_program, feeded_var_names,
                              target_vars, LocalSource(self._backend))


fleet = Collective()

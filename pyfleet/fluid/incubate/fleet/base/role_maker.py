"""Fluid 1.5-1.8's ``paddle.fluid.incubate.fleet.base.role_maker``: re-exports of
:mod:`pyfleet.distributed.role_maker` (see docs/fleet.md for the environment contract), and
Fluid 1.8's :class:`GeneralRoleMaker`."""

from pyfleet.distributed.role_maker import (
    MPISymetricRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleMakerBase,
    UserDefinedCollectiveRoleMaker,
    UserDefinedRoleMaker,
)
from pyfleet.errors import ConfigError

__all__ = ["GeneralRoleMaker", "MPISymetricRoleMaker", "PaddleCloudRoleMaker", "Role",
           "RoleMakerBase", "UserDefinedCollectiveRoleMaker", "UserDefinedRoleMaker"]

_GLOO_OPTIONS = ("hdfs_name", "hdfs_ugi", "path", "init_timeout_seconds",
                 "run_timeout_seconds", "http_ip_port")


class GeneralRoleMaker(PaddleCloudRoleMaker):
    """Fluid 1.8's ``GeneralRoleMaker(**kwargs)``: the role from the environment
    (``TRAINING_ROLE``, ``PADDLE_PSERVERS_IP_PORT_LIST``, ``PADDLE_TRAINER_ID``, ...,
    the contract :class:`PaddleCloudRoleMaker` reads). Fluid's keyword arguments
    (``path``, ``hdfs_name``, ``hdfs_ugi``, ``http_ip_port``, the timeouts) set up
    the rendezvous of its Gloo collectives among the roles; pyfleet has no Gloo,
    so those collectives (``_all_reduce``, ``_all_gather``, ``_barrier_worker``,
    ``_barrier_all``, ``_worker_gather``) raise a ConfigError naming them (a
    barrier of workers: ``fleet.barrier_worker()``). Any other keyword: TypeError."""

    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - set(_GLOO_OPTIONS))
        if unknown:
            raise TypeError(f"GeneralRoleMaker got unexpected keyword argument(s) {unknown}; "
                            f"Fluid's are {list(_GLOO_OPTIONS)}")
        super().__init__()
        self._gloo_options = dict(kwargs)

    def _no_gloo(self, name):
        raise ConfigError(f"GeneralRoleMaker.{name}: Fluid's Gloo collectives among the "
                          f"roles are not in pyfleet (workers meet at a barrier with "
                          f"fleet.barrier_worker(); metrics are summed by the servers)")

    def _all_reduce(self, *args, **kwargs):
        self._no_gloo("_all_reduce")

    def _all_gather(self, *args, **kwargs):
        self._no_gloo("_all_gather")

    def _worker_gather(self, *args, **kwargs):
        self._no_gloo("_worker_gather")

    def _barrier_worker(self):
        self._no_gloo("_barrier_worker")

    def _barrier_all(self):
        self._no_gloo("_barrier_all")


# Fluid 1.8 names pyfleet does not provide: refused by name when used.
from pyfleet.fluid import refusals as _refusals  # noqa: E402

_refusals.install(globals(), "paddle.fluid.incubate.fleet.base.role_maker")

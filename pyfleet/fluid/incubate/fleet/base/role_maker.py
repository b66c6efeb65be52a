"""Fluid 1.5's ``paddle.fluid.incubate.fleet.base.role_maker``: re-exports of
:mod:`pyfleet.role_maker` (see docs/fleet.md for the environment contract)."""

from pyfleet.role_maker import (
    MPISymetricRoleMaker,
    PaddleCloudRoleMaker,
    Role,
    RoleMakerBase,
    UserDefinedRoleMaker,
)

__all__ = ["MPISymetricRoleMaker", "PaddleCloudRoleMaker", "Role", "RoleMakerBase",
           "UserDefinedRoleMaker"]

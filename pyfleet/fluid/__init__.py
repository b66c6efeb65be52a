"""``pyfleet.fluid``: the subset of PaddlePaddle Fluid 1.5 that CTR scripts use.

Scripts written for Fluid run with ``import paddle.fluid as fluid`` replaced
by ``import pyfleet.fluid as fluid``. Parameters live in a backend
(:mod:`pyfleet.fluid.backend`): in-process tables by default, parameter
servers under Fleet.
"""

from pyfleet import initializer
from pyfleet.config import DistributeTranspilerConfig

# Imported for its effect: fluid.io's loaders then read Fleet checkpoints.
from pyfleet.distributed import local_checkpoint as _local_checkpoint  # noqa: F401
from pyfleet.fluid import (
    backend,
    clip,
    compiler,
    contrib,
    core,
    dataset,
    framework,
    incubate,
    io,
    layers,
    optimizer,
    regularizer,
    transpiler,
    unique_name,
)
from pyfleet.fluid.compiler import BuildStrategy, CompiledProgram, ExecutionStrategy
from pyfleet.fluid.data_feeder import DataFeeder
from pyfleet.fluid.dataset import DatasetFactory
from pyfleet.fluid.executor import Executor
from pyfleet.fluid.framework import (
    Program,
    Variable,
    default_main_program,
    default_startup_program,
    name_scope,
    program_guard,
)
from pyfleet.fluid.io import load, save
from pyfleet.fluid.layers_nn import one_hot_v2 as one_hot
from pyfleet.fluid.param_attr import ParamAttr
from pyfleet.fluid.reader import batch
from pyfleet.fluid.tensor import (
    CPUPlace,
    CUDAPlace,
    LoDTensor,
    Scope,
    create_lod_tensor,
    global_scope,
    scope_guard,
)
from pyfleet.fluid.version import require_version


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, dtype="float32"):
    """Fluid 1.5's ``fluid.embedding``: output shape = ids' shape + ``[dim]``."""
    return layers.embedding_v2(input, size, is_sparse, is_distributed, padding_idx,
                               param_attr, dtype)


def data(name, shape, dtype="float32", lod_level=0):
    """Fluid 1.5's ``fluid.data``: ``shape`` includes the batch dimension."""
    return layers.data(name, shape, dtype, lod_level, append_batch_size=False)


__all__ = [
    "BuildStrategy",
    "CPUPlace",
    "CUDAPlace",
    "CompiledProgram",
    "DataFeeder",
    "DatasetFactory",
    "DistributeTranspilerConfig",
    "ExecutionStrategy",
    "Executor",
    "LoDTensor",
    "ParamAttr",
    "Program",
    "Scope",
    "Variable",
    "backend",
    "batch",
    "clip",
    "compiler",
    "contrib",
    "core",
    "create_lod_tensor",
    "data",
    "dataset",
    "default_main_program",
    "default_startup_program",
    "embedding",
    "framework",
    "global_scope",
    "incubate",
    "initializer",
    "io",
    "layers",
    "load",
    "name_scope",
    "one_hot",
    "optimizer",
    "program_guard",
    "regularizer",
    "require_version",
    "save",
    "scope_guard",
    "transpiler",
    "unique_name",
]

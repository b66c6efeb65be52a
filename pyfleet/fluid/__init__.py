"""``pyfleet.fluid``: the subset of PaddlePaddle Fluid 1.5 that CTR scripts use.

Scripts written for Fluid run with ``import paddle.fluid as fluid`` replaced
by ``import pyfleet.fluid as fluid``. Parameters live in a backend
(:mod:`pyfleet.fluid.backend`): in-process tables by default, parameter
servers under Fleet.
"""

import contextlib
import logging

from pyfleet import initializer
from pyfleet.config import DistributeTranspilerConfig, HashName, RoundRobin

# Imported for its effect: fluid.io's loaders then read Fleet checkpoints.
from pyfleet.distributed import local_checkpoint as _local_checkpoint  # noqa: F401
from pyfleet.fluid import (
    backend,
    clip,
    compiler,
    contrib,
    core,
    dataset,
    dygraph,
    framework,
    incubate,
    install_check,
    io,
    layers,
    metrics,
    nets,
    optimizer,
    profiler,
    refusals,
    regularizer,
    transpiler,
    unique_name,
)
from pyfleet.fluid import layers_lr as learning_rate_decay
from pyfleet.fluid.compiler import BuildStrategy, CompiledProgram, ExecutionStrategy
from pyfleet.fluid.core import LoDTensorArray
from pyfleet.fluid.data_feeder import DataFeeder
from pyfleet.fluid.dataset import DatasetFactory, InMemoryDataset, QueueDataset
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
from pyfleet.fluid.parallel_executor import ParallelExecutor
from pyfleet.fluid.param_attr import ParamAttr
from pyfleet.fluid.reader import batch
from pyfleet.fluid.tensor import (
    CPUPlace,
    CUDAPlace,
    LoDTensor,
    Scope,
    create_lod_tensor,
    create_random_int_lodtensor,
    global_scope,
    scope_guard,
)
from pyfleet.fluid.version import require_version


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, dtype="float32"):
    """Fluid 1.5's ``fluid.embedding``: output shape = ids' shape + ``[dim]``."""
    return layers.embedding_v2(input, size, is_sparse, is_distributed, padding_idx,
                               param_attr, dtype)


Tensor = LoDTensor


def is_compiled_with_cuda():
    """False: pyfleet runs on CPUs."""
    return False


def in_dygraph_mode():
    """False: pyfleet runs static-graph programs only."""
    return False


def disable_dygraph():
    """Static-graph mode is pyfleet's only mode: nothing to switch off."""


disable_imperative = disable_dygraph


def cpu_places(device_count=None):
    """``device_count`` CPU places (Fluid's default: ``CPU_NUM``, else 1)."""
    import os
    n = int(device_count if device_count is not None else os.environ.get("CPU_NUM", 1))
    if n < 1:
        raise ValueError(f"cpu_places: device_count must be >= 1, got {n}")
    return [CPUPlace() for _ in range(n)]


@contextlib.contextmanager
def device_guard(device=None):
    """Fluid 1.8's device placement of ops: ``None`` or ``"cpu"`` (every pyfleet
    op runs on the CPU); a GPU device is refused by name."""
    if device not in (None, "cpu") and not str(device).startswith("cpu"):
        raise refusals.UnsupportedError(f"fluid.device_guard({device!r}) is not supported "
                                        f"by pyfleet: {refusals.GPU}")
    yield


def memory_optimize(input_program, skip_opt_set=None, print_log=False, level=0,
                    skip_grads=True):
    """Deprecated since Fluid 1.6, where it changes nothing; likewise here."""
    logging.getLogger("pyfleet.fluid").warning(
        "fluid.memory_optimize is deprecated (since Fluid 1.6) and takes no effect")


def release_memory(input_program, skip_opt_set=None):
    """Deprecated since Fluid 1.6, where it changes nothing; likewise here."""
    logging.getLogger("pyfleet.fluid").warning(
        "fluid.release_memory is deprecated (since Fluid 1.6) and takes no effect")


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
    "HashName",
    "InMemoryDataset",
    "LoDTensor",
    "LoDTensorArray",
    "ParallelExecutor",
    "ParamAttr",
    "Program",
    "QueueDataset",
    "RoundRobin",
    "Scope",
    "Tensor",
    "Variable",
    "backend",
    "batch",
    "clip",
    "compiler",
    "contrib",
    "core",
    "cpu_places",
    "create_lod_tensor",
    "create_random_int_lodtensor",
    "data",
    "dataset",
    "default_main_program",
    "default_startup_program",
    "device_guard",
    "disable_dygraph",
    "disable_imperative",
    "dygraph",
    "embedding",
    "framework",
    "global_scope",
    "in_dygraph_mode",
    "incubate",
    "initializer",
    "install_check",
    "io",
    "is_compiled_with_cuda",
    "layers",
    "learning_rate_decay",
    "load",
    "memory_optimize",
    "metrics",
    "name_scope",
    "nets",
    "one_hot",
    "optimizer",
    "profiler",
    "program_guard",
    "regularizer",
    "release_memory",
    "require_version",
    "save",
    "scope_guard",
    "transpiler",
    "unique_name",
]

refusals.install(globals(), "paddle.fluid")
# fluid.initializer is pyfleet.initializer (below the Fluid layer, it knows no
# refusal table): Fluid's initializers it lacks join it when Fluid loads.
refusals.install(vars(initializer), "paddle.fluid.initializer")

"""``fluid.compiler``: ``CompiledProgram``, ``BuildStrategy``, ``ExecutionStrategy``.

On one CPU process a compiled program runs as the program itself:
``exe.run(fluid.compiler.CompiledProgram(main).with_data_parallel(loss_name=
avg_cost.name, build_strategy=bs, exec_strategy=es))`` is ``exe.run(main)``.

What each strategy field does here. Fields Fluid uses only to schedule or
fuse work (threads, fusion, memory reuse, inplace, graph dumps, multi-device
reduction on one device) do not change a step's numbers in Fluid either;
they are recorded and have no effect. Fields that would change the numbers
are refused by name: ``gradient_scale_strategy = Customized`` (the loss's
gradient fed by the user), more than one place, and
``with_inference_optimize``. Setting a field Fluid does not have raises
AttributeError naming it, as Fluid's strategy objects do.
"""

from typing import ClassVar

from pyfleet.fluid.framework import Program

__all__ = ["BuildStrategy", "CompiledProgram", "ExecutionStrategy"]


class _Strategy:
    _fields: ClassVar[dict] = {}

    def __init__(self):
        for k, v in self._fields.items():
            object.__setattr__(self, k, v)

    def __setattr__(self, name, value):
        if name not in self._fields:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; fields: "
                                 f"{sorted(self._fields)}")
        object.__setattr__(self, name, value)

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._fields)})"


class ExecutionStrategy(_Strategy):
    """Fluid's op scheduling knobs; no effect on one CPU process (see the module doc)."""

    _fields: ClassVar[dict] = {"num_threads": 0, "use_cuda": False, "allow_op_delay": False,
               "num_iteration_per_drop_scope": 1, "num_iteration_per_run": 1,
               "use_thread_barrier": False, "use_experimental_executor": False}


class BuildStrategy(_Strategy):
    """Fluid's graph building knobs; see the module doc."""

    class ReduceStrategy:
        AllReduce = 0
        Reduce = 1

    class GradientScaleStrategy:
        CoeffNumDevice = 0
        One = 1
        Customized = 2

    _fields: ClassVar[dict] = {"reduce_strategy": 0, "gradient_scale_strategy": 0,
               "debug_graphviz_path": "", "enable_sequential_execution": False,
               "fuse_elewise_add_act_ops": False, "fuse_relu_depthwise_conv": False,
               "fuse_broadcast_ops": False, "fuse_all_optimizer_ops": False,
               "fuse_all_reduce_ops": False, "enable_inplace": False,
               "memory_optimize": False, "sync_batch_norm": False,
               "enable_backward_optimizer_op_deps": False, "cache_runtime_context": False,
               "num_trainers": 1, "trainer_id": 0, "trainers_endpoints": [],
               "remove_unnecessary_lock": True, "is_distribution": False, "async_mode": False,
               "mkldnn_enabled_op_types": []}


class CompiledProgram:
    """Fluid's ``CompiledProgram(program_or_graph, build_strategy=None)``; the
    executor runs its program."""

    def __init__(self, program_or_graph, build_strategy=None):
        program = getattr(program_or_graph, "_program", program_or_graph)
        if not isinstance(program, Program):
            raise ValueError(f"CompiledProgram needs a fluid.Program, got {program_or_graph!r}")
        self._program = program
        self._check(build_strategy, None, None)
        self._build_strategy = build_strategy

    @staticmethod
    def _check(build_strategy, exec_strategy, places):
        if build_strategy is not None:
            if not isinstance(build_strategy, BuildStrategy):
                raise ValueError(f"build_strategy must be a fluid.BuildStrategy, got "
                                 f"{build_strategy!r}")
            if build_strategy.gradient_scale_strategy == \
                    BuildStrategy.GradientScaleStrategy.Customized:
                raise ValueError("BuildStrategy.gradient_scale_strategy = Customized is not "
                                 "supported: the loss's gradient is always 1 (the executor "
                                 "computes it)")
        if exec_strategy is not None and not isinstance(exec_strategy, ExecutionStrategy):
            raise ValueError(f"exec_strategy must be a fluid.ExecutionStrategy, got "
                             f"{exec_strategy!r}")
        if places is not None:
            places = list(places) if isinstance(places, (list, tuple)) else [places]
            if len(places) > 1:
                raise ValueError(f"with_data_parallel: {len(places)} places given; pyfleet "
                                 "runs one CPU place per process (start more workers "
                                 "instead)")

    def with_data_parallel(self, loss_name=None, build_strategy=None, exec_strategy=None,
                           share_vars_from=None, places=None):
        if loss_name is not None and self._program._loss is not None and \
                loss_name != self._program._loss.name:
            raise ValueError(f"with_data_parallel: loss_name {loss_name!r} is not the loss "
                             f"the optimizer minimizes ({self._program._loss.name!r})")
        self._check(build_strategy, exec_strategy, places)
        self._build_strategy = build_strategy or self._build_strategy
        self._exec_strategy = exec_strategy
        return self

    def with_inference_optimize(self, config):
        raise ValueError("CompiledProgram.with_inference_optimize is not supported: load the "
                         "model with fluid.io.load_inference_model")

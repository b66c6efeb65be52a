"""``fluid.optimizer``: the optimizer rules under Fluid's names, and ``minimize``.

The rule classes are :mod:`pyfleet.optimizer`'s (the same class objects, so
``fluid.optimizer.Adam`` is ``pyfleet.optimizer.Adam``): that module holds
only hyper-parameters and what the table layer needs, and imports nothing of
Fluid. Attaching a rule to a network is the Fluid side's work, done by the
loss's program (:meth:`pyfleet.fluid.framework.Program.attach_optimizer`):

- ``opt.minimize(loss)`` (Fluid's spelling, on any rule) calls
  ``loss.block.program.attach_optimizer(opt, loss, ...)``: the rule reaches the
  graph through the loss it is given, never through an import, so the layers
  point down only (table and optimizer rules below Fluid);
- :func:`minimize` here is the same call as a function (what Fleet's
  ``distributed_optimizer(opt).minimize(loss)`` uses).
"""

import numpy as np

from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid.gradient_rules import check_clip
from pyfleet.fluid.lr_schedules import check_schedule
from pyfleet.fluid.regularizer import check_regularizer
from pyfleet.optimizer import (
    FTRL,
    SGD,
    Adagrad,
    AdagradOptimizer,
    Adam,
    AdamOptimizer,
    FtrlOptimizer,
    Momentum,
    MomentumOptimizer,
    Optimizer,
    RMSProp,
    RMSPropOptimizer,
    SGDOptimizer,
    from_config,
)

__all__ = ["FTRL", "SGD", "Adagrad", "AdagradOptimizer", "Adam", "AdamOptimizer", "Ftrl",
           "FtrlOptimizer", "Momentum", "MomentumOptimizer", "Optimizer",
           "RMSProp", "RMSPropOptimizer", "SGDOptimizer", "check_minimize", "from_config",
           "minimize"]

Ftrl = FTRL


def minimize(optimizer, loss, startup_program=None, parameter_list=None, no_grad_set=None):
    """Attach ``optimizer`` to the program of ``loss``; see
    :meth:`pyfleet.fluid.framework.Program.attach_optimizer`."""
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
    return optimizer.minimize(loss, startup_program=startup_program,
                              parameter_list=parameter_list, no_grad_set=no_grad_set)


def check_minimize(program, optimizer, loss, parameter_list=None, no_grad_set=None):
    """Check ``program.attach_optimizer``'s arguments (``loss`` a Variable of
    ``program``); returns the names of the parameters to train (None: all)."""
    if not isinstance(optimizer, Optimizer):
        raise ValueError(f"optimizer must be a pyfleet.optimizer rule, got {optimizer!r}")
    check_regularizer(optimizer.regularization, "the optimizer's regularization")
    check_clip(optimizer.grad_clip, "the optimizer's grad_clip")
    if loss.block.program is not program:
        raise ValueError(f"loss {loss.name!r} belongs to another program")
    if loss.shape is not None and int(np.prod([abs(s) for s in loss.shape])) != 1:
        raise ValueError(f"loss must be a scalar (shape [1]), got {loss.name} with shape "
                         f"{loss.shape}: reduce it with fluid.layers.mean")
    names = None
    if parameter_list is not None:
        names = {getattr(p, "name", None) or str(p) for p in parameter_list}
    if no_grad_set is not None:
        excluded = {getattr(p, "name", None) or str(p) for p in no_grad_set}
        base = names if names is not None else {p.name for p in program.all_parameters()}
        names = base - excluded
    check_schedule(program, optimizer)
    return names


def lazy_row_width(param, opt):
    """The row width of dense parameter ``param``'s table under ``opt`` if that
    is Fluid's lazy Adam and every use of ``param`` is a lookup with
    ``is_sparse=True`` (its gradient is then Fluid's row-sparse SelectedRows,
    whose rows alone move: see :mod:`pyfleet.optimizer`), else 0."""
    if not getattr(opt, "lazy_mode", False) or param.is_sparse_table or len(param.shape) != 2:
        return 0
    uses = [op for op in param.block.ops
            if any(v.name == param.name for v in op.input_vars())]
    if uses and all(op.type == "lookup_table" and op.attrs.get("is_sparse") for op in uses):
        return int(param.shape[1])
    return 0


# ModelAverage and the rules pyfleet's tables lack: refused by name when used.
_refusals.install(globals(), "paddle.fluid.optimizer")

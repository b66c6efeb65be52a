"""Optimizer configurations, named and shaped as ``paddle.fluid.optimizer``.

Each class is a small, validated record of hyper-parameters. The update rule
itself runs in the C++ core, where the row lives (``include/pyfleet/optimizer.h``
has the formulas); ``minimize`` hands the optimizer to the program that owns
the loss, as Fluid's ``optimizer.minimize(avg_cost)`` does. This module is
rules only: it sits below the table layer and imports nothing of Fluid
(:mod:`pyfleet.fluid.optimizer` is the Fluid-side view of these classes).

Rules (per element; ``g`` the gradient, ``w`` the weight):

- ``SGD``: ``w -= lr * g``.
- ``Adagrad``: ``acc += g*g; w -= lr * g / (sqrt(acc) + epsilon)``;
  ``acc`` starts at ``initial_accumulator_value``.
- ``Adam`` (Fluid's rule, sparse/lazy: only pushed rows move, and each row
  keeps its own ``beta1_pow``/``beta2_pow``, starting at ``beta1``/``beta2``):
  ``m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
  lr_t = lr * sqrt(1-b2_pow) / (1-b1_pow);
  w -= lr_t * m / (sqrt(v) + epsilon*sqrt(1-b2_pow)); b1_pow *= b1; b2_pow *= b2``.
- ``FTRL`` (FTRL-Proximal, Fluid's ``ftrl`` op): squared and linear
  accumulators ``n`` and ``z``; ``n' = n + g*g``;
  ``z += g - (n'^(-p) - n^(-p)) / lr * w`` (``p = lr_power``, ``-0.5`` gives
  square roots); ``w = (l1*sign(z) - z) / (n'^(-p)/lr + 2*l2)`` if ``|z| > l1``
  else ``0``.
- ``Momentum`` (Fluid's ``momentum`` op): ``v = mu*v + g``; ``w -= lr*v``, or
  with ``use_nesterov`` ``w -= lr*(g + mu*v)``.
- ``RMSProp`` (Fluid's ``rmsprop`` op): ``ms = rho*ms + (1-rho)*g*g``;
  centered: ``mg = rho*mg + (1-rho)*g``, ``mom = momentum*mom +
  lr*g/sqrt(ms - mg*mg + epsilon)``; else ``mom = momentum*mom +
  lr*g/sqrt(ms + epsilon)``; ``w -= mom``.

Momentum and RMSProp have no rule in the C++ core: they run as numpy rules
(:meth:`Optimizer.dense_state` / :meth:`Optimizer.dense_update`) for dense
parameters held in one process (the local backend); a sparse table or a
parameter server refuses them by name (``kind`` is None, see
:meth:`Optimizer._core_config`).

Fluid's keyword arguments every rule takes: ``regularization`` (a
``fluid.regularizer`` rule for every parameter without its own),
``grad_clip`` (Fluid 1.7: a ``fluid.clip`` rule for every gradient),
``parameter_list`` (Fluid 1.7: the default of ``minimize``'s) and ``name``.
They belong to the Fluid side (the executor applies regularization and
clipping to the gradients before they are pushed); they are kept out of
``params()``, so a rule's wire and manifest form is its update rule alone.
"""

import math

import numpy as np

from pyfleet import _core
from pyfleet._record import ConfigRecord
from pyfleet._record import from_config as _from_config

__all__ = ["FTRL", "SGD", "Adagrad", "AdagradOptimizer", "Adam", "AdamOptimizer",
           "FtrlOptimizer", "Momentum", "MomentumOptimizer", "Optimizer", "RMSProp",
           "RMSPropOptimizer", "SGDOptimizer", "from_config"]


def _positive(name, value):
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def _in_unit(name, value):
    value = float(value)
    if not (0.0 <= value < 1.0):
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return value


def _non_negative(name, value):
    value = float(value)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return value


class Optimizer(ConfigRecord):
    """Base class: a named rule and its hyper-parameters."""

    kind = None  # the C++ OptimizerKind name; None: a numpy rule for local dense parameters

    def _fluid_args(self, regularization=None, grad_clip=None, name=None, parameter_list=None):
        """Record Fluid's keyword arguments (not part of the update rule)."""
        self._regularization = regularization
        self._grad_clip = grad_clip
        self._name = None if name is None else str(name)
        self._parameter_list = None if parameter_list is None else list(parameter_list)

    @property
    def regularization(self):
        return getattr(self, "_regularization", None)

    @property
    def grad_clip(self):
        return getattr(self, "_grad_clip", None)

    @property
    def name(self):
        return getattr(self, "_name", None)

    def _core_config(self):
        if self.kind is None:
            raise ValueError(f"the {type(self).__name__} optimizer has no rule in the C++ core: "
                             "it trains only dense parameters held in this process (the "
                             "local backend); a sparse table or a parameter server needs "
                             "SGD, Adagrad, Adam or FTRL")
        c = _core.OptimizerConfig()
        c.kind = getattr(_core.OptimizerKind, self.kind)
        for k, v in self.params().items():
            setattr(c, k, float(v))
        return c

    def state_dim(self, dim):
        """Floats of optimizer state that one row of ``dim`` weights carries."""
        return _core.optimizer_state_dim(self._core_config(), int(dim))

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        """Fluid's ``optimizer.minimize(loss)``: attach this rule to the loss's program.

        The work is the Fluid side's (``Program.attach_optimizer``, reached
        through the loss): this module knows no graph and imports no Fluid
        module. Returns ``(optimize_ops, params_grads)`` as Fluid does.
        """
        program = getattr(getattr(loss, "block", None), "program", None)
        attach = getattr(program, "attach_optimizer", None)
        if attach is None:
            raise ValueError(f"loss must be a fluid Variable, got {loss!r}")
        if parameter_list is None:
            parameter_list = getattr(self, "_parameter_list", None)
        return attach(self, loss, parameter_list=parameter_list, no_grad_set=no_grad_set)

    def dense_state(self, shape):
        """The numpy state arrays of a rule without a core kind (see the module doc)."""
        raise ValueError(f"{type(self).__name__} has no numpy rule")

    def dense_update(self, w, state, g):
        """Apply the numpy rule in place to ``w`` (and ``state``) with gradient ``g``."""
        raise ValueError(f"{type(self).__name__} has no numpy rule")


class SGD(Optimizer):
    kind = "SGD"

    def __init__(self, learning_rate=0.01, regularization=None, name=None, grad_clip=None,
                 parameter_list=None):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


class Adagrad(Optimizer):
    kind = "Adagrad"

    def __init__(self, learning_rate=0.01, epsilon=1e-6, initial_accumulator_value=0.0,
                 regularization=None, name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.epsilon = _positive("epsilon", epsilon)
        self.initial_accumulator_value = _non_negative(
            "initial_accumulator_value", initial_accumulator_value)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


class Adam(Optimizer):
    kind = "Adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 regularization=None, name=None, lazy_mode=False, grad_clip=None,
                 parameter_list=None):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.beta1 = _in_unit("beta1", beta1)
        self.beta2 = _in_unit("beta2", beta2)
        self.epsilon = _positive("epsilon", epsilon)
        # Fluid's lazy_mode only matters for row-sparse gradients: a sparse
        # table is always lazy (only pushed rows move); a dense parameter gets a
        # full gradient, so both modes agree, except a dense embedding looked up
        # with is_sparse=True, which the Fluid side refuses under lazy_mode=True.
        self._lazy_mode = bool(lazy_mode)
        self._fluid_args(regularization, grad_clip, name, parameter_list)

    @property
    def lazy_mode(self):
        return getattr(self, "_lazy_mode", False)


class FTRL(Optimizer):
    kind = "FTRL"

    def __init__(self, learning_rate=0.05, l1=0.0, l2=0.0, lr_power=-0.5, regularization=None,
                 name=None, grad_clip=None, parameter_list=None):
        self._fluid_args(regularization, grad_clip, name, parameter_list)
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.l1 = _non_negative("l1", l1)
        self.l2 = _non_negative("l2", l2)
        lr_power = float(lr_power)
        if not (lr_power <= 0 and math.isfinite(lr_power)):
            raise ValueError(f"lr_power must be a finite number <= 0, got {lr_power!r}")
        self.lr_power = lr_power


class Momentum(Optimizer):
    """Fluid's momentum rule; a numpy rule for local dense parameters only."""

    kind = None

    def __init__(self, learning_rate, momentum, use_nesterov=False, regularization=None,
                 name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.momentum = _non_negative("momentum", momentum)
        self.use_nesterov = bool(use_nesterov)
        self._fluid_args(regularization, grad_clip, name, parameter_list)

    def dense_state(self, shape):
        return {"velocity": np.zeros(shape, dtype=np.float32)}

    def dense_update(self, w, state, g):
        v = state["velocity"]
        v *= self.momentum
        v += g
        if self.use_nesterov:
            w -= self.learning_rate * (g + self.momentum * v)
        else:
            w -= self.learning_rate * v


class RMSProp(Optimizer):
    """Fluid's rmsprop rule; a numpy rule for local dense parameters only."""

    kind = None

    def __init__(self, learning_rate, rho=0.95, epsilon=1e-6, momentum=0.0, centered=False,
                 regularization=None, name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.rho = _in_unit("rho", rho)
        self.epsilon = _positive("epsilon", epsilon)
        self.momentum = _non_negative("momentum", momentum)
        self.centered = bool(centered)
        self._fluid_args(regularization, grad_clip, name, parameter_list)

    def dense_state(self, shape):
        z = np.zeros(shape, dtype=np.float32)
        return {"mean_square": z, "mean_grad": z.copy(), "moment": z.copy()}

    def dense_update(self, w, state, g):
        ms, mg, mom = state["mean_square"], state["mean_grad"], state["moment"]
        ms *= self.rho
        ms += (1.0 - self.rho) * g * g
        if self.centered:
            mg *= self.rho
            mg += (1.0 - self.rho) * g
            denom = np.sqrt(ms - mg * mg + self.epsilon)
        else:
            denom = np.sqrt(ms + self.epsilon)
        mom *= self.momentum
        mom += self.learning_rate * g / denom
        w -= mom


# Fluid's long names.
SGDOptimizer = SGD
MomentumOptimizer = Momentum
RMSPropOptimizer = RMSProp
AdagradOptimizer = Adagrad
AdamOptimizer = Adam
FtrlOptimizer = FTRL


def from_config(config):
    """Rebuild an optimizer from :meth:`Optimizer.to_config` output."""
    return _from_config(config, (SGD, Adagrad, Adam, FTRL, Momentum, RMSProp), "optimizer")

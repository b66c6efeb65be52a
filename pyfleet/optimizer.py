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
"""

import math

from pyfleet import _core
from pyfleet._record import ConfigRecord
from pyfleet._record import from_config as _from_config

__all__ = ["FTRL", "SGD", "Adagrad", "AdagradOptimizer", "Adam", "AdamOptimizer",
           "FtrlOptimizer", "Optimizer", "SGDOptimizer", "from_config"]


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

    kind = None  # the C++ OptimizerKind name

    def _core_config(self):
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
        return attach(self, loss, parameter_list=parameter_list, no_grad_set=no_grad_set)


class SGD(Optimizer):
    kind = "SGD"

    def __init__(self, learning_rate=0.01):
        self.learning_rate = _positive("learning_rate", learning_rate)


class Adagrad(Optimizer):
    kind = "Adagrad"

    def __init__(self, learning_rate=0.01, epsilon=1e-6, initial_accumulator_value=0.0):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.epsilon = _positive("epsilon", epsilon)
        self.initial_accumulator_value = _non_negative(
            "initial_accumulator_value", initial_accumulator_value)


class Adam(Optimizer):
    kind = "Adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.beta1 = _in_unit("beta1", beta1)
        self.beta2 = _in_unit("beta2", beta2)
        self.epsilon = _positive("epsilon", epsilon)


class FTRL(Optimizer):
    kind = "FTRL"

    def __init__(self, learning_rate=0.05, l1=0.0, l2=0.0, lr_power=-0.5):
        self.learning_rate = _positive("learning_rate", learning_rate)
        self.l1 = _non_negative("l1", l1)
        self.l2 = _non_negative("l2", l2)
        lr_power = float(lr_power)
        if not (lr_power <= 0 and math.isfinite(lr_power)):
            raise ValueError(f"lr_power must be a finite number <= 0, got {lr_power!r}")
        self.lr_power = lr_power


# Fluid's long names.
SGDOptimizer = SGD
AdagradOptimizer = Adagrad
AdamOptimizer = Adam
FtrlOptimizer = FTRL


def from_config(config):
    """Rebuild an optimizer from :meth:`Optimizer.to_config` output."""
    return _from_config(config, (SGD, Adagrad, Adam, FTRL), "optimizer")

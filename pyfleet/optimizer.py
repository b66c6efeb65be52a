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

Sparse rows follow the rules lazily, as a row-sparse gradient of Fluid's
lazy Adam: only the rows a push touches move (Fluid's non-lazy sparse
momentum/rmsprop kernels would also decay the velocity of every other row).

A dense table of rows (a ``[vocab, dim]`` embedding) under Fluid's Adam
``lazy_mode=True``, looked up only with ``is_sparse=True``, is
``Adam(lazy_row_width=dim)``: its gradient rows that are all ``+0.0`` (the rows
no id of the step looked up) keep their weights and moments, the others take
the step, and the table's one beta-power pair advances once a push (Fluid's
adam op on a SelectedRows gradient in lazy mode). The Fluid side sets it and
marks a looked-up row whose gradient is all zero with ``-0.0``.

A weight decay applied where the row lives (Fluid's regularizers on the
servers) is a table's ``regularizer``: ``{"type": "L1Decay" | "L2Decay",
"regularization_coeff": c}`` (:func:`check_regularizer`), given to
:class:`pyfleet.SparseTable` / :class:`pyfleet.DenseTable`; it adds ``c*w`` or
``c*sign(w)`` to each updated row's gradient before the rule.

Fluid's keyword arguments every rule takes: ``regularization`` (a
``fluid.regularizer`` rule for every parameter without its own),
``grad_clip`` (Fluid 1.7: a ``fluid.clip`` rule for every gradient),
``parameter_list`` (Fluid 1.7: the default of ``minimize``'s) and ``name``.
They belong to the Fluid side (the executor clips the gradients before they
are pushed, and regularizes them unless the backend's tables apply the
decay themselves: a Fleet job's servers); they are kept out of ``params()``,
so a rule's wire and manifest form is its update rule alone.
"""

import math

from pyfleet import _core
from pyfleet._record import ConfigRecord
from pyfleet._record import from_config as _from_config

__all__ = ["FTRL", "REGULARIZER_TYPES", "SGD", "Adagrad", "AdagradOptimizer", "Adam",
           "AdamOptimizer", "FtrlOptimizer", "Momentum", "MomentumOptimizer", "Optimizer",
           "RMSProp", "RMSPropOptimizer", "SGDOptimizer", "check_regularizer", "from_config"]

# A table's regularizer: its config type -> the core's DecayKind name.
REGULARIZER_TYPES = {"L1Decay": "L1", "L2Decay": "L2"}


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


def check_regularizer(reg):
    """A table's ``regularizer`` as a JSON-friendly dict (None: none);
    anything else is a ValueError naming it."""
    if reg is None:
        return None
    if not isinstance(reg, dict) or set(reg) != {"type", "regularization_coeff"} \
            or reg["type"] not in REGULARIZER_TYPES:
        raise ValueError(f"regularizer must be None or {{'type': 'L1Decay' | 'L2Decay', "
                         f"'regularization_coeff': float}}, got {reg!r}")
    coeff = float(reg["regularization_coeff"])
    if not math.isfinite(coeff):
        raise ValueError(f"regularizer regularization_coeff must be finite, got {coeff!r}")
    return {"type": reg["type"], "regularization_coeff": coeff}


class Optimizer(ConfigRecord):
    """Base class: a named rule and its hyper-parameters."""

    kind = None  # the C++ OptimizerKind name

    def _rate(self, learning_rate):
        """The rule's learning rate: a positive number, or a Fluid
        learning-rate schedule (an object with ``lr_schedule_start``, the
        rate of its first step, e.g. ``fluid.layers.exponential_decay``'s
        Variable): the rule is configured with that start, and the Fluid
        side (``Program.attach_optimizer``) applies the schedule's ratio to
        it at each step, or refuses the combination by name."""
        start = getattr(learning_rate, "lr_schedule_start", None)
        if start is None:
            self._lr_schedule = None
            return _positive("learning_rate", learning_rate)
        self._lr_schedule = learning_rate
        return _positive("learning_rate (the schedule's first rate)", start)

    @property
    def lr_schedule(self):
        """The Fluid learning-rate schedule Variable given as ``learning_rate``, or None."""
        return getattr(self, "_lr_schedule", None)

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

    def _core_config(self, regularizer=None):
        """The core's config of this rule, with a table's ``regularizer`` (see
        :func:`check_regularizer`)."""
        c = _core.OptimizerConfig()
        c.kind = getattr(_core.OptimizerKind, self.kind)
        for k, v in self.params().items():
            if k == "lazy_row_width":
                c.lazy_row_width = int(v)
            else:
                setattr(c, k, v if isinstance(v, bool) else float(v))
        reg = check_regularizer(regularizer)
        if reg is not None:
            c.decay = getattr(_core.DecayKind, REGULARIZER_TYPES[reg["type"]])
            c.decay_coeff = reg["regularization_coeff"]
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


class SGD(Optimizer):
    kind = "SGD"

    def __init__(self, learning_rate=0.01, regularization=None, name=None, grad_clip=None,
                 parameter_list=None):
        self.learning_rate = self._rate(learning_rate)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


class Adagrad(Optimizer):
    kind = "Adagrad"

    def __init__(self, learning_rate=0.01, epsilon=1e-6, initial_accumulator_value=0.0,
                 regularization=None, name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = self._rate(learning_rate)
        self.epsilon = _positive("epsilon", epsilon)
        self.initial_accumulator_value = _non_negative(
            "initial_accumulator_value", initial_accumulator_value)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


class Adam(Optimizer):
    kind = "Adam"

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 regularization=None, name=None, lazy_mode=False, grad_clip=None,
                 parameter_list=None, lazy_row_width=0):
        self.learning_rate = self._rate(learning_rate)
        self.beta1 = _in_unit("beta1", beta1)
        self.beta2 = _in_unit("beta2", beta2)
        self.epsilon = _positive("epsilon", epsilon)
        # Fluid's lazy_mode only matters for row-sparse gradients: a sparse
        # table is always lazy (only pushed rows move); a dense parameter gets a
        # full gradient, so both modes agree, except a dense embedding looked up
        # with is_sparse=True: the Fluid side gives its table lazy_row_width.
        lazy_row_width = int(lazy_row_width)
        if lazy_row_width < 0:
            raise ValueError(f"lazy_row_width must be >= 0, got {lazy_row_width}")
        self.lazy_row_width = lazy_row_width
        self._lazy_mode = bool(lazy_mode) or lazy_row_width > 0
        self._fluid_args(regularization, grad_clip, name, parameter_list)

    @property
    def lazy_mode(self):
        return getattr(self, "_lazy_mode", False)

    def params(self):
        p = super().params()
        if not p.get("lazy_row_width"):
            p.pop("lazy_row_width", None)   # the plain rule's config stays as it was
        return p


class FTRL(Optimizer):
    kind = "FTRL"

    def __init__(self, learning_rate=0.05, l1=0.0, l2=0.0, lr_power=-0.5, regularization=None,
                 name=None, grad_clip=None, parameter_list=None):
        self._fluid_args(regularization, grad_clip, name, parameter_list)
        self.learning_rate = self._rate(learning_rate)
        self.l1 = _non_negative("l1", l1)
        self.l2 = _non_negative("l2", l2)
        lr_power = float(lr_power)
        if not (lr_power <= 0 and math.isfinite(lr_power)):
            raise ValueError(f"lr_power must be a finite number <= 0, got {lr_power!r}")
        self.lr_power = lr_power


class Momentum(Optimizer):
    """Fluid's momentum rule (state: the velocity)."""

    kind = "Momentum"

    def __init__(self, learning_rate, momentum, use_nesterov=False, regularization=None,
                 name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = self._rate(learning_rate)
        self.momentum = _non_negative("momentum", momentum)
        self.use_nesterov = bool(use_nesterov)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


class RMSProp(Optimizer):
    """Fluid's rmsprop rule (state: mean square, moment, and centered the mean gradient)."""

    kind = "RMSProp"

    def __init__(self, learning_rate, rho=0.95, epsilon=1e-6, momentum=0.0, centered=False,
                 regularization=None, name=None, grad_clip=None, parameter_list=None):
        self.learning_rate = self._rate(learning_rate)
        self.rho = _in_unit("rho", rho)
        self.epsilon = _positive("epsilon", epsilon)
        self.momentum = _non_negative("momentum", momentum)
        self.centered = bool(centered)
        self._fluid_args(regularization, grad_clip, name, parameter_list)


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

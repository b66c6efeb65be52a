"""``fluid.regularizer``: weight decay added to a gradient before the optimizer.

As Fluid 1.5-1.7: a regularizer set by ``ParamAttr(regularizer=...)`` applies
to that parameter and wins over the optimizer's ``regularization=``, which
applies to every other trainable parameter. The decay term is added to the
(clipped) gradient, then the optimizer's rule runs:

- ``L2Decay(c)``: ``g += c * w``;
- ``L1Decay(c)``: ``g += c * sign(w)``.

A row-sparse gradient (a sparse table, or a dense embedding looked up with
``is_sparse=True``) is regularized on the rows it touches only, as Fluid's
selected-rows path does; ``w`` is the value the step pulled.

The executor applies these on the worker before the push (see
:func:`pyfleet.fluid.gradient_rules.apply_gradient_rules`), for every backend that does
not declare ``applies_regularizers = True``: a Fleet job's servers in sync
and async mode apply them themselves, to the rows a push touches, once per
push (once per step, on the merged gradient, in sync mode), as Fluid's
pserver optimize blocks do (``to_config`` is the form their tables take).
"""

import math

import numpy as np

__all__ = ["L1Decay", "L1DecayRegularizer", "L2Decay", "L2DecayRegularizer",
           "WeightDecayRegularizer", "check_regularizer"]


class WeightDecayRegularizer:
    """Base of the weight-decay rules: :meth:`decay` of a parameter value."""

    def __init__(self, regularization_coeff=0.0):
        coeff = float(regularization_coeff)
        if not math.isfinite(coeff):
            raise ValueError(f"regularization_coeff must be a finite number, got "
                             f"{regularization_coeff!r}")
        self._regularization_coeff = coeff

    @property
    def regularization_coeff(self):
        return self._regularization_coeff

    config_type = None  # the name a table's regularizer config gives this rule

    def decay(self, w):
        """The term added to the gradient of a parameter whose value is ``w``."""
        raise NotImplementedError

    def to_config(self):
        """The table form (``pyfleet.optimizer.check_regularizer``): what a
        server's table applies itself."""
        return {"type": self.config_type, "regularization_coeff": self._regularization_coeff}

    def __eq__(self, other):
        return type(self) is type(other) and \
            self._regularization_coeff == other._regularization_coeff

    def __hash__(self):
        return hash((type(self).__name__, self._regularization_coeff))

    def __str__(self):
        return f"{type(self).__name__[:7]}, regularization_coeff={self._regularization_coeff:f}"

    __repr__ = __str__


class L2DecayRegularizer(WeightDecayRegularizer):
    """``g += regularization_coeff * w``."""

    config_type = "L2Decay"

    def decay(self, w):
        return self._regularization_coeff * w


class L1DecayRegularizer(WeightDecayRegularizer):
    """``g += regularization_coeff * sign(w)``."""

    config_type = "L1Decay"

    def decay(self, w):
        return self._regularization_coeff * np.sign(w)


L1Decay = L1DecayRegularizer
L2Decay = L2DecayRegularizer


def check_regularizer(value, what):
    """``value`` if it is None or a regularizer, else a ValueError naming ``what``."""
    if value is None or isinstance(value, WeightDecayRegularizer):
        return value
    raise ValueError(f"{what} must be a fluid.regularizer rule (L1Decay, L2Decay) or None, "
                     f"got {value!r}")

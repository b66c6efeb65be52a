"""The rules applied to a step's gradients before they are pushed: Fluid's
gradient clipping, then regularization (``fluid.clip`` is their face, with
:func:`~pyfleet.fluid.clip.set_gradient_clip`, which sets a rule on a program's
parameters).

Rules, as Fluid 1.5-1.7 (``g`` one parameter's gradient):

- ``GradientClipByValue(max, min=None)``: ``g = clip(g, min, max)``
  (``min`` defaults to ``-max``);
- ``GradientClipByNorm(clip_norm)``: ``g *= clip_norm / max(||g||, clip_norm)``;
- ``GradientClipByGlobalNorm(clip_norm, group_name)``: over the parameters of
  one group, ``n = sqrt(sum ||g||^2)`` and every ``g *= clip_norm / max(n,
  clip_norm)``; parameters of one group must share ``clip_norm``.

Where a rule comes from: the optimizer's ``grad_clip=`` (Fluid 1.7) for every
parameter it trains; else the parameter's own, set by
``ParamAttr(gradient_clip=...)`` or :func:`pyfleet.fluid.clip.set_gradient_clip`.
``need_clip`` (Fluid 1.7), a function of the parameter, limits a rule to the
parameters for which it returns True.

Order, as Fluid's ``apply_gradients``: parameters by name, clipping first,
then regularization (:mod:`pyfleet.fluid.regularizer`). A row-sparse
gradient's norm is that of its rows (summed per id, as Fluid merges selected
rows before clipping).
"""

import math

import numpy as np

from pyfleet.fluid.regularizer import WeightDecayRegularizer

__all__ = [
    "GradEntry",
    "GradientClipBase",
    "GradientClipByGlobalNorm",
    "GradientClipByNorm",
    "GradientClipByValue",
    "apply_gradient_rules",
    "check_clip",
    "has_gradient_rules",
]


def _finite(name, value):
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


class GradientClipBase:
    def __init__(self, need_clip=None):
        if need_clip is not None and not callable(need_clip):
            raise ValueError(f"need_clip must be a function of the parameter or None, got "
                             f"{need_clip!r}")
        self._need_clip = need_clip

    def _wants(self, param):
        return self._need_clip is None or bool(self._need_clip(param))


class GradientClipByValue(GradientClipBase):
    def __init__(self, max, min=None, need_clip=None):
        super().__init__(need_clip)
        self.max = _finite("max", max)
        self.min = -self.max if min is None else _finite("min", min)
        if self.min > self.max:
            raise ValueError(f"GradientClipByValue: min {self.min} is above max {self.max}")

    def _clip_one(self, g):
        return np.clip(g, self.min, self.max)

    def __repr__(self):
        return f"GradientClipByValue(max={self.max}, min={self.min})"


class GradientClipByNorm(GradientClipBase):
    def __init__(self, clip_norm, need_clip=None):
        super().__init__(need_clip)
        self.clip_norm = _finite("clip_norm", clip_norm)
        if self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm!r}")

    def _clip_one(self, g):
        norm = float(np.sqrt(np.sum(np.square(g, dtype=np.float64))))
        return g if norm <= self.clip_norm else g * (self.clip_norm / norm)

    def __repr__(self):
        return f"GradientClipByNorm(clip_norm={self.clip_norm})"


class GradientClipByGlobalNorm(GradientClipBase):
    def __init__(self, clip_norm, group_name="default_group", need_clip=None):
        super().__init__(need_clip)
        self.clip_norm = _finite("clip_norm", clip_norm)
        if self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm!r}")
        if not isinstance(group_name, str):
            raise ValueError(f"group_name must be a string, got {group_name!r}")
        self.group_name = group_name

    def __repr__(self):
        return (f"GradientClipByGlobalNorm(clip_norm={self.clip_norm}, "
                f"group_name={self.group_name!r})")


def check_clip(value, what):
    """``value`` if it is None or a clip rule, else a ValueError naming ``what``."""
    if value is None or isinstance(value, GradientClipBase):
        return value
    raise ValueError(f"{what} must be a fluid.clip rule (GradientClipByValue, "
                     f"GradientClipByNorm, GradientClipByGlobalNorm) or None, got {value!r}")


class GradEntry:
    """One parameter's gradient in a step: ``grad`` (the whole dense gradient,
    or a sparse table's rows), ``value`` (what the step pulled, same shape),
    and ``rows`` (a dense parameter's touched rows when its gradient is
    row-sparse, else None)."""

    __slots__ = ("grad", "param", "rows", "value")

    def __init__(self, param, grad, value, rows=None):
        self.param, self.grad, self.value, self.rows = param, grad, value, rows


def _clip_rule(param, optimizer):
    rule = optimizer.grad_clip if optimizer is not None else None
    if rule is None:
        rule = getattr(param, "gradient_clip_attr", None)
    return rule if rule is not None and rule._wants(param) else None


def apply_gradient_rules(entries, optimizer, regularize=True):
    """Clip, then regularize, ``entries`` (a list of :class:`GradEntry`) in
    place, as Fluid's ``apply_gradients`` does; see the module doc.
    ``regularize``: a bool, or a function of the parameter saying whether to
    add its decay here (False where the backend applies it)."""
    entries = sorted(entries, key=lambda e: e.param.name)
    groups = {}
    for e in entries:
        rule = _clip_rule(e.param, optimizer)
        if rule is None:
            continue
        if isinstance(rule, GradientClipByGlobalNorm):
            first = groups.setdefault(rule.group_name, (rule.clip_norm, []))
            if first[0] != rule.clip_norm:
                raise ValueError(f"gradient clip group {rule.group_name!r}: every parameter "
                                 f"must have the same clip_norm, got {first[0]} and "
                                 f"{rule.clip_norm} ({e.param.name})")
            first[1].append(e)
        else:
            e.grad = rule._clip_one(e.grad).astype(e.grad.dtype, copy=False)
    for clip_norm, members in groups.values():
        total = sum(float(np.sum(np.square(e.grad, dtype=np.float64))) for e in members)
        norm = math.sqrt(total)
        if norm > clip_norm:
            scale = clip_norm / norm
            for e in members:
                e.grad = (e.grad * scale).astype(e.grad.dtype, copy=False)
    if not regularize:
        return entries
    default = optimizer.regularization if optimizer is not None else None
    for e in entries:
        if callable(regularize) and not regularize(e.param):
            continue
        reg = getattr(e.param, "regularizer", None) or default
        if not isinstance(reg, WeightDecayRegularizer) or reg.regularization_coeff == 0.0:
            continue
        if e.rows is None:
            e.grad = (e.grad + reg.decay(e.value)).astype(e.grad.dtype, copy=False)
        else:
            g = np.array(e.grad, copy=True)
            g[e.rows] += reg.decay(e.value[e.rows]).astype(g.dtype, copy=False)
            e.grad = g
    return entries


def has_gradient_rules(program):
    """Whether any clip or regularization applies to ``program``'s training."""
    opt = program._optimizer
    if opt is not None and (opt.grad_clip is not None or opt.regularization is not None):
        return True
    return any(getattr(p, "regularizer", None) is not None or
               getattr(p, "gradient_clip_attr", None) is not None
               for p in program.all_parameters())


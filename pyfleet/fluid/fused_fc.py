"""Fully connected layers run as one op each.

``fluid.layers.fc`` builds ``mul`` (``x @ W``), ``elementwise_add`` (the
bias) and, with ``act="relu"``, ``relu``. A step's plan (:class:`pyfleet.fluid.step.Plan`)
replaces each such chain whose in-between values nobody else reads (no other
op, no fetch) by one :class:`FusedFC`: forward ``y = act(x @ W + b)``, the
bias and activation applied in place on the product; backward the
activation's and the bias's gradients in one pass, then ``gz @ W.T`` and
``x.T @ gz``. The matrix products stay numpy's (its BLAS); the elementwise
passes are the core's (``_core.fc_bias_act``, ``_core.fc_act_bias_grad``,
the GIL released), computing what the unfused kernels compute, from the same
float32 values, in the same order: the two paths give the same gradients
(tests/fluid/test_fused_fc.py compares them). Three ops' dispatch,
temporaries and a gradient copy become one kernel call each way.

``ENABLED = False`` (or ``PYFLEET_FUSED_FC=0`` in the environment; any value
but 0 or 1 is refused) keeps every op on its own numpy kernel, the reference; programs planned before a change
keep their plans.
"""

import os
from collections import Counter

import numpy as np

from pyfleet import _core
from pyfleet.errors import ConfigError
from pyfleet.fluid import ops as _ops
from pyfleet.fluid.framework import Operator

__all__ = ["ENABLED", "FusedFC", "backward", "forward", "fuse", "inner_outputs"]



def _enabled_by_env():
    flag = os.environ.get("PYFLEET_FUSED_FC", "1").strip()
    if flag not in ("0", "1"):
        raise ConfigError(f"PYFLEET_FUSED_FC must be 0 (the numpy ops, the reference) or 1 "
                          f"(fused fc layers, the default), got {flag!r}")
    return flag == "1"


ENABLED = _enabled_by_env()

_ACTS = {"relu": "relu"}
# A layer whose shapes or dtypes the fused kernels do not take runs its own ops.
_UNFUSED = object()


class FusedFC(Operator):
    """One fc layer's ``mul``, ``elementwise_add`` and activation as one op of a
    plan (never added to a block); ``ops``: those ops, ``act``: "relu" or "none"."""

    def __init__(self, ops, act):
        mul, add = ops[0], ops[1]
        super().__init__(mul.block, "fused_fc",
                         {"X": mul.input("X"), "W": mul.input("Y"), "Bias": add.input("Y")},
                         {"Out": ops[-1].output("Out")})
        self.ops, self.act = ops, act

    def __repr__(self):
        return f"FusedFC({[op.type for op in self.ops]}, out={self.outputs['Out'][0].name})"


def _only(op, slot):
    vs = op.input(slot)
    return vs[0] if len(vs) == 1 else None


def _chain(ops, i, readers, keep):
    """The FusedFC of the chain starting at ``ops[i]``, or None."""
    mul = ops[i]
    if mul.type != "mul" or i + 1 >= len(ops) or len(mul.output("Out")) != 1:
        return None
    x, w = _only(mul, "X"), _only(mul, "Y")
    if x is None or w is None or len(x.shape) != 2 or len(w.shape) != 2 or \
            mul.attrs.get("x_num_col_dims", 1) != 1 or mul.attrs.get("y_num_col_dims", 1) != 1:
        return None
    prod = mul.output("Out")[0]
    add = ops[i + 1]
    b = _only(add, "Y") if add.type == "elementwise_add" else None
    if b is None or _only(add, "X") is not prod or len(add.output("Out")) != 1 or \
            tuple(b.shape) != (w.shape[1],) or add.attrs.get("axis", -1) not in (1, -1):
        return None
    if readers[prod.name] != 1 or prod.name in keep or prod.persistable:
        return None
    chain = [mul, add]
    biased = add.output("Out")[0]
    if i + 2 < len(ops):
        act = ops[i + 2]
        if act.type in _ACTS and _only(act, "X") is biased and len(act.output("Out")) == 1 and \
                readers[biased.name] == 1 and biased.name not in keep and not biased.persistable:
            chain.append(act)
    return FusedFC(chain, _ACTS[chain[2].type] if len(chain) == 3 else "none")


def fuse(ops, keep):
    """``ops`` with each fusable fc chain replaced by a :class:`FusedFC`;
    ``keep``: names whose values must stay (the fetched variables, the loss)."""
    if not ENABLED:
        return list(ops)
    readers = Counter(v.name for op in ops for v in op.input_vars())
    out, i = [], 0
    while i < len(ops):
        f = _chain(ops, i, readers, keep)
        if f is None:
            out.append(ops[i])
            i += 1
        else:
            out.append(f)
            i += len(f.ops)
    return out


def forward(op, s, kernels=_ops.FORWARD):
    """``kernels``: the op kernels by type (a layer whose values the fused path
    does not take runs its own ops, whose errors are theirs)."""
    x, w, b = (s.data(op.inputs[k][0]) for k in ("X", "W", "Bias"))
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0] or b.shape != (w.shape[1],):
        s.set_aux(op, _UNFUSED)
        for o in op.ops:
            kernels[o.type](o, s)
        return
    y = x @ w
    if y.dtype == b.dtype == np.float32:
        _core.fc_bias_act(y, b, op.act)
    else:   # the unfused kernels' numpy arithmetic
        y = y + b
        if op.act == "relu":
            y = np.maximum(y, 0)
    s.set(op.outputs["Out"][0], y)


def backward(op, s, kernels=_ops.BACKWARD):
    """``kernels``: the ops' gradient kernels by type (see :func:`forward`)."""
    if s.aux(op) is _UNFUSED:
        for o in reversed(op.ops):
            if s.grad(o.output("Out")[0]) is not None:
                kernels[o.type](o, s)
        return
    out = op.outputs["Out"][0]
    g = s.grad(out)
    if g is None:
        return
    y = s.data(out)
    if g.dtype == y.dtype == np.float32:
        gz, gb = _core.fc_act_bias_grad(g, y, op.act)
    else:
        gz = g * (y > 0) if op.act == "relu" else g
        gb = gz.sum(axis=0)
    xv, wv, bv = op.inputs["X"][0], op.inputs["W"][0], op.inputs["Bias"][0]
    if s.needs_grad(xv):
        s.add_grad(xv, gz @ s.data(wv).T)
    if s.needs_grad(wv):
        s.add_grad(wv, s.data(xv).T @ gz)
    if s.needs_grad(bv):
        s.add_grad(bv, gb)


def inner_outputs(op):
    """The names a fused layer's own ops write besides its output (they get
    values and gradients only when the layer runs unfused)."""
    return [v.name for o in op.ops[:-1] for v in o.output_vars()]


# The kernels of the op type a plan's fusion makes (pyfleet.fluid.step imports
# this module; the ops module cannot, since this one builds on the graph's Operator).
_ops.FORWARD["fused_fc"] = forward
_ops.BACKWARD["fused_fc"] = backward

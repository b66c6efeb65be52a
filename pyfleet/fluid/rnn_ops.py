"""Kernel of ``dynamic_gru`` (:func:`pyfleet.fluid.layers_nn.dynamic_gru`):
Fluid's GRU over the sequences of a LoD input, forward and back-propagation
through time. The steps run time-major: step ``t`` updates, in one batched
matrix product, every sequence longer than ``t`` (no loop over sequences).
The kernel interface is :mod:`pyfleet.fluid.ops`'s (which registers it).

With ``x = input row`` (already projected, ``[3D]``: update, reset,
candidate parts), ``W = [W_u W_r | W_c]`` (``[D, 3D]``), ``b`` (``[1, 3D]``)::

    u = g(x_u + h W_u + b_u)        r = g(x_r + h W_r + b_r)
    c = a(x_c + (r * h) W_c + b_c)
    h' = (1 - u) * h + u * c        (origin_mode: u * h + (1 - u) * c)
"""

import numpy as np

from pyfleet.fluid.loss_ops import sigmoid as _sigmoid
from pyfleet.fluid.tensor import LoDTensor

__all__ = ["ACTIVATIONS", "BACKWARD", "FORWARD", "lod_source"]

FORWARD = {}
BACKWARD = {}

# name -> (f(x), f'(x) from y = f(x))
ACTIVATIONS = {
    "sigmoid": (_sigmoid, lambda y: y * (1 - y)),
    "tanh": (np.tanh, lambda y: 1 - y * y),
    "relu": (lambda x: np.maximum(x, 0), lambda y: (y > 0).astype(y.dtype)),
    "identity": (lambda x: x, lambda y: np.ones_like(y)),
}


def lod_source(var, depth=8):
    """The lod_level=1 variable whose sequences ``var``'s rows are: ``var``
    itself, or, through row-wise ops (an fc's mul, bias, activation), the
    first LoD input upstream; None if there is none."""
    if var.lod_level == 1:
        return var
    if depth == 0 or var.op is None:
        return None
    for v in var.op.input_vars():
        found = lod_source(v, depth - 1)
        if found is not None:
            return found
    return None


def _lod_value(s, xv):
    v = s.value(xv)
    if isinstance(v, LoDTensor):
        return v.data, v.offsets
    src = lod_source(xv)
    lod = s.value(src) if src is not None else None
    if not isinstance(lod, LoDTensor) or lod.data.shape[0] != v.shape[0]:
        raise ValueError(f"dynamic_gru: input {xv.name} is not rows of a LoD (lod_level=1) "
                         "value")
    return v, lod.offsets


def _steps(offsets, reverse):
    """Per time step: (the sequences still running, their rows of the input)."""
    lens = np.diff(offsets)
    out = []
    for t in range(int(lens.max()) if lens.size else 0):
        active = np.flatnonzero(lens > t)
        rows = offsets[active] + (lens[active] - 1 - t if reverse else t)
        out.append((active, rows))
    return out


def _gru_fwd(op, s):
    xv = op.input("Input")[0]
    x, offsets = _lod_value(s, xv)
    w = s.data(op.input("Weight")[0])
    b = s.data(op.input("Bias")[0]).reshape(-1)
    d = w.shape[0]
    if x.ndim != 2 or x.shape[1] != 3 * d:
        raise ValueError(f"dynamic_gru: input {xv.name} must be [T, 3 * size] = [T, {3 * d}], "
                         f"got {x.shape}")
    g, _ = ACTIVATIONS[op.attrs["gate_activation"]]
    a, _ = ACTIVATIONS[op.attrs["candidate_activation"]]
    n = offsets.shape[0] - 1
    h = (np.array(s.data(op.input("H0")[0]), dtype=x.dtype) if op.input("H0")
         else np.zeros((n, d), dtype=x.dtype))
    out = np.zeros((x.shape[0], d), dtype=x.dtype)
    tape = []
    for active, rows in _steps(offsets, op.attrs["is_reverse"]):
        hp = h[active]
        xt = x[rows] + b
        ur = g(xt[:, :2 * d] + hp @ w[:, :2 * d])
        u, r = ur[:, :d], ur[:, d:]
        c = a(xt[:, 2 * d:] + (r * hp) @ w[:, 2 * d:])
        hn = u * hp + (1 - u) * c if op.attrs["origin_mode"] else (1 - u) * hp + u * c
        h[active] = hn
        out[rows] = hn
        tape.append((active, rows, hp, u, r, c))
    s.set(op.output("Hidden")[0], LoDTensor(out, offsets))
    s.set_aux(op, tape)


def _gru_bwd(op, s):
    gout = s.grad(op.output("Hidden")[0])
    if gout is None:
        return
    xv, wv, bv = op.input("Input")[0], op.input("Weight")[0], op.input("Bias")[0]
    x, offsets = _lod_value(s, xv)
    w = s.data(wv)
    d = w.shape[0]
    _, dg = ACTIVATIONS[op.attrs["gate_activation"]]
    _, da = ACTIVATIONS[op.attrs["candidate_activation"]]
    origin = op.attrs["origin_mode"]
    n = offsets.shape[0] - 1
    gh = np.zeros((n, d), dtype=gout.dtype)
    gx = np.zeros(x.shape, dtype=gout.dtype)
    gw = np.zeros(w.shape, dtype=gout.dtype)
    for active, rows, hp, u, r, c in reversed(s.aux(op)):
        dh = gh[active] + gout[rows]
        if origin:
            du, dc, dhp = dh * (hp - c), dh * (1 - u), dh * u
        else:
            du, dc, dhp = dh * (c - hp), dh * u, dh * (1 - u)
        dc_pre = dc * da(c)
        gw[:, 2 * d:] += (r * hp).T @ dc_pre
        d_rh = dc_pre @ w[:, 2 * d:].T
        dhp = dhp + d_rh * r
        dur = np.concatenate([du * dg(u), d_rh * hp * dg(r)], axis=1)
        gw[:, :2 * d] += hp.T @ dur
        dhp = dhp + dur @ w[:, :2 * d].T
        gx[rows, :2 * d] = dur
        gx[rows, 2 * d:] = dc_pre
        gh[active] = dhp
    if s.needs_grad(xv):
        s.add_grad(xv, gx)
    if s.needs_grad(wv):
        s.add_grad(wv, gw)
    if s.needs_grad(bv):
        s.add_grad(bv, gx.sum(axis=0).reshape(s.data(bv).shape))
    if op.input("H0") and s.needs_grad(op.input("H0")[0]):
        s.add_grad(op.input("H0")[0], gh)


FORWARD["gru"] = _gru_fwd
BACKWARD["gru"] = _gru_bwd

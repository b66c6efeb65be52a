"""Kernels of the Fluid 1.8 layers added for PaddleRec's model zoo:
comparisons and logic, clip and the bounded activations, cosine similarity,
L2 normalization, top-k, the max/min/prod reductions and ``mse_loss``
(elementwise max/min/pow: :mod:`pyfleet.fluid.ops`; shape, constant and
state ops: :mod:`pyfleet.fluid.tensor_ops`). The kernel interface is
:mod:`pyfleet.fluid.ops`'s (which registers these).

Gradients follow Fluid's kernels where they choose at ties: ``clip`` and
``relu6`` pass it strictly inside the bounds, ``reduce_max``/``min`` to every
element equal to the result.
"""

import math

import numpy as np

from pyfleet.fluid.kernel_shapes import align as _align
from pyfleet.fluid.kernel_shapes import reduce_axes as _reduce_axes

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD", "read"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"compare", "floor", "logical"}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def read(s, var):
    """The value of ``var`` in step ``s``: computed or fed, else a persistable
    variable's value in the scope (a global variable, a step counter)."""
    return s.data(var)


def _out(op):
    return op.output("Out")[0]


# --------------------------------------------------------------------------- elementwise

_COMPARE = {"less_than": np.less, "less_equal": np.less_equal, "greater_than": np.greater,
            "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal}
_LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or,
            "logical_xor": np.logical_xor}


def _compare_fwd(op, s):
    x, y = read(s, op.input("X")[0]), read(s, op.input("Y")[0])
    s.set(_out(op), _COMPARE[op.attrs["fn"]](x, _align(x, y, op.attrs.get("axis", -1))))


def _logical_fwd(op, s):
    x = read(s, op.input("X")[0]).astype(bool)
    if op.attrs["fn"] == "logical_not":
        s.set(_out(op), ~x)
        return
    y = read(s, op.input("Y")[0]).astype(bool)
    s.set(_out(op), _LOGICAL[op.attrs["fn"]](x, y))


_register("compare", _compare_fwd)
_register("logical", _logical_fwd)


# --------------------------------------------------------------------------- unary

def _unary(fn, dfn):
    def fwd(op, s):
        s.set(_out(op), fn(read(s, op.input("X")[0]), op.attrs))

    def bwd(op, s):
        xv = op.input("X")[0]
        g = s.grad(_out(op))
        if g is None or not s.needs_grad(xv):
            return
        s.add_grad(xv, dfn(g, read(s, xv), s.data(_out(op)), op.attrs))
    return fwd, bwd


def _inside(x, lo, hi):
    return (x > lo) & (x < hi)


_register("clip", *_unary(
    lambda x, a: np.clip(x, x.dtype.type(a["min"]), x.dtype.type(a["max"])),
    lambda g, x, y, a: g * _inside(x, a["min"], a["max"])))
_register("relu6", *_unary(
    lambda x, a: np.clip(x, 0, x.dtype.type(a["threshold"])),
    lambda g, x, y, a: g * _inside(x, 0.0, a["threshold"])))
_register("softsign", *_unary(
    lambda x, a: x / (1 + np.abs(x)),
    lambda g, x, y, a: g / np.square(1 + np.abs(x))))
_register("abs", *_unary(lambda x, a: np.abs(x), lambda g, x, y, a: g * np.sign(x)))
_register("sqrt", *_unary(lambda x, a: np.sqrt(x), lambda g, x, y, a: g * 0.5 / y))
_register("rsqrt", *_unary(lambda x, a: 1 / np.sqrt(x), lambda g, x, y, a: -0.5 * g * y ** 3))
_register("reciprocal", *_unary(lambda x, a: 1 / x, lambda g, x, y, a: -g * y * y))
_register("softplus", *_unary(lambda x, a: np.logaddexp(0, x),
                              lambda g, x, y, a: g / (1 + np.exp(-x))))
_register("leaky_relu", *_unary(
    lambda x, a: np.where(x > 0, x, x * x.dtype.type(a["alpha"])),
    lambda g, x, y, a: g * np.where(x > 0, 1.0, a["alpha"]).astype(g.dtype)))
_register("elu", *_unary(
    lambda x, a: np.where(x > 0, x, a["alpha"] * (np.exp(np.minimum(x, 0)) - 1)).astype(x.dtype),
    lambda g, x, y, a: g * np.where(x > 0, 1.0, y + a["alpha"]).astype(g.dtype)))
_register("pow", *_unary(
    lambda x, a: np.power(x, x.dtype.type(a["factor"])),
    lambda g, x, y, a: g * a["factor"] * np.power(x, x.dtype.type(a["factor"] - 1))))
_register("cos", *_unary(lambda x, a: np.cos(x), lambda g, x, y, a: -g * np.sin(x)))
_register("sin", *_unary(lambda x, a: np.sin(x), lambda g, x, y, a: g * np.cos(x)))
_register("logsigmoid", *_unary(lambda x, a: -np.logaddexp(0, -x),
                                lambda g, x, y, a: g / (1 + np.exp(x))))
_register("floor", lambda op, s: s.set(_out(op), np.floor(read(s, op.input("X")[0]))))
_register("ceil", lambda op, s: s.set(_out(op), np.ceil(read(s, op.input("X")[0]))))
_register("sign", lambda op, s: s.set(_out(op), np.sign(read(s, op.input("X")[0]))))
_register("round", lambda op, s: s.set(_out(op), np.round(read(s, op.input("X")[0]))))
NO_GRAD |= {"ceil", "sign", "round"}


# --------------------------------------------------------------------------- cos_sim

def _cos_sim_fwd(op, s):
    x = read(s, op.input("X")[0])
    y = read(s, op.input("Y")[0])
    x2, y2 = x.reshape(x.shape[0], -1), y.reshape(y.shape[0], -1)
    if y2.shape[0] not in (1, x2.shape[0]) or x2.shape[1] != y2.shape[1]:
        raise ValueError(f"cos_sim: Y {op.input('Y')[0].name} must have 1 row or as many rows "
                         f"as X, and the same width: X {x.shape}, Y {y.shape}")
    xn = np.sqrt((x2 * x2).sum(axis=1, keepdims=True))
    yn = np.sqrt((y2 * y2).sum(axis=1, keepdims=True))
    out = (x2 * y2).sum(axis=1, keepdims=True) / (xn * yn)
    s.set(_out(op), out)
    s.set_aux(op, (x2, y2, xn, yn, out))


def _cos_sim_bwd(op, s):
    g = s.grad(_out(op))
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x2, y2, xn, yn, out = s.aux(op)
    # d cos / dx = y / (|x||y|) - cos * x / |x|^2 (and symmetrically for y).
    if s.needs_grad(xv):
        gx = g * (y2 / (xn * yn) - out * x2 / (xn * xn))
        s.add_grad(xv, gx.reshape(read(s, xv).shape))
    if s.needs_grad(yv):
        gy = g * (x2 / (xn * yn) - out * y2 / (yn * yn))
        if y2.shape[0] == 1 and x2.shape[0] != 1:
            gy = gy.sum(axis=0, keepdims=True)
        s.add_grad(yv, gy.reshape(read(s, yv).shape))


_register("cos_sim", _cos_sim_fwd, _cos_sim_bwd)


# --------------------------------------------------------------------------- l2_normalize

def _norm_fwd(op, s):
    x = read(s, op.input("X")[0])
    axis = op.attrs["axis"]
    norm = np.sqrt((x * x).sum(axis=axis, keepdims=True) + x.dtype.type(op.attrs["epsilon"]))
    s.set(_out(op), x / norm)
    s.set_aux(op, norm)


def _norm_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    y = s.data(_out(op))
    norm = s.aux(op)
    axis = op.attrs["axis"]
    s.add_grad(xv, (g - y * (g * y).sum(axis=axis, keepdims=True)) / norm)


_register("norm", _norm_fwd, _norm_bwd)


# --------------------------------------------------------------------------- top-k

def _topk_fwd(op, s):
    x = read(s, op.input("X")[0])
    k = op.attrs["k"]
    if k > x.shape[-1]:
        raise ValueError(f"topk: k={k} exceeds the last dimension of {op.input('X')[0].name} "
                         f"(shape {x.shape})")
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    s.set(_out(op), np.take_along_axis(x, idx, axis=-1))
    s.set(op.output("Indices")[0], idx.astype(np.int64))


def _topk_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    x = read(s, xv)
    gx = np.zeros(x.shape, dtype=g.dtype)
    np.put_along_axis(gx, s.data(op.output("Indices")[0]), g, axis=-1)
    s.add_grad(xv, gx)


_register("top_k", _topk_fwd, _topk_bwd)


def _reduce_ext_fwd(fn):
    def fwd(op, s):
        x = read(s, op.input("X")[0])
        out = fn(x, axis=_reduce_axes(op, x), keepdims=op.attrs.get("keep_dim", False))
        out = np.asarray(out, dtype=x.dtype)
        s.set(_out(op), out.reshape(1) if out.ndim == 0 else out)
    return fwd


def _reduce_bwd(local):
    """The backward of a reduction whose input gradient is ``g * local(x, y)``
    (``y`` the result broadcast back over the reduced axes)."""
    def bwd(op, s):
        xv = op.input("X")[0]
        g = s.grad(_out(op))
        if g is None or not s.needs_grad(xv):
            return
        x = read(s, xv)
        axes = _reduce_axes(op, x)
        kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
        y = s.data(_out(op)).reshape(kept)
        s.add_grad(xv, (g.reshape(kept) * local(x, y)).astype(x.dtype))
    return bwd


# reduce_max/min: the gradient goes to every element equal to the result.
_reduce_pick_bwd = _reduce_bwd(lambda x, y: x == y)
_reduce_prod_bwd = _reduce_bwd(lambda x, y: y / x)


_register("reduce_max", _reduce_ext_fwd(np.max), _reduce_pick_bwd)
_register("reduce_min", _reduce_ext_fwd(np.min), _reduce_pick_bwd)
_register("reduce_prod", _reduce_ext_fwd(np.prod), _reduce_prod_bwd)


def _mse_fwd(op, s):
    x, y = read(s, op.input("X")[0]), read(s, op.input("Y")[0])
    d = x - y.reshape(x.shape)
    s.set(_out(op), np.array([np.mean(d * d)], dtype=x.dtype))


def _mse_bwd(op, s):
    g = s.grad(_out(op))
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x, y = read(s, xv), read(s, yv)
    d = (x - y.reshape(x.shape)) * (2.0 * g.reshape(-1)[0] / x.size)
    if s.needs_grad(xv):
        s.add_grad(xv, d)
    if s.needs_grad(yv):
        s.add_grad(yv, -d.reshape(y.shape))


_register("mse_loss", _mse_fwd, _mse_bwd)


# --------------------------------------------------------------------------- more activations

def _erf(x):
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _softplus_t(x, t):
    """Fluid mish's softplus: x above t, exp(x) below -t, log(1 + exp(x)) between."""
    return np.where(x > t, x, np.where(x < -t, np.exp(x), np.log1p(np.exp(np.clip(x, -t, t)))))


def _dsoftplus_t(x, t):
    return np.where(x > t, 1.0, np.where(x < -t, np.exp(x), _sig(x)))


def _where(cond, a, b, like):
    return np.where(cond, a, b).astype(like.dtype)


_MORE = {
    # name: (forward(x, attrs), d out / d x (x, y, attrs))
    "hard_sigmoid": (lambda x, a: np.clip(a["slope"] * x + a["offset"], 0, 1),
                     lambda x, y, a: _where((y > 0) & (y < 1), a["slope"], 0.0, x)),
    "swish": (lambda x, a: x * _sig(a["beta"] * x),
              lambda x, y, a: _sig(a["beta"] * x) + a["beta"] * y * (1 - _sig(a["beta"] * x))),
    "selu": (lambda x, a: a["scale"] * np.where(x > 0, x, a["alpha"] * np.expm1(
        np.minimum(x, 0))).astype(x.dtype),
        lambda x, y, a: a["scale"] * _where(x > 0, 1.0, a["alpha"] * np.exp(np.minimum(x, 0)),
                                            x)),
    "brelu": (lambda x, a: np.clip(x, a["t_min"], a["t_max"]),
              lambda x, y, a: _where((x > a["t_min"]) & (x < a["t_max"]), 1.0, 0.0, x)),
    "soft_relu": (lambda x, a: np.log1p(np.exp(np.clip(x, -a["threshold"], a["threshold"]))),
                  lambda x, y, a: _where(np.abs(x) < a["threshold"], 1 - np.exp(-y), 0.0, x)),
    "stanh": (lambda x, a: a["scale_b"] * np.tanh(a["scale_a"] * x),
              lambda x, y, a: a["scale_a"] * a["scale_b"] * (1 - np.tanh(a["scale_a"] * x) ** 2)),
    "tanh_shrink": (lambda x, a: x - np.tanh(x), lambda x, y, a: np.tanh(x) ** 2),
    "thresholded_relu": (lambda x, a: _where(x > a["threshold"], x, 0.0, x),
                         lambda x, y, a: _where(x > a["threshold"], 1.0, 0.0, x)),
    "hard_shrink": (lambda x, a: _where(np.abs(x) > a["threshold"], x, 0.0, x),
                    lambda x, y, a: _where(np.abs(x) > a["threshold"], 1.0, 0.0, x)),
    "softshrink": (lambda x, a: _where(x > a["lambda"], x - a["lambda"], _where(
        x < -a["lambda"], x + a["lambda"], 0.0, x), x),
        lambda x, y, a: _where(np.abs(x) > a["lambda"], 1.0, 0.0, x)),
    "hard_swish": (lambda x, a: x * np.clip(x + a["offset"], 0, a["threshold"]) / a["scale"],
                   lambda x, y, a: _where(x + a["offset"] <= 0, 0.0, _where(
                       x + a["offset"] >= a["threshold"], a["threshold"] / a["scale"],
                       (2 * x + a["offset"]) / a["scale"], x), x)),
    "log1p": (lambda x, a: np.log1p(x), lambda x, y, a: 1 / (1 + x)),
    "mish": (lambda x, a: x * np.tanh(_softplus_t(x, a["threshold"])),
             lambda x, y, a: np.tanh(_softplus_t(x, a["threshold"])) + x * (
                 1 - np.tanh(_softplus_t(x, a["threshold"])) ** 2) * _dsoftplus_t(
                 x, a["threshold"])),
    "acos": (lambda x, a: np.arccos(x), lambda x, y, a: -1 / np.sqrt(1 - x * x)),
    "asin": (lambda x, a: np.arcsin(x), lambda x, y, a: 1 / np.sqrt(1 - x * x)),
    "atan": (lambda x, a: np.arctan(x), lambda x, y, a: 1 / (1 + x * x)),
    "erf": (lambda x, a: _erf(x), lambda x, y, a: 2 / math.sqrt(math.pi) * np.exp(-x * x)),
    "gelu": (lambda x, a: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
             lambda x, y, a: 0.5 * (1 + _erf(x / math.sqrt(2)))
             + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)),
}
for _name, (_f, _d) in _MORE.items():
    _register(_name, *_unary(_f, lambda g, x, y, a, _d=_d: g * _d(x, y, a)))


# --------------------------------------------------------------------------- p_norm

def _p_norm_parts(op, s):
    x = read(s, op.input("X")[0])
    axes = tuple(op.attrs["axes"])
    return x, axes, float(op.attrs["porder"])


def _p_norm_fwd(op, s):
    """Paddle 2.0's p_norm over ``axes``: ``(sum |x|^p)^(1/p)``; ``inf``/``-inf``
    the largest/smallest ``|x|``, ``0`` the count of non-zeros."""
    x, axes, p = _p_norm_parts(op, s)
    keep = bool(op.attrs["keepdim"])
    a = np.abs(x)
    if p == math.inf:
        out = a.max(axis=axes, keepdims=keep)
    elif p == -math.inf:
        out = a.min(axis=axes, keepdims=keep)
    elif p == 0:
        out = (x != 0).sum(axis=axes, keepdims=keep)
    else:
        out = (a ** p).sum(axis=axes, keepdims=keep) ** (1.0 / p)
    out = np.asarray(out, dtype=x.dtype)
    s.set(_out(op), out.reshape(1) if out.ndim == 0 else out)


def _p_norm_bwd(op, s):
    """``sign(x) |x|^(p-1) / max(norm^(p-1), epsilon)`` (Paddle's p_norm_grad);
    ``inf``/``-inf``: to every element whose ``|x|`` is the result; ``0``: none."""
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    x, axes, p = _p_norm_parts(op, s)
    kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
    y, g = s.data(_out(op)).reshape(kept), g.reshape(kept)
    a = np.abs(x)
    if p in (math.inf, -math.inf):
        gx = np.sign(x) * (a == y) * g
    elif p == 0:
        gx = np.zeros_like(x)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            local = np.where(x == 0, 0.0, np.sign(x) * a ** (p - 1))
        gx = local * g / np.maximum(y ** (p - 1), op.attrs["epsilon"])
    s.add_grad(xv, gx.astype(x.dtype))


_register("p_norm", _p_norm_fwd, _p_norm_bwd)

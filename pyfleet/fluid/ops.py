"""Operator kernels: numpy forward and reverse-mode backward of every op type.

Each kernel is a pair of functions over one :class:`~pyfleet.fluid.framework.Operator`
and the running step ``s`` (a :class:`pyfleet.fluid.step.Step`):

- ``forward(op, s)`` reads input values (``s.data(var)`` for an ndarray,
  ``s.value(var)`` for a possibly-LoD value) and stores outputs (``s.set``);
- ``backward(op, s)`` reads output gradients (``s.grad(var)``, None when no
  gradient reached that output) and adds input gradients (``s.add_grad``),
  only for inputs with ``s.needs_grad(var)``.

Kernels keep the dtype of their inputs (the engine runs float32; tests check
gradients in float64). Gradients of a LoD value are plain arrays shaped like
its data.
"""

import math

import numpy as np

from pyfleet.fluid import (
    index_ops,
    loss_ops,
    math_ops,
    metric_ops,
    nn_ops,
    rnn_ops,
    tensor_ops,
)
from pyfleet.fluid.kernel_shapes import align_y as _align_y
from pyfleet.fluid.kernel_shapes import reduce_axes as _reduce_axes
from pyfleet.fluid.loss_ops import sigmoid as _sigmoid
from pyfleet.fluid.sequence import (
    is_unit,
    segment_sum,
    sequence_pool_backward,
    sequence_pool_forward,
)
from pyfleet.fluid.tensor import LoDTensor

__all__ = [
    "BACKWARD",
    "FORWARD",
    "NO_GRAD",
    "STATEFUL",
    "is_unit",
    "segment_sum",
    "sequence_pool_backward",
    "sequence_pool_forward",
]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"auc", "fill_constant", "accuracy", "cast_int"}
STATEFUL = {"auc"}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def _reduce_to(g, shape):
    """Sum a broadcast gradient back to ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _flatten2(x, k):
    if x.ndim == 2 and k == 1:
        return x
    return x.reshape(math.prod(x.shape[:k]), -1)


# --------------------------------------------------------------------------- matmul

def _mul_fwd(op, s):
    x, y = s.data(op.input("X")[0]), s.data(op.input("Y")[0])
    k = op.attrs.get("x_num_col_dims", 1)
    x2 = _flatten2(x, k)
    if x2.shape[1] != y.shape[0]:
        raise ValueError(f"{op.type}: input {op.input('X')[0].name} has {x2.shape[1]} "
                         f"features per row, weight {op.input('Y')[0].name} expects "
                         f"{y.shape[0]}")
    out = x2 @ y.reshape(y.shape[0], -1)
    s.set(op.output("Out")[0], out.reshape(x.shape[:k] + y.shape[1:]))


def _mul_bwd(op, s):
    xv, yv = op.input("X")[0], op.input("Y")[0]
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    x, y = s.data(xv), s.data(yv)
    k = op.attrs.get("x_num_col_dims", 1)
    x2 = _flatten2(x, k)
    y2 = y.reshape(y.shape[0], -1)
    g2 = g.reshape(x2.shape[0], y2.shape[1])
    if s.needs_grad(xv):
        s.add_grad(xv, (g2 @ y2.T).reshape(x.shape))
    if s.needs_grad(yv):
        s.add_grad(yv, (x2.T @ g2).reshape(y.shape))


_register("mul", _mul_fwd, _mul_bwd)


def _matmul_operands(op, s):
    x, y = s.data(op.input("X")[0]), s.data(op.input("Y")[0])
    if x.ndim < 2 or y.ndim < 2:
        raise ValueError("matmul: both inputs must have at least 2 dimensions")
    if op.attrs.get("transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if op.attrs.get("transpose_y"):
        y = np.swapaxes(y, -1, -2)
    return x, y


def _matmul_fwd(op, s):
    x, y = _matmul_operands(op, s)
    if x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {x.shape} @ {y.shape}")
    out = np.matmul(x, y)
    alpha = op.attrs.get("alpha", 1.0)
    s.set(op.output("Out")[0], out if alpha == 1.0 else out * out.dtype.type(alpha))


def _matmul_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x, y = _matmul_operands(op, s)
    alpha = op.attrs.get("alpha", 1.0)
    if alpha != 1.0:
        g = g * g.dtype.type(alpha)
    if s.needs_grad(xv):
        gx = _reduce_to(np.matmul(g, np.swapaxes(y, -1, -2)), x.shape)
        s.add_grad(xv, np.swapaxes(gx, -1, -2) if op.attrs.get("transpose_x") else gx)
    if s.needs_grad(yv):
        gy = _reduce_to(np.matmul(np.swapaxes(x, -1, -2), g), y.shape)
        s.add_grad(yv, np.swapaxes(gy, -1, -2) if op.attrs.get("transpose_y") else gy)


_register("matmul", _matmul_fwd, _matmul_bwd)


# --------------------------------------------------------------------------- elementwise

def _ew(fn):
    def fwd(op, s):
        x, y = s.data(op.input("X")[0]), s.data(op.input("Y")[0])
        y = y.reshape(_align_y(x, y, op.attrs.get("axis", -1)))
        try:
            s.set(op.output("Out")[0], fn(x, y))
        except ValueError:
            raise ValueError(f"{op.type}: shapes {x.shape} and {y.shape} do not broadcast "
                             f"({op.input('X')[0].name}, {op.input('Y')[0].name})") from None
    return fwd


def _ew_bwd(dx, dy):
    def bwd(op, s):
        g = s.grad(op.output("Out")[0])
        if g is None:
            return
        xv, yv = op.input("X")[0], op.input("Y")[0]
        x, y0 = s.data(xv), s.data(yv)
        y = y0.reshape(_align_y(x, y0, op.attrs.get("axis", -1)))
        if s.needs_grad(xv):
            s.add_grad(xv, _reduce_to(dx(g, x, y), x.shape))
        if s.needs_grad(yv):
            s.add_grad(yv, _reduce_to(dy(g, x, y), y.shape).reshape(y0.shape))
    return bwd


_register("elementwise_add", _ew(np.add), _ew_bwd(lambda g, x, y: g, lambda g, x, y: g))
_register("elementwise_sub", _ew(np.subtract),
          _ew_bwd(lambda g, x, y: g, lambda g, x, y: -g))
_register("elementwise_mul", _ew(np.multiply),
          _ew_bwd(lambda g, x, y: g * y, lambda g, x, y: g * x))
_register("elementwise_div", _ew(np.divide),
          _ew_bwd(lambda g, x, y: g / y, lambda g, x, y: -g * x / (y * y)))
# As Fluid's kernels: max sends the gradient to x where x > y, to y elsewhere.
_register("elementwise_max", _ew(np.maximum),
          _ew_bwd(lambda g, x, y: g * (x > y), lambda g, x, y: g * (x <= y)))
_register("elementwise_min", _ew(np.minimum),
          _ew_bwd(lambda g, x, y: g * (x < y), lambda g, x, y: g * (x >= y)))
_register("elementwise_pow", _ew(np.power),
          _ew_bwd(lambda g, x, y: g * y * np.power(x, y - 1),
                  lambda g, x, y: g * np.power(x, y) * np.log(x)))


def _sum_fwd(op, s):
    xs = [s.data(v) for v in op.input("X")]
    out = xs[0].copy()
    for x in xs[1:]:
        if x.shape != out.shape:
            raise ValueError(f"sum: inputs must have equal shapes, got {out.shape} and "
                             f"{x.shape}")
        out += x
    s.set(op.output("Out")[0], out)


def _sum_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    for v in op.input("X"):
        if s.needs_grad(v):
            s.add_grad(v, g)


_register("sum", _sum_fwd, _sum_bwd)


def _scale_fwd(op, s):
    x = s.data(op.input("X")[0])
    a, b = x.dtype.type(op.attrs.get("scale", 1.0)), x.dtype.type(op.attrs.get("bias", 0.0))
    out = x * a + b if op.attrs.get("bias_after_scale", True) else (x + b) * a
    s.set(op.output("Out")[0], out)


def _scale_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    xv = op.input("X")[0]
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g * g.dtype.type(op.attrs.get("scale", 1.0)))


_register("scale", _scale_fwd, _scale_bwd)


# --------------------------------------------------------------------------- activations

def _unary(fn, dfn):
    """``dfn(g, x, y)``: the input gradient from output gradient, input, output."""
    def fwd(op, s):
        s.set(op.output("Out")[0], fn(s.data(op.input("X")[0])))

    def bwd(op, s):
        xv, yv = op.input("X")[0], op.output("Out")[0]
        g = s.grad(yv)
        if g is None or not s.needs_grad(xv):
            return
        s.add_grad(xv, dfn(g, s.data(xv), s.data(yv)))
    return fwd, bwd


def _softmax(x):
    z = x - x.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


_register("relu", *_unary(lambda x: np.maximum(x, 0), lambda g, x, y: g * (y > 0)))
_register("sigmoid", *_unary(_sigmoid, lambda g, x, y: g * y * (1 - y)))
_register("tanh", *_unary(np.tanh, lambda g, x, y: g * (1 - y * y)))
_register("square", *_unary(np.square, lambda g, x, y: g * 2 * x))
_register("exp", *_unary(np.exp, lambda g, x, y: g * y))
_register("log", *_unary(np.log, lambda g, x, y: g / x))
_register("softmax", *_unary(
    _softmax, lambda g, x, y: y * (g - (g * y).sum(axis=-1, keepdims=True))))


# --------------------------------------------------------------------------- shape

def _concat_fwd(op, s):
    xs = [s.data(v) for v in op.input("X")]
    axis = op.attrs.get("axis", 0)
    if len(xs) > 2 and xs[0].ndim == 2 and axis in (1, -1):
        # Interleaved embedding lookups (see step.LookupGroup) are column
        # blocks of one array: one copy for all of them instead of one per slot.
        xs = s.column_runs(xs)
        if len(xs) == 1:
            s.set(op.output("Out")[0], np.array(xs[0]))
            return
    try:
        s.set(op.output("Out")[0], np.concatenate(xs, axis=axis))
    except ValueError:
        shapes = [x.shape for x in xs]
        raise ValueError(f"concat: inputs do not fit along axis {axis}: shapes {shapes} "
                         f"({[v.name for v in op.input('X')]})") from None


def _concat_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    axis = op.attrs.get("axis", 0)
    start = 0
    for v in op.input("X"):
        n = s.data(v).shape[axis]
        if s.needs_grad(v):
            idx = [slice(None)] * g.ndim
            idx[axis] = slice(start, start + n)
            part = g[tuple(idx)]
            if g.ndim == 2 and axis in (1, -1):
                s.note_columns(part, g, start)
            s.add_grad(v, part)
        start += n


_register("concat", _concat_fwd, _concat_bwd)


def _reshape_fwd(op, s):
    x = s.data(op.input("X")[0])
    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(op.attrs["shape"])]
    try:
        s.set(op.output("Out")[0], x.reshape(shape))
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {x.shape} to {op.attrs['shape']}") from None


def _reshape_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g.reshape(s.data(xv).shape))


_register("reshape2", _reshape_fwd, _reshape_bwd)


def _slice_index(op, x):
    idx = [slice(None)] * x.ndim
    for a, b, e in zip(op.attrs["axes"], op.attrs["starts"], op.attrs["ends"]):
        idx[a] = slice(b, min(e, x.shape[a]) if e >= 0 else e)
    return tuple(idx)


def _slice_fwd(op, s):
    x = s.data(op.input("Input")[0])
    s.set(op.output("Out")[0], x[_slice_index(op, x)].copy())


def _slice_bwd(op, s):
    xv = op.input("Input")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    gx = np.zeros_like(x, dtype=g.dtype)
    gx[_slice_index(op, x)] = g
    s.add_grad(xv, gx)


_register("slice", _slice_fwd, _slice_bwd)


def _cast_fwd(op, s):
    v = s.value(op.input("X")[0])
    dt = np.dtype(op.attrs["out_dtype"])
    if isinstance(v, LoDTensor):
        s.set(op.output("Out")[0], LoDTensor(v.data.astype(dt), v.offsets))
    else:
        s.set(op.output("Out")[0], v.astype(dt))


def _cast_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g.astype(s.data(xv).dtype))


_register("cast", _cast_fwd, _cast_bwd)


def _fill_constant_fwd(op, s):
    s.set(op.output("Out")[0], np.full(op.attrs["shape"], op.attrs["value"],
                                       dtype=np.dtype(op.attrs["dtype"])))


_register("fill_constant", _fill_constant_fwd)


# --------------------------------------------------------------------------- reductions

def _mean_fwd(op, s):
    x = s.data(op.input("X")[0])
    if x.size == 0:
        raise ValueError(f"mean: input {op.input('X')[0].name} is empty")
    s.set(op.output("Out")[0], np.array([x.mean(dtype=np.float64)], dtype=x.dtype))


def _mean_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    s.add_grad(xv, np.full(x.shape, g.reshape(-1)[0] / x.size, dtype=x.dtype))


_register("mean", _mean_fwd, _mean_bwd)


def _reduce_fwd(fn):
    def fwd(op, s):
        x = s.data(op.input("X")[0])
        axes = _reduce_axes(op, x)
        keep = op.attrs.get("keep_dim", False)
        out = fn(x, axis=axes, keepdims=keep)
        if out.ndim == 0:
            out = out.reshape(1)
        s.set(op.output("Out")[0], np.asarray(out, dtype=x.dtype))
    return fwd


def _reduce_bwd(mean):
    def bwd(op, s):
        xv = op.input("X")[0]
        g = s.grad(op.output("Out")[0])
        if g is None or not s.needs_grad(xv):
            return
        x = s.data(xv)
        axes = _reduce_axes(op, x)
        kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
        g = np.broadcast_to(g.reshape(kept), x.shape)
        if mean:
            g = g / g.dtype.type(int(np.prod([x.shape[a] for a in axes])))
        s.add_grad(xv, np.array(g, dtype=x.dtype))
    return bwd


_register("reduce_sum", _reduce_fwd(np.sum), _reduce_bwd(False))
_register("reduce_mean", _reduce_fwd(np.mean), _reduce_bwd(True))


# --------------------------------------------------------------------------- sequences

def _seq_pool_fwd(op, s):
    xv = op.input("X")[0]
    x = s.value(xv)
    if x.__class__ is LoDTensor and x._unit:   # one row per sequence: every pool is it
        s.set(op.output("Out")[0], x.data)
        return
    if not isinstance(x, LoDTensor):
        raise ValueError(f"sequence_pool: input {xv.name} must be a LoD (lod_level=1) value")
    out, aux = sequence_pool_forward(x, op.attrs.get("pooltype", "SUM"))
    s.set(op.output("Out")[0], out)
    s.set_aux(op, aux)


def _seq_pool_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.value(xv)
    if x.__class__ is LoDTensor and x._unit:
        s.add_grad(xv, g)
        return
    s.add_grad(xv, sequence_pool_backward(s.value(xv), op.attrs.get("pooltype", "SUM"), g,
                                          s.aux(op)))


_register("sequence_pool", _seq_pool_fwd, _seq_pool_bwd)


# Losses and metrics (their own module), after this module's own kernels.
FORWARD.update(loss_ops.FORWARD)
BACKWARD.update(loss_ops.BACKWARD)

# dropout, batch_norm, data_norm, cvm, one_hot, transpose2 (their own module).
FORWARD.update(nn_ops.FORWARD)
BACKWARD.update(nn_ops.BACKWARD)
NO_GRAD |= nn_ops.NO_GRAD

# The layers of Fluid 1.8 PaddleRec's models use (their own module).
for _m in (math_ops, tensor_ops, rnn_ops, metric_ops, index_ops):
    FORWARD.update(_m.FORWARD)
    BACKWARD.update(_m.BACKWARD)
    NO_GRAD |= getattr(_m, "NO_GRAD", set())
STATEFUL |= tensor_ops.STATEFUL

"""The basic layers the others are built from (``paddle.fluid.layers``' shape ops,
elementwise math, activations, reductions and ``sequence_pool``), and the helpers
every layer module uses to append its operators to the current main program.
:mod:`pyfleet.fluid.layers` re-exports them with every other layer."""

import builtins

import numpy as np

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.tensor import convert_dtype

__all__ = [
    "cast",
    "concat",
    "elementwise_add",
    "elementwise_div",
    "elementwise_mul",
    "elementwise_sub",
    "exp",
    "log",
    "matmul",
    "mean",
    "reduce_mean",
    "reduce_sum",
    "relu",
    "reshape",
    "scale",
    "sequence_pool",
    "sigmoid",
    "slice",
    "softmax",
    "square",
    "sums",
    "tanh",
]


def _main():
    return framework.default_main_program()


def _block():
    return _main().global_block()


def _tmp(layer, shape, dtype="float32", lod_level=0):
    """A variable ``layer`` makes (a layer call's name, or a layer type: a call of its own)."""
    return _block().create_var(unique_name.tmp(layer), shape, dtype, lod_level)


def _named_out(layer_type, name, shape, dtype="float32"):
    """The output of a Fluid layer that names it ``name`` itself when given
    (elementwise ops, ``scale``), else ``<layer_type>_<k>.tmp_0``."""
    if name is None:
        return _tmp(layer_type, shape, dtype)
    return _block().create_var(name, shape, dtype)


def _op(type, inputs, outputs, attrs=None):
    return _block().append_op(type, inputs, outputs, attrs)


def _unary(type, x, shape=None, name=None):
    _check_var(x, f"{type} input")
    out = _tmp(unique_name.layer(type, name), shape if shape is not None else x.shape, x.dtype)
    _op(type, {"X": [x]}, {"Out": [out]})
    return out


def _act(x, act, layer):
    """``act`` applied to ``x`` as part of the call ``layer`` (Fluid's append_activation)."""
    if act is None:
        return x
    if act not in ("relu", "sigmoid", "tanh", "softmax"):
        raise ValueError(f"unsupported activation {act!r}; expected relu, sigmoid, tanh, "
                         "softmax or None")
    out = _tmp(layer, x.shape, x.dtype)
    _op(act, {"X": [x]}, {"Out": [out]})
    return out


# --------------------------------------------------------------------------- shape ops

def concat(input, axis=0, name=None):
    xs = [_check_var(x, "concat input") for x in input]
    if not xs:
        raise ValueError("concat needs at least one input")
    ref = xs[0].shape
    ax = axis % len(ref)
    total = 0
    for x in xs:
        if x.shape[ax] < 0:
            total = -1
            break
        total += x.shape[ax]
    shape = tuple(total if i == ax else d for i, d in enumerate(ref))
    out = _tmp(unique_name.layer("concat", name), shape, xs[0].dtype)
    _op("concat", {"X": xs}, {"Out": [out]}, {"axis": axis})
    return out


def sums(input, out=None):
    """Fluid's: the sum of the variables ``input``, into ``out`` when given (a variable
    of the program, as ``create_tensor`` makes), else a new one."""
    xs = [_check_var(x, "sums input") for x in input]
    res = _tmp("sum", xs[0].shape, xs[0].dtype) if out is None else _check_var(out, "sums out")
    if res.shape is None:   # an empty create_tensor takes the sum's shape
        res.shape = xs[0].shape
    _op("sum", {"X": xs}, {"Out": [res]})
    return res


def reshape(x, shape, actual_shape=None, act=None, inplace=False, name=None):
    _check_var(x, "reshape input")
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: at most one -1 in shape, got {shape}")
    static = tuple(x.shape[i] if d == 0 else d for i, d in enumerate(shape))
    layer = unique_name.layer("reshape2", name)
    out = _tmp(layer, static, x.dtype)
    _tmp(layer, None, x.dtype)   # Fluid's XShape output, made second
    _op("reshape2", {"X": [x]}, {"Out": [out]}, {"shape": shape})
    return _act(out, act, layer)


def slice(input, axes, starts, ends):
    _check_var(input, "slice input")
    shape = list(input.shape)
    for a, b, e in zip(axes, starts, ends):
        if shape[a] >= 0:
            shape[a] = len(builtins.range(*builtins.slice(b, e).indices(shape[a])))
    out = _tmp("slice", tuple(shape), input.dtype)
    _op("slice", {"Input": [input]}, {"Out": [out]},
        {"axes": list(axes), "starts": list(starts), "ends": list(ends)})
    return out


def cast(x, dtype):
    _check_var(x, "cast input")
    out = _tmp("cast", x.shape, dtype, x.lod_level)
    _op("cast", {"X": [x]}, {"Out": [out]}, {"out_dtype": convert_dtype(dtype).str})
    return out


# --------------------------------------------------------------------------- math

def _elementwise(type, x, y, axis, act, name=None):
    """Fluid's _elementwise_op: the output is ``name`` when given, else a tmp of the call."""
    _check_var(x, f"{type} x")
    _check_var(y, f"{type} y")
    shape = x.shape if len(x.shape) >= len(y.shape) else y.shape
    layer = unique_name.layer(type)
    out = _tmp(layer, shape, x.dtype) if name is None else _block().create_var(
        name, shape, x.dtype)
    _op(type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": int(axis)})
    return _act(out, act, layer)


def elementwise_add(x, y, axis=-1, act=None, name=None):
    return _elementwise("elementwise_add", x, y, axis, act, name)


def elementwise_sub(x, y, axis=-1, act=None, name=None):
    return _elementwise("elementwise_sub", x, y, axis, act, name)


def elementwise_mul(x, y, axis=-1, act=None, name=None):
    return _elementwise("elementwise_mul", x, y, axis, act, name)


def elementwise_div(x, y, axis=-1, act=None, name=None):
    return _elementwise("elementwise_div", x, y, axis, act, name)


def matmul(x, y, transpose_x=False, transpose_y=False, alpha=1.0, name=None):
    _check_var(x, "matmul x")
    _check_var(y, "matmul y")
    xs = list(x.shape[::-1][:2][::-1]) if not transpose_x else list(x.shape[-2:][::-1])
    ys = list(y.shape[-2:]) if not transpose_y else list(y.shape[-2:][::-1])
    shape = tuple(x.shape[:-2]) + (xs[0], ys[1])
    out = _tmp(unique_name.layer("matmul", name), shape, x.dtype)
    _op("matmul", {"X": [x], "Y": [y]}, {"Out": [out]},
        {"transpose_x": bool(transpose_x), "transpose_y": bool(transpose_y),
         "alpha": float(alpha)})
    return out


def scale(x, scale=1.0, bias=0.0, bias_after_scale=True, act=None, name=None):
    _check_var(x, "scale input")
    layer = unique_name.layer("scale")
    out = _tmp(layer, x.shape, x.dtype) if name is None else _block().create_var(
        name, x.shape, x.dtype)
    _op("scale", {"X": [x]}, {"Out": [out]},
        {"scale": float(scale), "bias": float(bias), "bias_after_scale": bool(bias_after_scale)})
    return _act(out, act, layer)


def sigmoid(x, name=None):
    return _unary("sigmoid", x, name=name)


def relu(x, name=None):
    return _unary("relu", x, name=name)


def tanh(x, name=None):
    return _unary("tanh", x, name=name)


def softmax(input, use_cudnn=False, name=None, axis=-1):
    if axis not in (-1, len(input.shape) - 1):
        raise ValueError("softmax: only the last axis is supported")
    return _unary("softmax", input, name=name)


def square(x, name=None):
    return _unary("square", x, name=name)


def exp(x, name=None):
    return _unary("exp", x, name=name)


def log(x, name=None):
    return _unary("log", x, name=name)


def mean(x, name=None):
    _check_var(x, "mean input")
    out = _tmp(unique_name.layer("mean", name), (1,), x.dtype)
    _op("mean", {"X": [x]}, {"Out": [out]})
    return out


def _reduce(type, input, dim, keep_dim, name=None):
    _check_var(input, f"{type} input")
    nd = len(input.shape)
    if dim is None:
        shape = (1,) * nd if keep_dim else (1,)
    else:
        dims = {d % nd for d in ([dim] if np.isscalar(dim) else dim)}
        shape = tuple(1 if i in dims else s for i, s in enumerate(input.shape)
                      if keep_dim or i not in dims) or (1,)
    out = _tmp(unique_name.layer(type, name), shape, input.dtype)
    _op(type, {"X": [input]}, {"Out": [out]},
        {"dim": dim, "keep_dim": bool(keep_dim), "reduce_all": dim is None})
    return out


def reduce_sum(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_sum", input, dim, keep_dim, name)


def reduce_mean(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_mean", input, dim, keep_dim, name)


# --------------------------------------------------------------------------- sequences

def sequence_pool(input, pool_type, is_test=False, pad_value=0.0):
    """Pool each sequence of a lod_level=1 input: ``sum``, ``average``,
    ``sqrt`` (sum / sqrt(length)), ``max``, ``first`` or ``last``. An empty
    sequence gives zeros."""
    _check_var(input, "sequence_pool input")
    if input.lod_level != 1:
        raise ValueError(f"sequence_pool input {input.name} must have lod_level=1")
    pool_type = str(pool_type).lower()
    if pool_type not in ("sum", "average", "sqrt", "max", "first", "last"):
        raise ValueError(f"sequence_pool: unknown pool_type {pool_type!r}")
    if pad_value != 0.0:
        raise ValueError("sequence_pool: only pad_value=0.0 is supported")
    layer = unique_name.layer("sequence_pool")
    out = _tmp(layer, tuple(input.shape), input.dtype)
    unique_name.tmp(layer)      # Fluid's MaxIndex output
    _op("sequence_pool", {"X": [input]}, {"Out": [out]}, {"pooltype": pool_type.upper()})
    return out

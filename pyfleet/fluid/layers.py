"""Layer functions with the signatures of ``paddle.fluid.layers`` (1.5).

Each call appends operators (and parameters) to the current main program
(:func:`pyfleet.fluid.program_guard`) and returns the output
:class:`~pyfleet.fluid.framework.Variable`. Every layer has a numpy kernel and
a gradient (:mod:`pyfleet.fluid.ops`); ``docs/layers.md`` lists them with the
differences from Fluid.

Default initializers, as Fluid: fc weights ``Xavier``, biases ``Constant(0)``,
dense embeddings ``Xavier``. A sparse-table embedding (``is_distributed=True``
or a vocabulary of at least ``SPARSE_TABLE_MIN_VOCAB`` rows) defaults to
``Uniform(-0.01, 0.01)`` per row (:data:`pyfleet.table.DEFAULT_INITIALIZER`);
an explicit ``Xavier`` there uses the declared ``[vocab, dim]`` fans.
"""

import builtins

import numpy as np

from pyfleet import initializer as _init
from pyfleet.fluid import framework, unique_name
from pyfleet.fluid import layers_create as _lc
from pyfleet.fluid import layers_index as _li
from pyfleet.fluid import layers_lr as _lr
from pyfleet.fluid import layers_math as _lm
from pyfleet.fluid import layers_metric as _lmt
from pyfleet.fluid import layers_nn as _ln
from pyfleet.fluid import layers_tensor as _lt
from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_create import *  # noqa: F403
from pyfleet.fluid.layers_index import *  # noqa: F403
from pyfleet.fluid.layers_lr import *  # noqa: F403 (their __all__ joins this module's)
from pyfleet.fluid.layers_math import *  # noqa: F403
from pyfleet.fluid.layers_metric import *  # noqa: F403
from pyfleet.fluid.layers_nn import *  # noqa: F403
from pyfleet.fluid.layers_tensor import *  # noqa: F403
from pyfleet.fluid.param_attr import ParamAttr, create_parameter_in
from pyfleet.fluid.reader import PyReader, double_buffer, py_reader, read_file
from pyfleet.fluid.tensor import convert_dtype
from pyfleet.table import DEFAULT_INITIALIZER

__all__ = [
    "cast",
    "concat",
    "create_parameter",
    "create_py_reader_by_data",
    "cross_entropy",
    "data",
    "double_buffer",
    "elementwise_add",
    "elementwise_div",
    "elementwise_mul",
    "elementwise_sub",
    "embedding",
    "embedding_v2",
    "exp",
    "fc",
    "log",
    "log_loss",
    "matmul",
    "mean",
    "py_reader",
    "read_file",
    "reduce_mean",
    "reduce_sum",
    "relu",
    "reshape",
    "scale",
    "sequence_pool",
    "sigmoid",
    "sigmoid_cross_entropy_with_logits",
    "slice",
    "softmax",
    "square",
    "square_error_cost",
    "sums",
    "tanh",
] + _lmt.__all__ + _lm.__all__ + _lt.__all__ + _lr.__all__ + _li.__all__ + _lc.__all__ + [
    n for n in _ln.__all__ if n != "one_hot_v2"]


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


def _param(attr, shape, dtype, default_initializer, layer, is_sparse_table=False,
           is_bias=False):
    """A parameter of the call ``layer``: ``attr``'s name, else ``<layer>.w_<n>``/``.b_<n>``."""
    if attr.name is None:
        attr = _with_name(attr, unique_name.param(layer, is_bias))
    return create_parameter_in(_main(), framework.default_startup_program(), attr, shape,
                               dtype, default_initializer, None, is_sparse_table)


def _with_name(attr, name):
    return ParamAttr(name, attr.initializer, attr.learning_rate, attr.regularizer,
                     attr.trainable, attr.gradient_clip, attr.do_model_average)


# --------------------------------------------------------------------------- inputs

def data(name, shape, dtype="float32", lod_level=0, append_batch_size=True,
         type=None, stop_gradient=True):
    """An input fed by name. ``lod_level=1``: a batch of variable-length
    sequences (fed as a LoDTensor, a ``(values, offsets)`` tuple or a list of
    sequences)."""
    shape = [-1 if s is None else int(s) for s in shape]
    if any(s < 0 for s in shape):
        append_batch_size = False
    if append_batch_size:
        shape = [-1] + shape
    if lod_level not in (0, 1):
        raise ValueError(f"data {name!r}: only lod_level 0 or 1 is supported, got {lod_level}")
    return _lt.declared_data(name, shape, dtype, lod_level) or _block().create_var(
        name, shape, dtype, lod_level, stop_gradient=stop_gradient, is_data=True)


def create_py_reader_by_data(capacity, feed_list, name=None, use_double_buffer=True):
    """A non-iterable :class:`~pyfleet.fluid.reader.PyReader` filling ``feed_list``:
    ``start()``, ``exe.run(program)`` until ``fluid.core.EOFException``, ``reset()``."""
    return PyReader(feed_list, capacity, use_double_buffer, iterable=False)


def embedding(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
              param_attr=None, dtype="float32"):
    """Look up rows of ``size = [vocab, dim]`` for integer ids.

    A ``lod_level=1`` input gives a LoD output of one row per id; ids shaped
    ``[..., 1]`` give ``[..., dim]``. Embeddings with the same ``param_attr``
    name share one parameter (or sparse table). ``is_distributed=True``, or
    ``vocab >= SPARSE_TABLE_MIN_VOCAB``, makes the parameter a sparse table
    keyed by the raw uint64 id (ids unbounded); otherwise ids must lie in
    ``[0, vocab)``.
    """
    return _embedding(input, size, is_sparse, is_distributed, padding_idx, param_attr, dtype,
                      keep_last_dim=False)


def embedding_v2(input, size, is_sparse=False, is_distributed=False, padding_idx=None,
                 param_attr=None, dtype="float32"):
    """``fluid.embedding`` (Fluid 1.5's lookup_table_v2): the output shape is
    the ids' shape plus ``[dim]`` (a trailing 1 is kept)."""
    return _embedding(input, size, is_sparse, is_distributed, padding_idx, param_attr, dtype,
                      keep_last_dim=True)


def _embedding(input, size, is_sparse, is_distributed, padding_idx, param_attr, dtype,
               keep_last_dim):
    _check_var(input, "embedding input")
    if input.dtype.kind not in "iu":
        raise ValueError(f"embedding input {input.name} must hold integer ids, got "
                         f"{input.dtype}")
    if len(size) != 2 or int(size[0]) < 1 or int(size[1]) < 1:
        raise ValueError(f"embedding size must be [vocab, dim] with positive entries, "
                         f"got {size!r}")
    vocab, dim = int(size[0]), int(size[1])
    sparse_table = bool(is_distributed) or vocab >= framework.SPARSE_TABLE_MIN_VOCAB
    layer = unique_name.layer("embedding")
    attr = ParamAttr._to_attr(param_attr)
    default = DEFAULT_INITIALIZER if sparse_table else _init.Xavier()
    w = _param(attr, [vocab, dim], dtype, default, layer, sparse_table)
    if padding_idx is not None:
        padding_idx = int(padding_idx)
        if padding_idx < 0:
            padding_idx += vocab
    if input.shape and input.shape[-1] == 1 and not keep_last_dim:
        shape = tuple(input.shape[:-1]) + (dim,)
    else:
        shape = tuple(input.shape or (-1,)) + (dim,)
    out = _tmp(layer, shape, dtype, input.lod_level)
    _op("lookup_table", {"W": [w], "Ids": [input]}, {"Out": [out]},
        {"is_sparse": bool(is_sparse), "is_distributed": bool(is_distributed),
         "padding_idx": padding_idx, "keep_last_dim": bool(keep_last_dim)})
    return out


def fc(input, size, num_flatten_dims=1, param_attr=None, bias_attr=None, act=None,
       is_test=False, name=None):
    """Fully connected: ``act(sum_i flatten(input_i) @ W_i + b)``; a list input
    gets one weight per input, summed, as Fluid."""
    inputs = list(input) if isinstance(input, (list, tuple)) else [input]
    if not inputs:
        raise ValueError("fc needs at least one input")
    attrs = list(param_attr) if isinstance(param_attr, (list, tuple)) else \
        [param_attr] * len(inputs)
    if len(attrs) != len(inputs):
        raise ValueError(f"fc: {len(attrs)} param_attrs for {len(inputs)} inputs")
    size = int(size)
    layer = unique_name.layer("fc", name)
    partial = []
    for x, a in zip(inputs, attrs):
        _check_var(x, "fc input")
        feat = x.shape[num_flatten_dims:]
        if any(d < 0 for d in feat):
            raise ValueError(f"fc input {x.name} has unknown feature dims {x.shape}")
        k = int(np.prod(feat))
        attr = ParamAttr._to_attr(a)
        if attr is False:
            raise ValueError("fc weights cannot be disabled (param_attr=False)")
        w = _param(attr, [k, size], x.dtype, _init.Xavier(), layer)
        out = _tmp(layer, tuple(x.shape[:num_flatten_dims]) + (size,), x.dtype)
        _op("mul", {"X": [x], "Y": [w]}, {"Out": [out]},
            {"x_num_col_dims": num_flatten_dims, "y_num_col_dims": 1})
        partial.append(out)
    if len(partial) == 1:
        pre = partial[0]
    else:
        pre = _tmp(layer, partial[0].shape, partial[0].dtype)
        _op("sum", {"X": partial}, {"Out": [pre]})
    battr = ParamAttr._to_attr(bias_attr)
    if battr is not False:
        b = _param(battr, [size], pre.dtype, _init.Constant(0.0), layer, is_bias=True)
        biased = _tmp(layer, pre.shape, pre.dtype)
        _op("elementwise_add", {"X": [pre], "Y": [b]}, {"Out": [biased]},
            {"axis": num_flatten_dims})
        pre = biased
    return _act(pre, act, layer)


def create_parameter(shape, dtype, name=None, attr=None, is_bias=False,
                     default_initializer=None):
    """A free parameter usable by any layer (e.g. with matmul)."""
    attr = ParamAttr._to_attr(attr)
    if attr is False:
        raise ValueError("create_parameter needs a ParamAttr, not False")
    if name is not None and attr.name is None:
        attr = _with_name(attr, name)
    default = default_initializer or (_init.Constant(0.0) if is_bias else _init.Xavier())
    return _param(attr, [int(s) for s in shape], dtype, default,
                  unique_name.layer("create_parameter"), is_bias=is_bias)


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
    xs = [_check_var(x, "sums input") for x in input]
    res = _tmp("sum", xs[0].shape, xs[0].dtype)
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


# --------------------------------------------------------------------------- losses

def sigmoid_cross_entropy_with_logits(x, label, ignore_index=-100, name=None, normalize=False):
    _check_var(x, "sigmoid_cross_entropy_with_logits x")
    _check_var(label, "sigmoid_cross_entropy_with_logits label")
    out = _tmp(unique_name.layer("sigmoid_cross_entropy_with_logits", name), x.shape, x.dtype)
    _op("sigmoid_cross_entropy_with_logits", {"X": [x], "Label": [label]}, {"Out": [out]},
        {"ignore_index": int(ignore_index), "normalize": bool(normalize)})
    return out


def cross_entropy(input, label, soft_label=False, ignore_index=-100):
    """``-log(input[label])`` per row: ``input`` probabilities ``[B, C]``,
    ``label`` int64 ``[B, 1]`` (or ``[B, C]`` with ``soft_label``)."""
    _check_var(input, "cross_entropy input")
    _check_var(label, "cross_entropy label")
    # Fluid 1.8 builds a hard-label cross_entropy as its cross_entropy2 layer.
    layer = unique_name.layer("cross_entropy" if soft_label else "cross_entropy2")
    out = _tmp(layer, tuple(input.shape[:-1]) + (1,), input.dtype)
    _op("cross_entropy", {"X": [input], "Label": [label]}, {"Y": [out]},
        {"soft_label": bool(soft_label), "ignore_index": int(ignore_index)})
    return out


def log_loss(input, label, epsilon=1e-4, name=None):
    _check_var(input, "log_loss input")
    out = _tmp(unique_name.layer("log_loss", name), input.shape, input.dtype)
    _op("log_loss", {"Predicted": [input], "Labels": [label]}, {"Loss": [out]},
        {"epsilon": float(epsilon)})
    return out


def square_error_cost(input, label):
    layer = unique_name.layer("square_error_cost")
    _check_var(input, "square_error_cost input")
    _check_var(label, "square_error_cost label")
    minus = _tmp(layer, input.shape, input.dtype)
    _op("elementwise_sub", {"X": [input], "Y": [label]}, {"Out": [minus]}, {"axis": -1})
    out = _tmp(layer, input.shape, input.dtype)
    _op("square", {"X": [minus]}, {"Out": [out]})
    return out


_refusals.install(globals(), "paddle.fluid.layers")   # shadows range, hash: use builtins.*

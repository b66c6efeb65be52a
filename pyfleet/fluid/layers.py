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

import numpy as np

from pyfleet import initializer as _init
from pyfleet.fluid import framework, unique_name
from pyfleet.fluid import layers_basic as _lb
from pyfleet.fluid import layers_create as _lc
from pyfleet.fluid import layers_index as _li
from pyfleet.fluid import layers_lr as _lr
from pyfleet.fluid import layers_math as _lm
from pyfleet.fluid import layers_metric as _lmt
from pyfleet.fluid import layers_nn as _ln
from pyfleet.fluid import layers_tensor as _lt
from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_basic import *  # noqa: F403
from pyfleet.fluid.layers_basic import _act, _block, _main, _op, _tmp
from pyfleet.fluid.layers_create import *  # noqa: F403
from pyfleet.fluid.layers_index import *  # noqa: F403
from pyfleet.fluid.layers_lr import *  # noqa: F403 (their __all__ joins this module's)
from pyfleet.fluid.layers_math import *  # noqa: F403
from pyfleet.fluid.layers_metric import *  # noqa: F403
from pyfleet.fluid.layers_nn import *  # noqa: F403
from pyfleet.fluid.layers_tensor import *  # noqa: F403
from pyfleet.fluid.param_attr import ParamAttr, create_parameter_in
from pyfleet.fluid.reader import PyReader, double_buffer, py_reader, read_file
from pyfleet.table import DEFAULT_INITIALIZER

__all__ = [
    "create_parameter",
    "create_py_reader_by_data",
    "cross_entropy",
    "data",
    "double_buffer",
    "embedding",
    "embedding_v2",
    "fc",
    "log_loss",
    "py_reader",
    "read_file",
    "sigmoid_cross_entropy_with_logits",
    "square_error_cost",
] + _lb.__all__ + _lmt.__all__ + _lm.__all__ + _lt.__all__ + _lr.__all__ + _li.__all__ + _lc.__all__ + [
    n for n in _ln.__all__ if n != "one_hot_v2"]


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

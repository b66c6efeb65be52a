"""Layers of Fluid 1.6's ``fluid.layers`` used by CTR models beyond the basic
set: ``dropout``, ``batch_norm``, ``data_norm``, ``continuous_value_model``,
``one_hot``, ``transpose`` (re-exported by :mod:`pyfleet.fluid.layers`), and
``fluid.one_hot`` (:func:`one_hot_v2`). Kernels in :mod:`pyfleet.fluid.nn_ops`.

``batch_norm``'s moving mean/variance and ``data_norm``'s batch size/sum/
square sum are parameters updated outside the gradient (``stat_rule`` set on
them): the local backend keeps them; a backend that does not
(``keeps_op_statistics``, e.g. Fleet's parameter servers, where each worker
would keep its own copy) refuses them by name when the startup program runs.
"""

from pyfleet import initializer as _init
from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.param_attr import ParamAttr, create_parameter_in

__all__ = ["batch_norm", "continuous_value_model", "conv2d", "data_norm", "dropout",
           "dynamic_gru", "layer_norm", "one_hot", "one_hot_v2", "prelu", "transpose"]

_ACTS = ("relu", "sigmoid", "tanh", "softmax")


def _block():
    return framework.default_main_program().global_block()


def _tmp(layer, shape, dtype="float32", lod_level=0):
    """A variable ``layer`` makes (a layer call's name, or a layer type: a call of its own)."""
    return _block().create_var(unique_name.tmp(layer), shape, dtype, lod_level)


def _op(type, inputs, outputs, attrs=None):
    return _block().append_op(type, inputs, outputs, attrs)


def _act(x, act, layer, call=None):
    """``act`` applied to ``x`` as part of the layer call ``call`` (Fluid's append_activation)."""
    if act is None:
        return x
    if act not in _ACTS:
        raise ValueError(f"{layer}: unsupported act {act!r}; expected one of {_ACTS} or None")
    out = _tmp(call if call is not None else act, x.shape, x.dtype, x.lod_level)
    _op(act, {"X": [x]}, {"Out": [out]})
    return out


def _param(attr, shape, dtype, default_init, prefix):
    return create_parameter_in(framework.default_main_program(),
                               framework.default_startup_program(), attr, shape, dtype,
                               default_init, prefix)


def _statistic(name, shape, dtype, value, rule):
    attr = ParamAttr(name=name, initializer=_init.Constant(float(value)), trainable=False)
    p = _param(attr, shape, dtype, None, name)
    p.stat_rule = rule
    return p


def _named(attr, layer, is_bias=False):
    """``attr`` (a ParamAttr, a name, an initializer, None), named as Fluid names a
    parameter of the call ``layer`` if it has no name (``<layer>.w_<n>``/``.b_<n>``)."""
    attr = ParamAttr._to_attr(attr)
    if attr is False or attr.name is not None:
        return attr
    return ParamAttr(unique_name.param(layer, is_bias), attr.initializer, attr.learning_rate,
                     attr.regularizer, attr.trainable, attr.gradient_clip,
                     attr.do_model_average)


def _refuse(layer, **options):
    for key, (value, default, why) in options.items():
        if value != default:
            raise ValueError(f"{layer}: {key}={value!r} is not supported ({why})")


# --------------------------------------------------------------------------- dropout

def dropout(x, dropout_prob, is_test=False, seed=None, name=None,
            dropout_implementation="downgrade_in_infer"):
    """Fluid's dropout: zero each element with probability ``dropout_prob``.

    ``downgrade_in_infer`` (Fluid's default): training ``x * mask``, test
    ``x * (1 - p)``; ``upscale_in_train``: training ``x * mask / (1 - p)``,
    test ``x``. Test mode: ``is_test=True`` or a ``clone(for_test=True)``
    program. A ``seed`` draws the same mask on every run (Fluid's fixed
    seed); without one the masks follow the program's ``random_seed``."""
    _check_var(x, "dropout x")
    p = float(dropout_prob)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: dropout_prob must be in [0, 1], got {dropout_prob!r}")
    if dropout_implementation not in ("downgrade_in_infer", "upscale_in_train"):
        raise ValueError(f"dropout: dropout_implementation must be 'downgrade_in_infer' or "
                         f"'upscale_in_train', got {dropout_implementation!r}")
    layer = unique_name.layer("dropout", name)
    out = _tmp(layer, x.shape, x.dtype, x.lod_level)
    unique_name.tmp(layer)      # Fluid's Mask output
    _op("dropout", {"X": [x]}, {"Out": [out]},
        {"dropout_prob": p, "is_test": bool(is_test), "fix_seed": seed is not None,
         "seed": 0 if seed is None else int(seed),
         "dropout_implementation": dropout_implementation})
    return out


# --------------------------------------------------------------------------- batch_norm

def batch_norm(input, act=None, is_test=False, momentum=0.9, epsilon=1e-05, param_attr=None,
               bias_attr=None, data_layout="NCHW", in_place=False, name=None,
               moving_mean_name=None, moving_variance_name=None,
               do_model_average_for_mean_and_var=False, fuse_with_relu=False,
               use_global_stats=False):
    """Fluid's batch_norm over the channel axis (1 for NCHW and for 2-D
    ``[N, C]`` input, the last for NHWC).

    Training: normalize by the batch's mean and (biased) variance, and move
    ``moving = moving * momentum + batch * (1 - momentum)``. Test mode
    (``is_test``, a ``for_test`` clone, an inference model) or
    ``use_global_stats``: normalize by the moving statistics, which stay.
    Parameters as Fluid names them: ``<name>.w_0`` scale (1), ``.b_0`` bias
    (0), ``.w_1`` moving mean (0), ``.w_2`` moving variance (1)."""
    _check_var(input, "batch_norm input")
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"batch_norm: data_layout must be 'NCHW' or 'NHWC', got "
                         f"{data_layout!r}")
    if not 2 <= len(input.shape) <= 5:
        raise ValueError(f"batch_norm: input {input.name} must have 2 to 5 dimensions, got "
                         f"shape {input.shape}")
    _refuse("batch_norm", fuse_with_relu=(fuse_with_relu, False,
                                          "use act='relu', which Fluid's CPU kernel honours"))
    c = 1 if data_layout == "NCHW" or len(input.shape) == 2 else len(input.shape) - 1
    channels = int(input.shape[c])
    if channels < 1:
        raise ValueError(f"batch_norm: input {input.name} has an unknown channel count "
                         f"(shape {input.shape}, axis {c})")
    prefix = unique_name.layer("batch_norm", name)
    dtype = input.dtype
    scale = _param(_named(param_attr, prefix), [channels], dtype,
                   _init.Constant(1.0), prefix)
    battr = ParamAttr._to_attr(bias_attr)
    if battr is False:
        raise ValueError("batch_norm: bias_attr=False is not supported (Fluid always has "
                         "the bias)")
    bias = _param(_named(battr, prefix, is_bias=True), [channels], dtype,
                  _init.Constant(0.0), prefix)
    mean = _statistic(moving_mean_name or unique_name.param(prefix), [channels], dtype, 0.0,
                      "batch_norm")
    var = _statistic(moving_variance_name or unique_name.param(prefix), [channels], dtype,
                     1.0, "batch_norm")
    unique_name.tmp(prefix)     # Fluid's SavedMean and SavedVariance, made before Y
    unique_name.tmp(prefix)
    out = _tmp(prefix, input.shape, dtype, input.lod_level)
    _op("batch_norm", {"X": [input], "Scale": [scale], "Bias": [bias], "Mean": [mean],
                       "Variance": [var]},
        {"Y": [out]},
        {"momentum": float(momentum), "epsilon": float(epsilon), "is_test": bool(is_test),
         "data_layout": data_layout, "use_global_stats": bool(use_global_stats)})
    return _act(out, act, "batch_norm", prefix)


# --------------------------------------------------------------------------- data_norm

def data_norm(input, act=None, epsilon=1e-05, param_attr=None, data_layout="NCHW",
              in_place=False, name=None, moving_mean_name=None, moving_variance_name=None,
              do_model_average_for_mean_and_var=False, summary_decay_rate=0.999999):
    """PaddleRec's data normalization of a 2-D ``[N, C]`` input (Fluid 1.6).

    ``y = (x - sum / size) * sqrt(size / square_sum)`` per column, from three
    ``[C]`` statistics parameters ``<name>.batch_size`` (initially 1e4),
    ``.batch_sum`` (0) and ``.batch_square_sum`` (1e4); ``param_attr`` may be
    a dict ``{"batch_size": .., "batch_sum": .., "batch_square": ..}`` of
    initial values, as in Fluid. Each training step adds the batch to them
    the way Fluid's PSLib summary table does: ``stat = stat * decay + (N,
    sum x, sum (x - mean)^2 + N * epsilon)`` with ``decay =
    summary_decay_rate`` (PSLib's default 0.999999; the keyword is Fluid 1.8's).
    The gradient reaching ``x`` is ``dy * sqrt(size / square_sum)``."""
    _check_var(input, "data_norm input")
    if data_layout not in ("NCHW", "NHWC"):
        raise ValueError(f"data_norm: data_layout must be 'NCHW' or 'NHWC', got "
                         f"{data_layout!r}")
    if len(input.shape) != 2 or int(input.shape[1]) < 1:
        raise ValueError(f"data_norm: input {input.name} must be 2-D [N, C] with known C "
                         f"(Fluid's kernel is 2-D only), got shape {input.shape}")
    if not 0.0 <= float(epsilon) <= 1e-3:
        raise ValueError(f"data_norm: epsilon must be in [0, 0.001] as in Fluid, got "
                         f"{epsilon!r}")
    if not 0.0 < float(summary_decay_rate) <= 1.0:
        raise ValueError(f"data_norm: summary_decay_rate must be in (0, 1], got "
                         f"{summary_decay_rate!r}")
    init = {"batch_size": 1e4, "batch_sum": 0.0, "batch_square": 1e4}
    if isinstance(param_attr, dict):
        unknown = set(param_attr) - set(init)
        if unknown:
            raise ValueError(f"data_norm: param_attr keys {sorted(unknown)} are unknown; "
                             f"expected {sorted(init)}")
        init.update({k: float(v) for k, v in param_attr.items()})
    elif param_attr is not None:
        raise ValueError("data_norm: param_attr must be a dict of initial values "
                         "{'batch_size', 'batch_sum', 'batch_square'} or None (Fluid uses "
                         f"nothing else of it), got {param_attr!r}")
    call = unique_name.layer("data_norm", name)
    prefix = name or "dn"       # Fluid's statistics names when the layer has no name
    c = [int(input.shape[1])]
    size = _statistic(f"{prefix}.batch_size", c, input.dtype, init["batch_size"], "data_norm")
    total = _statistic(f"{prefix}.batch_sum", c, input.dtype, init["batch_sum"], "data_norm")
    square = _statistic(f"{prefix}.batch_square_sum", c, input.dtype, init["batch_square"],
                        "data_norm")
    # Fluid makes the output with create_variable() and no name: "_generated_var_<n>".
    out = _block().create_var(None, input.shape, input.dtype, input.lod_level)
    _op("data_norm", {"X": [input], "BatchSize": [size], "BatchSum": [total],
                      "BatchSquareSum": [square]},
        {"Y": [out]},
        {"epsilon": float(epsilon), "data_layout": data_layout,
         "summary_decay_rate": float(summary_decay_rate)})
    return _act(out, act, "data_norm", call)


# --------------------------------------------------------------------------- cvm

def continuous_value_model(input, cvm, use_cvm=True):
    """Fluid's cvm op of the CTR models: ``input`` ``[N, D]`` rows whose first
    two columns are show and click, ``cvm`` ``[N, 2]`` (one row per sample;
    per sequence for a LoD input). ``use_cvm=True``: ``[log(show + 1),
    log(click + 1) - log(show + 1), rest]``; ``False``: the rest ``[N, D - 2]``.
    As Fluid's cvm_grad, the gradient of the show and click columns is the
    ``cvm`` values themselves (PSLib's accessor counted them)."""
    _check_var(input, "continuous_value_model input")
    _check_var(cvm, "continuous_value_model cvm")
    if len(input.shape) != 2 or input.shape[1] < 2:
        raise ValueError(f"continuous_value_model: input {input.name} must be [N, D] with "
                         f"D >= 2, got shape {input.shape}")
    d = int(input.shape[1])
    out = _tmp("cvm", (input.shape[0], d if use_cvm else d - 2), input.dtype,
               input.lod_level)
    _op("cvm", {"X": [input], "CVM": [cvm]}, {"Y": [out]}, {"use_cvm": bool(use_cvm)})
    return out


# --------------------------------------------------------------------------- one_hot

def _one_hot(input, depth, allow_out_of_range, drop_last_dim, layer):
    _check_var(input, f"{layer} input")
    if input.dtype.kind not in "iu":
        raise ValueError(f"{layer}: input {input.name} must hold integer ids, got "
                         f"{input.dtype}")
    if isinstance(depth, framework.Variable):
        raise TypeError(f"{layer}: depth must be an int (a Variable depth is not supported)")
    depth = int(depth)
    if depth < 1:
        raise ValueError(f"{layer}: depth must be positive, got {depth}")
    shape = tuple(input.shape)
    if drop_last_dim:
        if not shape or shape[-1] != 1:
            raise ValueError(f"{layer}: input {input.name} must end in a dimension of 1 "
                             f"(fluid.one_hot takes ids without it), got shape {shape}")
        shape = shape[:-1]
    out = _tmp("one_hot" if drop_last_dim else "one_hot_v2", shape + (depth,), "float32",
               input.lod_level)
    out.stop_gradient = True
    _op("one_hot", {"X": [input]}, {"Out": [out]},
        {"depth": depth, "allow_out_of_range": bool(allow_out_of_range),
         "drop_last_dim": drop_last_dim})
    return out


def one_hot(input, depth, allow_out_of_range=False):
    """``fluid.layers.one_hot``: ids ``[..., 1]`` -> float32 ``[..., depth]``.
    An id outside ``[0, depth)`` is an error, or a zero row with
    ``allow_out_of_range=True``."""
    return _one_hot(input, depth, allow_out_of_range, True, "one_hot")


def one_hot_v2(input, depth, allow_out_of_range=False):
    """``fluid.one_hot`` (1.6's v2): ids of any shape -> shape + ``[depth]``."""
    return _one_hot(input, depth, allow_out_of_range, False, "fluid.one_hot")


# --------------------------------------------------------------------------- transpose

def transpose(x, perm, name=None):
    """Permute the axes of ``x``: output axis ``i`` is input axis ``perm[i]``."""
    _check_var(x, "transpose x")
    perm = [int(p) for p in perm]
    if sorted(perm) != list(range(len(x.shape))):
        raise ValueError(f"transpose: perm {perm} must be a permutation of the "
                         f"{len(x.shape)} axes of {x.name} (shape {x.shape})")
    out = _tmp(unique_name.layer("transpose", name), tuple(x.shape[p] for p in perm), x.dtype)
    _op("transpose2", {"X": [x]}, {"Out": [out]}, {"axis": perm})
    return out


# --------------------------------------------------------------------------- conv2d

def _pair(value, what):
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) and v >= 0 for v in value):
        return tuple(value)
    raise ValueError(f"conv2d: {what} must be an int or a pair of ints, got {value!r}")


def conv2d(input, num_filters, filter_size, stride=1, padding=0, dilation=1, groups=None,
           param_attr=None, bias_attr=None, use_cudnn=True, act=None, name=None,
           data_format="NCHW"):
    """Fluid's 2-D convolution of an NCHW input (xDeepFM's CIN uses 1x1
    filters): filter ``[num_filters, C, kh, kw]`` (default ``Normal(0,
    sqrt(2 / (kh * kw * C)))`` as Fluid), bias ``[num_filters]`` (Constant 0;
    ``bias_attr=False``: none), symmetric zero ``padding``, ``stride``,
    ``dilation``. ``groups`` other than 1, NHWC and padding strings are
    refused by name."""
    _check_var(input, "conv2d input")
    if data_format != "NCHW":
        raise ValueError(f"conv2d: data_format={data_format!r} is not supported; use NCHW")
    if groups not in (None, 1):
        raise ValueError(f"conv2d: groups={groups!r} is not supported (grouped convolution)")
    if len(input.shape) != 4 or input.shape[1] < 1:
        raise ValueError(f"conv2d: input {input.name} must be NCHW with a known C, got shape "
                         f"{input.shape}")
    kh, kw = _pair(filter_size, "filter_size")
    stride, padding, dilation = (_pair(stride, "stride"), _pair(padding, "padding"),
                                 _pair(dilation, "dilation"))
    if min(kh, kw, *stride, *dilation) < 1:
        raise ValueError("conv2d: filter_size, stride and dilation must be positive")
    channels = int(input.shape[1])
    prefix = unique_name.layer("conv2d", name)
    std = (2.0 / (kh * kw * channels)) ** 0.5
    w = _param(_named(param_attr, prefix), [int(num_filters), channels, kh, kw],
               input.dtype, _init.Normal(0.0, std), prefix)

    def out_size(n, k, p, s, d):
        return -1 if n < 0 else (n + 2 * p - ((k - 1) * d + 1)) // s + 1
    shape = (input.shape[0], int(num_filters),
             out_size(input.shape[2], kh, padding[0], stride[0], dilation[0]),
             out_size(input.shape[3], kw, padding[1], stride[1], dilation[1]))
    out = _tmp(prefix, shape, input.dtype)
    _op("conv2d", {"Input": [input], "Filter": [w]}, {"Output": [out]},
        {"kernel": [kh, kw], "strides": list(stride), "paddings": list(padding),
         "dilations": list(dilation)})
    battr = ParamAttr._to_attr(bias_attr)
    if battr is not False:
        b = _param(_named(battr, prefix, is_bias=True), [int(num_filters)], input.dtype,
                   _init.Constant(0.0), prefix)
        biased = _tmp(prefix, shape, input.dtype)
        _op("elementwise_add", {"X": [out], "Y": [b]}, {"Out": [biased]}, {"axis": 1})
        out = biased
    return _act(out, act, "conv2d", prefix)


# --------------------------------------------------------------------------- dynamic_gru

def dynamic_gru(input, size, param_attr=None, bias_attr=None, is_reverse=False,
                gate_activation="sigmoid", candidate_activation="tanh", h_0=None,
                origin_mode=False):
    """Fluid's GRU over each sequence of a lod_level=1 ``input`` ``[T, 3 *
    size]`` (an fc's projection): hidden ``[T, size]`` with the input's LoD.
    Weight ``[size, 3 * size]`` (Xavier), bias ``[1, 3 * size]`` (0), ``h_0``
    ``[N, size]`` (default zeros); formulas in :mod:`pyfleet.fluid.rnn_ops`.
    An fc of a LoD input is accepted as Fluid does: its rows are the sequences'."""
    from pyfleet.fluid.rnn_ops import ACTIVATIONS, lod_source
    _check_var(input, "dynamic_gru input")
    if lod_source(input) is None:
        raise ValueError(f"dynamic_gru: input {input.name} must be sequences: lod_level=1, "
                         "or rows of one (an fc of a lod_level=1 input)")
    size = int(size)
    if len(input.shape) != 2 or input.shape[1] != 3 * size:
        raise ValueError(f"dynamic_gru: input {input.name} must be [T, 3 * size] = "
                         f"[T, {3 * size}], got {input.shape}")
    for what, act in (("gate_activation", gate_activation),
                      ("candidate_activation", candidate_activation)):
        if act not in ACTIVATIONS:
            raise ValueError(f"dynamic_gru: {what} must be one of {sorted(ACTIVATIONS)}, "
                             f"got {act!r}")
    prefix = unique_name.layer("gru")
    w = _param(_named(param_attr, prefix), [size, 3 * size], input.dtype,
               _init.Xavier(), prefix)
    battr = ParamAttr._to_attr(bias_attr)
    if battr is False:
        raise ValueError("dynamic_gru: bias_attr=False is not supported (Fluid's GRU has "
                         "its bias)")
    b = _param(_named(battr, prefix, is_bias=True), [1, 3 * size], input.dtype,
               _init.Constant(0.0), prefix)
    inputs = {"Input": [input], "Weight": [w], "Bias": [b]}
    if h_0 is not None:
        inputs["H0"] = [_check_var(h_0, "dynamic_gru h_0")]
    out = _tmp(prefix, (input.shape[0], size), input.dtype, 1)
    _op("gru", inputs, {"Hidden": [out]},
        {"is_reverse": bool(is_reverse), "gate_activation": gate_activation,
         "candidate_activation": candidate_activation, "origin_mode": bool(origin_mode)})
    return out


# --------------------------------------------------------------------------- layer_norm, prelu

def layer_norm(input, scale=True, shift=True, begin_norm_axis=1, epsilon=1e-05,
               param_attr=None, bias_attr=None, act=None, name=None):
    """Normalize each sample over the dimensions from ``begin_norm_axis`` on:
    ``(x - mean) / sqrt(var + epsilon) * scale + bias``, scale (1) and bias (0)
    of shape ``[prod(shape[begin_norm_axis:])]``, as Fluid."""
    _check_var(input, "layer_norm input")
    k = int(begin_norm_axis)
    if not 1 <= k < len(input.shape) or any(d < 0 for d in input.shape[k:]):
        raise ValueError(f"layer_norm: begin_norm_axis {k} must leave known dimensions of "
                         f"{input.name} (shape {input.shape}) to normalize over")
    width = 1
    for d in input.shape[k:]:
        width *= int(d)
    prefix = unique_name.layer("layer_norm", name)
    inputs = {"X": [input]}
    if scale:
        inputs["Scale"] = [_param(_named(param_attr, prefix), [width], input.dtype,
                                  _init.Constant(1.0), prefix)]
    if shift:
        inputs["Bias"] = [_param(_named(bias_attr, prefix, is_bias=True), [width], input.dtype,
                                 _init.Constant(0.0), prefix)]
    unique_name.tmp(prefix)     # Fluid's Mean and Variance, made before Y
    unique_name.tmp(prefix)
    out = _tmp(prefix, input.shape, input.dtype)
    _op("layer_norm", inputs, {"Y": [out]},
        {"begin_norm_axis": k, "epsilon": float(epsilon)})
    return _act(out, act, "layer_norm", prefix)


def prelu(x, mode, param_attr=None, name=None):
    """``x`` where positive, ``alpha * x`` elsewhere; ``alpha`` (0.25) one for
    ``"all"``, one per channel (axis 1) for ``"channel"``, one per element of a
    sample for ``"element"``."""
    _check_var(x, "prelu x")
    if mode == "all":
        shape = [1]
    elif mode == "channel":
        if len(x.shape) < 2 or x.shape[1] < 0:
            raise ValueError(f"prelu: mode 'channel' needs a known axis 1 in {x.shape}")
        shape = [1, int(x.shape[1])] + [1] * (len(x.shape) - 2)
    elif mode == "element":
        if any(d < 0 for d in x.shape[1:]):
            raise ValueError(f"prelu: mode 'element' needs known sample dims in {x.shape}")
        shape = [1] + [int(d) for d in x.shape[1:]]
    else:
        raise ValueError(f"prelu: mode must be 'all', 'channel' or 'element', got {mode!r}")
    prefix = unique_name.layer("prelu", name)
    alpha = _param(_named(param_attr, prefix), shape, x.dtype, _init.Constant(0.25),
                   prefix)
    out = _tmp(prefix, x.shape, x.dtype)
    _op("prelu", {"X": [x], "Alpha": [alpha]}, {"Out": [out]}, {"mode": mode})
    return out

"""Fluid 1.8's indexing, reduction and loss layers beyond the CTR basics
(re-exported by :mod:`pyfleet.fluid.layers`): ``split``, ``gather``,
``argmax``/``argmin``/``argsort``, ``cumsum``, ``flip``/``reverse``,
``expand_as``, ``logsumexp``, ``reduce_all``/``reduce_any``,
``isfinite``/``has_inf``/``has_nan``, ``size``, ``rank``, ``t``, ``mul``,
``log_softmax``, ``softmax_with_cross_entropy``, ``label_smooth``,
``rank_loss``, ``margin_rank_loss``. Kernels in :mod:`pyfleet.fluid.index_ops`;
the last three are compositions of layers (their gradients are theirs).
"""

import math

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid import layers_basic as _lb
from pyfleet.fluid import layers_math as _lm
from pyfleet.fluid import layers_nn as _ln
from pyfleet.fluid import layers_tensor as _lt
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_nn import _op
from pyfleet.fluid.layers_nn import _tmp as _new_tmp

__all__ = [
    "addcmul",
    "addmm",
    "argmax",
    "argmin",
    "argsort",
    "bmm",
    "bpr_loss",
    "cumsum",
    "dot",
    "elementwise_equal",
    "elementwise_floordiv",
    "elementwise_mod",
    "expand_as",
    "flip",
    "gather",
    "has_inf",
    "has_nan",
    "huber_loss",
    "index_select",
    "isfinite",
    "label_smooth",
    "linspace",
    "log_softmax",
    "logsumexp",
    "margin_rank_loss",
    "mul",
    "nonzero",
    "rank",
    "rank_loss",
    "reduce_all",
    "reduce_any",
    "reverse",
    "roll",
    "shard_index",
    "size",
    "smooth_l1",
    "softmax_with_cross_entropy",
    "split",
    "t",
    "tril",
    "triu",
    "unique",
    "unique_with_counts",
    "where",
]


def _tmp(prefix, shape, dtype="float32", stop_gradient=False):
    v = _new_tmp(prefix, shape, dtype)
    v.stop_gradient = stop_gradient
    return v


def _axis(x, axis):
    return int(axis) % len(x.shape)


def split(input, num_or_sections, dim=-1, name=None):
    """Split along ``dim`` into ``num_or_sections`` equal parts or parts of the
    listed sizes (one ``-1`` takes the rest)."""
    _check_var(input, "split input")
    dim = _axis(input, dim)
    total = input.shape[dim]
    if isinstance(num_or_sections, int):
        if total < 0 or total % num_or_sections:
            raise ValueError(f"split: dimension {dim} of {input.name} (size {total}) does not "
                             f"split into {num_or_sections} equal parts")
        sections = [total // num_or_sections] * num_or_sections
    else:
        sections = [int(n) for n in num_or_sections]
        if sections.count(-1) == 1 and total >= 0:
            sections[sections.index(-1)] = total - (sum(sections) + 1)
    outs = []
    call = unique_name.layer("split", name)
    for n in sections:
        shape = list(input.shape)
        shape[dim] = n
        outs.append(_tmp(call, tuple(shape), input.dtype))
    _op("split", {"X": [input]}, {"Out": outs}, {"axis": dim, "sections": sections})
    return outs


def gather(input, index, overwrite=True):
    """Rows ``input[index]`` (index int, 1-D); the gradient adds up at repeated rows."""
    _check_var(input, "gather input")
    _check_var(index, "gather index")
    out = _tmp("gather", (index.shape[0],) + tuple(input.shape[1:]), input.dtype)
    _op("gather", {"X": [input], "Index": [index]}, {"Out": [out]})
    return out


def _arg(kind, x, axis):
    _check_var(x, f"{kind} x")
    axis = _axis(x, axis)
    out = _tmp(kind.replace("arg", "arg_"), tuple(d for i, d in enumerate(x.shape) if i != axis),
               "int64", True)
    _op("arg_min_max", {"X": [x]}, {"Out": [out]}, {"axis": axis, "kind": kind})
    return out


def argmax(x, axis=0):
    return _arg("argmax", x, axis)


def argmin(x, axis=0):
    return _arg("argmin", x, axis)


def argsort(input, axis=-1, descending=False, name=None):
    """``(sorted values, int64 indices)`` along ``axis`` (a stable sort)."""
    _check_var(input, "argsort input")
    axis = _axis(input, axis)
    call = unique_name.layer("argsort", name)
    out = _tmp(call, input.shape, input.dtype)
    idx = _tmp(call, input.shape, "int64", True)
    _op("argsort", {"X": [input]}, {"Out": [out], "Indices": [idx]},
        {"axis": axis, "kind": "argsort", "descending": bool(descending)})
    return out, idx


def cumsum(x, axis=None, exclusive=None, reverse=None):
    _check_var(x, "cumsum x")
    shape = x.shape if axis is not None else (-1 if any(d < 0 for d in x.shape)
                                              else math.prod(x.shape),)
    out = _tmp("cumsum", shape, x.dtype)
    _op("cumsum", {"X": [x]}, {"Out": [out]},
        {"axis": None if axis is None else _axis(x, axis), "exclusive": bool(exclusive),
         "reverse": bool(reverse)})
    return out


def flip(input, dims, name=None):
    _check_var(input, "flip input")
    dims = [dims] if isinstance(dims, int) else list(dims)
    out = _tmp("flip", input.shape, input.dtype)
    _op("flip", {"X": [input]}, {"Out": [out]}, {"dims": [_axis(input, d) for d in dims]})
    return out


def reverse(x, axis):
    return flip(x, axis)


def expand_as(x, target_tensor, name=None):
    _check_var(x, "expand_as x")
    _check_var(target_tensor, "expand_as target_tensor")
    out = _tmp("expand_as", target_tensor.shape, x.dtype)
    _op("expand_as", {"X": [x], "Target": [target_tensor]}, {"Out": [out]})
    return out


def _reduce_shape(x, dim, keep_dim):
    nd = len(x.shape)
    if dim is None:
        return (1,) * nd if keep_dim else (1,)
    dims = {d % nd for d in ([dim] if isinstance(dim, int) else dim)}
    return tuple(1 if i in dims else s for i, s in enumerate(x.shape)
                 if keep_dim or i not in dims) or (1,)


def logsumexp(x, dim=None, keep_dim=False, name=None):
    _check_var(x, "logsumexp x")
    out = _tmp("logsumexp", _reduce_shape(x, dim, keep_dim), x.dtype)
    _op("logsumexp", {"X": [x]}, {"Out": [out]}, {"dim": dim, "keep_dim": bool(keep_dim)})
    return out


def _reduce_bool(kind, input, dim, keep_dim):
    _check_var(input, f"reduce_{kind} input")
    out = _tmp(f"reduce_{kind}", _reduce_shape(input, dim, keep_dim), "bool", True)
    _op("reduce_bool", {"X": [input]}, {"Out": [out]},
        {"dim": dim, "keep_dim": bool(keep_dim), "kind": kind})
    return out


def reduce_all(input, dim=None, keep_dim=False, name=None):
    return _reduce_bool("all", input, dim, keep_dim)


def reduce_any(input, dim=None, keep_dim=False, name=None):
    return _reduce_bool("any", input, dim, keep_dim)


def _finite(kind, x):
    _check_var(x, f"{kind} x")
    out = _tmp(kind, (1,), "bool", True)
    _op("finite_check", {"X": [x]}, {"Out": [out]}, {"kind": kind})
    return out


def isfinite(x):
    """True when every element is finite (``[1]`` bool)."""
    return _finite("isfinite", x)


def has_inf(x):
    return _finite("has_inf", x)


def has_nan(x):
    return _finite("has_nan", x)


def size(input):
    """The number of elements, int64 ``[1]``, read when the step runs."""
    return _lb.cast(_lm.reduce_prod(_lb.cast(_lt.shape(input), "int64")), "int64")


def rank(input):
    """The number of dimensions (static), int32 ``[1]``."""
    return _lt.fill_constant([1], "int32", len(input.shape))


def t(input, name=None):
    """The transpose of a 1-D (unchanged) or 2-D tensor."""
    if len(input.shape) > 2:
        raise ValueError(f"t: input {input.name} must be 1-D or 2-D, got shape {input.shape}")
    return input if len(input.shape) < 2 else _ln.transpose(input, [1, 0])


def mul(x, y, x_num_col_dims=1, y_num_col_dims=1, name=None):
    """``flatten(x, x_num_col_dims) @ y`` (Fluid's mul op, fc's product)."""
    _check_var(x, "mul x")
    _check_var(y, "mul y")
    if y_num_col_dims != 1:
        raise ValueError(f"mul: y_num_col_dims={y_num_col_dims} is not supported; use 1")
    out = _tmp("mul", tuple(x.shape[:x_num_col_dims]) + tuple(y.shape[1:]), x.dtype)
    _op("mul", {"X": [x], "Y": [y]}, {"Out": [out]},
        {"x_num_col_dims": int(x_num_col_dims), "y_num_col_dims": 1})
    return out


def log_softmax(input, axis=None, dtype=None, name=None):
    _check_var(input, "log_softmax input")
    if dtype is not None:
        raise ValueError("log_softmax: dtype= is not supported; cast the input first")
    out = _tmp("log_softmax", input.shape, input.dtype)
    _op("log_softmax", {"X": [input]}, {"Out": [out]},
        {"axis": -1 if axis is None else _axis(input, axis)})
    return out


def softmax_with_cross_entropy(logits, label, soft_label=False, ignore_index=-100,
                               numeric_stable_mode=True, return_softmax=False, axis=-1):
    """``-log(softmax(logits)[label])`` per row, ``[..., 1]`` (soft labels:
    ``-sum(label * log softmax)``); ``ignore_index`` rows give 0. The last axis only."""
    _check_var(logits, "softmax_with_cross_entropy logits")
    _check_var(label, "softmax_with_cross_entropy label")
    if _axis(logits, axis) != len(logits.shape) - 1:
        raise ValueError("softmax_with_cross_entropy: only the last axis is supported")
    call = unique_name.layer("softmax_with_cross_entropy")
    prob = _tmp(call, logits.shape, logits.dtype)       # Fluid makes Softmax first
    loss = _tmp(call, tuple(logits.shape[:-1]) + (1,), logits.dtype)
    _op("softmax_with_cross_entropy", {"Logits": [logits], "Label": [label]},
        {"Loss": [loss], "Softmax": [prob]},
        {"soft_label": bool(soft_label), "ignore_index": int(ignore_index)})
    return (loss, prob) if return_softmax else loss


def label_smooth(label, prior_dist=None, epsilon=0.1, dtype="float32", name=None):
    """``(1 - epsilon) * label + epsilon * prior`` (uniform ``1 / C`` by default)."""
    if not 0.0 <= float(epsilon) <= 1.0:
        raise ValueError(f"label_smooth: epsilon must be in [0, 1], got {epsilon}")
    if prior_dist is None:
        return _lb.scale(label, 1.0 - float(epsilon), float(epsilon) / label.shape[-1])
    return _lb.elementwise_add(_lb.scale(label, 1.0 - float(epsilon)),
                             _lb.scale(prior_dist, float(epsilon)))


def rank_loss(label, left, right, name=None):
    """RankNet: ``log(1 + exp(left - right)) - label * (left - right)``."""
    o = _lb.elementwise_sub(left, right)
    return _lb.elementwise_sub(_lm.softplus(o), _lb.elementwise_mul(label, o))


def margin_rank_loss(label, left, right, margin=0.1, name=None):
    """``max(0, -label * (left - right) + margin)``."""
    o = _lb.elementwise_mul(label, _lb.elementwise_sub(left, right))
    return _lb.relu(_lb.scale(o, -1.0, float(margin)))


# --------------------------------------------------------------------------- more

def where(condition):
    """The int64 ``[K, ndim]`` indices of the True entries of ``condition``."""
    _check_var(condition, "where condition")
    out = _tmp("where_index", (-1, len(condition.shape)), "int64", True)
    _op("where_index", {"Condition": [condition]}, {"Out": [out]})
    return out


def huber_loss(input, label, delta):
    """``0.5 r^2`` where ``|r| <= delta``, else ``delta (|r| - delta / 2)``; ``r = label - input``."""
    _check_var(input, "huber_loss input")
    _check_var(label, "huber_loss label")
    out = _tmp("huber_loss", input.shape, input.dtype)
    _op("huber_loss", {"X": [input], "Y": [label]}, {"Out": [out]}, {"delta": float(delta)})
    return out


def bpr_loss(input, label, name=None):
    """Bayesian personalized ranking: ``mean over j != label of
    -log(sigmoid(x[label] - x[j]))`` per row, ``[N, 1]``."""
    _check_var(input, "bpr_loss input")
    _check_var(label, "bpr_loss label")
    out = _tmp("bpr_loss", (input.shape[0], 1), input.dtype)
    _op("bpr_loss", {"X": [input], "Label": [label]}, {"Out": [out]})
    return out


def index_select(input, index, dim=0):
    _check_var(input, "index_select input")
    _check_var(index, "index_select index")
    dim = _axis(input, dim)
    shape = list(input.shape)
    shape[dim] = index.shape[0]
    out = _tmp("index_select", tuple(shape), input.dtype)
    _op("index_select", {"X": [input], "Index": [index]}, {"Out": [out]}, {"axis": dim})
    return out


def dot(x, y, name=None):
    """``sum(x * y)`` over the last axis (keeping it as 1)."""
    return _lb.reduce_sum(_lb.elementwise_mul(x, y), dim=-1, keep_dim=True)


def bmm(x, y, name=None):
    """Batched ``[B, M, K] @ [B, K, N]``."""
    if len(x.shape) != 3 or len(y.shape) != 3:
        raise ValueError(f"bmm: x and y must be 3-D, got {x.shape} and {y.shape}")
    return _lb.matmul(x, y)


def _constant(value, dtype):
    return _lb.cast(_lt.assign(value), dtype)


def _tri(input, diagonal, lower):
    import numpy as np

    r, c = input.shape[-2:]
    if r < 0 or c < 0:
        raise ValueError(f"tril/triu: the last two dimensions of {input.name} must be known")
    mask = (np.tril if lower else np.triu)(np.ones((r, c)), int(diagonal))
    return _lb.elementwise_mul(input, _constant(mask, input.dtype))


def tril(input, diagonal=0, name=None):
    return _tri(input, diagonal, True)


def triu(input, diagonal=0, name=None):
    return _tri(input, diagonal, False)


def _int_binary(fn, x, y, axis):
    _check_var(x, f"elementwise_{fn} x")
    _check_var(y, f"elementwise_{fn} y")
    shape = x.shape if len(x.shape) >= len(y.shape) else y.shape
    out = _tmp(f"elementwise_{fn}", shape, "bool" if fn == "equal" else x.dtype, True)
    _op("elementwise_int", {"X": [x], "Y": [y]}, {"Out": [out]}, {"fn": fn, "axis": int(axis)})
    return out


def elementwise_mod(x, y, axis=-1, act=None, name=None):
    """``x mod y`` (the sign of ``y``, as numpy and Fluid); no gradient."""
    return _int_binary("mod", x, y, axis)


def elementwise_floordiv(x, y, axis=-1, act=None, name=None):
    return _int_binary("floordiv", x, y, axis)


def elementwise_equal(x, y, name=None):
    return _int_binary("equal", x, y, -1)


def shard_index(input, index_num, nshards, shard_id, ignore_value=-1):
    """Fluid's id sharding: ``x % shard_size`` for ids of shard ``shard_id``
    (``shard_size = ceil(index_num / nshards)``), ``ignore_value`` for the others."""
    _check_var(input, "shard_index input")
    if not 0 <= int(shard_id) < int(nshards):
        raise ValueError(f"shard_index: shard_id {shard_id} is outside [0, {nshards})")
    out = _tmp("shard_index", input.shape, input.dtype, True)
    _op("shard_index", {"X": [input]}, {"Out": [out]},
        {"index_num": int(index_num), "nshards": int(nshards), "shard_id": int(shard_id),
         "ignore_value": int(ignore_value)})
    return out


def nonzero(input, as_tuple=False):
    """The int64 ``[K, ndim]`` indices of the nonzero entries (``as_tuple``: one
    ``[K, 1]`` per dimension)."""
    idx = where(input)
    if not as_tuple:
        return idx
    return split(idx, len(input.shape), dim=1)


def roll(input, shifts, dims=None):
    _check_var(input, "roll input")
    shifts = [shifts] if isinstance(shifts, int) else [int(k) for k in shifts]
    if dims is not None:
        dims = [dims] if isinstance(dims, int) else [_axis(input, d) for d in dims]
        if len(dims) != len(shifts):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    elif len(shifts) != 1:
        raise ValueError("roll: without dims, shifts must be one number")
    out = _tmp("roll", input.shape, input.dtype)
    _op("roll", {"X": [input]}, {"Out": [out]}, {"shifts": shifts, "dims": dims})
    return out


def _unique(x, dtype, counts):
    _check_var(x, "unique x")
    call = unique_name.layer("unique_with_counts" if counts else "unique")
    out = _tmp(call, (-1,), x.dtype, True)
    outputs = {"Out": [out], "Index": [_tmp(call, (-1,), dtype, True)]}
    if counts:
        outputs["Count"] = [_tmp(call, (-1,), dtype, True)]
    from pyfleet.fluid.tensor import convert_dtype
    _op("unique", {"X": [x]}, outputs, {"dtype": convert_dtype(dtype).str})
    return (out, outputs["Index"][0]) + ((outputs["Count"][0],) if counts else ())


def unique(x, dtype="int32"):
    """``(values in first-occurrence order, index of each element's value)``."""
    return _unique(x, dtype, False)


def unique_with_counts(x, dtype="int32"):
    return _unique(x, dtype, True)


def linspace(start, stop, num, dtype):
    import numpy as np
    for v in (start, stop, num):
        if isinstance(v, framework.Variable):
            raise ValueError("linspace: Variable arguments are not supported; pass numbers")
    return _constant(np.linspace(float(start), float(stop), int(num)), dtype)


def addmm(input, x, y, alpha=1.0, beta=1.0, name=None):
    """``beta * input + alpha * (x @ y)``."""
    return _lb.elementwise_add(_lb.scale(input, float(beta)), _lb.matmul(x, y, alpha=float(alpha)))


def addcmul(input, tensor1, tensor2, value=1.0, out=None, name=None):
    """``input + value * tensor1 * tensor2``."""
    res = _lb.elementwise_add(input, _lb.scale(_lb.elementwise_mul(tensor1, tensor2), float(value)))
    return res if out is None else _lt.assign(res, out)


def smooth_l1(x, y, inside_weight=None, outside_weight=None, sigma=None):
    """Per sample, the sum over its elements of ``0.5 (sigma d)^2`` where
    ``|d| < 1 / sigma^2``, else ``|d| - 0.5 / sigma^2``; ``d = (x - y) *
    inside_weight``, each term times ``outside_weight``: ``[N, 1]``."""
    _check_var(x, "smooth_l1 x")
    _check_var(y, "smooth_l1 y")
    inputs = {"X": [x], "Y": [y]}
    if inside_weight is not None:
        inputs["InsideWeight"] = [_check_var(inside_weight, "smooth_l1 inside_weight")]
    if outside_weight is not None:
        inputs["OutsideWeight"] = [_check_var(outside_weight, "smooth_l1 outside_weight")]
    sigma = 1.0 if sigma is None else float(sigma)
    call = unique_name.layer("smooth_l1_loss")
    unique_name.tmp(call)       # Fluid's Diff output, made first
    out = _tmp(call, (x.shape[0], 1), x.dtype)
    _op("smooth_l1_loss", inputs, {"Out": [out]}, {"sigma2": sigma * sigma})
    return out

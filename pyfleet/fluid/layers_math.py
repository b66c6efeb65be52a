"""Layers of Fluid 1.8's ``fluid.layers`` that PaddleRec 1.8.5's model zoo
uses beyond the CTR basics (re-exported by :mod:`pyfleet.fluid.layers`):
element maxima, comparisons and logic, ``clip`` and bounded activations,
``cos_sim``, ``l2_normalize``, ``topk``, ``mse_loss``, the max/min/prod
reductions (shapes, constants and variables: :mod:`pyfleet.fluid.layers_tensor`).
Signatures and semantics are Fluid 1.8's; kernels in
:mod:`pyfleet.fluid.math_ops`.
"""


from pyfleet.fluid import unique_name
from pyfleet.fluid.framework import Variable
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_basic import _reduce, sequence_pool, sums
from pyfleet.fluid.layers_nn import _op, _tmp

__all__ = [
    "abs",
    "acos",
    "asin",
    "atan",
    "brelu",
    "ceil",
    "clip",
    "cos",
    "cos_sim",
    "elementwise_max",
    "elementwise_min",
    "elementwise_pow",
    "elu",
    "equal",
    "erf",
    "floor",
    "gelu",
    "greater_equal",
    "greater_than",
    "hard_shrink",
    "hard_sigmoid",
    "hard_swish",
    "l2_normalize",
    "leaky_relu",
    "less_equal",
    "less_than",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logsigmoid",
    "mish",
    "mse_loss",
    "not_equal",
    "pow",
    "reciprocal",
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "relu6",
    "round",
    "rsqrt",
    "selu",
    "sequence_first_step",
    "sequence_last_step",
    "sign",
    "sin",
    "soft_relu",
    "softplus",
    "softshrink",
    "softsign",
    "sqrt",
    "stanh",
    "sum",
    "swish",
    "tanh_shrink",
    "thresholded_relu",
    "topk",
]

_ACTS = ("relu", "sigmoid", "tanh", "softmax")


def _unary(type, x, attrs=None, stop_gradient=False, name=None, layer_type=None,
           out_name=None):
    """One op of a layer call named as Fluid's ``LayerHelper(layer_type or type,
    name=name)`` names it; ``out_name``: the output's own name (Fluid's ``clip``)."""
    _check_var(x, f"{type} x")
    if out_name is not None:
        out = x.block.create_var(out_name, x.shape, x.dtype, x.lod_level)
    else:
        out = _tmp(unique_name.layer(layer_type or type, name), x.shape, x.dtype, x.lod_level)
    out.stop_gradient = stop_gradient
    _op(type, {"X": [x]}, {"Out": [out]}, attrs or {})
    return out


def _act(x, act, layer, call):
    """``act`` applied to ``x`` as part of the layer call ``call`` (Fluid's append_activation)."""
    if act is None:
        return x
    if act not in _ACTS:
        raise ValueError(f"{layer}: unsupported act {act!r}; expected one of {_ACTS} or None")
    out = _tmp(call, x.shape, x.dtype, x.lod_level)
    _op(act, {"X": [x]}, {"Out": [out]}, {})
    return out


def _broadcast_shape(x, y):
    return x.shape if len(x.shape) >= len(y.shape) else y.shape


# --------------------------------------------------------------------------- elementwise

def _elementwise(type, x, y, axis, act, name):
    """Fluid's _elementwise_op: the output is ``name`` when given, else a tmp of the call."""
    _check_var(x, f"{type} x")
    _check_var(y, f"{type} y")
    call = unique_name.layer(type)
    shape = _broadcast_shape(x, y)
    out = _tmp(call, shape, x.dtype) if name is None else x.block.create_var(
        name, shape, x.dtype)
    _op(type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": int(axis)})
    return _act(out, act, type, call)


def elementwise_max(x, y, axis=-1, act=None, name=None):
    """``max(x, y)`` with Fluid's broadcast of ``y`` at ``axis``; the gradient
    goes to ``x`` where ``x > y``, to ``y`` elsewhere."""
    return _elementwise("elementwise_max", x, y, axis, act, name)


def elementwise_min(x, y, axis=-1, act=None, name=None):
    """``min(x, y)``; the gradient goes to ``x`` where ``x < y``, to ``y`` elsewhere."""
    return _elementwise("elementwise_min", x, y, axis, act, name)


def elementwise_pow(x, y, axis=-1, act=None, name=None):
    """``x ** y`` (the gradient to ``y`` needs ``x > 0``)."""
    return _elementwise("elementwise_pow", x, y, axis, act, name)


def _compare(fn, x, y, cond):
    _check_var(x, f"{fn} x")
    if not isinstance(y, Variable):
        raise ValueError(f"{fn}: y must be a fluid Variable, got {type(y).__name__}")
    _check_var(y, f"{fn} y")
    out = cond if cond is not None else _tmp(fn, _broadcast_shape(x, y), "bool")
    out.stop_gradient = True
    _op("compare", {"X": [x], "Y": [y]}, {"Out": [out]}, {"fn": fn, "axis": -1})
    return out


def less_than(x, y, force_cpu=None, cond=None):
    """Elementwise ``x < y`` as a bool tensor (no gradient)."""
    return _compare("less_than", x, y, cond)


def less_equal(x, y, cond=None):
    return _compare("less_equal", x, y, cond)


def greater_than(x, y, cond=None):
    return _compare("greater_than", x, y, cond)


def greater_equal(x, y, cond=None):
    return _compare("greater_equal", x, y, cond)


def equal(x, y, cond=None):
    return _compare("equal", x, y, cond)


def not_equal(x, y, cond=None):
    return _compare("not_equal", x, y, cond)


def _logical(fn, x, y, out):
    _check_var(x, f"{fn} x")
    inputs = {"X": [x]}
    if y is not None:
        inputs["Y"] = [_check_var(y, f"{fn} y")]
    res = out if out is not None else _tmp(fn, x.shape, "bool")
    res.stop_gradient = True
    _op("logical", inputs, {"Out": [res]}, {"fn": fn})
    return res


def logical_and(x, y, out=None, name=None):
    return _logical("logical_and", x, y, out)


def logical_or(x, y, out=None, name=None):
    return _logical("logical_or", x, y, out)


def logical_xor(x, y, out=None, name=None):
    return _logical("logical_xor", x, y, out)


def logical_not(x, out=None, name=None):
    return _logical("logical_not", x, None, out)


# --------------------------------------------------------------------------- activations

def clip(x, min, max, name=None):
    """``min(max(x, min), max)``; the gradient passes where ``min < x < max``."""
    if float(min) > float(max):
        raise ValueError(f"clip: min {min} is greater than max {max}")
    return _unary("clip", x, {"min": float(min), "max": float(max)}, out_name=name)


def relu6(x, threshold=6.0, name=None):
    return _unary("relu6", x, {"threshold": float(threshold)}, name=name)


def softsign(x, name=None):
    """``x / (1 + |x|)``."""
    return _unary("softsign", x, name=name)


def softplus(x, name=None):
    return _unary("softplus", x, name=name)


def logsigmoid(x, name=None):
    return _unary("logsigmoid", x, name=name)


def leaky_relu(x, alpha=0.02, name=None):
    return _unary("leaky_relu", x, {"alpha": float(alpha)}, name=name)


def elu(x, alpha=1.0, name=None):
    return _unary("elu", x, {"alpha": float(alpha)}, name=name)


def abs(x, name=None):
    return _unary("abs", x, name=name)


def sqrt(x, name=None):
    return _unary("sqrt", x, name=name)


def rsqrt(x, name=None):
    return _unary("rsqrt", x, name=name)


def reciprocal(x, name=None):
    return _unary("reciprocal", x, name=name)


def cos(x, name=None):
    return _unary("cos", x, name=name)


def sin(x, name=None):
    return _unary("sin", x, name=name)


def pow(x, factor=1.0, name=None):
    if isinstance(factor, Variable):
        raise ValueError("pow: a Variable factor is not supported; use elementwise_pow")
    return _unary("pow", x, {"factor": float(factor)}, name=name)


def floor(x, name=None):
    return _unary("floor", x, stop_gradient=True, name=name)


def ceil(x, name=None):
    return _unary("ceil", x, stop_gradient=True, name=name)


def sign(x):
    return _unary("sign", x, stop_gradient=True)


def round(x, name=None):
    return _unary("round", x, stop_gradient=True, name=name)


# --------------------------------------------------------------------------- similarity

def cos_sim(X, Y):
    """Cosine similarity of each row of ``X`` with the matching row of ``Y``
    (or with ``Y``'s single row): shape ``[N, 1]``. As Fluid, no epsilon: a
    zero row gives NaN."""
    _check_var(X, "cos_sim X")
    _check_var(Y, "cos_sim Y")
    out = _tmp("cos_sim", (X.shape[0], 1), X.dtype)
    _op("cos_sim", {"X": [X], "Y": [Y]}, {"Out": [out]})
    return out


def l2_normalize(x, axis, epsilon=1e-12, name=None):
    """``x / sqrt(sum(x * x, axis) + epsilon)``."""
    _check_var(x, "l2_normalize x")
    axis = int(axis) % len(x.shape)
    return _unary("norm", x, {"axis": axis, "epsilon": float(epsilon)}, name=name,
                  layer_type="l2_normalize")


def topk(input, k, name=None):
    """The ``k`` largest entries of the last axis and their int64 indices."""
    _check_var(input, "topk input")
    if isinstance(k, Variable):
        raise ValueError("topk: a Variable k is not supported; pass an int")
    k = int(k)
    if k < 1:
        raise ValueError(f"topk: k must be >= 1, got {k}")
    shape = tuple(input.shape[:-1]) + (k,)
    call = unique_name.layer("top_k", name)
    values = _tmp(call, shape, input.dtype)
    indices = _tmp(call, shape, "int64")
    indices.stop_gradient = True
    _op("top_k", {"X": [input]}, {"Out": [values], "Indices": [indices]}, {"k": k})
    return values, indices


def mse_loss(input, label):
    """``mean((input - label) ** 2)`` as a ``[1]`` tensor."""
    _check_var(input, "mse_loss input")
    _check_var(label, "mse_loss label")
    # Fluid 1.8's mse_loss is reduce_mean(square_error_cost(input, label)): named so.
    square_error = unique_name.layer("square_error_cost")
    unique_name.tmp(square_error)
    unique_name.tmp(square_error)
    out = _tmp("reduce_mean", (1,), input.dtype)
    _op("mse_loss", {"X": [input], "Y": [label]}, {"Out": [out]})
    return out


def reduce_max(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_max", input, dim, keep_dim, name)


def reduce_min(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_min", input, dim, keep_dim, name)


def reduce_prod(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_prod", input, dim, keep_dim, name)


def sum(x):
    """Fluid's ``layers.sum``: the elementwise sum of a list of tensors."""
    return sums(x if isinstance(x, (list, tuple)) else [x])


def sequence_first_step(input):
    """The first row of each sequence (``sequence_pool(input, "first")``)."""
    return sequence_pool(input, "first")


def sequence_last_step(input):
    """The last row of each sequence (``sequence_pool(input, "last")``)."""
    return sequence_pool(input, "last")


# --------------------------------------------------------------------------- more activations

def hard_sigmoid(x, slope=0.2, offset=0.5, name=None):
    return _unary("hard_sigmoid", x, {"slope": float(slope), "offset": float(offset)}, name=name)


def swish(x, beta=1.0, name=None):
    return _unary("swish", x, {"beta": float(beta)}, name=name)


def selu(x, scale=None, alpha=None, name=None):
    return _unary("selu", x, {
        "scale": 1.0507009873554804934193349852946 if scale is None else float(scale),
        "alpha": 1.6732632423543772848170429916717 if alpha is None else float(alpha)})


def brelu(x, t_min=0.0, t_max=24.0, name=None):
    return _unary("brelu", x, {"t_min": float(t_min), "t_max": float(t_max)}, name=name)


def soft_relu(x, threshold=40.0, name=None):
    return _unary("soft_relu", x, {"threshold": float(threshold)}, name=name)


def stanh(x, scale_a=0.67, scale_b=1.7159, name=None):
    return _unary("stanh", x, {"scale_a": float(scale_a), "scale_b": float(scale_b)}, name=name)


def tanh_shrink(x, name=None):
    return _unary("tanh_shrink", x, name=name)


def thresholded_relu(x, threshold=1.0):
    return _unary("thresholded_relu", x, {"threshold": float(threshold)})


def hard_shrink(x, threshold=0.5):
    return _unary("hard_shrink", x, {"threshold": float(threshold)})


def softshrink(x, alpha=None):
    return _unary("softshrink", x, {"lambda": 0.5 if alpha is None else float(alpha)})


def hard_swish(x, threshold=6.0, scale=6.0, offset=3.0, name=None):
    return _unary("hard_swish", x, {"threshold": float(threshold), "scale": float(scale),
                                    "offset": float(offset)})


def mish(x, threshold=20, name=None):
    """``x * tanh(softplus(x))``, softplus taken as ``x`` above ``threshold`` and
    ``exp(x)`` below ``-threshold``, as Fluid."""
    return _unary("mish", x, {"threshold": float(threshold)}, name=name)


def log1p(x, out=None, name=None):
    return _unary("log1p", x, name=name)


def acos(x, name=None):
    return _unary("acos", x, name=name)


def asin(x, name=None):
    return _unary("asin", x, name=name)


def atan(x, name=None):
    return _unary("atan", x, name=name)


def erf(x):
    return _unary("erf", x)


def gelu(x, approximate=False):
    """``x * Phi(x)`` with the exact normal CDF (``approximate=True``, the tanh
    form, is refused by name)."""
    if approximate:
        raise ValueError("gelu: approximate=True (the tanh form) is not supported; use the "
                         "exact gelu (approximate=False)")
    return _unary("gelu", x)


def paddle_norm(x, p="fro", axis=None, keepdim=False, name=None):
    """Paddle 2.0's ``paddle.norm`` (what ``paddle.norm`` is in zero-edit mode;
    PaddleRec 1.8.5's rank/pnn calls it). ``p``: ``"fro"``, ``inf``, ``-inf``,
    ``0`` or a positive number; ``axis``: None (every element, as one vector),
    an int or a one-element list (a vector norm along it), or two axes (over
    both, as Paddle: a vector norm of the flattened pair; ``"fro"`` is the 2-norm
    there). ``keepdim`` keeps the reduced axes as 1. Other values are refused."""
    _check_var(x, "paddle.norm x")
    if isinstance(p, str):
        if p != "fro":
            raise ValueError(f"paddle.norm: p={p!r} is not supported; expected 'fro', inf, "
                             f"-inf, 0 or a positive number")
        porder = 2.0
    elif isinstance(p, (int, float)) and not isinstance(p, bool) and (
            p >= 0 or p == -float("inf")):
        porder = float(p)
    else:
        raise ValueError(f"paddle.norm: p={p!r} is not supported; expected 'fro', inf, -inf, "
                         f"0 or a positive number (as Paddle 2.0)")
    nd = len(x.shape)
    if isinstance(axis, (list, tuple)) and len(axis) == 1:
        axis = axis[0]
    if axis is None:
        axes = tuple(range(nd))
    elif isinstance(axis, int):
        axes = (axis % nd,)
    elif isinstance(axis, (list, tuple)) and len(axis) == 2 and \
            len({int(a) % nd for a in axis}) == 2:
        axes = tuple(sorted(int(a) % nd for a in axis))
    else:
        raise ValueError(f"paddle.norm: axis={axis!r} is not supported; expected None, an int "
                         f"or two different axes of {x.name} (shape {x.shape})")
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)
                  if keepdim or i not in axes) or (1,)
    call = unique_name.layer("frobenius_norm" if p == "fro" and len(axes) != 1 else "p_norm",
                             name)
    out = _tmp(call, shape, x.dtype)
    _op("p_norm", {"X": [x]}, {"Out": [out]},
        {"axes": list(axes), "porder": porder, "keepdim": bool(keepdim), "epsilon": 1e-12})
    return out

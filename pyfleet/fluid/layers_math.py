"""Layers of Fluid 1.8's ``fluid.layers`` that PaddleRec 1.8.5's model zoo
uses beyond the CTR basics (re-exported by :mod:`pyfleet.fluid.layers`):
element maxima, comparisons and logic, ``clip`` and bounded activations,
``cos_sim``, ``l2_normalize``, ``topk``, ``mse_loss``, shape ops
(``squeeze``, ``unsqueeze``, ``flatten``, ``stack``, ``unstack``, ``expand``,
``shape``), constants (``fill_constant_batch_size_like``, ``zeros``,
``ones``, ``*_like``), variables (``create_tensor``, ``create_global_var``,
``assign``, ``increment``) and the step counter of learning-rate schedules.
Signatures and semantics are Fluid 1.8's; kernels in
:mod:`pyfleet.fluid.math_ops`.
"""

import numpy as np

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.framework import Variable
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.tensor import convert_dtype

__all__ = [
    "abs", "assign", "autoincreased_step_counter", "ceil", "clip", "cos", "cos_sim",
    "create_global_var", "create_tensor", "elementwise_max", "elementwise_min",
    "elementwise_pow", "elu", "equal", "expand", "fill_constant_batch_size_like",
    "flatten", "floor", "greater_equal", "greater_than", "increment", "l2_normalize",
    "leaky_relu", "less_equal", "less_than", "logical_and", "logical_not", "logical_or",
    "logical_xor", "logsigmoid", "mse_loss", "not_equal", "ones", "ones_like", "pow",
    "reciprocal", "reduce_max", "reduce_min", "reduce_prod", "relu6", "round", "rsqrt",
    "shape", "sign", "sin", "softplus", "softsign", "sqrt", "squeeze", "stack", "sum",
    "topk", "unsqueeze", "unstack", "zeros", "zeros_like",
]

_ACTS = ("relu", "sigmoid", "tanh", "softmax")


def _block():
    return framework.default_main_program().global_block()


def _tmp(prefix, shape, dtype="float32", lod_level=0):
    return _block().create_var(unique_name.generate(prefix + ".tmp"), shape, dtype, lod_level)


def _op(type, inputs, outputs, attrs=None):
    return _block().append_op(type, inputs, outputs, attrs)


def _unary(type, x, attrs=None, stop_gradient=False):
    _check_var(x, f"{type} x")
    out = _tmp(type, x.shape, x.dtype, x.lod_level)
    out.stop_gradient = stop_gradient
    _op(type, {"X": [x]}, {"Out": [out]}, attrs or {})
    return out


def _act(x, act, layer):
    if act is None:
        return x
    if act not in _ACTS:
        raise ValueError(f"{layer}: unsupported act {act!r}; expected one of {_ACTS} or None")
    return _unary(act, x)


def _broadcast_shape(x, y):
    return x.shape if len(x.shape) >= len(y.shape) else y.shape


# --------------------------------------------------------------------------- elementwise

def _elementwise(type, x, y, axis, act):
    _check_var(x, f"{type} x")
    _check_var(y, f"{type} y")
    out = _tmp(type, _broadcast_shape(x, y), x.dtype)
    _op(type, {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": int(axis)})
    return _act(out, act, type)


def elementwise_max(x, y, axis=-1, act=None, name=None):
    """``max(x, y)`` with Fluid's broadcast of ``y`` at ``axis``; the gradient
    goes to ``x`` where ``x > y``, to ``y`` elsewhere."""
    return _elementwise("elementwise_max", x, y, axis, act)


def elementwise_min(x, y, axis=-1, act=None, name=None):
    """``min(x, y)``; the gradient goes to ``x`` where ``x < y``, to ``y`` elsewhere."""
    return _elementwise("elementwise_min", x, y, axis, act)


def elementwise_pow(x, y, axis=-1, act=None, name=None):
    """``x ** y`` (the gradient to ``y`` needs ``x > 0``)."""
    return _elementwise("elementwise_pow", x, y, axis, act)


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
    return _unary("clip", x, {"min": float(min), "max": float(max)})


def relu6(x, threshold=6.0, name=None):
    return _unary("relu6", x, {"threshold": float(threshold)})


def softsign(x, name=None):
    """``x / (1 + |x|)``."""
    return _unary("softsign", x)


def softplus(x, name=None):
    return _unary("softplus", x)


def logsigmoid(x, name=None):
    return _unary("logsigmoid", x)


def leaky_relu(x, alpha=0.02, name=None):
    return _unary("leaky_relu", x, {"alpha": float(alpha)})


def elu(x, alpha=1.0, name=None):
    return _unary("elu", x, {"alpha": float(alpha)})


def abs(x, name=None):
    return _unary("abs", x)


def sqrt(x, name=None):
    return _unary("sqrt", x)


def rsqrt(x, name=None):
    return _unary("rsqrt", x)


def reciprocal(x, name=None):
    return _unary("reciprocal", x)


def cos(x, name=None):
    return _unary("cos", x)


def sin(x, name=None):
    return _unary("sin", x)


def pow(x, factor=1.0, name=None):
    if isinstance(factor, Variable):
        raise ValueError("pow: a Variable factor is not supported; use elementwise_pow")
    return _unary("pow", x, {"factor": float(factor)})


def floor(x, name=None):
    return _unary("floor", x, stop_gradient=True)


def ceil(x, name=None):
    return _unary("ceil", x, stop_gradient=True)


def sign(x):
    return _unary("sign", x, stop_gradient=True)


def round(x, name=None):
    return _unary("round", x, stop_gradient=True)


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
    return _unary("norm", x, {"axis": axis, "epsilon": float(epsilon)})


def topk(input, k, name=None):
    """The ``k`` largest entries of the last axis and their int64 indices."""
    _check_var(input, "topk input")
    if isinstance(k, Variable):
        raise ValueError("topk: a Variable k is not supported; pass an int")
    k = int(k)
    if k < 1:
        raise ValueError(f"topk: k must be >= 1, got {k}")
    shape = tuple(input.shape[:-1]) + (k,)
    values = _tmp("top_k", shape, input.dtype)
    indices = _tmp("top_k", shape, "int64")
    indices.stop_gradient = True
    _op("top_k", {"X": [input]}, {"Out": [values], "Indices": [indices]}, {"k": k})
    return values, indices


def mse_loss(input, label):
    """``mean((input - label) ** 2)`` as a ``[1]`` tensor."""
    _check_var(input, "mse_loss input")
    _check_var(label, "mse_loss label")
    out = _tmp("mse_loss", (1,), input.dtype)
    _op("mse_loss", {"X": [input], "Y": [label]}, {"Out": [out]})
    return out


def _reduce(type, input, dim, keep_dim):
    from pyfleet.fluid.layers import _reduce as reduce_
    return reduce_(type, input, dim, keep_dim)


def reduce_max(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_max", input, dim, keep_dim)


def reduce_min(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_min", input, dim, keep_dim)


def reduce_prod(input, dim=None, keep_dim=False, name=None):
    return _reduce("reduce_prod", input, dim, keep_dim)


def sum(x):
    """Fluid's ``layers.sum``: the elementwise sum of a list of tensors."""
    from pyfleet.fluid.layers import sums
    return sums(x if isinstance(x, (list, tuple)) else [x])


# --------------------------------------------------------------------------- shapes

def _reshape_like(type, x, shape, attrs):
    _check_var(x, f"{type} input")
    out = _tmp(type, shape, x.dtype)
    _op(type, {"X": [x]}, {"Out": [out]}, attrs)
    return out


def squeeze(input, axes, name=None):
    """Drop the size-1 dimensions ``axes`` (every size-1 one if ``axes`` is empty)."""
    nd = len(input.shape)
    axes = [int(a) for a in axes]
    dropped = {a % nd for a in axes} if axes else {i for i, d in enumerate(input.shape)
                                                  if d == 1}
    for a in dropped:
        if input.shape[a] not in (1, -1):
            raise ValueError(f"squeeze: axis {a} of {input.name} has size {input.shape[a]}, "
                             f"not 1 (shape {input.shape})")
    shape = tuple(d for i, d in enumerate(input.shape) if i not in dropped)
    return _reshape_like("squeeze2", input, shape, {"axes": axes})


def unsqueeze(input, axes, name=None):
    """Insert size-1 dimensions at ``axes`` (positions in the output)."""
    if isinstance(axes, int):
        axes = [axes]
    axes = [int(a) for a in axes]
    shape = list(input.shape)
    for a in axes:
        shape.insert(a if a >= 0 else a + len(shape) + 1, 1)
    return _reshape_like("unsqueeze2", input, tuple(shape), {"axes": axes})


def flatten(x, axis=1, name=None):
    """A 2-D ``[prod(shape[:axis]), prod(shape[axis:])]`` view of ``x``."""
    axis = int(axis)
    if not 0 <= axis <= len(x.shape):
        raise ValueError(f"flatten: axis must be in [0, {len(x.shape)}], got {axis}")

    def prod(dims):
        return -1 if any(d < 0 for d in dims) else int(np.prod(dims))
    return _reshape_like("flatten2", x, (prod(x.shape[:axis]), prod(x.shape[axis:])),
                         {"axis": axis})


def stack(x, axis=0):
    """Stack equal-shaped tensors along a new axis ``axis``."""
    xs = list(x) if isinstance(x, (list, tuple)) else [x]
    xs = [_check_var(v, "stack input") for v in xs]
    if not xs:
        raise ValueError("stack needs at least one input")
    axis = int(axis)
    nd = len(xs[0].shape) + 1
    ax = axis % nd
    shape = list(xs[0].shape)
    shape.insert(ax, len(xs))
    out = _tmp("stack", tuple(shape), xs[0].dtype)
    _op("stack", {"X": xs}, {"Y": [out]}, {"axis": ax})
    return out


def unstack(x, axis=0, num=None):
    """Split ``x`` along ``axis`` into its slices (that dimension must be known)."""
    _check_var(x, "unstack x")
    axis = int(axis) % len(x.shape)
    n = int(num) if num is not None else int(x.shape[axis])
    if n < 0:
        raise ValueError(f"unstack: axis {axis} of {x.name} has unknown size; pass num")
    shape = tuple(d for i, d in enumerate(x.shape) if i != axis)
    outs = [_tmp("unstack", shape, x.dtype) for _ in range(n)]
    _op("unstack", {"X": [x]}, {"Y": outs}, {"axis": axis})
    return outs


def expand(x, expand_times, name=None):
    """Tile ``x``: dimension ``i`` repeated ``expand_times[i]`` times."""
    _check_var(x, "expand x")
    if isinstance(expand_times, Variable) or any(isinstance(t, Variable)
                                                 for t in expand_times):
        raise ValueError("expand: expand_times must be ints (Variables are not supported)")
    times = [int(t) for t in expand_times]
    if len(times) != len(x.shape):
        raise ValueError(f"expand: expand_times {times} must have one entry per dimension "
                         f"of {x.name} (shape {x.shape})")
    shape = tuple(-1 if d < 0 else d * t for d, t in zip(x.shape, times))
    out = _tmp("expand", shape, x.dtype)
    _op("expand", {"X": [x]}, {"Out": [out]}, {"expand_times": times})
    return out


def shape(input):
    """The runtime shape of ``input`` as an int32 tensor."""
    _check_var(input, "shape input")
    out = _tmp("shape", (len(input.shape),), "int32")
    out.stop_gradient = True
    _op("shape", {"Input": [input]}, {"Out": [out]})
    return out


# --------------------------------------------------------------------------- constants

def fill_constant_batch_size_like(input, shape, dtype, value, input_dim_idx=0,
                                  output_dim_idx=0, force_cpu=False):
    """A tensor of ``value`` shaped ``shape``, whose dimension ``output_dim_idx``
    is the runtime size of ``input``'s dimension ``input_dim_idx`` (for a LoD
    input and index 0: its number of sequences)."""
    _check_var(input, "fill_constant_batch_size_like input")
    shape = [int(s) for s in shape]
    if not 0 <= output_dim_idx < len(shape):
        raise ValueError(f"fill_constant_batch_size_like: output_dim_idx {output_dim_idx} "
                         f"is outside shape {shape}")
    static = list(shape)
    static[output_dim_idx] = input.shape[input_dim_idx]
    out = _tmp("fill_constant_batch_size_like", tuple(static), dtype)
    out.stop_gradient = True
    _op("fill_constant_batch_size_like", {"Input": [input]}, {"Out": [out]},
        {"shape": shape, "dtype": convert_dtype(dtype).str, "value": float(value),
         "input_dim_idx": int(input_dim_idx), "output_dim_idx": int(output_dim_idx)})
    return out


def fill_constant_dynamic(shape, dtype, value, out=None):
    """``fill_constant`` whose ``shape`` holds Variables (e.g. ``shape(x)[0]``)."""
    dims, tensors = [], []
    for d in shape:
        if isinstance(d, Variable):
            dims.append(None)
            tensors.append(_check_var(d, "fill_constant shape entry"))
        else:
            dims.append(int(d))
    res = out if out is not None else _tmp(
        "fill_constant", tuple(-1 if d is None else d for d in dims), dtype)
    res.stop_gradient = True
    _op("fill_constant_dynamic", {"ShapeTensorList": tensors}, {"Out": [res]},
        {"shape": dims, "dtype": convert_dtype(dtype).str, "value": float(value)})
    return res


def zeros(shape, dtype, force_cpu=False):
    from pyfleet.fluid.layers import fill_constant
    return fill_constant(shape, dtype, 0.0)


def ones(shape, dtype, force_cpu=False):
    from pyfleet.fluid.layers import fill_constant
    return fill_constant(shape, dtype, 1.0)


def zeros_like(x, out=None):
    return fill_constant_batch_size_like(x, [d if d >= 0 else 1 for d in x.shape] or [1],
                                         x.dtype, 0.0) if out is None else assign(
        zeros_like(x), out)


def ones_like(x, out=None):
    return fill_constant_batch_size_like(x, [d if d >= 0 else 1 for d in x.shape] or [1],
                                         x.dtype, 1.0) if out is None else assign(
        ones_like(x), out)


# --------------------------------------------------------------------------- variables

def create_tensor(dtype, name=None, persistable=False):
    """An empty variable, for a layer's ``out``/``total`` argument or ``assign``."""
    return _block().create_var(name or unique_name.generate("create_tensor.tmp"), None,
                               dtype, persistable=persistable, stop_gradient=True)


def create_global_var(shape, value, dtype, persistable=False, force_cpu=False, name=None):
    """A variable initialized to ``value`` by the startup program; a
    persistable one keeps what ``assign`` writes into it from run to run."""
    shape = tuple(int(s) for s in shape)
    block = _block()
    var = block.create_var(name or unique_name.generate("global_var"), shape, dtype,
                           persistable=True if persistable else False, stop_gradient=True)
    var.persistable = True   # its value lives in the scope, as Fluid's global block
    framework.default_startup_program()._init_states.append(
        (var.name, np.full(shape, value, dtype=convert_dtype(dtype))))
    return var


def assign(input, output=None):
    """Copy a Variable or a numpy array into ``output`` (a new variable if
    None); into a persistable variable the value stays for later runs."""
    if isinstance(input, Variable):
        _check_var(input, "assign input")
        out = output if output is not None else _tmp("assign", input.shape, input.dtype,
                                                     input.lod_level)
        if output is not None and out.shape is None:
            out.shape = input.shape
        _op("assign", {"X": [input]}, {"Out": [out]})
        return out
    value = np.asarray(input)
    if value.dtype == np.float64:
        value = value.astype(np.float32)   # as Fluid: float64 arrays become float32
    if value.dtype.kind not in "biuf":
        raise ValueError(f"assign: cannot assign an array of dtype {value.dtype}")
    out = output if output is not None else _tmp("assign", value.shape, value.dtype)
    out.stop_gradient = True
    _op("assign", {}, {"Out": [out]},
        {"value": value.reshape(-1).tolist(), "shape": list(value.shape),
         "dtype": value.dtype.str})
    return out


def increment(x, value=1.0, in_place=True):
    """``x + value`` into ``x`` (``in_place``) or a new variable."""
    _check_var(x, "increment x")
    out = x if in_place else _tmp("increment", x.shape, x.dtype)
    _op("increment", {"X": [x]}, {"Out": [out]}, {"step": float(value)})
    return out


def autoincreased_step_counter(counter_name=None, begin=1, step=1):
    """An int64 ``[1]`` counter increased by ``step`` at the start of each run
    of the program: the first run sees ``begin``."""
    name = counter_name or "@STEP_COUNTER@"
    block = _block()
    if block.has_var(name):
        return block.var(name)
    counter = block.create_var(name, (1,), "int64", persistable=True, stop_gradient=True)
    framework.default_startup_program()._init_states.append(
        (name, np.full((1,), begin - 1, dtype=np.int64)))
    op = block.append_op("increment", {"X": [counter]}, {"Out": [counter]},
                         {"step": float(step)})
    block.ops.remove(op)
    block.ops.insert(0, op)   # as Fluid, first: every later op sees the new count
    return counter


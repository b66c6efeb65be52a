"""Kernels of the Fluid 1.8 layers added for PaddleRec's model zoo: element
maxima and comparisons, clip and the bounded activations, cosine similarity,
L2 normalization, top-k, shape ops (squeeze, unsqueeze, flatten, stack,
expand, shape), constants sized by a batch, assignment into persistable
variables and the step counter of learning-rate schedules. The kernel
interface is :mod:`pyfleet.fluid.ops`'s (which registers these).

Gradients follow Fluid's kernels where they choose at ties:
``elementwise_max`` sends the gradient to ``x`` where ``x > y`` and to ``y``
elsewhere (``elementwise_min``: ``x < y``); ``clip`` and ``relu6`` pass it
strictly inside the bounds.
"""

import weakref

import numpy as np

from pyfleet.fluid.tensor import LoDTensor

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD", "STATEFUL", "read"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"compare", "fill_constant_batch_size_like", "shape", "increment", "floor",
           "logical"}
# Ops whose outputs are persistable state: they run whenever their inputs are fed.
STATEFUL = {"assign"}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def read(s, var):
    """The value of ``var`` in step ``s``: computed or fed, else a persistable
    variable's value in the scope (a global variable, a step counter)."""
    return s.data(var)


def _write_state(s, var, value):
    s.set(var, value)
    if var.persistable:
        s.scope.vars[var.name] = np.array(value, copy=True)


def _out(op):
    return op.output("Out")[0]


# --------------------------------------------------------------------------- elementwise

def _align(x, y, axis):
    from pyfleet.fluid.ops import _align_y
    return y.reshape(_align_y(x, y, axis))


def _minmax(pick_x, fn):
    def fwd(op, s):
        x, y = read(s, op.input("X")[0]), read(s, op.input("Y")[0])
        s.set(_out(op), fn(x, _align(x, y, op.attrs.get("axis", -1))))

    def bwd(op, s):
        from pyfleet.fluid.ops import _reduce_to
        g = s.grad(_out(op))
        if g is None:
            return
        xv, yv = op.input("X")[0], op.input("Y")[0]
        x, y0 = read(s, xv), read(s, yv)
        y = _align(x, y0, op.attrs.get("axis", -1))
        to_x = pick_x(x, y)
        if s.needs_grad(xv):
            s.add_grad(xv, _reduce_to(g * to_x, x.shape))
        if s.needs_grad(yv):
            s.add_grad(yv, _reduce_to(g * ~to_x, y.shape).reshape(y0.shape))
    return fwd, bwd


_register("elementwise_max", *_minmax(lambda x, y: x > y, np.maximum))
_register("elementwise_min", *_minmax(lambda x, y: x < y, np.minimum))


def _pow_fwd(op, s):
    x, y = read(s, op.input("X")[0]), read(s, op.input("Y")[0])
    s.set(_out(op), np.power(x, _align(x, y, op.attrs.get("axis", -1))))


def _pow_bwd(op, s):
    from pyfleet.fluid.ops import _reduce_to
    g = s.grad(_out(op))
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x, y0 = read(s, xv), read(s, yv)
    y = _align(x, y0, op.attrs.get("axis", -1))
    if s.needs_grad(xv):
        s.add_grad(xv, _reduce_to(g * y * np.power(x, y - 1), x.shape))
    if s.needs_grad(yv):
        s.add_grad(yv, _reduce_to(g * np.power(x, y) * np.log(x), y.shape).reshape(y0.shape))


_register("elementwise_pow", _pow_fwd, _pow_bwd)

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
        from pyfleet.fluid.ops import _reduce_axes
        x = read(s, op.input("X")[0])
        out = fn(x, axis=_reduce_axes(op, x), keepdims=op.attrs.get("keep_dim", False))
        out = np.asarray(out, dtype=x.dtype)
        s.set(_out(op), out.reshape(1) if out.ndim == 0 else out)
    return fwd


def _reduce_pick_bwd(op, s):
    """reduce_max/min: the gradient goes to every element equal to the result."""
    from pyfleet.fluid.ops import _reduce_axes
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    x = read(s, xv)
    axes = _reduce_axes(op, x)
    kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
    y = s.data(_out(op)).reshape(kept)
    s.add_grad(xv, np.where(x == y, g.reshape(kept), 0).astype(x.dtype))


def _reduce_prod_bwd(op, s):
    from pyfleet.fluid.ops import _reduce_axes
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    x = read(s, xv)
    axes = _reduce_axes(op, x)
    kept = [1 if i in axes else d for i, d in enumerate(x.shape)]
    y = s.data(_out(op)).reshape(kept)
    s.add_grad(xv, (g.reshape(kept) * y / x).astype(x.dtype))


_register("reduce_max", _reduce_ext_fwd(np.max), _reduce_pick_bwd)
_register("reduce_min", _reduce_ext_fwd(np.min), _reduce_pick_bwd)
_register("reduce_prod", _reduce_ext_fwd(np.prod), _reduce_prod_bwd)


# --------------------------------------------------------------------------- shapes

def _reshape_like_fwd(op, s):
    """squeeze2 / unsqueeze2 / flatten2 / expand-free reshapes: the static
    attr ``shape_fn`` is applied to the runtime shape."""
    v = s.value(op.input("X")[0])
    x = v.data if isinstance(v, LoDTensor) else v
    s.set(_out(op), x.reshape(_new_shape(op, x.shape)))


def _new_shape(op, shape):
    kind = op.type
    if kind == "squeeze2":
        axes = [a % len(shape) for a in op.attrs["axes"]]
        if not axes:
            return tuple(d for d in shape if d != 1)
        for a in axes:
            if shape[a] != 1:
                raise ValueError(f"squeeze: axis {a} of {op.input('X')[0].name} has size "
                                 f"{shape[a]}, not 1 (shape {shape})")
        return tuple(d for i, d in enumerate(shape) if i not in axes)
    if kind == "unsqueeze2":
        out = list(shape)
        for a in op.attrs["axes"]:
            a = a if a >= 0 else a + len(out) + 1
            out.insert(a, 1)
        return tuple(out)
    if kind == "flatten2":
        k = op.attrs["axis"]
        return (int(np.prod(shape[:k])), int(np.prod(shape[k:])))
    raise ValueError(f"no shape rule for {kind}")


def _reshape_like_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g.reshape(read(s, xv).shape))


for _name in ("squeeze2", "unsqueeze2", "flatten2"):
    _register(_name, _reshape_like_fwd, _reshape_like_bwd)


def _stack_fwd(op, s):
    xs = [read(s, v) for v in op.input("X")]
    try:
        s.set(op.output("Y")[0], np.stack(xs, axis=op.attrs["axis"]))
    except ValueError:
        raise ValueError(f"stack: inputs must have equal shapes, got "
                         f"{[x.shape for x in xs]}") from None


def _stack_bwd(op, s):
    g = s.grad(op.output("Y")[0])
    if g is None:
        return
    for i, v in enumerate(op.input("X")):
        if s.needs_grad(v):
            s.add_grad(v, np.take(g, i, axis=op.attrs["axis"]))


_register("stack", _stack_fwd, _stack_bwd)


def _unstack_fwd(op, s):
    x = read(s, op.input("X")[0])
    axis = op.attrs["axis"]
    for i, v in enumerate(op.output("Y")):
        s.set(v, np.take(x, i, axis=axis))


def _unstack_bwd(op, s):
    xv = op.input("X")[0]
    if not s.needs_grad(xv):
        return
    x = read(s, xv)
    axis = op.attrs["axis"]
    parts = [s.grad(v) for v in op.output("Y")]
    if all(p is None for p in parts):
        return
    shape = np.take(x, 0, axis=axis).shape
    s.add_grad(xv, np.stack([np.zeros(shape, x.dtype) if p is None else p for p in parts],
                            axis=axis))


_register("unstack", _unstack_fwd, _unstack_bwd)


def _expand_fwd(op, s):
    x = read(s, op.input("X")[0])
    times = op.attrs["expand_times"]
    if len(times) != x.ndim:
        raise ValueError(f"expand: expand_times {times} must have one entry per dimension of "
                         f"{op.input('X')[0].name} (shape {x.shape})")
    s.set(_out(op), np.tile(x, times))


def _expand_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    x = read(s, xv)
    times = op.attrs["expand_times"]
    split = []
    for t, d in zip(times, x.shape):
        split += [t, d]
    s.add_grad(xv, g.reshape(split).sum(axis=tuple(range(0, 2 * x.ndim, 2))))


_register("expand", _expand_fwd, _expand_bwd)


def _shape_fwd(op, s):
    v = s.value(op.input("Input")[0])
    x = v.data if isinstance(v, LoDTensor) else v
    s.set(_out(op), np.array(x.shape, dtype=np.int32))


_register("shape", _shape_fwd)


def _fill_like_fwd(op, s):
    v = s.value(op.input("Input")[0])
    x = v.data if isinstance(v, LoDTensor) else v
    if isinstance(v, LoDTensor) and op.attrs["input_dim_idx"] == 0:
        n = v.offsets.shape[0] - 1   # Fluid: a LoD input's batch is its number of sequences
    else:
        n = x.shape[op.attrs["input_dim_idx"]]
    shape = list(op.attrs["shape"])
    shape[op.attrs["output_dim_idx"]] = n
    s.set(_out(op), np.full(shape, op.attrs["value"], dtype=np.dtype(op.attrs["dtype"])))


_register("fill_constant_batch_size_like", _fill_like_fwd)


def _fill_dynamic_fwd(op, s):
    """fill_constant whose shape holds Variables (``ShapeTensorList``)."""
    shape, it = [], iter(op.input("ShapeTensorList"))
    for d in op.attrs["shape"]:
        if d is None:
            v = read(s, next(it))
            shape.append(int(np.asarray(v).reshape(-1)[0]))
        else:
            shape.append(int(d))
    s.set(_out(op), np.full(shape, op.attrs["value"], dtype=np.dtype(op.attrs["dtype"])))


_register("fill_constant_dynamic", _fill_dynamic_fwd)
NO_GRAD.add("fill_constant_dynamic")


# --------------------------------------------------------------------------- state

def _assign_fwd(op, s):
    if "value" in op.attrs:
        val = np.array(op.attrs["value"], dtype=np.dtype(op.attrs["dtype"])).reshape(
            op.attrs["shape"])
    else:
        v = op.input("X")[0]
        val = s.value(v)
        val = val.data.copy() if isinstance(val, LoDTensor) else np.array(val, copy=True)
    _write_state(s, _out(op), val)


def _assign_bwd(op, s):
    if not op.input("X"):
        return
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g)


_register("assign", _assign_fwd, _assign_bwd)


def _increment_fwd(op, s):
    xv = op.input("X")[0]
    x = read(s, xv)
    _write_state(s, _out(op), x + x.dtype.type(op.attrs.get("step", 1.0)))


_register("increment", _increment_fwd)


def _shuffle_batch_fwd(op, s):
    x = read(s, op.input("X")[0])
    seed = op.attrs.get("seed")
    rng = _shuffle_rng(op) if seed is None else np.random.default_rng(seed)
    perm = rng.permutation(x.shape[0])
    s.set(_out(op), x[perm])
    s.set_aux(op, perm)


# One generator per unseeded shuffle_batch op, advancing run after run.
_SHUFFLE_RNGS = weakref.WeakKeyDictionary()


def _shuffle_rng(op):
    rng = _SHUFFLE_RNGS.get(op)
    if rng is None:
        rng = _SHUFFLE_RNGS[op] = np.random.default_rng(op.attrs.get("startup_seed", 0))
    return rng


def _shuffle_batch_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(_out(op))
    if g is None or not s.needs_grad(xv):
        return
    gx = np.empty_like(g)
    gx[s.aux(op)] = g
    s.add_grad(xv, gx)


_register("shuffle_batch", _shuffle_batch_fwd, _shuffle_batch_bwd)


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


def _lr_schedule_fwd(op, s):
    from pyfleet.fluid.layers_lr import schedule_value
    step = float(read(s, op.input("Step")[0]).reshape(-1)[0])
    attrs = {k: v for k, v in op.attrs.items() if k != "kind"}
    s.set(_out(op), np.array([schedule_value(op.attrs["kind"], step, attrs)],
                             dtype=np.float32))


_register("lr_schedule", _lr_schedule_fwd)
NO_GRAD.add("lr_schedule")

"""Kernels of the Fluid 1.8 shape, constant and state layers
(:mod:`pyfleet.fluid.layers_tensor`): squeeze, unsqueeze, flatten, stack,
unstack, expand, shape, constants sized at run time, ``assign`` (into a
persistable variable: kept in the scope), the step counter and the
learning-rate schedules it drives, ``shuffle_batch``. The kernel interface
is :mod:`pyfleet.fluid.ops`'s (which registers these).
"""

import weakref

import numpy as np

from pyfleet.fluid.lr_schedules import schedule_value
from pyfleet.fluid.tensor import LoDTensor

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD", "STATEFUL"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"fill_constant_batch_size_like", "shape", "increment"}
# Ops whose outputs are persistable state: they run whenever their inputs are fed.
STATEFUL = {"assign"}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def read(s, var):
    return s.data(var)


def _write_state(s, var, value):
    s.set(var, value)
    if var.persistable:
        s.scope.vars[var.name] = np.array(value, copy=True)


def _out(op):
    return op.output("Out")[0]


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




def _lr_schedule_fwd(op, s):
    step = float(read(s, op.input("Step")[0]).reshape(-1)[0])
    attrs = {k: v for k, v in op.attrs.items() if k != "kind"}
    s.set(_out(op), np.array([schedule_value(op.attrs["kind"], step, attrs)],
                             dtype=np.float32))


_register("lr_schedule", _lr_schedule_fwd)
NO_GRAD.add("lr_schedule")

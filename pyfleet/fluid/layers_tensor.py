"""Fluid 1.8's shape, constant and variable layers (re-exported by
:mod:`pyfleet.fluid.layers`): ``squeeze``, ``unsqueeze``, ``flatten``,
``stack``, ``unstack``, ``expand``, ``shape``, ``fill_constant`` (a shape
may hold Variables), ``fill_constant_batch_size_like``, ``zeros``, ``ones``,
``*_like``, ``create_tensor``, ``create_global_var``, ``assign``,
``increment``, the step counter of learning-rate schedules, and
``Variable.__getitem__`` (:func:`getitem`). Kernels in
:mod:`pyfleet.fluid.tensor_ops`.
"""

import builtins

import numpy as np

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.framework import Variable
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_basic import reshape, slice
from pyfleet.fluid.layers_nn import _block, _op, _tmp
from pyfleet.fluid.tensor import convert_dtype

__all__ = [
    "assign", "autoincreased_step_counter", "create_global_var", "create_tensor", "expand",
    "fill_constant", "fill_constant_batch_size_like", "flatten", "getitem", "increment",
    "ones", "ones_like", "shape", "squeeze", "stack", "unsqueeze", "unstack", "zeros",
    "zeros_like",
]


# --------------------------------------------------------------------------- shapes

def _reshape_like(type, x, shape, attrs, layer_type, name):
    _check_var(x, f"{type} input")
    out = _tmp(unique_name.layer(layer_type, name), shape, x.dtype)
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
    return _reshape_like("squeeze2", input, shape, {"axes": axes}, "squeeze", name)


def unsqueeze(input, axes, name=None):
    """Insert size-1 dimensions at ``axes`` (positions in the output)."""
    if isinstance(axes, int):
        axes = [axes]
    axes = [int(a) for a in axes]
    shape = list(input.shape)
    for a in axes:
        shape.insert(a if a >= 0 else a + len(shape) + 1, 1)
    return _reshape_like("unsqueeze2", input, tuple(shape), {"axes": axes}, "unsqueeze2", name)


def flatten(x, axis=1, name=None):
    """A 2-D ``[prod(shape[:axis]), prod(shape[axis:])]`` view of ``x``."""
    axis = int(axis)
    if not 0 <= axis <= len(x.shape):
        raise ValueError(f"flatten: axis must be in [0, {len(x.shape)}], got {axis}")

    def prod(dims):
        return -1 if any(d < 0 for d in dims) else int(np.prod(dims))
    return _reshape_like("flatten2", x, (prod(x.shape[:axis]), prod(x.shape[axis:])),
                         {"axis": axis}, "flatten", name)


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
    call = unique_name.layer("unstack")
    outs = [_tmp(call, shape, x.dtype) for _ in range(n)]
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
    out = _tmp(unique_name.layer("expand", name), shape, x.dtype)
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


def declared_data(name, shape, dtype, lod_level):
    """The data variable ``name`` of the current block when it is declared already
    in this form (Fluid's ``data`` declared again is that input), else None; in
    another form, a ValueError naming both (as Fluid)."""
    block = _block()
    old = block.vars.get(name)
    if old is None or not getattr(old, "is_data", False):
        return None
    if (tuple(old.shape), str(old.dtype), old.lod_level) != (tuple(shape), str(dtype),
                                                             lod_level):
        raise ValueError(f"data {name!r} is declared already with shape {old.shape}, dtype "
                         f"{old.dtype}, lod_level {old.lod_level}; now {tuple(shape)}, "
                         f"{dtype}, {lod_level}")
    return old


def fill_constant(shape, dtype, value, force_cpu=False, out=None):
    """A tensor of ``value``; ``shape`` may hold int Variables (``shape(x)[0]``),
    read when the step runs, or be one 1-D int Variable of the dims (``shape(x)``,
    as Fluid 1.8); ``out``, if given, receives the value."""
    if isinstance(shape, Variable):
        n = shape.shape[0] if shape.shape and len(shape.shape) == 1 else None
        if n is None or n < 0:
            raise ValueError(f"fill_constant: the shape Variable {shape.name!r} must be 1-D "
                             f"of a known length, has shape {shape.shape}")
        shape = [shape[i] for i in range(n)]
    if any(isinstance(d, Variable) for d in shape) or out is not None:
        return fill_constant_dynamic(shape, dtype, value, out)
    res = _tmp("fill_constant", tuple(int(s) for s in shape), dtype)
    res.stop_gradient = True
    _op("fill_constant", {}, {"Out": [res]},
        {"shape": [int(s) for s in shape], "dtype": convert_dtype(dtype).str,
         "value": float(value)})
    return res


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
    return fill_constant(shape, dtype, 0.0)


def ones(shape, dtype, force_cpu=False):
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
    """An empty variable, for a layer's ``out``/``total`` argument or ``assign``.
    As Fluid's, it passes gradients (``assign(x, create_tensor(...))`` on the
    loss's path trains what ``x`` depends on)."""
    return _block().create_var(unique_name.layer("create_tensor", name), None,
                               dtype, persistable=persistable)


def create_global_var(shape, value, dtype, persistable=False, force_cpu=False, name=None):
    """A variable initialized to ``value`` by the startup program; a
    persistable one keeps what ``assign`` writes into it from run to run."""
    shape = tuple(int(s) for s in shape)
    block = _block()
    unique_name.layer("global_var", name)   # Fluid's helper; the variable is unnamed
    var = block.create_var(name, shape, dtype,
                           persistable=bool(persistable), stop_gradient=True)
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


def getitem(var, item):
    """Fluid's ``var[i]``, ``var[a:b, j]``: a ``slice`` op, integer indices
    dropping their axis (a result with no axis left has shape ``[1]``)."""
    items = item if isinstance(item, tuple) else (item,)
    if len(items) > len(var.shape or ()):
        raise IndexError(f"{var.name}: {len(items)} indices for shape {var.shape}")
    axes, starts, ends, drop = [], [], [], []
    for i, it in enumerate(items):
        if isinstance(it, builtins.slice):
            if it.step not in (None, 1):
                raise ValueError(f"{var.name}[...]: slice steps are not supported")
            if it.start is None and it.stop is None:
                continue
            axes.append(i)
            starts.append(int(it.start or 0))
            ends.append(int(it.stop) if it.stop is not None else 2 ** 31 - 1)
        elif isinstance(it, (int, np.integer)) and not isinstance(it, bool):
            axes.append(i)
            starts.append(int(it))
            ends.append(int(it) + 1 if it != -1 else 2 ** 31 - 1)
            drop.append(i)
        else:
            raise ValueError(f"{var.name}[...]: only int and slice indices are supported, "
                             f"got {it!r}")
    out = slice(var, axes, starts, ends) if axes else var
    if drop and len(drop) < len(var.shape):
        out = squeeze(out, drop)
    elif drop and len(var.shape) > 1:
        out = reshape(out, [1])
    return out


def _not_iterable(var):
    raise TypeError(f"Variable {var.name!r} is not iterable: index it (var[i]) or use "
                    "fluid.layers.unstack")


# As Fluid's math_op_patch: indexing joins Variable's operators here, beside the
# layers it appends; without __iter__, __getitem__ would make every Variable an
# endless sequence.
Variable.__getitem__ = getitem
Variable.__iter__ = _not_iterable

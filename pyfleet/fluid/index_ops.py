"""Kernels of Fluid 1.8's indexing and reduction layers
(:mod:`pyfleet.fluid.layers_index`): split, gather, argmax/argmin/argsort,
cumsum, flip, expand_as, logsumexp, the boolean reductions and the
finiteness checks, log_softmax and softmax_with_cross_entropy. The kernel
interface is :mod:`pyfleet.fluid.ops`'s (which registers these).
"""

import numpy as np

from pyfleet.fluid.kernel_shapes import align as _align

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"arg_min_max", "reduce_bool", "finite_check"}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def _x(op, s, slot="X"):
    return s.data(op.input(slot)[0])


def _split_fwd(op, s):
    x = _x(op, s)
    axis, sections = op.attrs["axis"], op.attrs["sections"]
    if sum(sections) != x.shape[axis]:
        raise ValueError(f"split: sections {sections} do not add up to dimension {axis} of "
                         f"{op.input('X')[0].name} (size {x.shape[axis]})")
    for v, part in zip(op.output("Out"), np.split(x, np.cumsum(sections)[:-1], axis=axis)):
        s.set(v, part)


def _split_bwd(op, s):
    xv = op.input("X")[0]
    if not s.needs_grad(xv):
        return
    parts = [s.grad(v) for v in op.output("Out")]
    if all(p is None for p in parts):
        return
    outs = [s.data(v) for v in op.output("Out")]
    s.add_grad(xv, np.concatenate([np.zeros_like(o) if p is None else p
                                   for p, o in zip(parts, outs)], axis=op.attrs["axis"]))


_register("split", _split_fwd, _split_bwd)


def _gather_fwd(op, s):
    x, idx = _x(op, s), _x(op, s, "Index").reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[0]):
        raise ValueError(f"gather: an index of {op.input('Index')[0].name} is outside "
                         f"[0, {x.shape[0]})")
    s.set(op.output("Out")[0], x[idx])


def _gather_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    gx = np.zeros(s.data(xv).shape, dtype=g.dtype)
    np.add.at(gx, _x(op, s, "Index").reshape(-1), g)
    s.add_grad(xv, gx)


_register("gather", _gather_fwd, _gather_bwd)


def _arg_fwd(op, s):
    x = _x(op, s)
    axis = op.attrs["axis"]
    kind = op.attrs["kind"]
    if kind == "argsort":
        idx = np.argsort(-x if op.attrs["descending"] else x, axis=axis, kind="stable")
        s.set(op.output("Out")[0], np.take_along_axis(x, idx, axis=axis))
        s.set(op.output("Indices")[0], idx.astype(np.int64))
        return
    fn = np.argmax if kind == "argmax" else np.argmin
    s.set(op.output("Out")[0], fn(x, axis=axis).astype(np.int64))


def _argsort_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv) or op.attrs["kind"] != "argsort":
        return
    gx = np.zeros(g.shape, dtype=g.dtype)
    np.put_along_axis(gx, s.data(op.output("Indices")[0]), g, axis=op.attrs["axis"])
    s.add_grad(xv, gx)


_register("arg_min_max", _arg_fwd)
_register("argsort", _arg_fwd, _argsort_bwd)


def _cumsum_fwd(op, s):
    x = _x(op, s)
    axis = op.attrs["axis"]
    if axis is None:
        x, axis = x.reshape(-1), 0
    y = np.flip(x, axis) if op.attrs["reverse"] else x
    out = np.cumsum(y, axis=axis)
    if op.attrs["exclusive"]:
        out = out - y
    s.set(op.output("Out")[0], np.flip(out, axis) if op.attrs["reverse"] else out)


def _cumsum_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    axis = op.attrs["axis"]
    g2 = g.reshape(-1) if axis is None else g
    ax = 0 if axis is None else axis
    # The adjoint of a forward cumsum is a cumsum from the other end.
    rev = not op.attrs["reverse"]
    y = np.flip(g2, ax) if rev else g2
    out = np.cumsum(y, axis=ax)
    if op.attrs["exclusive"]:
        out = out - y
    gx = np.flip(out, ax) if rev else out
    s.add_grad(xv, gx.reshape(x.shape))


_register("cumsum", _cumsum_fwd, _cumsum_bwd)


def _flip_fwd(op, s):
    s.set(op.output("Out")[0], np.flip(_x(op, s), op.attrs["dims"]).copy())


def _flip_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, np.flip(g, op.attrs["dims"]).copy())


_register("flip", _flip_fwd, _flip_bwd)


def _expand_as_fwd(op, s):
    x, target = _x(op, s), _x(op, s, "Target")
    if x.ndim != target.ndim or any(t % d for d, t in zip(x.shape, target.shape)):
        raise ValueError(f"expand_as: {op.input('X')[0].name} {x.shape} does not tile to "
                         f"{target.shape}")
    s.set(op.output("Out")[0], np.tile(x, [t // d for d, t in zip(x.shape, target.shape)]))


def _expand_as_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    split = []
    for d, t in zip(x.shape, g.shape):
        split += [t // d, d]
    s.add_grad(xv, g.reshape(split).sum(axis=tuple(range(0, 2 * x.ndim, 2))))


_register("expand_as", _expand_as_fwd, _expand_as_bwd)


def _axes(op, x):
    dim = op.attrs.get("dim")
    if dim is None:
        return tuple(range(x.ndim))
    dims = [dim] if np.isscalar(dim) else list(dim)
    return tuple(sorted(d % x.ndim for d in dims))


def _keep(out):
    return out.reshape(1) if np.ndim(out) == 0 else out


def _logsumexp_fwd(op, s):
    x = _x(op, s)
    axes = _axes(op, x)
    m = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    s.set_aux(op, out)
    s.set(op.output("Out")[0], _keep(out if op.attrs["keep_dim"] else np.squeeze(out, axes)))


def _logsumexp_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    lse = s.aux(op)
    s.add_grad(xv, g.reshape(lse.shape) * np.exp(x - lse))


_register("logsumexp", _logsumexp_fwd, _logsumexp_bwd)


def _reduce_bool_fwd(op, s):
    x = _x(op, s).astype(bool)
    fn = np.all if op.attrs["kind"] == "all" else np.any
    s.set(op.output("Out")[0], _keep(fn(x, axis=_axes(op, x), keepdims=op.attrs["keep_dim"])))


_register("reduce_bool", _reduce_bool_fwd)


def _finite_fwd(op, s):
    x = _x(op, s)
    kind = op.attrs["kind"]
    val = (np.isfinite(x).all() if kind == "isfinite" else np.isinf(x).any()
           if kind == "has_inf" else np.isnan(x).any())
    s.set(op.output("Out")[0], np.array([bool(val)]))


_register("finite_check", _finite_fwd)


def _log_softmax(x, axis):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def _log_softmax_fwd(op, s):
    s.set(op.output("Out")[0], _log_softmax(_x(op, s), op.attrs["axis"]))


def _log_softmax_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    y = s.data(op.output("Out")[0])
    axis = op.attrs["axis"]
    s.add_grad(xv, g - np.exp(y) * g.sum(axis=axis, keepdims=True))


_register("log_softmax", _log_softmax_fwd, _log_softmax_bwd)


def _swce_fwd(op, s):
    """softmax_with_cross_entropy over the last axis: Loss ``[..., 1]``, Softmax."""
    logits = _x(op, s, "Logits")
    label = _x(op, s, "Label")
    logp = _log_softmax(logits, -1)
    if op.attrs["soft_label"]:
        loss = -(label * logp).sum(axis=-1, keepdims=True)
    else:
        lab = label.reshape(logits.shape[:-1]).astype(np.int64)
        ignore = lab == op.attrs["ignore_index"]
        safe = np.where(ignore, 0, lab)
        if safe.size and (safe.min() < 0 or safe.max() >= logits.shape[-1]):
            raise ValueError(f"softmax_with_cross_entropy: a label of "
                             f"{op.input('Label')[0].name} is outside [0, {logits.shape[-1]})")
        loss = -np.take_along_axis(logp, safe[..., None], axis=-1)
        loss[ignore] = 0
    s.set(op.output("Loss")[0], loss)
    s.set(op.output("Softmax")[0], np.exp(logp))


def _swce_bwd(op, s):
    lv = op.input("Logits")[0]
    g = s.grad(op.output("Loss")[0])
    if g is None or not s.needs_grad(lv):
        return
    p = s.data(op.output("Softmax")[0])
    label = _x(op, s, "Label")
    if op.attrs["soft_label"]:
        grad = p * label.sum(axis=-1, keepdims=True) - label
    else:
        lab = label.reshape(p.shape[:-1]).astype(np.int64)
        ignore = lab == op.attrs["ignore_index"]
        grad = p.copy()
        np.put_along_axis(grad, np.where(ignore, 0, lab)[..., None],
                          np.take_along_axis(grad, np.where(ignore, 0, lab)[..., None], -1) - 1,
                          axis=-1)
        grad[ignore] = 0
    s.add_grad(lv, grad * g)


_register("softmax_with_cross_entropy", _swce_fwd, _swce_bwd)


# --------------------------------------------------------------------------- more

def _where_fwd(op, s):
    c = _x(op, s, "Condition").astype(bool)
    s.set(op.output("Out")[0], np.argwhere(c).astype(np.int64))


_register("where_index", _where_fwd)
NO_GRAD.add("where_index")


def _huber_fwd(op, s):
    x, y = _x(op, s), _x(op, s, "Y")
    r = y.reshape(x.shape) - x
    d = op.attrs["delta"]
    s.set(op.output("Out")[0], np.where(np.abs(r) <= d, 0.5 * r * r, d * (np.abs(r) - 0.5 * d)))


def _huber_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x, y = s.data(xv), s.data(yv)
    r = y.reshape(x.shape) - x
    d = op.attrs["delta"]
    dr = g * np.where(np.abs(r) <= d, r, d * np.sign(r))
    if s.needs_grad(xv):
        s.add_grad(xv, -dr)
    if s.needs_grad(yv):
        s.add_grad(yv, dr.reshape(y.shape))


_register("huber_loss", _huber_fwd, _huber_bwd)


def _bpr_parts(op, s):
    x = _x(op, s)
    lab = _x(op, s, "Label").reshape(-1).astype(np.int64)
    pos = np.take_along_axis(x, lab[:, None], axis=1)
    other = np.ones(x.shape, dtype=bool)
    np.put_along_axis(other, lab[:, None], False, axis=1)
    return x, lab, pos, other


def _bpr_fwd(op, s):
    x, _, pos, other = _bpr_parts(op, s)
    # -log(sigmoid(pos - x_j)) = log(1 + exp(x_j - pos)), averaged over the C - 1 others.
    terms = np.logaddexp(0, x - pos) * other
    s.set(op.output("Out")[0], terms.sum(axis=1, keepdims=True) / (x.shape[1] - 1))


def _bpr_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x, lab, pos, other = _bpr_parts(op, s)
    w = other / (1 + np.exp(pos - x)) * g / (x.shape[1] - 1)     # d/dx_j
    gx = w.copy()
    np.put_along_axis(gx, lab[:, None], -w.sum(axis=1, keepdims=True), axis=1)
    s.add_grad(xv, gx)


_register("bpr_loss", _bpr_fwd, _bpr_bwd)


def _gather_axis_fwd(op, s):
    x, idx = _x(op, s), _x(op, s, "Index").reshape(-1)
    axis = op.attrs["axis"]
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[axis]):
        raise ValueError(f"index_select: an index of {op.input('Index')[0].name} is outside "
                         f"[0, {x.shape[axis]})")
    s.set(op.output("Out")[0], np.take(x, idx, axis=axis))


def _gather_axis_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    axis = op.attrs["axis"]
    gx = np.zeros(s.data(xv).shape, dtype=g.dtype)
    np.add.at(np.moveaxis(gx, axis, 0), _x(op, s, "Index").reshape(-1),
              np.moveaxis(g, axis, 0))
    s.add_grad(xv, gx)


_register("index_select", _gather_axis_fwd, _gather_axis_bwd)


def _random_fwd(op, s):
    from pyfleet.fluid.nn_ops import random_generator
    shape = list(op.attrs["shape"])
    if op.input("Input"):
        v = s.value(op.input("Input")[0])
        data = getattr(v, "data", v)
        shape[op.attrs["output_dim_idx"]] = data.shape[op.attrs["input_dim_idx"]]
    rng = random_generator(op, s)
    dtype = np.dtype(op.attrs["dtype"])
    if op.attrs["kind"] == "uniform":
        out = rng.uniform(op.attrs["min"], op.attrs["max"], size=shape)
    else:
        out = rng.normal(op.attrs["mean"], op.attrs["std"], size=shape)
    s.set(op.output("Out")[0], out.astype(dtype))


_register("random", _random_fwd)
NO_GRAD.add("random")


def _int_binary_fwd(op, s):
    x, y = _x(op, s), _x(op, s, "Y")
    y = _align(x, y, op.attrs.get("axis", -1))
    fn = {"mod": np.mod, "floordiv": np.floor_divide, "equal": np.equal}[op.attrs["fn"]]
    s.set(op.output("Out")[0], fn(x, y))


_register("elementwise_int", _int_binary_fwd)
NO_GRAD.add("elementwise_int")


def _shard_index_fwd(op, s):
    x = _x(op, s)
    a = op.attrs
    size = (a["index_num"] + a["nshards"] - 1) // a["nshards"]
    if x.size and (x.min() < 0 or x.max() >= a["index_num"]):
        raise ValueError(f"shard_index: an id of {op.input('X')[0].name} is outside "
                         f"[0, {a['index_num']})")
    s.set(op.output("Out")[0], np.where(x // size == a["shard_id"], x % size,
                                        a["ignore_value"]).astype(x.dtype))


_register("shard_index", _shard_index_fwd)
NO_GRAD.add("shard_index")


def _roll_fwd(op, s):
    x = _x(op, s)
    dims = op.attrs["dims"]
    out = np.roll(x.reshape(-1) if dims is None else x, op.attrs["shifts"], axis=dims)
    s.set(op.output("Out")[0], out.reshape(x.shape))


def _roll_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    dims = op.attrs["dims"]
    back = [-k for k in op.attrs["shifts"]]
    gx = np.roll(g.reshape(-1) if dims is None else g, back if dims is not None else back[0],
                 axis=dims)
    s.add_grad(xv, gx.reshape(g.shape))


_register("roll", _roll_fwd, _roll_bwd)


def _unique_fwd(op, s):
    x = _x(op, s).reshape(-1)
    vals, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                             return_counts=True)
    order = np.argsort(first, kind="stable")          # Fluid: first-occurrence order
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    dtype = np.dtype(op.attrs["dtype"])
    s.set(op.output("Out")[0], vals[order])
    s.set(op.output("Index")[0], rank[inverse].astype(dtype))
    if op.output("Count"):
        s.set(op.output("Count")[0], counts[order].astype(dtype))


_register("unique", _unique_fwd)
NO_GRAD.add("unique")


def _smooth_l1_parts(op, s):
    x, y = _x(op, s), _x(op, s, "Y")
    d = x - y.reshape(x.shape)
    if op.input("InsideWeight"):
        d = d * _x(op, s, "InsideWeight").reshape(x.shape)
    return x, d, op.attrs["sigma2"]


def _smooth_l1_fwd(op, s):
    x, d, s2 = _smooth_l1_parts(op, s)
    e = np.where(np.abs(d) < 1.0 / s2, 0.5 * s2 * d * d, np.abs(d) - 0.5 / s2)
    if op.input("OutsideWeight"):
        e = e * _x(op, s, "OutsideWeight").reshape(x.shape)
    s.set(op.output("Out")[0], e.reshape(x.shape[0], -1).sum(axis=1, keepdims=True))


def _smooth_l1_bwd(op, s):
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    xv, yv = op.input("X")[0], op.input("Y")[0]
    x, d, s2 = _smooth_l1_parts(op, s)
    dd = np.where(np.abs(d) < 1.0 / s2, s2 * d, np.sign(d))
    if op.input("OutsideWeight"):
        dd = dd * _x(op, s, "OutsideWeight").reshape(x.shape)
    if op.input("InsideWeight"):
        dd = dd * _x(op, s, "InsideWeight").reshape(x.shape)
    gx = dd * g.reshape((-1,) + (1,) * (x.ndim - 1))
    if s.needs_grad(xv):
        s.add_grad(xv, gx)
    if s.needs_grad(yv):
        s.add_grad(yv, -gx.reshape(s.data(yv).shape))


_register("smooth_l1_loss", _smooth_l1_fwd, _smooth_l1_bwd)

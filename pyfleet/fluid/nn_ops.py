"""Kernels of dropout, batch_norm, data_norm, cvm, one_hot and transpose2
(see :mod:`pyfleet.fluid.ops` for the kernel interface; it registers these).

Two of these ops keep statistics that change outside the gradient:
``batch_norm`` (moving mean and variance, when not in test mode) and
``data_norm`` (batch size, sum and square sum, on training steps). Their
kernels do not write parameters: they record the new values with
:func:`record_statistics` and the executor writes them through the backend
after the step (``Executor._apply_statistics``), only on a backend that keeps
them (``keeps_op_statistics``, see :mod:`pyfleet.fluid.backend`).

Test mode: an op's ``is_test`` attribute, or a program cloned with
``for_test=True`` (Fluid's clone sets ``is_test`` on these ops; pyfleet's
clone shares the operators, so the kernels read the program's flag).
"""

import weakref
import zlib

import numpy as np

from pyfleet.fluid.tensor import LoDTensor

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD", "STATISTICS", "is_test", "random_generator",
           "record_statistics"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"one_hot"}
STATISTICS = "statistics"   # the Step.cache key of the recorded new values


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def is_test(op, s):
    """Whether ``op`` runs in test mode in this step."""
    return bool(op.attrs.get("is_test")) or bool(getattr(s.program, "_for_test", False))


def record_statistics(s, var, value):
    """Ask the executor to set parameter ``var`` to ``value`` after this step."""
    s.cache.setdefault(STATISTICS, {})[var.name] = value


# --------------------------------------------------------------------------- dropout

# One generator per dropout op without a fixed seed, advancing run after run
# (the op is shared by a program and its clones, so they draw one sequence).
_RNGS = weakref.WeakKeyDictionary()


def _dropout_rng(op, s):
    if op.attrs.get("fix_seed"):
        # Fluid: a fixed seed draws the same mask on every run.
        return np.random.default_rng(int(op.attrs["seed"]) & 0xFFFFFFFFFFFFFFFF)
    rng = _RNGS.get(op)
    if rng is None:
        out = op.output("Out")[0].name
        seed = ((int(s.program.random_seed) & 0xFFFFFFFF) << 32) | zlib.crc32(out.encode())
        rng = _RNGS[op] = np.random.default_rng(seed)
    return rng


def random_generator(op, s):
    """The generator of a random op: a fixed ``seed`` (``fix_seed``) draws the
    same values every run, as Fluid; otherwise one generator per op, seeded by
    the program's ``random_seed`` and the output's name, advancing run after run."""
    return _dropout_rng(op, s)


def _dropout_fwd(op, s):
    xv = op.input("X")[0]
    x = s.data(xv)
    p = op.attrs["dropout_prob"]
    upscale = op.attrs["dropout_implementation"] == "upscale_in_train"
    if is_test(op, s):
        mask = None
        out = x.copy() if upscale else x * x.dtype.type(1.0 - p)
    else:
        # Fluid drops an element when its uniform draw is below dropout_prob.
        keep = _dropout_rng(op, s).random(x.shape) >= p
        if upscale:
            mask = keep * x.dtype.type(0.0 if p == 1.0 else 1.0 / (1.0 - p))
        else:
            mask = keep.astype(x.dtype)
        out = x * mask
    s.set_aux(op, mask)
    s.set(op.output("Out")[0], out)


def _dropout_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    mask = s.aux(op)
    if mask is not None:
        s.add_grad(xv, g * mask)
    elif op.attrs["dropout_implementation"] == "upscale_in_train":
        s.add_grad(xv, g)
    else:
        s.add_grad(xv, g * g.dtype.type(1.0 - op.attrs["dropout_prob"]))


_register("dropout", _dropout_fwd, _dropout_bwd)


# --------------------------------------------------------------------------- batch_norm

def _channel_axis(op, x):
    return 1 if op.attrs.get("data_layout", "NCHW") == "NCHW" or x.ndim == 2 else x.ndim - 1


def _bn_fwd(op, s):
    x = s.data(op.input("X")[0])
    c = _channel_axis(op, x)
    axes = tuple(i for i in range(x.ndim) if i != c)
    bshape = [1] * x.ndim
    bshape[c] = x.shape[c]
    scale = s.data(op.input("Scale")[0]).astype(x.dtype, copy=False)
    bias = s.data(op.input("Bias")[0]).astype(x.dtype, copy=False)
    mv, vv = op.input("Mean")[0], op.input("Variance")[0]
    moving_mean, moving_var = s.data(mv), s.data(vv)
    if scale.shape[0] != x.shape[c]:
        raise ValueError(f"batch_norm: input {op.input('X')[0].name} has {x.shape[c]} "
                         f"channels on axis {c}, the layer was built for {scale.shape[0]}")
    eps = x.dtype.type(op.attrs["epsilon"])
    batch = not (is_test(op, s) or op.attrs.get("use_global_stats"))
    if batch:
        mean = x.mean(axis=axes)
        var = np.square(x - mean.reshape(bshape)).mean(axis=axes)
        mom = op.attrs["momentum"]
        record_statistics(s, mv, moving_mean * mom + mean * (1.0 - mom))
        record_statistics(s, vv, moving_var * mom + var * (1.0 - mom))
    else:
        mean = moving_mean.astype(x.dtype, copy=False)
        var = moving_var.astype(x.dtype, copy=False)
    inv = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(bshape)) * inv.reshape(bshape)
    s.set_aux(op, (xhat, inv, batch, axes, bshape))
    s.set(op.output("Y")[0], xhat * scale.reshape(bshape) + bias.reshape(bshape))


def _bn_bwd(op, s):
    g = s.grad(op.output("Y")[0])
    if g is None:
        return
    xhat, inv, batch, axes, bshape = s.aux(op)
    xv, sv, bv = op.input("X")[0], op.input("Scale")[0], op.input("Bias")[0]
    dbias = g.sum(axis=axes)
    dscale = (g * xhat).sum(axis=axes)
    if s.needs_grad(sv):
        s.add_grad(sv, dscale.astype(s.data(sv).dtype, copy=False))
    if s.needs_grad(bv):
        s.add_grad(bv, dbias.astype(s.data(bv).dtype, copy=False))
    if s.needs_grad(xv):
        scale = s.data(sv).astype(g.dtype, copy=False)
        k = (scale * inv).reshape(bshape)
        if batch:
            m = g.size // dbias.size
            dx = k / m * (m * g - dbias.reshape(bshape) - xhat * dscale.reshape(bshape))
        else:
            dx = g * k
        s.add_grad(xv, dx)


_register("batch_norm", _bn_fwd, _bn_bwd)


# --------------------------------------------------------------------------- data_norm

def _dn_fwd(op, s):
    x = s.data(op.input("X")[0])
    if x.ndim != 2:
        raise ValueError(f"data_norm: input {op.input('X')[0].name} must be 2-D [N, C], "
                         f"got shape {x.shape}")
    sv, mv, qv = op.input("BatchSize")[0], op.input("BatchSum")[0], op.input("BatchSquareSum")[0]
    size, total, square = (s.data(v).astype(x.dtype, copy=False) for v in (sv, mv, qv))
    if size.shape[0] != x.shape[1]:
        raise ValueError(f"data_norm: input {op.input('X')[0].name} has {x.shape[1]} "
                         f"columns, the layer was built for {size.shape[0]}")
    means = total / size
    scales = np.sqrt(size / square)
    s.set_aux(op, scales)
    s.set(op.output("Y")[0], (x - means) * scales)
    if s.plan.training and not is_test(op, s):
        # Fluid's statistics "gradient" applied by PSLib's summary rule:
        # stat = stat * decay + this batch's count, sum, centred square sum.
        d = op.attrs["summary_decay_rate"]
        n = x.shape[0]
        eps = op.attrs["epsilon"]
        record_statistics(s, sv, s.data(sv) * d + n)
        record_statistics(s, mv, s.data(mv) * d + x.sum(axis=0))
        record_statistics(s, qv, s.data(qv) * d + np.square(x - means).sum(axis=0) + n * eps)


def _dn_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Y")[0])
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, g * s.aux(op))


_register("data_norm", _dn_fwd, _dn_bwd)


# --------------------------------------------------------------------------- cvm

def _cvm_rows(s, xv, cvm):
    """The show/click row of every row of input ``xv`` (a LoD input's rows
    take their sequence's)."""
    x = s.value(xv)
    if isinstance(x, LoDTensor):
        lens = np.diff(x.offsets)
        if lens.shape[0] != cvm.shape[0]:
            raise ValueError(f"continuous_value_model: {cvm.shape[0]} show/click rows for "
                             f"{lens.shape[0]} sequences of {xv.name}")
        return np.repeat(cvm, lens, axis=0)
    if cvm.shape[0] != x.shape[0]:
        raise ValueError(f"continuous_value_model: {cvm.shape[0]} show/click rows for "
                         f"{x.shape[0]} rows of {xv.name}")
    return cvm


def _cvm_fwd(op, s):
    xv = op.input("X")[0]
    x = s.data(xv)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"continuous_value_model: input {xv.name} must be [N, D] with "
                         f"D >= 2 (show, click, embedding), got shape {x.shape}")
    cvm = s.data(op.input("CVM")[0])
    if cvm.ndim != 2 or cvm.shape[1] != 2:
        raise ValueError(f"continuous_value_model: cvm {op.input('CVM')[0].name} must be "
                         f"[N, 2] (show, click), got shape {cvm.shape}")
    _cvm_rows(s, xv, cvm)   # checks the row counts
    if op.attrs["use_cvm"]:
        y = x.copy()
        y[:, 0] = np.log(x[:, 0] + 1)
        y[:, 1] = np.log(x[:, 1] + 1) - y[:, 0]
    else:
        y = x[:, 2:].copy()
    v = s.value(xv)
    s.set(op.output("Y")[0], v._like(y) if isinstance(v, LoDTensor) else y)


def _cvm_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Y")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    dx = np.empty_like(x, dtype=g.dtype)
    dx[:, 2:] = g[:, 2:] if op.attrs["use_cvm"] else g
    # Fluid's cvm_grad: the show and click columns get the show/click values
    # themselves, not a derivative (PSLib's CTR accessor counts them on push).
    dx[:, :2] = _cvm_rows(s, xv, s.data(op.input("CVM")[0]))
    s.add_grad(xv, dx)


_register("cvm", _cvm_fwd, _cvm_bwd)


# --------------------------------------------------------------------------- one_hot

def _one_hot_fwd(op, s):
    xv = op.input("X")[0]
    v = s.value(xv)
    ids = v.data if isinstance(v, LoDTensor) else v
    depth = op.attrs["depth"]
    if op.attrs.get("drop_last_dim"):
        if ids.ndim < 1 or ids.shape[-1] != 1:
            raise ValueError(f"one_hot: input {xv.name} must end in a dimension of 1, got "
                             f"shape {ids.shape}")
        lead = ids.shape[:-1]
    else:
        lead = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    bad = (flat < 0) | (flat >= depth)
    if bad.any() and not op.attrs.get("allow_out_of_range"):
        raise ValueError(f"one_hot: id {int(flat[bad][0])} of {xv.name} is outside "
                         f"[0, {depth}) (allow_out_of_range=True gives a zero row)")
    out = np.zeros((flat.shape[0], depth), dtype=np.float32)
    ok = np.flatnonzero(~bad)
    out[ok, flat[ok]] = 1.0
    out = out.reshape(tuple(lead) + (depth,))
    s.set(op.output("Out")[0], v._like(out) if isinstance(v, LoDTensor) else out)


_register("one_hot", _one_hot_fwd)


# --------------------------------------------------------------------------- transpose

def _transpose_fwd(op, s):
    x = s.data(op.input("X")[0])
    perm = op.attrs["axis"]
    if len(perm) != x.ndim:
        raise ValueError(f"transpose: perm {perm} has {len(perm)} axes, input "
                         f"{op.input('X')[0].name} has {x.ndim} (shape {x.shape})")
    s.set(op.output("Out")[0], np.ascontiguousarray(np.transpose(x, perm)))


def _transpose_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is not None and s.needs_grad(xv):
        s.add_grad(xv, np.ascontiguousarray(np.transpose(g, np.argsort(op.attrs["axis"]))))


_register("transpose2", _transpose_fwd, _transpose_bwd)


# --------------------------------------------------------------------------- conv2d

def _conv_windows(x, op):
    """``[N, C, Ho, Wo, kh, kw]`` views of the padded NCHW input: one window per
    output position (im2col without copying until the einsum)."""
    (ph, pw), (sh, sw), (dh, dw) = op.attrs["paddings"], op.attrs["strides"], \
        op.attrs["dilations"]
    kh, kw = op.attrs["kernel"]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    span_h, span_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    if xp.shape[2] < span_h or xp.shape[3] < span_w:
        raise ValueError(f"conv2d: input {op.input('Input')[0].name} of spatial size "
                         f"{x.shape[2:]} (padded {xp.shape[2:]}) is smaller than the filter's "
                         f"span {(span_h, span_w)}")
    win = np.lib.stride_tricks.sliding_window_view(xp, (span_h, span_w), axis=(2, 3))
    return xp, win[:, :, ::sh, ::sw, ::dh, ::dw]


def _conv2d_fwd(op, s):
    x = s.data(op.input("Input")[0])
    w = s.data(op.input("Filter")[0])
    _, win = _conv_windows(x, op)
    s.set(op.output("Output")[0], np.einsum("nchwij,fcij->nfhw", win, w, optimize=True))


def _conv2d_bwd(op, s):
    xv, wv = op.input("Input")[0], op.input("Filter")[0]
    g = s.grad(op.output("Output")[0])
    if g is None:
        return
    x, w = s.data(xv), s.data(wv)
    xp, win = _conv_windows(x, op)
    if s.needs_grad(wv):
        s.add_grad(wv, np.einsum("nfhw,nchwij->fcij", g, win, optimize=True))
    if s.needs_grad(xv):
        (ph, pw), (sh, sw), (dh, dw) = op.attrs["paddings"], op.attrs["strides"], \
            op.attrs["dilations"]
        ho, wo = g.shape[2], g.shape[3]
        gp = np.zeros(xp.shape, dtype=g.dtype)
        cols = np.einsum("nfhw,fcij->nchwij", g, w, optimize=True)
        for i in range(w.shape[2]):          # one strided add per filter position
            for j in range(w.shape[3]):
                gp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh,
                   j * dw:j * dw + sw * (wo - 1) + 1:sw] += cols[..., i, j]
        s.add_grad(xv, gp[:, :, ph:gp.shape[2] - ph, pw:gp.shape[3] - pw])


_register("conv2d", _conv2d_fwd, _conv2d_bwd)


# --------------------------------------------------------------------------- layer_norm

def _ln_fwd(op, s):
    x = s.data(op.input("X")[0])
    k = op.attrs["begin_norm_axis"]
    x2 = x.reshape(int(np.prod(x.shape[:k])), -1)
    mean = x2.mean(axis=1, keepdims=True)
    inv = 1.0 / np.sqrt(x2.var(axis=1, keepdims=True) + op.attrs["epsilon"])
    xhat = (x2 - mean) * inv
    y = xhat
    if op.input("Scale"):
        y = y * s.data(op.input("Scale")[0]).reshape(1, -1)
    if op.input("Bias"):
        y = y + s.data(op.input("Bias")[0]).reshape(1, -1)
    s.set(op.output("Y")[0], y.reshape(x.shape).astype(x.dtype))
    s.set_aux(op, (xhat, inv))


def _ln_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Y")[0])
    if g is None:
        return
    xhat, inv = s.aux(op)
    g2 = g.reshape(xhat.shape)
    if op.input("Bias") and s.needs_grad(op.input("Bias")[0]):
        s.add_grad(op.input("Bias")[0], g2.sum(axis=0))
    gamma = np.ones(xhat.shape[1], dtype=g.dtype)
    if op.input("Scale"):
        sv = op.input("Scale")[0]
        gamma = s.data(sv).reshape(-1)
        if s.needs_grad(sv):
            s.add_grad(sv, (g2 * xhat).sum(axis=0))
    if s.needs_grad(xv):
        dxhat = g2 * gamma
        d = xhat.shape[1]
        gx = inv / d * (d * dxhat - dxhat.sum(axis=1, keepdims=True)
                        - xhat * (dxhat * xhat).sum(axis=1, keepdims=True))
        s.add_grad(xv, gx.reshape(s.data(xv).shape))


_register("layer_norm", _ln_fwd, _ln_bwd)


# --------------------------------------------------------------------------- prelu

def _prelu_alpha(op, s, x):
    a = s.data(op.input("Alpha")[0])
    mode = op.attrs["mode"]
    if mode == "all":
        return a.reshape(())
    if mode == "channel":
        return a.reshape((1, -1) + (1,) * (x.ndim - 2))
    return a.reshape((1,) + x.shape[1:])


def _prelu_fwd(op, s):
    x = s.data(op.input("X")[0])
    s.set(op.output("Out")[0], np.where(x > 0, x, _prelu_alpha(op, s, x) * x).astype(x.dtype))


def _prelu_bwd(op, s):
    xv, av = op.input("X")[0], op.input("Alpha")[0]
    g = s.grad(op.output("Out")[0])
    if g is None:
        return
    x = s.data(xv)
    alpha = _prelu_alpha(op, s, x)
    if s.needs_grad(xv):
        s.add_grad(xv, np.where(x > 0, g, g * alpha).astype(g.dtype))
    if s.needs_grad(av):
        ga = np.where(x > 0, 0, g * x)
        mode = op.attrs["mode"]
        if mode == "all":
            ga = ga.sum()
        elif mode == "channel":
            ga = ga.sum(axis=tuple(i for i in range(x.ndim) if i != 1))
        else:
            ga = ga.sum(axis=0)
        s.add_grad(av, np.asarray(ga, dtype=g.dtype).reshape(s.data(av).shape))


_register("prelu", _prelu_fwd, _prelu_bwd)

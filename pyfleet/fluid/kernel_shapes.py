"""Shape rules the op kernels share (:mod:`pyfleet.fluid.ops` and the kernel
modules it registers): Fluid's elementwise broadcast of ``y`` against ``x``
from an ``axis``, and the axes a reduction op reduces."""

import numpy as np

__all__ = ["align", "align_y", "reduce_axes"]


def align_y(x, y, axis):
    """Fluid's broadcast: y's dims match x's starting at ``axis`` (-1: trailing)."""
    if y.ndim >= x.ndim or y.ndim == 0:
        return y.shape
    if axis == -1:
        axis = x.ndim - y.ndim
    shape = y.shape
    while len(shape) > 0 and shape[-1] == 1 and axis + len(shape) > x.ndim:
        shape = shape[:-1]
    return (1,) * axis + tuple(shape) + (1,) * (x.ndim - axis - len(shape))


def align(x, y, axis):
    """``y`` reshaped to broadcast against ``x`` as Fluid does from ``axis``."""
    return y.reshape(align_y(x, y, axis))


def reduce_axes(op, x):
    """The axes of ``x`` the reduction ``op`` reduces (its ``dim``, or all)."""
    if op.attrs.get("reduce_all") or op.attrs.get("dim") is None:
        return tuple(range(x.ndim))
    dims = op.attrs["dim"]
    dims = [dims] if np.isscalar(dims) else list(dims)
    return tuple(sorted(d % x.ndim for d in dims))

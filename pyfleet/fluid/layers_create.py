"""Fluid 1.8's layers that make a tensor from nothing but a shape or a value
(re-exported by :mod:`pyfleet.fluid.layers`): ``uniform_random``,
``gaussian_random`` and their ``*_batch_size_like`` forms (the ``random`` kernel
of :mod:`pyfleet.fluid.index_ops`), ``full``, ``full_like``, ``eye``, ``arange``,
``range``.
"""

from pyfleet.fluid import framework
from pyfleet.fluid import layers_tensor as _lt
from pyfleet.fluid.framework import check_variable as _check_var
from pyfleet.fluid.layers_index import _constant, _tmp
from pyfleet.fluid.layers_nn import _op

__all__ = ["arange", "eye", "full", "full_like", "gaussian_random",
           "gaussian_random_batch_size_like", "range", "uniform_random",
           "uniform_random_batch_size_like"]


def _random(kind, shape, dtype, seed, params, input=None, input_dim_idx=0, output_dim_idx=0):
    from pyfleet.fluid.tensor import convert_dtype
    shape = [int(d) for d in shape]
    static = list(shape)
    inputs = {}
    if input is not None:
        inputs["Input"] = [_check_var(input, f"{kind}_random_batch_size_like input")]
        static[output_dim_idx] = input.shape[input_dim_idx]
    layer_type = f"{kind}_random" + ("" if input is None else "_batch_size_like")
    out = _tmp(layer_type, tuple(static), dtype, True)
    _op("random", inputs, {"Out": [out]},
        {"kind": kind, "shape": shape, "dtype": convert_dtype(dtype).str,
         "fix_seed": int(seed) != 0, "seed": int(seed), "input_dim_idx": int(input_dim_idx),
         "output_dim_idx": int(output_dim_idx), **params})
    return out


def uniform_random(shape, dtype="float32", min=-1.0, max=1.0, seed=0):
    """Uniform in ``[min, max)``; ``seed != 0`` draws the same values every run (Fluid)."""
    return _random("uniform", shape, dtype, seed, {"min": float(min), "max": float(max)})


def gaussian_random(shape, mean=0.0, std=1.0, seed=0, dtype="float32"):
    return _random("gaussian", shape, dtype, seed, {"mean": float(mean), "std": float(std)})


def uniform_random_batch_size_like(input, shape, dtype="float32", input_dim_idx=0,
                                   output_dim_idx=0, min=-1.0, max=1.0, seed=0):
    return _random("uniform", shape, dtype, seed, {"min": float(min), "max": float(max)},
                   input, input_dim_idx, output_dim_idx)


def gaussian_random_batch_size_like(input, shape, input_dim_idx=0, output_dim_idx=0,
                                    mean=0.0, std=1.0, seed=0, dtype="float32"):
    return _random("gaussian", shape, dtype, seed, {"mean": float(mean), "std": float(std)},
                   input, input_dim_idx, output_dim_idx)


def full(shape, fill_value, out=None, dtype=None, device=None, stop_gradient=True, name=None):
    return _lt.fill_constant(shape, dtype or "float32", fill_value, out=out)


def full_like(input, fill_value, out=None, dtype=None, device=None, stop_gradient=True,
              name=None):
    res = _lt.fill_constant_batch_size_like(input, [d if d >= 0 else 1 for d in input.shape],
                                          dtype or input.dtype, fill_value)
    return res if out is None else _lt.assign(res, out)


def eye(num_rows, num_columns=None, batch_shape=None, dtype="float32"):
    import numpy as np
    m = np.eye(int(num_rows), int(num_columns or num_rows))
    if batch_shape:
        m = np.broadcast_to(m, tuple(batch_shape) + m.shape).copy()
    return _constant(m, dtype)


def arange(start, end, step=1, dtype=None, name=None):
    """``[start, end)`` by ``step`` (numbers, not Variables)."""
    import numpy as np
    for v in (start, end, step):
        if isinstance(v, framework.Variable):
            raise ValueError("arange/range: Variable bounds are not supported; pass numbers")
    return _constant(np.arange(start, end, step), dtype or "int64")


def range(start, end, step, dtype):
    return arange(start, end, step, dtype)

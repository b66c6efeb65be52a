"""``fluid.nets``: Fluid's composite networks built from layers.

``glu`` (gated linear unit) and ``scaled_dot_product_attention`` (multi-head
attention, as Fluid 1.8 composes it) work; the convolution compositions
(``simple_img_conv_pool``, ``img_conv_group``, ``sequence_conv_pool``) are
refused by name with the layers they are made of."""

import math

from pyfleet.fluid import layers as _layers
from pyfleet.fluid import refusals as _refusals

__all__ = ["glu", "scaled_dot_product_attention"]


def glu(input, dim=-1):
    """``a * sigmoid(b)`` of the two halves ``a, b`` of ``input`` along ``dim``."""
    nd = len(input.shape)
    dim = dim % nd
    size = input.shape[dim]
    if size < 0 or size % 2:
        raise ValueError(f"glu: dimension {dim} of {input.name} must have a known even "
                         f"size, got {size}")
    a = _layers.slice(input, axes=[dim], starts=[0], ends=[size // 2])
    b = _layers.slice(input, axes=[dim], starts=[size // 2], ends=[size])
    return _layers.elementwise_mul(a, _layers.sigmoid(b))


def scaled_dot_product_attention(queries, keys, values, num_heads=1, dropout_rate=0.0):
    """``softmax(Q K^T / sqrt(d)) V`` over ``[N, L, D]`` inputs, with
    ``num_heads`` heads splitting ``D`` (the heads are joined again)."""
    for v, what in ((queries, "queries"), (keys, "keys"), (values, "values")):
        if len(v.shape) != 3:
            raise ValueError(f"scaled_dot_product_attention: {what} must be 3-D [N, L, D], "
                             f"got {v.shape}")
    if queries.shape[-1] != keys.shape[-1]:
        raise ValueError("scaled_dot_product_attention: queries and keys must have the same "
                         f"hidden size, got {queries.shape[-1]} and {keys.shape[-1]}")
    if keys.shape[1] != values.shape[1] and keys.shape[1] >= 0 and values.shape[1] >= 0:
        raise ValueError("scaled_dot_product_attention: keys and values must have the same "
                         "length")
    if queries.shape[-1] % num_heads or values.shape[-1] % num_heads:
        raise ValueError(f"scaled_dot_product_attention: hidden sizes must be divisible by "
                         f"num_heads={num_heads}")

    def split_heads(x):
        if num_heads == 1:
            return x
        r = _layers.reshape(x, [0, 0, num_heads, x.shape[-1] // num_heads])
        return _layers.transpose(r, [0, 2, 1, 3])

    q, k, v = split_heads(queries), split_heads(keys), split_heads(values)
    d = queries.shape[-1] // num_heads
    weights = _layers.softmax(_layers.matmul(q, k, transpose_y=True, alpha=1.0 / math.sqrt(d)))
    if dropout_rate:
        weights = _layers.dropout(weights, dropout_prob=dropout_rate, is_test=False)
    ctx = _layers.matmul(weights, v)
    if num_heads == 1:
        return ctx
    t = _layers.transpose(ctx, [0, 2, 1, 3])
    return _layers.reshape(t, [0, 0, t.shape[2] * t.shape[3]])


_refusals.install(globals(), "paddle.fluid.nets")

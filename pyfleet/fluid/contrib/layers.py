"""``fluid.contrib.layers``: ``fused_embedding_seq_pool`` (the CTR sum of a
slot's embeddings in one op); the other contrib layers of Fluid 1.5-1.7 are
refused by name."""

from pyfleet.errors import ConfigError
from pyfleet.fluid import layers as _layers

__all__ = ["fused_embedding_seq_pool"]


def fused_embedding_seq_pool(input, size, is_sparse=False, padding_idx=None, combiner="sum",
                             param_attr=None, dtype="float32"):
    """Fluid's fused lookup and sum: ``sequence_pool(embedding(input), "sum")``
    for a ``lod_level=1`` input (padding ids add zeros). Only
    ``combiner="sum"`` exists, as in Fluid."""
    if combiner != "sum":
        raise ValueError(f"fused_embedding_seq_pool: combiner must be 'sum' (Fluid's only "
                         f"one), got {combiner!r}")
    if getattr(input, "lod_level", 0) != 1:
        raise ValueError("fused_embedding_seq_pool: input must be a lod_level=1 variable")
    emb = _layers.embedding(input, size, is_sparse=is_sparse, padding_idx=padding_idx,
                            param_attr=param_attr, dtype=dtype)
    return _layers.sequence_pool(emb, "sum")


_REFUSED = ("sequence_topk_avg_pooling", "var_conv_2d", "match_matrix_tensor", "tree_conv",
            "fused_elemwise_activation", "multiclass_nms2", "search_pyramid_hash",
            "shuffle_batch", "partial_concat", "partial_sum", "tdm_child", "tdm_sampler",
            "rank_attention", "batch_fc", "sparse_embedding", "correlation", "bilateral_slice",
            "_pull_box_extended_sparse", "basic_gru", "basic_lstm", "BasicGRUUnit",
            "BasicLSTMUnit")


def __getattr__(name):
    if name in _REFUSED:
        raise ConfigError(f"fluid.contrib.layers.{name} is not supported by pyfleet: its "
                          f"layers are those of docs/layers.md plus fused_embedding_seq_pool")
    raise AttributeError(f"module 'pyfleet.fluid.contrib.layers' has no attribute {name!r}")

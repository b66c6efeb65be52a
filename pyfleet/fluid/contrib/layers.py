"""``fluid.contrib.layers``: ``fused_embedding_seq_pool`` (the CTR sum of a
slot's embeddings in one op), ``shuffle_batch`` (word2vec's negatives) and
``sparse_embedding`` (PaddleRec's large-scale table); the other contrib layers of Fluid 1.5-1.7 are
refused by name."""

from pyfleet.fluid import layers as _layers
from pyfleet.fluid import refusals as _refusals
from pyfleet.fluid import unique_name as _unique_name

__all__ = ["ctr_metric_bundle", "fused_embedding_seq_pool", "shuffle_batch",
           "sparse_embedding"]


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


def shuffle_batch(x, seed=None):
    """The rows of ``x`` in a random order (the gradient flows back to each
    row's origin). ``seed`` fixes one order for every run; without it each
    run draws a new one from a generator seeded by the program's
    ``random_seed``."""
    from pyfleet.fluid import framework, unique_name
    framework.check_variable(x, "shuffle_batch x")
    if isinstance(seed, framework.Variable):
        raise ValueError("shuffle_batch: a Variable seed is not supported; pass an int")
    block = framework.default_main_program().global_block()
    out = block.create_var(unique_name.tmp("shuffle_batch"), x.shape, x.dtype)
    attrs = {"startup_seed": int(framework.default_main_program().random_seed or 0)}
    if seed is not None:
        attrs["seed"] = int(seed)
    block.append_op("shuffle_batch", {"X": [x]}, {"Out": [out]}, attrs)
    return out


def sparse_embedding(input, size, padding_idx=None, is_test=False, entry=None,
                     param_attr=None, dtype="float32"):
    """PaddleRec's large-scale embedding: rows in a sparse table keyed by the
    raw id (``fluid.layers.embedding(..., is_distributed=True)``). ``entry``
    (Fluid 2.0's admission rule) is refused unless None: a table's admission
    is configured on the table (``pyfleet.entry``)."""
    if entry is not None:
        raise ValueError("sparse_embedding: entry= is not supported here; configure "
                         "admission on the table (pyfleet.entry)")
    return _layers.embedding(input, size, is_sparse=True, is_distributed=True,
                             padding_idx=padding_idx, param_attr=param_attr, dtype=dtype)


def ctr_metric_bundle(input, label):
    """Fluid's CTR metric accumulators over every run: ``(local_sqrerr,
    local_abserr, local_prob, local_q, local_pos_num, local_ins_num)``, each a
    persistable ``[1]`` float32 sum of, per batch, ``sum((input - label)^2)``,
    ``sum(|input - label|)``, ``sum(input)``, ``sum(sigmoid(input))``,
    ``sum(label)`` and the number of rows."""
    from pyfleet.fluid import layers as L
    if tuple(input.shape) != tuple(label.shape):
        raise ValueError(f"ctr_metric_bundle: input {input.shape} and label {label.shape} "
                         "must have the same shape")
    diff = L.elementwise_sub(input, label)
    batch = [L.reduce_sum(L.square(diff)), L.reduce_sum(L.abs(diff)), L.reduce_sum(input),
             L.reduce_sum(L.sigmoid(input)), L.reduce_sum(label),
             L.reduce_sum(L.fill_constant_batch_size_like(label, [-1, 1], "float32", 1.0))]
    totals = []
    for value in batch:
        total = L.create_global_var([1], 0.0, "float32", persistable=True,
                                    name=_unique_name.generate("ctr_metric_bundle"))
        L.assign(L.elementwise_add(L.cast(value, "float32"), total), total)
        totals.append(total)
    return tuple(totals)


# Every other contrib layer: refused by name when used (pyfleet.fluid.refusals).
_refusals.install(globals(), "paddle.fluid.contrib", shown_as="paddle.fluid.contrib.layers")

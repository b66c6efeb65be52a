"""CTR model zoo built from :mod:`pyfleet.fluid.layers`: LR, DNN, Wide&Deep, DeepFM.

Each function builds its network in the current main program (use
:func:`pyfleet.fluid.program_guard`) and returns a :class:`CTRModel` with the
input variables (feed order: ``dense_input``, ``C1`` .. ``C<num_slots>``,
``label``), ``avg_cost``, ``predict`` (probability of click, ``[B, 1]``),
``auc`` / ``batch_auc`` (Fluid's auc layer) and ``auc_states``.

Inputs: ``dense_input`` float32 ``[B, num_dense]``; each slot ``C<i>`` int64
ids with ``lod_level=1`` (any number of ids per sample, sum-pooled);
``label`` int64 ``[B, 1]``. Every slot shares the sparse table
``sparse_table_name`` (keyed by raw uint64 id, as Fluid's CTR example shares
``SparseFeatFactors``); first-order weights (LR, Wide&Deep, DeepFM) live in
a second table ``sparse_table_name + "_first_order"`` of dim 1.

The reference configuration: embedding dim 16, layers 256-128-64, Adam lr
0.001, batch 512.
"""

import math

from pyfleet.fluid import layers as L
from pyfleet.fluid.param_attr import ParamAttr
from pyfleet.initializer import Constant, Normal, TruncatedNormal

__all__ = ["DNN", "LR", "MODELS", "CTRModel", "DeepFM", "WideDeep", "build"]


class CTRModel:
    """What a model function returns.

    Attributes: ``inputs`` (list of data Variables in feed order),
    ``dense_input``, ``slots``, ``label``, ``avg_cost``, ``predict``,
    ``predict_2d`` (``[B, 2]`` as the auc layer takes), ``auc``,
    ``batch_auc``, ``auc_states``.
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    @property
    def feed_names(self):
        return [v.name for v in self.inputs]

    def __iter__(self):
        # Fluid scripts unpack ``avg_cost, auc, batch_auc = model()``.
        return iter((self.avg_cost, self.auc, self.batch_auc))


def _inputs(num_dense, num_slots, dtype):
    dense = L.data("dense_input", [num_dense], dtype=dtype)
    slots = [L.data(f"C{i}", [1], dtype="int64", lod_level=1) for i in range(1, num_slots + 1)]
    label = L.data("label", [1], dtype="int64")
    return dense, slots, label


# The declared vocabulary of Fluid's CTR example; a sparse table is keyed by
# raw ids, so it only documents the expected id range.
SPARSE_FEATURE_DIM = 1000001


def _pooled(slots, table, dim, dtype, initializer=None):
    attr = ParamAttr(name=table, initializer=initializer)
    return [L.sequence_pool(L.embedding(s, [SPARSE_FEATURE_DIM, dim], is_distributed=True,
                                        param_attr=attr, dtype=dtype), "sum")
            for s in slots]


# The deep part's initialisation (the model zoo's choice; a Fluid script's
# fc keeps Fluid's Xavier default): hidden layers Normal(0, 1/sqrt(fan_in)), as
# PaddleRec's CTR DNN, and the output layer at zero, so every model's first
# prediction is 0.5 (a logloss of ln 2), as logistic regression starts. With
# Xavier the output layer on the dense log counts (values up to ~10, never
# centred) gave first logits of several units on narrow networks: one seed in
# four of a DNN with layers 8, dim 4 trained 5,400 rows at a logloss of 1.9,
# against 0.56 for the click rate alone. On the default network the choice
# is neutral (test AUC within 0.0007 either way over three seeds, 100k rows).


def _hidden_attr(x):
    fan_in = int(math.prod(int(d) for d in x.shape[1:]))
    return ParamAttr(initializer=Normal(0.0, 1.0 / math.sqrt(fan_in)))


def _deep(x, layers):
    for size in layers:
        x = L.fc(x, int(size), act="relu", param_attr=_hidden_attr(x))
    return x


def _output(x, size, **kw):
    """The logit layer of a deep part: zero weights (see above)."""
    return L.fc(x, size, param_attr=ParamAttr(initializer=Constant(0.0)), **kw)


def _finish_sigmoid(logit, label, inputs, dense, slots, num_thresholds):
    """Loss, probability and auc from a ``[B, 1]`` logit."""
    flabel = L.cast(label, logit.dtype.name)
    avg_cost = L.mean(L.sigmoid_cross_entropy_with_logits(logit, flabel))
    predict = L.sigmoid(logit)
    predict_2d = L.concat([L.scale(predict, scale=-1.0, bias=1.0), predict], axis=1)
    auc, batch_auc, states = L.auc(predict_2d, label, num_thresholds=num_thresholds)
    return CTRModel(inputs=inputs, dense_input=dense, slots=slots, label=label, logit=logit,
                    avg_cost=avg_cost, predict=predict, predict_2d=predict_2d, auc=auc,
                    batch_auc=batch_auc, auc_states=states)


def _wide_logit(dense, slots, table, dtype):
    """``w . dense + b + sum over slots of each id's dim-1 weight``."""
    first = _pooled(slots, table + "_first_order", 1, dtype)
    sparse_part = L.reduce_sum(L.concat(first, axis=1), dim=1, keep_dim=True)
    # Zeros, as logistic regression starts: Xavier weights on raw log counts
    # (values up to ~10) give logits of +-5 that Adam at 0.001 takes a pass
    # to undo.
    linear = L.fc(dense, 1, param_attr=ParamAttr(initializer=Constant(0.0)))
    return L.elementwise_add(linear, sparse_part)


def LR(num_dense=13, num_slots=26, embedding_dim=16, layers=(256, 128, 64),
       sparse_table_name="SparseFeatFactors", dtype="float32", num_thresholds=2 ** 12 - 1):
    """Logistic regression: a weight per id (dim-1 table) plus a linear dense part."""
    dense, slots, label = _inputs(num_dense, num_slots, dtype)
    logit = _wide_logit(dense, slots, sparse_table_name, dtype)
    return _finish_sigmoid(logit, label, [dense] + slots + [label], dense, slots,
                           num_thresholds)


def DNN(num_dense=13, num_slots=26, embedding_dim=16, layers=(256, 128, 64),
        sparse_table_name="SparseFeatFactors", dtype="float32", num_thresholds=2 ** 12 - 1,
        output="softmax"):
    """Fluid's CTR DNN: sum-pooled slot embeddings concatenated with the dense
    features, relu layers, then ``fc(2, softmax)`` + ``cross_entropy``
    (``output="softmax"``, as Fluid's example) or ``fc(1)`` + sigmoid
    cross-entropy (``output="sigmoid"``)."""
    dense, slots, label = _inputs(num_dense, num_slots, dtype)
    embs = _pooled(slots, sparse_table_name, embedding_dim, dtype)
    x = _deep(L.concat(embs + [dense], axis=1), layers)
    inputs = [dense] + slots + [label]
    if output == "sigmoid":
        return _finish_sigmoid(_output(x, 1), label, inputs, dense, slots, num_thresholds)
    if output != "softmax":
        raise ValueError(f"output must be 'softmax' or 'sigmoid', got {output!r}")
    predict_2d = _output(x, 2, act="softmax")
    avg_cost = L.mean(L.cross_entropy(predict_2d, label))
    predict = L.slice(predict_2d, axes=[1], starts=[1], ends=[2])
    auc, batch_auc, states = L.auc(predict_2d, label, num_thresholds=num_thresholds)
    return CTRModel(inputs=inputs, dense_input=dense, slots=slots, label=label,
                    avg_cost=avg_cost, predict=predict, predict_2d=predict_2d, auc=auc,
                    batch_auc=batch_auc, auc_states=states)


def WideDeep(num_dense=13, num_slots=26, embedding_dim=16, layers=(256, 128, 64),
             sparse_table_name="SparseFeatFactors", dtype="float32",
             num_thresholds=2 ** 12 - 1):
    """Wide & Deep: the LR logit plus the DNN's ``fc(1)`` logit, sigmoid loss."""
    dense, slots, label = _inputs(num_dense, num_slots, dtype)
    wide = _wide_logit(dense, slots, sparse_table_name, dtype)
    embs = _pooled(slots, sparse_table_name, embedding_dim, dtype)
    deep = _output(_deep(L.concat(embs + [dense], axis=1), layers), 1, bias_attr=False)
    return _finish_sigmoid(L.elementwise_add(wide, deep), label, [dense] + slots + [label],
                           dense, slots, num_thresholds)


def DeepFM(num_dense=13, num_slots=26, embedding_dim=16, layers=(256, 128, 64),
           sparse_table_name="SparseFeatFactors", dtype="float32",
           num_thresholds=2 ** 12 - 1):
    """DeepFM: first-order terms + FM pairwise interactions + a DNN, one logit.

    The FM fields are the pooled slot embeddings ``v_i`` and, for the dense
    features, ``x_j * V_j`` with a dense ``[num_dense, dim]`` parameter ``V``;
    the pairwise term is ``0.5 * sum_k((sum_i e_ik)^2 - sum_i e_ik^2)``.
    """
    dense, slots, label = _inputs(num_dense, num_slots, dtype)
    first = _wide_logit(dense, slots, sparse_table_name, dtype)
    embs = _pooled(slots, sparse_table_name, embedding_dim, dtype)
    emb_cat = L.concat(embs, axis=1)                                   # [B, S*dim]
    fields = L.reshape(emb_cat, [-1, num_slots, embedding_dim])        # [B, S, dim]
    # Small factors, as PaddleRec's DeepFM (std 0.1 / sqrt(dim)): the FM term
    # sums products of pairs of them, and the dense inputs are log counts up to
    # ~10. With create_parameter's Xavier default (+-0.45 here) the dense pairs
    # alone gave logits of several units at the start (a first logloss of 3.6),
    # and the model spent its pass undoing them (test AUC below LR's).
    v_dense = L.create_parameter([num_dense, embedding_dim], dtype,
                                 name=sparse_table_name + "_dense_factors",
                                 default_initializer=TruncatedNormal(
                                     0.0, 0.1 / math.sqrt(embedding_dim)))
    sum_v = L.elementwise_add(L.reduce_sum(fields, dim=1), L.matmul(dense, v_dense))
    sum_sq = L.elementwise_add(L.reduce_sum(L.square(fields), dim=1),
                               L.matmul(L.square(dense), L.square(v_dense)))
    fm = L.scale(L.reduce_sum(L.elementwise_sub(L.square(sum_v), sum_sq), dim=1,
                              keep_dim=True), scale=0.5)
    deep = _output(_deep(L.concat([emb_cat, dense], axis=1), layers), 1, bias_attr=False)
    logit = L.sums([first, fm, deep])
    return _finish_sigmoid(logit, label, [dense] + slots + [label], dense, slots,
                           num_thresholds)


MODELS = {"lr": LR, "dnn": DNN, "wide_deep": WideDeep, "widedeep": WideDeep,
          "deepfm": DeepFM}


def build(name, **kwargs):
    """The model called ``name`` (lr, dnn, wide_deep, deepfm) built with ``kwargs``."""
    try:
        fn = MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of "
                         f"{sorted(set(MODELS) - {'widedeep'})}") from None
    return fn(**kwargs)

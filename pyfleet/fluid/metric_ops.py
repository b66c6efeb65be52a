"""Fluid's ``precision_recall`` operator (what PaddleRec's ``PrecisionRecall``
metric appends through ``LayerHelper``), registered by :mod:`pyfleet.fluid.ops`.

Inputs ``MaxProbs`` (unused but for its shape), ``Indices`` (the predicted
class, ``[N, 1]``), ``Labels`` (``[N, 1]``), optional ``Weights`` (``[N, 1]``,
default 1) and ``StatesInfo`` (``[C, 4]``: each class's accumulated TP, FP, TN,
FN). Outputs ``AccumStatesInfo`` (``StatesInfo`` plus this batch's counts),
``BatchMetrics`` and ``AccumMetrics`` (``[6]``: macro precision, recall, F1,
then micro precision, recall, F1, of the batch and of the accumulated counts).
As Fluid: a sample predicted right adds its weight to TP of its class; a wrong
one to FN of its label and FP of the predicted class; every class the sample
is neither predicted nor labelled gets TN. A precision or recall with nothing
counted is 1, an F1 of two zeros 0.
"""

import numpy as np

__all__ = ["BACKWARD", "FORWARD", "NO_GRAD", "batch_states", "metrics"]

FORWARD = {}
BACKWARD = {}
NO_GRAD = {"precision_recall"}
TP, FP, TN, FN = range(4)


def batch_states(indices, labels, weights, num_classes):
    """``[C, 4]`` TP/FP/TN/FN counts of one batch."""
    idx = np.asarray(indices).reshape(-1).astype(np.int64)
    lab = np.asarray(labels).reshape(-1).astype(np.int64)
    w = np.ones(idx.shape, np.float64) if weights is None else \
        np.asarray(weights, np.float64).reshape(-1)
    for what, v in (("Indices", idx), ("Labels", lab)):
        if v.size and (v.min() < 0 or v.max() >= num_classes):
            raise ValueError(f"precision_recall: {what} holds a class outside "
                             f"[0, {num_classes})")
    states = np.zeros((num_classes, 4), np.float64)
    right = idx == lab
    np.add.at(states[:, TP], idx[right], w[right])
    np.add.at(states[:, FN], lab[~right], w[~right])
    np.add.at(states[:, FP], idx[~right], w[~right])
    states[:, TN] = w.sum()
    np.subtract.at(states[:, TN], idx, w)
    np.subtract.at(states[:, TN], lab[~right], w[~right])
    return states


def _ratio(a, b):
    return np.where((a > 0) | (b > 0), a / np.maximum(a + b, 1e-300), 1.0)


def _f1(p, r):
    return 2 * p * r / (p + r) if (p > 0 or r > 0) else 0.0


def metrics(states):
    """The 6 metrics of ``[C, 4]`` counts (see the module doc)."""
    tp, fp, fn = states[:, TP], states[:, FP], states[:, FN]
    macro_p, macro_r = float(_ratio(tp, fp).mean()), float(_ratio(tp, fn).mean())
    micro_p = float(_ratio(tp.sum(), fp.sum()))
    micro_r = float(_ratio(tp.sum(), fn.sum()))
    return np.array([macro_p, macro_r, _f1(macro_p, macro_r), micro_p, micro_r,
                     _f1(micro_p, micro_r)], np.float32)


def _precision_recall_fwd(op, s):
    num_classes = int(op.attrs["class_number"])
    weights = op.input("Weights")
    batch = batch_states(s.data(op.input("Indices")[0]), s.data(op.input("Labels")[0]),
                         s.data(weights[0]) if weights else None, num_classes)
    prior = op.input("StatesInfo")
    accum = batch + (np.asarray(s.data(prior[0]), np.float64) if prior else 0.0)
    s.set(op.output("BatchMetrics")[0], metrics(batch))
    s.set(op.output("AccumMetrics")[0], metrics(accum))
    s.set(op.output("AccumStatesInfo")[0], accum.astype(np.float32))


FORWARD["precision_recall"] = _precision_recall_fwd

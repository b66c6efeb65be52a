"""Fluid's metric layers (``fluid.layers.accuracy``, ``fluid.layers.auc``; Fluid's
``layers/metric_op.py``), re-exported by :mod:`pyfleet.fluid.layers`."""

import numpy as np

from pyfleet.fluid import framework, unique_name
from pyfleet.fluid.framework import check_variable as _check_var

__all__ = ["accuracy", "auc"]


def _block():
    return framework.default_main_program().global_block()


def _tmp(layer, shape, dtype="float32"):
    return _block().create_var(unique_name.tmp(layer), shape, dtype)


def _op(type, inputs, outputs, attrs=None):
    return _block().append_op(type, inputs, outputs, attrs)


def accuracy(input, label, k=1, correct=None, total=None):
    """Top-``k`` accuracy of a batch; ``correct`` and ``total`` (e.g.
    ``create_tensor('int64')``), when given, receive the int64 counts."""
    _check_var(input, "accuracy input")
    layer = unique_name.layer("accuracy")
    unique_name.tmp("top_k")    # Fluid's accuracy calls its topk layer (named like Fluid's)
    out = _tmp(layer, (1,), "float32")
    outputs = {"Accuracy": [out]}
    for slot, var in (("Correct", correct), ("Total", total)):
        if var is None:
            unique_name.tmp(layer)
            continue
        var.shape = (1,)
        outputs[slot] = [var]
    _op("accuracy", {"Out": [input], "Label": [label]}, outputs, {"k": int(k)})
    return out


def auc(input, label, curve="ROC", num_thresholds=2 ** 12 - 1, topk=1, slide_steps=1):
    """Fluid's auc layer: ``(auc_out, batch_auc_out, state_vars)``.

    ``input`` is ``[B, 2]`` probabilities (column 1 = click), ``label`` int
    ``[B, 1]``. The global AUC accumulates bucket counts over every step the
    op runs; the batch AUC covers the last ``slide_steps`` batches. The four
    state variables ``[batch_stat_pos, batch_stat_neg, stat_pos, stat_neg]``
    live in the executor's scope (reset them with
    ``global_scope().find_var(v.name).get_tensor().set(zeros, place)``).
    """
    _check_var(input, "auc input")
    _check_var(label, "auc label")
    if curve != "ROC":
        raise ValueError(f"auc: only curve='ROC' is supported, got {curve!r}")
    num_thresholds = int(num_thresholds)
    slide_steps = int(slide_steps)
    if num_thresholds < 1 or slide_steps < 0:
        raise ValueError(f"auc: num_thresholds must be >= 1 and slide_steps >= 0, got "
                         f"{num_thresholds} and {slide_steps}")
    layer = unique_name.layer("auc")
    block = _block()
    startup = framework.default_startup_program()
    bucket = num_thresholds + 1

    def state(shape):
        v = block.create_var(unique_name.generate("_generated_var"), shape, "int64",
                             persistable=True, stop_gradient=True)
        startup._init_states.append((v.name, np.zeros(shape, dtype=np.int64)))
        return v

    window = max(slide_steps, 1)
    batch_pos = state(((window + 1) * bucket + 1,))
    batch_neg = state(((window + 1) * bucket + 1,))
    stat_pos = state((1, bucket))
    stat_neg = state((1, bucket))
    auc_out = _tmp(layer, (1,), "float64")
    batch_auc_out = _tmp(layer, (1,), "float64")
    _op("auc", {"Predict": [input], "Label": [label], "StatPos": [batch_pos],
                "StatNeg": [batch_neg]},
        {"AUC": [batch_auc_out], "StatPosOut": [batch_pos], "StatNegOut": [batch_neg]},
        {"curve": curve, "num_thresholds": num_thresholds, "slide_steps": window})
    _op("auc", {"Predict": [input], "Label": [label], "StatPos": [stat_pos],
                "StatNeg": [stat_neg]},
        {"AUC": [auc_out], "StatPosOut": [stat_pos], "StatNegOut": [stat_neg]},
        {"curve": curve, "num_thresholds": num_thresholds, "slide_steps": 0})
    return auc_out, batch_auc_out, [batch_pos, batch_neg, stat_pos, stat_neg]

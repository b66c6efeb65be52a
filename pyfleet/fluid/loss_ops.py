"""Kernels of the losses and metrics ops: sigmoid cross-entropy,
cross-entropy, log loss, accuracy and auc (see :mod:`pyfleet.fluid.ops` for
the kernel interface; :mod:`pyfleet.fluid.ops` registers these).
"""

import numpy as np

from pyfleet import metrics

__all__ = ["BACKWARD", "FORWARD", "sigmoid"]

FORWARD = {}
BACKWARD = {}


def _register(name, fwd, bwd=None):
    FORWARD[name] = fwd
    if bwd is not None:
        BACKWARD[name] = bwd


def sigmoid(x):
    """The logistic function of an array, computed without overflow."""
    # Split by sign so exp never overflows.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out



def _label_like(label, x, name):
    if label.shape != x.shape:
        if label.size != x.size:
            raise ValueError(f"{name}: label shape {label.shape} does not match input "
                             f"shape {x.shape}")
        label = label.reshape(x.shape)
    return label.astype(x.dtype, copy=False)


def _sce_fwd(op, s):
    x = s.data(op.input("X")[0])
    raw = s.data(op.input("Label")[0])
    label = _label_like(raw, x, op.type)
    # max(x, 0) - x*z + log(1 + exp(-|x|)): stable for any x.
    loss = np.maximum(x, 0) - x * label + np.log1p(np.exp(-np.abs(x)))
    ignore = op.attrs.get("ignore_index", -100)
    mask = label != ignore
    loss = np.where(mask, loss, 0).astype(x.dtype, copy=False)
    if op.attrs.get("normalize"):
        loss = loss / x.dtype.type(max(int(mask.sum()), 1))
    s.set(op.output("Out")[0], loss)


def _sce_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Out")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    label = _label_like(s.data(op.input("Label")[0]), x, op.type)
    mask = label != op.attrs.get("ignore_index", -100)
    dx = np.where(mask, (sigmoid(x) - label) * g, 0).astype(x.dtype, copy=False)
    if op.attrs.get("normalize"):
        dx = dx / x.dtype.type(max(int(mask.sum()), 1))
    s.add_grad(xv, dx)


_register("sigmoid_cross_entropy_with_logits", _sce_fwd, _sce_bwd)


def _ce_label_index(op, x, label):
    lab = label.reshape(-1).astype(np.int64)
    if lab.shape[0] != x.shape[0]:
        raise ValueError(f"cross_entropy: {lab.shape[0]} labels for {x.shape[0]} rows")
    ignore = op.attrs.get("ignore_index", -100)
    mask = lab != ignore
    bad = mask & ((lab < 0) | (lab >= x.shape[1]))
    if bad.any():
        raise ValueError(f"cross_entropy: label {lab[bad][0]} out of range [0, {x.shape[1]})")
    return np.where(mask, lab, 0), mask


def _ce_fwd(op, s):
    x = s.data(op.input("X")[0])
    label = s.data(op.input("Label")[0])
    tiny = np.finfo(x.dtype).tiny
    if op.attrs.get("soft_label"):
        loss = -(label * np.log(np.maximum(x, tiny))).sum(axis=-1, keepdims=True)
    else:
        lab, mask = _ce_label_index(op, x, label)
        p = x[np.arange(x.shape[0]), lab]
        loss = np.where(mask, -np.log(np.maximum(p, tiny)), 0).reshape(-1, 1)
    s.set(op.output("Y")[0], loss.astype(x.dtype, copy=False))


def _ce_bwd(op, s):
    xv = op.input("X")[0]
    g = s.grad(op.output("Y")[0])
    if g is None or not s.needs_grad(xv):
        return
    x = s.data(xv)
    label = s.data(op.input("Label")[0])
    tiny = np.finfo(x.dtype).tiny
    if op.attrs.get("soft_label"):
        dx = -g.reshape(-1, 1) * label / np.maximum(x, tiny)
    else:
        lab, mask = _ce_label_index(op, x, label)
        rows = np.arange(x.shape[0])
        dx = np.zeros_like(x)
        p = np.maximum(x[rows, lab], tiny)
        dx[rows, lab] = np.where(mask, -g.reshape(-1) / p, 0)
    s.add_grad(xv, dx.astype(x.dtype, copy=False))


_register("cross_entropy", _ce_fwd, _ce_bwd)


def _log_loss_fwd(op, s):
    p = s.data(op.input("Predicted")[0])
    y = _label_like(s.data(op.input("Labels")[0]), p, "log_loss")
    eps = p.dtype.type(op.attrs.get("epsilon", 1e-4))
    s.set(op.output("Loss")[0], -y * np.log(p + eps) - (1 - y) * np.log(1 - p + eps))


def _log_loss_bwd(op, s):
    pv = op.input("Predicted")[0]
    g = s.grad(op.output("Loss")[0])
    if g is None or not s.needs_grad(pv):
        return
    p = s.data(pv)
    y = _label_like(s.data(op.input("Labels")[0]), p, "log_loss")
    eps = p.dtype.type(op.attrs.get("epsilon", 1e-4))
    s.add_grad(pv, g * (-y / (p + eps) + (1 - y) / (1 - p + eps)))


_register("log_loss", _log_loss_fwd, _log_loss_bwd)


def _accuracy_fwd(op, s):
    x = s.data(op.input("Out")[0])
    label = s.data(op.input("Label")[0]).reshape(-1)
    k = op.attrs.get("k", 1)
    topk = np.argsort(-x, axis=1, kind="stable")[:, :k]
    correct = (topk == label[:, None]).any(axis=1)
    s.set(op.output("Accuracy")[0], np.array([correct.mean() if len(correct) else 0.0],
                                             dtype=np.float32))
    for slot, count in (("Correct", int(correct.sum())), ("Total", len(correct))):
        if op.output(slot):
            s.set(op.output(slot)[0], np.array([count], dtype=np.int64))


_register("accuracy", _accuracy_fwd)


def _auc_fwd(op, s):
    """Fluid's auc op: bucket counts in scope state (``s.scope``), AUC of the
    (window) sums. Stateful and without gradient; the batch and the global
    auc op of one layer count the buckets once (``s.cache``)."""
    pred = s.data(op.input("Predict")[0])
    label = s.data(op.input("Label")[0]).reshape(-1)
    if pred.ndim != 2 or pred.shape[0] != label.shape[0]:
        raise ValueError(f"auc: input must be [batch, 2] probabilities with one label per "
                         f"row, got input {pred.shape} and {label.shape[0]} labels")
    t = op.attrs["num_thresholds"]
    steps = op.attrs["slide_steps"]
    # The batch and the global auc ops of one layer see the same input.
    key = ("auc", op.input("Predict")[0].name, op.input("Label")[0].name, t)
    counts = s.cache.get(key)
    if counts is None:
        counts = s.cache[key] = metrics.count_buckets(pred[:, -1], label, t)
    pos, neg = counts
    pos_name, neg_name = op.output("StatPosOut")[0].name, op.output("StatNegOut")[0].name
    bucket = t + 1
    size = bucket if steps == 0 else (steps + 1) * bucket + 1
    sp = s.scope.vars.get(pos_name)
    sn = s.scope.vars.get(neg_name)
    if sp is None or sp.size != size:
        sp = np.zeros(size, dtype=np.int64)
    if sn is None or sn.size != size:
        sn = np.zeros(size, dtype=np.int64)
    shape_p, shape_n = sp.shape, sn.shape
    sp, sn = sp.reshape(-1).copy(), sn.reshape(-1).copy()
    if steps == 0:
        sp[:bucket] += pos
        sn[:bucket] += neg
        tot_p, tot_n = sp[:bucket], sn[:bucket]
    else:
        # Ring of `steps` batches, then their running sum, then the step counter.
        cur = int(sp[-1]) % steps
        cb, sb = cur * bucket, steps * bucket
        sp[sb:sb + bucket] += pos - sp[cb:cb + bucket]
        sn[sb:sb + bucket] += neg - sn[cb:cb + bucket]
        sp[cb:cb + bucket], sn[cb:cb + bucket] = pos, neg
        sp[-1] += 1
        sn[-1] += 1
        tot_p, tot_n = sp[sb:sb + bucket], sn[sb:sb + bucket]
    s.scope.vars[pos_name] = sp.reshape(shape_p)
    s.scope.vars[neg_name] = sn.reshape(shape_n)
    out = op.output("AUC")[0]
    if out.name in s.plan.used:   # else only the state had to move
        s.set(out, np.array([metrics.bucketed_auc(tot_p, tot_n)], dtype=np.float64))


_register("auc", _auc_fwd)

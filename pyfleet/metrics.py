"""CTR metrics: exact and bucketed AUC, logloss, and their aggregation across workers.

- :func:`exact_auc` is the Mann-Whitney statistic: the probability that a
  random positive scores above a random negative, ties counting one half.
- :func:`bucket_counts` / :func:`bucketed_auc` reproduce Fluid's ``auc`` op:
  a prediction ``p`` falls in bucket ``int(float32(p) * num_thresholds)``
  (``num_thresholds + 1`` buckets); the area is summed by the trapezoid rule
  from the highest bucket down, then divided by ``positives * negatives``
  (0.0 when either is zero, as Fluid).
- :class:`MetricStats` holds additive statistics (bucket counts, logloss
  sum, counts), so workers' statistics can be summed (as arrays or JSON) and
  the global AUC and logloss computed from all of them, not from one worker.

All functions are pure; :class:`MetricStats` is not thread-safe.
"""

import json

import numpy as np

__all__ = [
    "DEFAULT_NUM_THRESHOLDS",
    "MetricStats",
    "SlidingAuc",
    "bucket_counts",
    "bucket_index",
    "bucketed_auc",
    "calibration",
    "count_buckets",
    "exact_auc",
    "logloss",
    "normalized_entropy",
]

DEFAULT_NUM_THRESHOLDS = 2 ** 12 - 1


def _as_1d(x, what):
    a = np.asarray(x)
    if a.ndim == 2 and a.shape[1] in (1, 2):
        a = a[:, -1]     # [B, 2] class probabilities: column 1 is the click
    elif a.ndim != 1:
        a = a.reshape(-1)
    return a


def _check_pair(pred, label):
    p = _as_1d(pred, "pred").astype(np.float64, copy=False)
    y = _as_1d(label, "label")
    if p.shape[0] != y.shape[0]:
        raise ValueError(f"pred has {p.shape[0]} entries but label has {y.shape[0]}")
    return p, y


def exact_auc(pred, label):
    """Exact ROC AUC with ties counted as one half (the Mann-Whitney U / (P*N)).

    ``pred``: scores ``[n]`` (or ``[n, 2]`` class probabilities, column 1 used);
    ``label``: 0/1 ``[n]`` (or ``[n, 1]``). NaN when all labels are equal.
    O(n log n).
    """
    p, y = _check_pair(pred, label)
    pos = y.astype(bool)
    n_pos = int(pos.sum())
    n_neg = p.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sp = p[order]
    # Average rank (1-based) of each run of tied scores.
    boundary = np.concatenate([[True], sp[1:] != sp[:-1], [True]])
    edges = np.flatnonzero(boundary)
    run_avg = (edges[:-1] + edges[1:] + 1) / 2.0
    ranks = np.empty(p.shape[0], dtype=np.float64)
    ranks[order] = np.repeat(run_avg, np.diff(edges))
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def bucket_index(pred, num_thresholds=DEFAULT_NUM_THRESHOLDS):
    """Fluid's bucket of each probability: ``int(float32(p) * num_thresholds)``.

    Raises ValueError for a probability outside ``[0, 1]`` (as Fluid's op)."""
    p = np.asarray(_as_1d(pred, "pred"), dtype=np.float32)
    if p.size and not (np.all(p >= 0) and np.all(p <= 1)):
        bad = p[~((p >= 0) & (p <= 1))][0]
        raise ValueError(f"predictions must be probabilities in [0, 1], got {bad}")
    return (p * np.float32(num_thresholds)).astype(np.int64)


def bucket_counts(pred, label, num_thresholds=DEFAULT_NUM_THRESHOLDS):
    """``(pos, neg)``: int64 ``[num_thresholds + 1]`` counts of positives and
    negatives per bucket (a label is positive when non-zero)."""
    _, y = _check_pair(pred, label)
    return count_buckets(_as_1d(pred, "pred"), y, num_thresholds)


def count_buckets(pred, label, num_thresholds):
    """:func:`bucket_counts` of 1-D ``pred`` and ``label`` of one length, without
    the shape handling: the kernel (one ``bincount``) that the Fluid auc op
    runs every step. Raises ValueError for a probability outside ``[0, 1]``."""
    p = np.asarray(pred, dtype=np.float32)
    if p.size and not (p.min() >= 0 and p.max() <= 1):
        bucket_index(p, num_thresholds)   # raises, naming the bad value
    idx = (p * np.float32(num_thresholds)).astype(np.int64)
    idx *= 2
    idx += label != 0
    both = np.bincount(idx, minlength=2 * (num_thresholds + 1))
    return both[1::2].copy(), both[0::2].copy()


def bucketed_auc(pos, neg):
    """The AUC from bucket counts, computed as Fluid's auc op does."""
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)
    neg = np.asarray(neg, dtype=np.float64).reshape(-1)
    if pos.shape != neg.shape:
        raise ValueError(f"pos and neg counts differ in length: {pos.shape} vs {neg.shape}")
    tot_pos = np.cumsum(pos[::-1])
    tot_neg = np.cumsum(neg[::-1])
    prev_pos = np.concatenate([[0.0], tot_pos[:-1]])
    area = float(np.sum(neg[::-1] * (tot_pos + prev_pos) / 2.0))
    if tot_pos.size and tot_pos[-1] > 0 and tot_neg[-1] > 0:
        area = area / tot_pos[-1] / tot_neg[-1]
    return area


def logloss(pred, label, eps=1e-15):
    """Mean binary cross-entropy of probabilities ``pred`` (clipped to ``[eps, 1-eps]``)."""
    p, y = _check_pair(pred, label)
    if p.shape[0] == 0:
        return float("nan")
    return float(_logloss_sum(p, y, eps) / p.shape[0])


def _entropy(ctr):
    """The logloss of predicting the constant ``ctr`` for labels whose mean it is."""
    if not 0.0 < ctr < 1.0:
        return float("nan")
    return float(-(ctr * np.log(ctr) + (1 - ctr) * np.log1p(-ctr)))


def calibration(pred, label):
    """Predicted CTR over actual CTR, ``sum(pred) / sum(label)`` (TorchRec's
    calibration; 1 is calibrated, above 1 over-predicts); nan without a click."""
    p, y = _check_pair(pred, label)
    clicks = float(y.sum())
    return float(p.astype(np.float64).sum() / clicks) if clicks else float("nan")


def normalized_entropy(pred, label, eps=1e-15):
    """Logloss over the entropy of the labels' CTR (TorchRec's NE): below 1 the
    model beats predicting the average CTR for everyone; nan when every label is
    the same."""
    p, y = _check_pair(pred, label)
    if p.shape[0] == 0:
        return float("nan")
    return float(_logloss_sum(p, y, eps) / p.shape[0] / _entropy(float(y.mean())))


def _logloss_sum(p, y, eps):
    p = np.clip(p, eps, 1 - eps)
    y = y.astype(np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).sum())


class SlidingAuc:
    """Fluid's batch AUC: bucketed AUC over the last ``slide_steps`` batches."""

    def __init__(self, num_thresholds=DEFAULT_NUM_THRESHOLDS, slide_steps=1):
        if slide_steps < 1:
            raise ValueError(f"slide_steps must be >= 1, got {slide_steps}")
        self.num_thresholds = int(num_thresholds)
        self.slide_steps = int(slide_steps)
        self._pos = np.zeros((slide_steps, num_thresholds + 1), dtype=np.int64)
        self._neg = np.zeros_like(self._pos)
        self._step = 0

    def update(self, pred, label):
        """Add one batch; returns the AUC over the window that ends with it."""
        pos, neg = bucket_counts(pred, label, self.num_thresholds)
        i = self._step % self.slide_steps
        self._pos[i], self._neg[i] = pos, neg
        self._step += 1
        return bucketed_auc(self._pos.sum(axis=0), self._neg.sum(axis=0))


class MetricStats:
    """Additive statistics of predictions: bucket counts, logloss sum, counts.

    ``stats.update(pred, label)`` per batch; ``a + b`` (or :meth:`merge`,
    :meth:`sum`) combines workers; :meth:`to_array` / :meth:`from_array` and
    :meth:`to_json` / :meth:`from_json` are the exchange forms (float64 holds
    every count exactly up to 2**53).
    """

    _SCALARS = ("logloss_sum", "count", "label_sum", "pred_sum")

    def __init__(self, num_thresholds=DEFAULT_NUM_THRESHOLDS, eps=1e-15):
        self.num_thresholds = int(num_thresholds)
        if self.num_thresholds < 1:
            raise ValueError(f"num_thresholds must be >= 1, got {num_thresholds}")
        self.eps = float(eps)
        self.pos = np.zeros(self.num_thresholds + 1, dtype=np.int64)
        self.neg = np.zeros(self.num_thresholds + 1, dtype=np.int64)
        self.logloss_sum = 0.0
        self.count = 0
        self.label_sum = 0.0
        self.pred_sum = 0.0

    def update(self, pred, label):
        p, y = _check_pair(pred, label)
        pos, neg = bucket_counts(p, y, self.num_thresholds)
        self.pos += pos
        self.neg += neg
        self.logloss_sum += _logloss_sum(p, y, self.eps)
        self.count += int(p.shape[0])
        self.label_sum += float((y != 0).sum())
        self.pred_sum += float(p.sum())
        return self

    @classmethod
    def from_buckets(cls, pos, neg):
        """Stats holding only bucket counts (e.g. the auc layer's state)."""
        pos = np.asarray(pos, dtype=np.int64).reshape(-1)
        neg = np.asarray(neg, dtype=np.int64).reshape(-1)
        s = cls(pos.shape[0] - 1)
        s.pos[:], s.neg[:] = pos, neg
        s.count = int(pos.sum() + neg.sum())
        s.label_sum = float(pos.sum())
        s.logloss_sum = float("nan")
        s.pred_sum = float("nan")
        return s

    def merge(self, other):
        """Add ``other``'s statistics into this one (in place)."""
        if other.num_thresholds != self.num_thresholds:
            raise ValueError(f"cannot merge stats with {other.num_thresholds} thresholds "
                             f"into stats with {self.num_thresholds}")
        self.pos += other.pos
        self.neg += other.neg
        for k in self._SCALARS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        return self

    def __add__(self, other):
        return self.copy().merge(other)

    def copy(self):
        return MetricStats.from_array(self.to_array())

    @classmethod
    def sum(cls, stats):
        """The merge of a sequence of stats (or arrays from :meth:`to_array`)."""
        stats = [s if isinstance(s, MetricStats) else cls.from_array(s) for s in stats]
        if not stats:
            raise ValueError("MetricStats.sum needs at least one stats object")
        out = stats[0].copy()
        for s in stats[1:]:
            out.merge(s)
        return out

    def to_array(self):
        """float64 ``[num_thresholds, pos..., neg..., logloss_sum, count,
        label_sum, pred_sum]``: element-wise summable across workers except
        the first entry (use :meth:`sum_arrays`)."""
        return np.concatenate([[self.num_thresholds], self.pos, self.neg,
                               [getattr(self, k) for k in self._SCALARS]]).astype(np.float64)

    @staticmethod
    def sum_arrays(arrays):
        """Element-wise sum of :meth:`to_array` outputs (keeping the header)."""
        arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
        out = np.sum(arrays, axis=0)
        out[0] = arrays[0][0]
        return out

    @classmethod
    def from_array(cls, array):
        a = np.asarray(array, dtype=np.float64).reshape(-1)
        if a.size < 1:
            raise ValueError("metric stats array is empty")
        t = int(a[0])
        if t < 1 or a.size != 2 * (t + 1) + 1 + len(cls._SCALARS):
            raise ValueError(f"metric stats array of {a.size} entries does not match "
                             f"num_thresholds={a[0]}")
        s = cls(t)
        s.pos[:] = a[1:t + 2].astype(np.int64)
        s.neg[:] = a[t + 2:2 * t + 3].astype(np.int64)
        for k, v in zip(cls._SCALARS, a[2 * t + 3:]):
            setattr(s, k, float(v))
        s.count = int(s.count)
        return s

    def to_json(self):
        return json.dumps({"num_thresholds": self.num_thresholds, "pos": self.pos.tolist(),
                           "neg": self.neg.tolist(),
                           **{k: getattr(self, k) for k in self._SCALARS}})

    @classmethod
    def from_json(cls, text):
        d = json.loads(text)
        s = cls(d["num_thresholds"])
        s.pos[:] = np.asarray(d["pos"], dtype=np.int64)
        s.neg[:] = np.asarray(d["neg"], dtype=np.int64)
        for k in cls._SCALARS:
            setattr(s, k, d[k])
        s.count = int(s.count)
        return s

    def auc(self):
        """Bucketed AUC (Fluid's rule) over everything merged."""
        return bucketed_auc(self.pos, self.neg)

    def logloss(self):
        return self.logloss_sum / self.count if self.count else float("nan")

    def ctr(self):
        return self.label_sum / self.count if self.count else float("nan")

    def predicted_ctr(self):
        return self.pred_sum / self.count if self.count else float("nan")

    def calibration(self):
        """Predicted over actual CTR (see :func:`calibration`)."""
        return self.pred_sum / self.label_sum if self.label_sum else float("nan")

    def normalized_entropy(self):
        """Logloss over the entropy of the actual CTR (see :func:`normalized_entropy`)."""
        return self.logloss() / _entropy(self.ctr()) if self.count else float("nan")

    def summary(self):
        return {"auc": self.auc(), "logloss": self.logloss(), "count": self.count,
                "ctr": self.ctr(), "predicted_ctr": self.predicted_ctr()}

    def __repr__(self):
        return f"MetricStats(count={self.count}, auc={self.auc():.6f}, logloss={self.logloss():.6f})"

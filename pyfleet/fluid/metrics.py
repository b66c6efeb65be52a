"""``fluid.metrics``: Fluid 1.8's Python metric accumulators, fed numpy values
fetched from the executor (``update``), read with ``eval``, cleared with
``reset``. The arithmetic is Fluid's; counting is vectorized.

- ``Accuracy.update(value, weight)``: the weighted mean of batch accuracies.
- ``Precision`` / ``Recall``: binary, predictions rounded to 0/1.
- ``Auc(name, curve="ROC", num_thresholds=4095)``: ``preds`` ``[N, 2]``
  (column 1 = positive), bucketed by ``int(p * num_thresholds)``; ``eval``
  is the trapezoid area of the ROC from those buckets.
- ``ChunkEvaluator``, ``EditDistance``: counters of the values their layers
  compute (the layers themselves are refused; the accumulators work).
- ``CompositeMetric``: several metrics updated with the same values.

``DetectionMAP`` is refused by name (a detection metric).
"""

import copy

import numpy as np

from pyfleet.fluid import refusals as _refusals

__all__ = ["Accuracy", "Auc", "ChunkEvaluator", "CompositeMetric", "EditDistance",
           "MetricBase", "Precision", "Recall"]


def _array(value, what):
    if not isinstance(value, np.ndarray):
        raise ValueError(f"The {what!r} must be a numpy ndarray, got {type(value).__name__}")
    return value


def _number_or_array(value, what):
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float, np.ndarray,
                                                                 np.generic)):
        raise ValueError(f"The {what!r} must be a number or a numpy ndarray, got "
                         f"{type(value).__name__}")
    return value


class MetricBase:
    """Base class: public attributes are the state (``reset`` zeroes them)."""

    def __init__(self, name):
        self._name = str(name) if name is not None else type(self).__name__

    def __str__(self):
        return self._name

    def _states(self):
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def reset(self):
        for attr, value in self._states().items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.ndarray,
                                                                  np.generic)):
                setattr(self, attr, None)
            elif isinstance(value, int):
                setattr(self, attr, 0)
            elif isinstance(value, float):
                setattr(self, attr, 0.0)
            else:
                setattr(self, attr, np.zeros_like(value))

    def get_config(self):
        return {"name": self._name, "states": copy.deepcopy(self._states())}

    def update(self, preds, labels):
        raise NotImplementedError("MetricBase.update: use a subclass")

    def eval(self):
        raise NotImplementedError("MetricBase.eval: use a subclass")


class CompositeMetric(MetricBase):
    def __init__(self, name=None):
        super().__init__(name)
        self._metrics = []

    def add_metric(self, metric):
        if not isinstance(metric, MetricBase):
            raise ValueError("CompositeMetric.add_metric: the metric must be a MetricBase")
        self._metrics.append(metric)

    def update(self, preds, labels):
        for m in self._metrics:
            m.update(preds, labels)

    def eval(self):
        return [m.eval() for m in self._metrics]


def _binary(preds, labels):
    preds = np.rint(_array(preds, "preds")).astype(np.int32).reshape(-1)
    labels = _array(labels, "labels").reshape(-1)
    if preds.shape != labels.shape:
        raise ValueError(f"preds and labels hold {preds.size} and {labels.size} values")
    return preds, labels


class Precision(MetricBase):
    def __init__(self, name=None):
        super().__init__(name)
        self.tp = 0
        self.fp = 0

    def update(self, preds, labels):
        preds, labels = _binary(preds, labels)
        hit = preds == 1
        self.tp += int(np.count_nonzero(hit & (labels == 1)))
        self.fp += int(np.count_nonzero(hit & (labels != 1)))

    def eval(self):
        ap = self.tp + self.fp
        return float(self.tp) / ap if ap else 0.0


class Recall(MetricBase):
    def __init__(self, name=None):
        super().__init__(name)
        self.tp = 0
        self.fn = 0

    def update(self, preds, labels):
        preds, labels = _binary(preds, labels)
        pos = labels == 1
        self.tp += int(np.count_nonzero(pos & (preds == 1)))
        self.fn += int(np.count_nonzero(pos & (preds != 1)))

    def eval(self):
        total = self.tp + self.fn
        return float(self.tp) / total if total else 0.0


class Accuracy(MetricBase):
    def __init__(self, name=None):
        super().__init__(name)
        self.value = 0.0
        self.weight = 0.0

    def update(self, value, weight):
        _number_or_array(value, "value")
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.generic)):
            raise ValueError("The 'weight' must be a number")
        if weight < 0:
            raise ValueError("The 'weight' can not be negative")
        self.value += value * weight
        self.weight += weight

    def eval(self):
        if self.weight == 0:
            raise ValueError("There is no data in Accuracy: add each batch's "
                             "layers.accuracy output with update(value, weight)")
        return self.value / self.weight


class ChunkEvaluator(MetricBase):
    def __init__(self, name=None):
        super().__init__(name)
        self.num_infer_chunks = 0
        self.num_label_chunks = 0
        self.num_correct_chunks = 0

    def update(self, num_infer_chunks, num_label_chunks, num_correct_chunks):
        self.num_infer_chunks += _number_or_array(num_infer_chunks, "num_infer_chunks")
        self.num_label_chunks += _number_or_array(num_label_chunks, "num_label_chunks")
        self.num_correct_chunks += _number_or_array(num_correct_chunks, "num_correct_chunks")

    def eval(self):
        precision = float(self.num_correct_chunks) / self.num_infer_chunks \
            if self.num_infer_chunks else 0
        recall = float(self.num_correct_chunks) / self.num_label_chunks \
            if self.num_label_chunks else 0
        f1 = float(2 * precision * recall) / (precision + recall) \
            if self.num_correct_chunks else 0
        return precision, recall, f1


class EditDistance(MetricBase):
    def __init__(self, name):
        super().__init__(name)
        self.total_distance = 0.0
        self.seq_num = 0
        self.instance_error = 0

    def update(self, distances, seq_num):
        distances = _array(distances, "distances")
        _number_or_array(seq_num, "seq_num")
        self.seq_num += int(seq_num)
        self.instance_error += int(seq_num) - int(np.count_nonzero(distances == 0))
        self.total_distance += float(np.sum(distances))

    def eval(self):
        if self.seq_num == 0:
            raise ValueError("There is no data in EditDistance: call update first")
        return self.total_distance / self.seq_num, self.instance_error / float(self.seq_num)


class Auc(MetricBase):
    def __init__(self, name, curve="ROC", num_thresholds=4095):
        super().__init__(name)
        if curve != "ROC":
            raise ValueError(f"Auc: only curve='ROC' is supported, got {curve!r}")
        self._curve = curve
        self._num_thresholds = int(num_thresholds)
        self._stat_pos = np.zeros(self._num_thresholds + 1)
        self._stat_neg = np.zeros(self._num_thresholds + 1)

    def reset(self):
        self._stat_pos[:] = 0
        self._stat_neg[:] = 0

    def update(self, preds, labels):
        preds = _array(preds, "preds")
        labels = _array(labels, "labels").reshape(-1)
        if preds.ndim != 2 or preds.shape[1] < 2 or preds.shape[0] != labels.shape[0]:
            raise ValueError(f"Auc.update: preds must be [N, 2] probabilities for N labels, "
                             f"got {preds.shape} and {labels.shape[0]} labels")
        bins = (preds[:, 1] * self._num_thresholds).astype(np.int64)
        if bins.size and (bins.min() < 0 or bins.max() > self._num_thresholds):
            raise ValueError("Auc.update: probabilities must lie in [0, 1]")
        pos = labels.astype(bool)
        self._stat_pos += np.bincount(bins[pos], minlength=self._num_thresholds + 1)
        self._stat_neg += np.bincount(bins[~pos], minlength=self._num_thresholds + 1)

    def eval(self):
        # From the top bucket down: cumulative positives (y) over negatives (x).
        pos = np.concatenate([[0.0], np.cumsum(self._stat_pos[::-1])])
        neg = np.concatenate([[0.0], np.cumsum(self._stat_neg[::-1])])
        tot_pos, tot_neg = pos[-1], neg[-1]
        if tot_pos <= 0 or tot_neg <= 0:
            return 0.0
        area = np.sum(np.abs(np.diff(neg)) * (pos[1:] + pos[:-1]) / 2.0)
        return float(area / tot_pos / tot_neg)


_refusals.install(globals(), "paddle.fluid.metrics")

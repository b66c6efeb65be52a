"""A synthetic Criteo-format data set with a known ground truth.

The generator draws a hidden model once from the seed, then rows from it:

- 13 dense integer columns I1..I13: heavy-tailed counts ``floor(lognormal)``
  (I2 shifted down by 2, so it can be -2 or -1 as in Criteo), each missing
  with its own rate (some columns never).
- 26 categorical columns C1..C26: 8 lowercase hex digits; column j has a
  vocabulary of ``V_j`` distinct values (from about 30 to 100,000) drawn with
  Zipf-like popularity ``p(rank k) ∝ (k + 1) ** -s_j``, and its own missing rate.
- ``logit = bias + Σ_j w_j[value] + Σ_i β_i · log1p(max(I_i, 0))
  + Σ_pairs γ · <U_a[value_a], U_b[value_b]>``: a per-value weight for every
  categorical column (a missing value has its own weight), linear effects of the
  log-scaled counts, and rank-4 factorized interactions between four pairs of
  categorical columns, which a linear model cannot express and an FM or DNN can.
  ``bias`` is set so the mean click probability is ``ctr`` (0.25).
- ``label ~ Bernoulli(sigmoid(logit))``.

The true probabilities give the best AUC and logloss any model can reach on the
test rows, reported by :func:`generate` as ``truth_auc_test`` and
``truth_logloss_test``.

Determinism: the same ``(rows, seed)`` gives identical arrays and byte-identical
files on any machine with the same numpy release (PCG64 streams keyed by the
seed and a 65,536-row block number; numpy may change how its Generator draws
distributions between releases). Rows are drawn with numpy over blocks
of 65,536 and written by one compiled call per block; nothing loops per row
in Python.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import numpy as np

from pyfleet.data import _parse

__all__ = ["N_DENSE", "N_SLOTS", "auc", "cached", "generate", "generate_arrays", "logloss"]

N_DENSE = 13
N_SLOTS = 26
BLOCK_ROWS = 1 << 16
_DIGITS = 9  # dense values are clipped to at most 9 decimal digits
_N_PAIRS = 4
_RANK = 4


@dataclass
class _Truth:
    vocab_sizes: np.ndarray          # int64[26]
    values: list[np.ndarray]          # uint32[V_j]: the hex value of each popularity rank
    cdf: list[np.ndarray]             # float64[V_j]: Zipf-like popularity, cumulative
    cat_missing: np.ndarray           # float64[26]: missing rate per column
    cat_weight: list[np.ndarray]      # float64[V_j + 1]: weight per rank; [V_j] is "missing"
    dense_mu: np.ndarray              # float64[13]
    dense_sigma: np.ndarray           # float64[13]
    dense_shift: np.ndarray           # int64[13]: subtracted after the floor
    dense_missing: np.ndarray         # float64[13]
    dense_beta: np.ndarray            # float64[13]
    pairs: list[tuple]                # (a, b, U_a[V_a + 1, R], U_b[V_b + 1, R], gamma)
    bias: float = 0.0


def _truth(seed: int, ctr: float) -> _Truth:
    rng = np.random.default_rng([seed, 0])
    sizes = np.round(np.geomspace(30, 100_000, N_SLOTS)).astype(np.int64)
    sizes = sizes[rng.permutation(N_SLOTS)]
    exponents = rng.uniform(1.05, 1.35, N_SLOTS)
    cat_missing = np.where(rng.random(N_SLOTS) < 0.6, 0.0, rng.uniform(0.02, 0.45, N_SLOTS))
    cat_sigma = rng.uniform(0.05, 0.45, N_SLOTS)
    values, cdf, weights = [], [], []
    for j in range(N_SLOTS):
        v = int(sizes[j])
        values.append(rng.choice(1 << 32, size=v, replace=False).astype(np.uint32))
        p = (np.arange(v) + 1.0) ** -exponents[j]
        c = np.cumsum(p)
        cdf.append(c / c[-1])
        weights.append(rng.normal(0.0, cat_sigma[j], v + 1))
    dense_mu = rng.uniform(0.0, 5.0, N_DENSE)
    dense_sigma = rng.uniform(0.8, 2.0, N_DENSE)
    dense_shift = np.zeros(N_DENSE, dtype=np.int64)
    dense_shift[1] = 2
    dense_missing = np.where(rng.random(N_DENSE) < 0.4, 0.0, rng.uniform(0.02, 0.45, N_DENSE))
    dense_beta = rng.normal(0.0, 0.15, N_DENSE)
    small = np.flatnonzero(sizes <= 3000)
    chosen = rng.choice(small, size=2 * _N_PAIRS, replace=False)
    pairs = []
    for k in range(_N_PAIRS):
        a, b = int(chosen[2 * k]), int(chosen[2 * k + 1])
        ua = rng.normal(0.0, 1.0 / np.sqrt(_RANK), (int(sizes[a]) + 1, _RANK))
        ub = rng.normal(0.0, 1.0 / np.sqrt(_RANK), (int(sizes[b]) + 1, _RANK))
        pairs.append((a, b, ua, ub, float(rng.uniform(0.6, 1.0))))
    truth = _Truth(sizes, values, cdf, cat_missing, weights, dense_mu, dense_sigma,
                   dense_shift, dense_missing, dense_beta, pairs)
    # The bias comes from a fixed calibration sample, so it does not depend on `rows`.
    z = _block(truth, np.random.default_rng([seed, 2]), 50_000)["logit"]
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(_sigmoid(z + mid)) < ctr:
            lo = mid
        else:
            hi = mid
    truth.bias = (lo + hi) / 2
    return truth


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _block(truth: _Truth, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """n rows drawn from the truth; ``logit`` excludes the bias."""
    rank = np.empty((n, N_SLOTS), dtype=np.int64)
    cat_missing = np.empty((n, N_SLOTS), dtype=bool)
    cat = np.empty((n, N_SLOTS), dtype=np.uint32)
    logit = np.zeros(n)
    for j in range(N_SLOTS):
        r = np.searchsorted(truth.cdf[j], rng.random(n), side="right")
        np.minimum(r, truth.vocab_sizes[j] - 1, out=r)
        miss = rng.random(n) < truth.cat_missing[j]
        cat[:, j] = truth.values[j][r]
        r[miss] = truth.vocab_sizes[j]  # the missing value's own weight row
        rank[:, j] = r
        cat_missing[:, j] = miss
        logit += truth.cat_weight[j][r]
    raw = np.floor(np.exp(rng.normal(truth.dense_mu, truth.dense_sigma, (n, N_DENSE))))
    dense = np.minimum(raw, 10.0 ** _DIGITS - 1).astype(np.int64) - truth.dense_shift
    dense_missing = rng.random((n, N_DENSE)) < truth.dense_missing
    logit += (np.where(dense_missing, 0.0, np.log1p(np.maximum(dense, 0)))
              * truth.dense_beta).sum(axis=1)
    for a, b, ua, ub, gamma in truth.pairs:
        logit += gamma * np.einsum("ij,ij->i", ua[rank[:, a]], ub[rank[:, b]])
    u = rng.random(n)
    return {"dense": dense, "dense_missing": dense_missing, "cat": cat,
            "cat_missing": cat_missing, "logit": logit, "u": u}


def _blocks(rows: int, seed: int, ctr: float):
    if not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative integer, got {rows!r}")
    if not 0.0 < ctr < 1.0:
        raise ValueError(f"ctr must be in (0, 1), got {ctr!r}")
    truth = _truth(int(seed), ctr)
    for k, start in enumerate(range(0, rows, BLOCK_ROWS)):
        n = min(BLOCK_ROWS, rows - start)
        b = _block(truth, np.random.default_rng([int(seed), 1, k]), n)
        b["logit"] += truth.bias
        b["prob"] = _sigmoid(b["logit"])
        b["labels"] = (b.pop("u") < b["prob"]).astype(np.uint8)
        yield truth, b


def generate_arrays(rows: int, seed: int = 0, ctr: float = 0.25) -> dict[str, np.ndarray]:
    """``rows`` examples in memory, exactly the rows :func:`generate` writes.

    Returns ``labels`` uint8[n], ``dense`` int64[n, 13] and ``dense_missing``
    bool[n, 13], ``cat`` uint32[n, 26] (the value whose 8-hex-digit text is
    written) and ``cat_missing`` bool[n, 26], ``logit`` and ``prob`` float64[n]
    (the true click probability).
    """
    parts = [b for _, b in _blocks(rows, seed, ctr)]
    if not parts:
        parts = [{"labels": np.zeros(0, np.uint8), "dense": np.zeros((0, N_DENSE), np.int64),
                  "dense_missing": np.zeros((0, N_DENSE), bool),
                  "cat": np.zeros((0, N_SLOTS), np.uint32),
                  "cat_missing": np.zeros((0, N_SLOTS), bool),
                  "logit": np.zeros(0), "prob": np.zeros(0)}]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def format_tsv(labels, dense, dense_missing, cat, cat_missing) -> bytes:
    """Criteo TSV text of the rows (``label \\t I1..I13 \\t C1..C26 \\n`` each).

    One compiled pass over the arrays (``pyfleet.data._parse.format_criteo_tsv``);
    a categorical value is written as 8 lowercase hex digits, a missing value
    as an empty field.
    """
    return _parse.format_criteo_tsv(
        np.ascontiguousarray(labels, dtype=np.uint8),
        np.ascontiguousarray(dense, dtype=np.int64),
        np.ascontiguousarray(dense_missing, dtype=bool).view(np.uint8),
        np.ascontiguousarray(cat, dtype=np.uint32),
        np.ascontiguousarray(cat_missing, dtype=bool).view(np.uint8))


def auc(labels, scores) -> float:
    """Area under the ROC curve (ties count one half); NaN without both classes."""
    y = np.asarray(labels).astype(bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    s, y = s[order], y[order]
    bounds = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [s.shape[0]]])
    ranks = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels, probs) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-15, 1 - 1e-15]."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-15, 1 - 1e-15)
    if y.shape[0] == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def generate(path_or_dir, rows: int, seed: int = 0, test_fraction: float = 0.1,
             ctr: float = 0.25, train_shards: int = 1) -> dict:
    """Write ``train.tsv`` and ``test.tsv`` (Criteo TSV) into the directory ``path_or_dir``.

    The first ``rows - round(rows * test_fraction)`` rows are the training set,
    the rest the test set. With ``train_shards > 1`` the training rows go to
    ``train/part-00000.tsv``... (row i to shard ``i * train_shards // n_train``),
    and ``"train"`` is that directory. Also writes ``truth.json`` holding the
    returned summary: paths, row counts, ``truth_auc_test`` and
    ``truth_logloss_test`` (of the true probabilities), ``ctr_train``,
    ``ctr_test``, ``mean_prob_test``, ``seed``. Files are byte-identical for
    equal arguments.
    """
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative integer, got {rows!r}")  # before mkdir
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    if not isinstance(train_shards, (int, np.integer)) or train_shards < 1:
        raise ValueError(f"train_shards must be a positive integer, got {train_shards!r}")
    out_dir = os.fspath(path_or_dir)
    if os.path.isfile(out_dir):
        raise ValueError(f"generate: {out_dir!r} is a file; pass a directory")
    os.makedirs(out_dir, exist_ok=True)
    n_test = round(rows * test_fraction) if rows else 0
    n_train = rows - n_test
    if train_shards > 1:
        train_path = os.path.join(out_dir, "train")
        os.makedirs(train_path, exist_ok=True)
        shard_paths = [os.path.join(train_path, f"part-{k:05d}.tsv") for k in range(train_shards)]
    else:
        train_path = os.path.join(out_dir, "train.tsv")
        shard_paths = [train_path]
    test_path = os.path.join(out_dir, "test.tsv")
    shard_files = [open(p, "wb") for p in shard_paths]
    test_labels, test_probs = [], []
    train_clicks = 0
    try:
        with open(test_path, "wb") as ftest:
            start = 0
            for _, b in _blocks(rows, seed, ctr):
                n = b["labels"].shape[0]
                row = np.arange(start, start + n)
                is_train = row < n_train
                if is_train.any():
                    shard = row[is_train] * train_shards // max(n_train, 1)
                    for k in np.unique(shard):
                        sel = np.flatnonzero(is_train)[shard == k]
                        shard_files[k].write(_text(b, sel))
                    train_clicks += int(b["labels"][is_train].sum())
                if not is_train.all():
                    sel = np.flatnonzero(~is_train)
                    ftest.write(_text(b, sel))
                    test_labels.append(b["labels"][sel])
                    test_probs.append(b["prob"][sel])
                start += n
    finally:
        for f in shard_files:
            f.close()
    y = np.concatenate(test_labels) if test_labels else np.zeros(0, np.uint8)
    p = np.concatenate(test_probs) if test_probs else np.zeros(0)
    summary = {
        "train": train_path, "test": test_path, "rows_train": n_train, "rows_test": n_test,
        "truth_auc_test": auc(y, p), "truth_logloss_test": logloss(y, p),
        "ctr_train": train_clicks / n_train if n_train else float("nan"),
        "ctr_test": float(y.mean()) if y.shape[0] else float("nan"),
        "mean_prob_test": float(p.mean()) if p.shape[0] else float("nan"),
        "seed": int(seed), "format": "criteo",
    }
    with open(os.path.join(out_dir, "truth.json"), "w") as f:
        json.dump({k: (None if isinstance(v, float) and v != v else v)
                   for k, v in summary.items()}, f, indent=2, sort_keys=True)
        f.write("\n")
    return summary


def _text(b: dict[str, np.ndarray], sel: np.ndarray | None) -> bytes:
    return format_tsv(b["labels"][sel], b["dense"][sel], b["dense_missing"][sel],
                      b["cat"][sel], b["cat_missing"][sel])


# Bump when the generator's output changes: old cache entries are then not used.
GENERATOR_VERSION = 1


def cached(cache_dir, rows: int, seed: int = 0, test_fraction: float = 0.1,
           ctr: float = 0.25, say=None) -> dict:
    """:func:`generate`'s data set from a cache, generated on a miss.

    Entries live in ``cache_dir/<key>``, the key naming every parameter the
    files depend on (and numpy's version, which fixes the draws). An entry is
    generated in a temporary directory and renamed into place only once
    complete, with ``cache.json`` recording each file's size; an entry that
    does not match it (truncated, edited) is deleted and generated again, so a
    partial or corrupt entry is never used. ``say`` (a callable) is told what
    happens. Returns :func:`generate`'s summary with the entry's paths."""
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative integer, got {rows!r}")
    key = (f"synthetic-v{GENERATOR_VERSION}-rows{int(rows)}-seed{int(seed)}-"
           f"test{float(test_fraction):g}-ctr{float(ctr):g}-numpy{np.__version__}")
    entry = os.path.join(os.fspath(cache_dir), key)
    info = _cache_entry(entry)
    if info is not None:
        if say:
            say(f"generated data: {entry} (cached)")
        return info
    if os.path.exists(entry):
        if say:
            say(f"generated data: {entry} is incomplete or damaged; generating it again")
        shutil.rmtree(entry, ignore_errors=True)
    if say:
        say(f"generating {rows:,} synthetic rows (seed {seed}) into {entry} ...")
    os.makedirs(os.fspath(cache_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{key}.", dir=os.fspath(cache_dir))
    try:
        generate(tmp, rows=rows, seed=seed, test_fraction=test_fraction, ctr=ctr)
        sizes = {name: os.path.getsize(os.path.join(tmp, name))
                 for name in ("train.tsv", "test.tsv", "truth.json")}
        with open(os.path.join(tmp, "cache.json"), "w") as f:
            json.dump({"key": key, "sizes": sizes}, f)
        try:
            os.rename(tmp, entry)
        except OSError:  # another run put it there first: use that one
            if _cache_entry(entry) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info = _cache_entry(entry)
    if info is None:
        raise ValueError(f"the cache entry {entry} is unreadable right after it was written")
    return info


def _cache_entry(entry: str) -> dict | None:
    """The summary of a complete cache entry, or None."""
    try:
        with open(os.path.join(entry, "cache.json")) as f:
            sizes = json.load(f)["sizes"]
        for name, size in sizes.items():
            if os.path.getsize(os.path.join(entry, name)) != size:
                return None
        with open(os.path.join(entry, "truth.json")) as f:
            info = json.load(f)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    info.update(train=os.path.join(entry, "train.tsv"), test=os.path.join(entry, "test.tsv"))
    return info

"""Write PaddleRec slot data for this model: ``data/train/part-0``, ``part-1`` and
``data/test/part-0`` beside this file. A line is ``click:Y dense_var:X x3 s1:ID ...
s6:ID``; clicks follow a logistic model of the ids and dense values, so the
model has something to learn.

    python examples/paddlerec/ctr_dnn/gen_data.py [--rows 320] [--seed 7] [--out DIR]
"""

import argparse
import os

import numpy as np

SPARSE = [f"s{i}" for i in range(1, 7)]
VOCAB = 200


def lines(rng, n, weights):
    ids = rng.integers(1, VOCAB, (n, len(SPARSE)))
    dense = rng.normal(size=(n, 3))
    logit = weights[ids].sum(axis=1) + dense @ np.array([1.5, -1.0, 0.5])
    clicks = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    out = []
    for y, row, x in zip(clicks, ids, dense):
        fields = [f"click:{y}"] + [f"dense_var:{v:.4f}" for v in x]
        fields += [f"{s}:{i}" for s, i in zip(SPARSE, row)]
        out.append(" ".join(fields) + "\n")
    return out


def write(out, rows=320, seed=7):
    """Two training files (one a worker in a 2-worker local cluster) and a test file."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(scale=1.2, size=VOCAB)
    for part in ("train/part-0", "train/part-1", "test/part-0"):
        path = os.path.join(out, part)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.writelines(lines(rng, rows, weights))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=320, help="lines a file")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "data"))
    a = p.parse_args()
    write(a.out, a.rows, a.seed)

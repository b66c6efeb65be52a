"""One rank of benchmarks/training/bench_vs_torchrec.py's two-process data-parallel
pass (``_train_data_parallel``), checked against one process's steps over both
processes' batches together.

    python -m support.torch_dp_job OUT RANK PORT

Rank r trains the batches ``2*i + r`` (rank 0 has one more, and rank 1's last
batch is short, so a step's losses are weighted by their examples and the pass
ends at the first step one rank has no batch for) on a sum-pooled
``nn.EmbeddingBag`` with ``SparseAdam`` and an fc stack with Adam, as the
``torch-2p`` run does. Rank 0 then builds the same model afresh, trains it in
this process on the steps the pair took (each the two batches concatenated,
one loss over all their examples) and writes ``OUT/result.json``: the examples
each pass trained and the largest differences of the table and the fc weights.
"""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "training"))
import bench_vs_torchrec as bench  # noqa: E402

ROWS, SLOTS, DIM, DENSE = 300, 26, 4, 13
SIZES = [(0, 64), (2, 64), (4, 64), (6, 64), (1, 64), (3, 64), (5, 40)]  # (batch, n)


def batch(i, n):
    rng = np.random.default_rng(i)
    rows = torch.from_numpy(rng.integers(0, ROWS, SLOTS * n).astype(np.int64))
    dense = torch.from_numpy(rng.normal(size=(n, DENSE)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 2, n).astype(np.int64))
    return rows, dense, labels, n


def model():
    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
    mlp = torch.nn.Sequential(torch.nn.Linear(SLOTS * DIM + DENSE, 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 2))
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=0.01)
    sparse_opt = torch.optim.SparseAdam(emb.parameters(), lr=0.01)

    def pooled(rows, n):
        offsets = torch.arange(0, rows.numel(), dtype=torch.int64)
        return emb(rows, offsets).view(SLOTS, n, DIM).transpose(0, 1).reshape(n, SLOTS * DIM)
    return emb, mlp, dense_opt, sparse_opt, pooled


def main(out, rank, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    emb, mlp, dense_opt, sparse_opt, pooled = model()
    mine = [batch(i, n) for i, n in sorted(SIZES) if i % 2 == rank]
    examples = bench._train_data_parallel(torch, rank, 2, mine, mlp, pooled, dense_opt,
                                          sparse_opt, SLOTS * DIM)
    if rank:
        return
    start = model()[0].weight.detach().clone()
    r_emb, r_mlp, r_dense_opt, r_sparse_opt, r_pooled = model()
    ref_examples = 0
    for step in range(3):   # rank 1 has 3 batches: the pair trains 3 steps
        a, b = batch(2 * step, 64), batch(2 * step + 1, dict(SIZES)[2 * step + 1])
        n = a[3] + b[3]
        rows = torch.cat([a[0].view(SLOTS, a[3]), b[0].view(SLOTS, b[3])], 1).reshape(-1)
        logits = r_mlp(torch.cat([r_pooled(rows, n), torch.cat([a[1], b[1]])], 1))
        loss = torch.nn.functional.cross_entropy(logits, torch.cat([a[2], b[2]]))
        r_dense_opt.zero_grad()
        r_sparse_opt.zero_grad()
        loss.backward()
        r_dense_opt.step()
        r_sparse_opt.step()
        ref_examples += n
    table = emb.weight.detach()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"examples": examples, "ref_examples": ref_examples,
                   "table_diff": float((table - r_emb.weight.detach()).abs().max()),
                   "table_moved": float((r_emb.weight.detach() - start).abs().max()),
                   "fc_diff": max(float((p - q).abs().max())
                                  for p, q in zip(mlp.parameters(), r_mlp.parameters()))}, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))

"""benchmarks/training/bench_vs_torchrec.py's ``-hw`` runs' two processes
(``_Hogwild``): each steps its own rows of one ``nn.EmbeddingBag`` table in shared
memory, and the parent sees both processes' updates.

    python -m support.torch_hogwild_job OUT

Rank 0 trains rows 0-9, rank 1 rows 100-109 (three SGD steps of a sum's
gradient, 1 each, lr 0.5: every such row moves by -1.5); the parent writes
``OUT/result.json``: the rows it sees moved, each row's change, and the figures
``finish`` combined.
"""

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "training"))
import bench_vs_torchrec as bench  # noqa: E402


def main(out):
    torch.set_num_threads(1)
    emb = torch.nn.EmbeddingBag(200, 4, mode="sum", sparse=True)
    start = emb.weight.detach().clone()
    hogwild = bench._Hogwild(list(emb.parameters()))
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)
    hogwild.start()
    rows = torch.arange(10) + (100 if hogwild.rank else 0)
    for _ in range(3):
        opt.zero_grad()
        emb(rows, torch.arange(10)).sum().backward()
        opt.step()
    figures = hogwild.finish({"train_examples": 10 * (1 + hogwild.rank),
                              "train_cpu_seconds": 1.0, "train_seconds": 2.0 + hogwild.rank})
    change = (emb.weight.detach() - start)
    moved = torch.nonzero(change.abs().sum(1)).flatten().tolist()
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"moved": moved, "change": change[moved].flatten().tolist(),
                   "figures": figures}, f)


if __name__ == "__main__":
    main(sys.argv[1])

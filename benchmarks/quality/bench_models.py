"""Model quality: the model zoo trained by ``pyfleet train`` against PyTorch.

```
python benchmarks/quality/bench_models.py [--rows 200000] [--models lr dnn wide_deep deepfm]
                                  [--data generated criteo] [--seed 0] [--epochs 1]
```

For every model and data set, two trainings of the same network on the same
batches:

- ``pyfleet``: ``pyfleet train`` with 1 server + 1 worker, ``--mode sync``,
  ``--json`` (its ``test_auc``);
- ``torch``: a plain PyTorch implementation of the network
  (:class:`TorchCTR`). It reads the batches :class:`pyfleet.data.Dataset`
  yields the trainer's worker (the same shuffle, the same hashed ids, the same
  log-transformed dense values), starts from **the same initial values**
  (the dense parameters the job's startup program gives, each sparse id's row
  from the table's initializer and seed, pulled for every id of the train and
  test files), and trains with Adam at the same learning rates (the dense
  parameters' and the sparse tables' ``--sparse-lr``), betas, epsilon and
  batch: ``torch.optim.Adam`` for the dense parameters, and for the
  embedding rows a lazy Adam like the parameter server's (only the rows of a
  batch move, each row with its own step count for the bias correction;
  ``torch.optim.SparseAdam`` counts steps per tensor instead, so it is not used).

The test AUC of both is the exact AUC (``pyfleet.metrics.exact_auc``).
Targets: |pyfleet - torch| <= 0.0005 for every model and data set, and
DeepFM >= DNN >= LR on the generated data. torch is needed only here:
``pip install torch`` in the benchmark's environment (never a dependency).

Data: ``generated`` is ``pyfleet gen-data --rows N`` (cached under
``--cache``); ``criteo`` is the 1,999 real Kaggle rows of
``../shared/data/criteo-kaggle-tiny`` (the first 1,600 to train, the rest to
test: a small sample, so its AUCs are noisy, but both trainers see the same).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]  # the checkout
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import harness  # noqa: E402

from pyfleet import fluid  # noqa: E402
from pyfleet.metrics import exact_auc, logloss  # noqa: E402
from pyfleet.table import SparseTable  # noqa: E402
from pyfleet.trainer.job import JOB_DEFAULTS, build_program, job_dataset, optimizer_of  # noqa: E402


def _env():
    env = dict(os.environ)
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


# ---------------------------------------------------------------- data sets

def generated(cache, rows, seed):
    return {"name": "generated", "format": "criteo",
            **harness.generated_rows(cache, rows, seed)}


def criteo_tiny(cache):
    src = DATA / "criteo-kaggle-tiny" / "train.tiny.csv"
    out = Path(cache) / "criteo-kaggle-tiny"
    out.mkdir(parents=True, exist_ok=True)
    lines = src.read_text().replace("\r\n", "\n").splitlines()
    header, rows = lines[0], lines[1:]
    (out / "train.csv").write_text("\n".join([header] + rows[:1600]) + "\n")
    (out / "test.csv").write_text("\n".join([header] + rows[1600:]) + "\n")
    return {"name": "criteo", "train": str(out / "train.csv"), "test": str(out / "test.csv"),
            "format": "csv", "truth_auc": None}


# ---------------------------------------------------------------- pyfleet

def run_pyfleet(data, model, args, run_root):
    run_dir = Path(run_root) / f"{data['name']}-{model}"
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--train", data["train"],
           "--test", data["test"], "--format", data["format"], "--model", model.replace("_", ""),
           "--servers", "1", "--workers", "1", "--mode", "sync", "--seed", str(args.seed),
           "--epochs", str(args.epochs), "--run-dir", str(run_dir), "--json", "--quiet"]
    if args.sparse_lr is not None:
        cmd += ["--sparse-lr", str(args.sparse_lr)]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    summary = json.loads(p.stdout)
    summary["sparse_lr"] = json.loads((run_dir / "job.json").read_text())["sparse_lr"]
    return summary


# ---------------------------------------------------------------- torch

class LazyAdam:
    """The parameter server's Adam for sparse rows: only the rows of a batch
    move, each row counting its own steps (Fluid's per-row beta powers)."""

    def __init__(self, weight, lr, beta1, beta2, eps):
        import torch
        self.w, self.lr, self.b1, self.b2, self.eps = weight, lr, beta1, beta2, eps
        self.m = torch.zeros_like(weight)
        self.v = torch.zeros_like(weight)
        self.t = torch.zeros(weight.shape[0], 1, dtype=torch.float64)

    def step(self):
        import torch
        g = self.w.grad.coalesce()
        rows, grad = g.indices()[0], g.values()
        self.w.grad = None
        m = self.b1 * self.m[rows] + (1 - self.b1) * grad
        v = self.b2 * self.v[rows] + (1 - self.b2) * grad * grad
        self.m[rows], self.v[rows] = m, v
        self.t[rows] += 1
        t = self.t[rows]
        b2p = (1 - self.b2 ** t).to(torch.float32)
        lr_t = self.lr * torch.sqrt(b2p) / (1 - self.b1 ** t).to(torch.float32)
        with torch.no_grad():
            self.w[rows] -= lr_t * (m / (torch.sqrt(v) + self.eps * torch.sqrt(b2p)))


def _torch_model(kind, params, tables, n_slots, dim):
    """The forward pass of ``kind`` over torch tensors initialised from
    pyfleet's initial values (``params``: dense name -> array, in program order;
    ``tables``: table name -> [n_ids, dim] rows)."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    t = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in tables.items()}
    names = list(params)
    fcs = [n for n in names if n.startswith("fc_") and n.endswith(".w_0")]

    def pooled(table, idx, offsets, batch):
        out = F.embedding_bag(idx, t[table], offsets, mode="sum", sparse=True)
        return out.view(n_slots, batch, -1).transpose(0, 1)        # [B, S, dim]

    def linear(x, w):
        y = x @ p[w]
        b = w.replace(".w_0", ".b_0")
        return y + p[b] if b in p else y

    def deep(x, layer_names):
        for w in layer_names:
            x = torch.relu(linear(x, w))
        return x

    def forward(dense, idx, offsets, batch):
        if kind in ("lr", "wide_deep", "deepfm"):
            first = pooled("SparseFeatFactors_first_order", idx, offsets, batch).sum(dim=(1, 2))
            wide = linear(dense, fcs[0]).squeeze(1) + first
        if kind == "lr":
            return wide, "sigmoid"
        hidden = fcs[1:-1] if kind != "dnn" else fcs[:-1]
        emb = pooled("SparseFeatFactors", idx, offsets, batch)     # [B, S, dim]
        x = torch.cat([emb.reshape(batch, -1), dense], dim=1)
        out = linear(deep(x, hidden), fcs[-1])
        if kind == "dnn":
            return out, "softmax"
        logit = wide + out.squeeze(1)
        if kind == "deepfm":
            v = p["SparseFeatFactors_dense_factors"]
            sum_v = emb.sum(1) + dense @ v
            sum_sq = (emb * emb).sum(1) + (dense * dense) @ (v * v)
            logit = logit + 0.5 * (sum_v * sum_v - sum_sq).sum(1)
        return logit, "sigmoid"

    return forward, list(p.values()), t


def _torch_default_fc(params, seed):
    """``params`` with every fc weight and bias replaced by what
    ``torch.nn.Linear`` draws for it (``--torch-init torch``: PyTorch's own
    default, U(+-1/sqrt(fan_in)) for both, instead of pyfleet's values)."""
    import torch
    torch.manual_seed(seed)
    out = dict(params)
    for name, w in params.items():
        if name.startswith("fc_") and name.endswith(".w_0"):
            lin = torch.nn.Linear(w.shape[0], w.shape[1])
            out[name] = lin.weight.detach().numpy().T.copy()
            b = name.replace(".w_0", ".b_0")
            if b in params:
                out[b] = lin.bias.detach().numpy().copy()
    return out


def _flat(batch, index_of):
    """All slots' ids as one index tensor (slot-major) and the bags' offsets."""
    import torch
    ids, offsets, base = [], [], 0
    for s_ids, s_off in batch.sparse:
        ids.append(s_ids)
        offsets.append(np.asarray(s_off[:-1], dtype=np.int64) + base)
        base += len(s_ids)
    ids = np.concatenate(ids)
    idx = np.searchsorted(index_of, ids)
    return torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(np.concatenate(offsets))


def run_torch(data, model, args, sparse_lr):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    job = {**JOB_DEFAULTS, "train": data["train"], "test": data["test"],
           "format": data["format"], "model": model, "seed": args.seed, "sparse_lr": sparse_lr}
    train = job_dataset(job, job["train"], 0, 1, shuffle=True, prefetch=0)
    test = job_dataset(job, job["test"], 0, 1, prefetch=0)
    n_dense, n_slots = train.schema.n_dense, train.schema.n_slots
    # Every id of both files, sorted: a row index per id.
    # (Read by other Dataset objects: each iteration of one is a pass, shuffled
    # by its pass number.)
    keys = [np.concatenate([i for i, _ in b.sparse])
            for path in (job["train"], job["test"]) for b in job_dataset(job, path, 0, 1, prefetch=0)]
    index_of = np.unique(np.concatenate(keys))
    # pyfleet's initial values: the startup program's dense parameters, each
    # id's row from its table's initializer and seed.
    with fluid.unique_name.guard():
        main, startup, m = build_program(job, n_dense, n_slots)
        with fluid.program_guard(main, startup):
            opt = optimizer_of(job)
            opt.minimize(m.avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    scope = fluid.Scope()
    exe.run(startup, scope=scope)
    params, tables, table_lr = {}, {}, {}
    for prm in main.all_parameters():
        if prm.is_sparse_table:
            tab = SparseTable(prm.dim, opt, initializer=prm.initializer, seed=prm.seed)
            tables[prm.name] = tab.pull(index_of.astype(np.uint64), create=False)
            table_lr[prm.name] = prm.optimizer.learning_rate   # the job's sparse rate
        else:
            params[prm.name] = np.asarray(scope.find_var(prm.name).get_tensor(),
                                          dtype=np.float32)
    if args.torch_init == "torch":
        params = _torch_default_fc(params, args.seed)
    forward, dense_params, emb = _torch_model(model, params, tables, n_slots,
                                              int(job["embedding_dim"]))
    betas = (opt.beta1, opt.beta2)
    dense_opt = torch.optim.Adam(dense_params, lr=opt.learning_rate, betas=betas,
                                 eps=opt.epsilon)
    sparse_opts = [LazyAdam(w, table_lr[name], opt.beta1, opt.beta2, opt.epsilon)
                   for name, w in emb.items()]

    def loss_of(out, kind, labels):
        if kind == "softmax":
            return F.cross_entropy(out, labels.long()), torch.softmax(out, 1)[:, 1]
        return (F.binary_cross_entropy_with_logits(out, labels.float()),
                torch.sigmoid(out))

    for _epoch in range(args.epochs):
        for batch in train:
            idx, offsets = _flat(batch, index_of)
            out, kind = forward(torch.from_numpy(batch.dense), idx, offsets, len(batch))
            loss, _ = loss_of(out, kind, torch.from_numpy(batch.labels))
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            for o in sparse_opts:
                o.step()
    preds, labels = [], []
    with torch.no_grad():
        for batch in test:
            idx, offsets = _flat(batch, index_of)
            out, kind = forward(torch.from_numpy(batch.dense), idx, offsets, len(batch))
            preds.append(loss_of(out, kind, torch.from_numpy(batch.labels))[1].numpy())
            labels.append(batch.labels)
    pred, label = np.concatenate(preds), np.concatenate(labels)
    return {"test_auc": exact_auc(pred, label), "test_logloss": logloss(pred, label)}


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000,
                    help="generated rows (default: %(default)s)")
    ap.add_argument("--models", nargs="+", default=["lr", "dnn", "wide_deep", "deepfm"])
    ap.add_argument("--data", nargs="+", default=["generated", "criteo"],
                    choices=["generated", "criteo"])
    ap.add_argument("--seed", type=int, default=0,
                    help="the job's seed: initial values and shuffle (default: %(default)s)")
    ap.add_argument("--data-seed", type=int, default=0,
                    help="pyfleet gen-data --seed (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(),
                                                    "pyfleet-bench-models"))
    ap.add_argument("--torch-init", choices=["same", "torch"], default="same",
                    help="torch's fc layers start from pyfleet's initial values (same) or "
                         "from torch.nn.Linear's default draw (torch) (default: %(default)s)")
    ap.add_argument("--skip-pyfleet", action="store_true",
                    help="train only the torch side (its AUC in both columns)")
    ap.add_argument("--sparse-lr", type=float, default=None,
                    help="pyfleet train --sparse-lr, and the torch side's embedding rate "
                         "(default: pyfleet train's)")
    ap.add_argument("--tolerance", type=float, default=0.0005)
    args = ap.parse_args(argv)
    sets = [generated(args.cache, args.rows, args.data_seed) if d == "generated"
            else criteo_tiny(args.cache) for d in args.data]
    rows, fails = [], []
    print(f"| model | data | pyfleet AUC | torch AUC | diff | |diff| <= {args.tolerance} "
          "| pyfleet logloss | torch logloss | seconds (pyfleet, torch) |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-models-") as run_root:
        for data in sets:
            for model in args.models:
                t0 = time.perf_counter()
                pf = None if args.skip_pyfleet else run_pyfleet(data, model, args, run_root)
                t1 = time.perf_counter()
                # pyfleet train's sparse rate as its job file says (without a
                # pyfleet run, --sparse-lr or the trainer's default)
                th = run_torch(data, model, args, pf["sparse_lr"] if pf else args.sparse_lr)
                pf = pf or th
                t2 = time.perf_counter()
                diff = pf["test_auc"] - th["test_auc"]
                ok = abs(diff) <= args.tolerance
                r = (model, data["name"], pf["test_auc"], th["test_auc"], diff, ok,
                     pf["test_logloss"], th["test_logloss"], t1 - t0, t2 - t1)
                rows.append(r)
                print(f"| {r[0]} | {r[1]} | {r[2]:.4f} | {r[3]:.4f} | {r[4]:+.4f} | "
                      f"{'yes' if r[5] else 'NO'} | {r[6]:.4f} | {r[7]:.4f} | "
                      f"{r[8]:.0f}, {r[9]:.0f} |", flush=True)
                if not ok:
                    fails.append(f"{model} on {data['name']}: |diff| {abs(diff):.4f}")
    for data in sets:
        if data["truth_auc"] is not None:
            print(f"\n{data['name']}: ground-truth test AUC {data['truth_auc']:.4f}")
    gen = {r[0]: r[2] for r in rows if r[1] == "generated"}
    if {"lr", "dnn", "deepfm"} <= set(gen):
        order = gen["deepfm"] >= gen["dnn"] >= gen["lr"]
        print(f"DeepFM >= DNN >= LR on generated data (pyfleet): "
              f"{'yes' if order else 'NO'} ({gen['deepfm']:.4f}, {gen['dnn']:.4f}, "
              f"{gen['lr']:.4f})")
        if not order:
            fails.append("DeepFM >= DNN >= LR does not hold")
    print("targets met" if not fails else "targets missed: " + "; ".join(fails))
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())

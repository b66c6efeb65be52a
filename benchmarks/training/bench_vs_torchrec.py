"""pyfleet against single-process PyTorch and TorchRec on the same rows, alternating.

```
python benchmarks/training/bench_vs_torchrec.py [--rows 1000000] [--rounds 2]
        [--runs async sync collective hybrid async-numpy sync-numpy
                torch fusedebc fbgemm
                torch-2p fusedebc-2p fbgemm-2p torch-hw fusedebc-hw fbgemm-hw]
        [--torch-threads 2] [--torch-preload] [--sparse-lr 0.05] [--cache DIR]
        [--json out.json]
```

Generates ``--rows`` synthetic Criteo rows once (``pyfleet gen-data``, cached
under ``--cache``: every run and every later invocation reads the same rows),
then trains the reference DNN (26 slots sharing one dim-16 table, sum-pooled,
concatenated with the 13 dense features, fc 256-128-64 relu, a 2-way softmax,
batch 512, dense Adam 0.001) for one pass with each trainer, one after the
other, ``--rounds`` times (``async sync ... fbgemm``, then again), and prints
each run's training examples/s, test AUC (exact) and the load average around it:

- ``async``, ``sync``: ``pyfleet train`` with its default layout, 1 server + 2
  workers on this machine (``--mode``; the sparse rows with Adam on the server);
  ``collective``: ``--mode collective --workers 2`` (no server, MPI);
  ``hybrid``: ``--mode hybrid`` (1 server + 2 workers, dense all-reduced);
- ``async-tcp``, ``sync-tcp``: the same over loopback TCP with the job's CURVE
  keys (``PYFLEET_IPC_DIR=`` empty) instead of the Unix sockets ``pyfleet train``
  uses on one machine;
- ``async-numpy``, ``sync-numpy``: the same with each fc layer's product, bias
  and relu run as three numpy ops (``PYFLEET_FUSED_FC=0``) instead of one fused
  op (``pyfleet.fluid.fused_fc``): what the fusion saves;
- ``torch``: one PyTorch process, ``torch.set_num_threads(--torch-threads)``,
  ``nn.EmbeddingBag(sparse=True)`` with ``torch.optim.SparseAdam`` and the fc
  layers with ``torch.optim.Adam`` (both lr 0.001);
- ``fusedebc``: TorchRec's ``FusedEmbeddingBagCollection`` on CPU, the table's
  optimizer (row-wise Adagrad, ``--sparse-lr``) applied inside the backward by
  FBGEMM, the fc layers with ``torch.optim.Adam``;
- ``fbgemm``: FBGEMM's batched embedding kernel
  (``SplitTableBatchedEmbeddingBagsCodegen``, the same optimizer) called
  directly, without TorchRec's modules around it;
- ``torch-2p``, ``fusedebc-2p``, ``fbgemm-2p``: the same as two data-parallel
  processes of one thread each (torch.distributed, gloo on 127.0.0.1; the table
  replicated, the batches' rows and pooled gradients all-gathered, the fc
  gradients summed, the learning rates doubled for the batch of 1,024 a step
  trains; see ``_train_data_parallel``), started in one session;
- ``torch-hw``, ``fusedebc-hw``, ``fbgemm-hw``: the same as two processes of one
  thread each training one model in shared memory without locks (Hogwild,
  PyTorch's multiprocessing pattern; each its own half of the rows and its own
  fc optimizer state, the rates of one process; see ``_Hogwild``): the
  asynchronous counterpart of pyfleet's async workers.

Every torch run uses the fused form of Adam for the fc stack and one interop
thread.

Every torch trainer reads the batches :class:`pyfleet.data.Dataset` yields a
pyfleet worker (the same parser, shuffle and hashed ids, in a reader thread as
a worker has), maps each batch's hashed ids to rows of a fixed-size table with
one ``np.searchsorted`` over the sorted ids of the data set (a torch table has
a fixed number of rows; the index is built before the clock starts), and
counts examples/s over its training loop, as ``pyfleet train`` does. Each
trainer runs in a process and session of its own (Linux's autogroup scheduler
shares a loaded machine between sessions). ``fusedebc`` and ``fbgemm`` need
``torch``, ``fbgemm-gpu-cpu`` and ``torchrec`` (see benchmarks/README.md for
a matching set); a trainer whose packages are missing is reported as skipped.

The ratios are to the fastest TorchRec path (``fusedebc``, ``fbgemm`` or their
``-2p``/``-hw`` runs) of the same round, or to ``torch`` when neither ran. Each row also gives its CPU per
batch (a torch process's training loop, every thread; pyfleet's workers'
training loops plus its servers' whole life) and the examples/s two idle cores
would allow at that CPU: on a machine shared with other jobs, the figure that
moves least. ``--report FILE`` prints the tables of a ``--json`` file again.
Then, for each pyfleet run, where its CPU went per batch of 512 training examples, from ``/proc`` (each role's
whole life: start, the training pass and the test pass): the workers' user and
kernel time, the servers' user and kernel time, and the launcher's; a sum over
2 cores says how far from the machine's limit a configuration is.
Not a timed test: nothing fails on a figure.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/
import harness  # noqa: E402

BATCH = 512
PYFLEET_RUNS = {"async": ["--mode", "async"], "sync": ["--mode", "sync"],
                "collective": ["--mode", "collective", "--servers", "0"],
                "hybrid": ["--mode", "hybrid"],
                "async-tcp": ["--mode", "async"], "sync-tcp": ["--mode", "sync"],
                "async-numpy": ["--mode", "async"], "sync-numpy": ["--mode", "sync"]}
# ...-tcp: the roles talk over loopback TCP with the job's CURVE keys, as every
# job did before the launcher gave each one a directory of Unix sockets;
# ...-numpy: every fc layer's mul, bias and relu on their own numpy kernels, the
# reference of the fused layers (pyfleet.fluid.fused_fc)
PYFLEET_ENV = {"async-tcp": {"PYFLEET_IPC_DIR": ""}, "sync-tcp": {"PYFLEET_IPC_DIR": ""},
               "async-numpy": {"PYFLEET_FUSED_FC": "0"}, "sync-numpy": {"PYFLEET_FUSED_FC": "0"}}
TORCH_RUNS = ("torch", "fusedebc", "fbgemm", "torch-2p", "fusedebc-2p", "fbgemm-2p",
              "torch-hw", "fusedebc-hw", "fbgemm-hw")
TORCHREC_RUNS = ("fusedebc", "fbgemm", "fusedebc-2p", "fbgemm-2p", "fusedebc-hw",
                 "fbgemm-hw")


def _base(kind):
    """The trainer of a run: ``fbgemm`` of ``fbgemm-2p``/``fbgemm-hw``."""
    return kind.removesuffix("-2p").removesuffix("-hw")


def _env(threads=1):
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    # An OpenMP thread that spins at a barrier holds the core its partner waits
    # for when other processes share the cores: measured here, torch with 2
    # threads at load 8 trained 1,500 examples/s spinning and 15,000 passive.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# ---------------------------------------------------------------- pyfleet

def _proc_tree(root):
    """Pids of ``root`` and every process below it."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def _role_of(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read()
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = f.read().split(b"\0")
    if b"TRAINING_ROLE=PSERVER" in env or b"pyfleet.server" in cmd:
        return "server"
    if b"pyfleet.trainer" in cmd:
        return "worker"
    return "other"


def _sample(root, seen):
    """Record in ``seen`` {pid: (role, user s, kernel s)} of the tree under ``root``."""
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _proc_tree(root):
        try:
            # asked again while "other": a child forked but not yet exec'd still
            # shows the launcher's command line and environment
            role = seen[pid][0] if seen.get(pid, ("other",))[0] != "other" else _role_of(pid)
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seen[pid] = (role, int(fields[11]) / tick, int(fields[12]) / tick)


def run_pyfleet(name, data, run_root, timeout):
    run_dir = os.path.join(run_root, f"pyfleet-{name}-{time.monotonic_ns()}")
    cmd = [sys.executable, "-m", "pyfleet.cli", "train", "--train", data["train"],
           "--test", data["test"], "--format", "criteo", "--workers", "2",
           *PYFLEET_RUNS[name], "--run-dir", run_dir, "--json", "--quiet", "--no-model",
           "--timeout", str(timeout)]
    seen = {}
    stdout = harness.run_watched(cmd, {**_env(), **PYFLEET_ENV.get(name, {})}, timeout,
                                 lambda pid: _sample(pid, seen), every=0.1)
    r = json.loads(stdout)
    cpu = {}
    for role, user, kernel in seen.values():
        cpu[f"{role}_user"] = cpu.get(f"{role}_user", 0.0) + user
        cpu[f"{role}_kernel"] = cpu.get(f"{role}_kernel", 0.0) + kernel
    return {"examples_per_sec": r["train_examples_per_sec"], "test_auc": r["test_auc"],
            "train_examples": r["train_examples"], "cpu_seconds": cpu,
            "worker_train_cpu_seconds": r.get("train_cpu_seconds")}


# ---------------------------------------------------------------- torch side

def _dataset(path, shuffle, rank=0, world=1):
    from pyfleet.data import Dataset
    return Dataset(path, format="criteo", batch_size=BATCH, shuffle=shuffle, seed=0,
                   prefetch=4, worker_index=rank, worker_num=world)


def _id_index(paths):
    """The sorted distinct hashed ids of ``paths``: a row of the table for each."""
    seen = []
    for path in paths:
        for b in _dataset(path, False):
            seen.append(np.unique(np.concatenate([ids for ids, _ in b.sparse])))
    return np.unique(np.concatenate(seen))


def _rows_of(batch, index):
    """Slot-major row indices and offsets of a batch (every slot one id a row)."""
    ids = np.concatenate([ids for ids, _ in batch.sparse])
    return np.searchsorted(index, ids).astype(np.int64)


def train_torch(kind, data, threads, sparse_lr, preload=False, rank=0, world=1):
    """One trainer of TORCH_RUNS in this process (rank ``rank`` of ``world`` data-parallel
    processes); returns its summary."""
    import torch

    from pyfleet.metrics import exact_auc

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)   # nothing here runs ops concurrently
    torch.manual_seed(0)
    index = _id_index([data["train"], data["test"]])
    n_rows, n_slots, dim, n_dense = len(index), 26, 16, 13
    sizes = [n_slots * dim + n_dense, 256, 128, 64]
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    mlp = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], 2))
    # fused: one kernel over all the fc parameters (torch's CPU default is a loop of ops per
    # parameter); the same Adam, a little less CPU a step
    # A data-parallel step is one step of the processes' batches together: the learning
    # rates scale with the processes (the linear scaling rule), else they train half as
    # far a pass.
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=1e-3 * world, fused=True)
    sparse_lr *= world
    sparse_opt = None
    base = _base(kind)
    if base == "torch":
        emb = torch.nn.EmbeddingBag(n_rows, dim, mode="sum", sparse=True)
        torch.nn.init.uniform_(emb.weight, -0.01, 0.01)
        sparse_opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3 * world)

        def pooled(rows, batch_size):
            offsets = torch.arange(0, rows.numel(), dtype=torch.int64)
            return emb(rows, offsets).view(n_slots, batch_size, dim).transpose(0, 1) \
                .reshape(batch_size, n_slots * dim)
    elif base == "fusedebc":
        from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad
        keys = [f"C{i}" for i in range(1, n_slots + 1)]
        emb = FusedEmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name="t", embedding_dim=dim, num_embeddings=n_rows,
                                       feature_names=keys)],
            optimizer_type=RowWiseAdagrad, optimizer_kwargs={"lr": sparse_lr},
            device=torch.device("cpu"))

        def pooled(rows, batch_size):
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=keys, values=rows, lengths=torch.ones(rows.numel(), dtype=torch.int32))
            return emb(kjt).values()
    elif base == "fbgemm":
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
        emb = SplitTableBatchedEmbeddingBagsCodegen(
            embedding_specs=[(n_rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            feature_table_map=[0] * n_slots, optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            learning_rate=sparse_lr)

        def pooled(rows, batch_size):
            offsets = torch.arange(0, rows.numel() + 1, dtype=torch.int64)
            return emb(rows, offsets)
    else:
        raise ValueError(f"unknown torch trainer {kind!r}")

    def prepare(batch):
        """A batch as the step takes it: table rows, dense values, labels, size."""
        return (torch.from_numpy(_rows_of(batch, index)), torch.from_numpy(batch.dense),
                torch.from_numpy(batch.labels).long(), len(batch))

    def forward(rows, dense, n):
        return mlp(torch.cat([pooled(rows, n), dense], dim=1))

    def step(rows, dense, labels, n):
        logits = forward(rows, dense, n)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        dense_opt.zero_grad(set_to_none=True)
        if sparse_opt is not None:
            sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        if sparse_opt is not None:
            sparse_opt.step()

    hogwild = None
    if kind.endswith("-hw"):   # two processes, one table and fc stack in shared memory
        hogwild = _Hogwild([*mlp.parameters(), *emb.parameters(), *emb.buffers()])
        rank, world = hogwild.rank, 2
    train = _dataset(data["train"], True, rank, world)
    if preload:   # every batch read and mapped before the clock starts: the step alone
        train = [prepare(batch) for batch in train]
    items = train if preload else map(prepare, train)
    if hogwild is not None:
        hogwild.start()
        world = 1   # each process steps on its own
    t0, c0 = time.perf_counter(), time.process_time()
    if world > 1:
        examples = _train_data_parallel(torch, rank, world, items, mlp, pooled, dense_opt,
                                        sparse_opt, n_slots * dim)
    else:
        examples = 0
        for rows, dense, labels, n in items:
            step(rows, dense, labels, n)
            examples += n
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"examples_per_sec": examples / seconds, "train_examples": examples,
           "train_seconds": seconds, "train_cpu_seconds": cpu}
    if hogwild is not None:
        out = hogwild.finish(out)   # the child exits here; the parent has both
    if rank:   # the replicas are equal: rank 0 tests
        return out
    preds, labels = [], []
    with torch.no_grad():
        for batch in _dataset(data["test"], False):
            rows, dense, _, n = prepare(batch)
            preds.append(torch.softmax(forward(rows, dense, n), 1)[:, 1].numpy())
            labels.append(batch.labels)
    return {**out, "test_auc": exact_auc(np.concatenate(preds), np.concatenate(labels))}


class _Hogwild:
    """Two processes training one model without locks (Hogwild, PyTorch's
    multiprocessing pattern for CPU training): ``tensors`` (the table, its
    optimizer's row state, the fc parameters) moved to shared memory, then a
    fork; each process reads its own half of the rows and steps with its own
    fc optimizer state, both writing the shared values as they go (as an async
    parameter server's workers do). :meth:`start` lines the two clocks up;
    :meth:`finish` ends the child and gives the parent both processes' figures."""

    def __init__(self, tensors):
        for t in tensors:
            t.data.share_memory_()
        up, down, result = os.pipe(), os.pipe(), os.pipe()   # child -> parent, back, result
        self.pid = os.fork()
        self.rank = 0 if self.pid else 1
        # each end in one process only: a peer that died is an end of file, not a hang
        keep = ((up[1], down[0], result[1]) if self.rank else (up[0], down[1], result[0]))
        for fd in (*up, *down, *result):
            if fd not in keep:
                os.close(fd)
        self._send, self._recv, self._result = keep if self.rank else (keep[1], keep[0],
                                                                        keep[2])

    def start(self):
        os.write(self._send, b"1")
        if os.read(self._recv, 1) != b"1":
            raise RuntimeError("the other Hogwild process ended before training")

    def finish(self, out):
        if self.rank:
            os.write(self._result, json.dumps(out).encode())
            os._exit(0)
        with os.fdopen(self._result) as f:
            text = f.read()
        if not text:
            raise RuntimeError("the second Hogwild process ended without its figures")
        other = json.loads(text)
        _, status = os.waitpid(self.pid, 0)
        if status:
            raise RuntimeError(f"the second Hogwild process ended with status {status}")
        both = [out, other]
        out = {"train_examples": sum(x["train_examples"] for x in both),
               "train_cpu_seconds": sum(x["train_cpu_seconds"] for x in both),
               "train_seconds": max(x["train_seconds"] for x in both)}
        out["examples_per_sec"] = out["train_examples"] / out["train_seconds"]
        return out


def _train_data_parallel(torch, rank, world, items, mlp, pooled, dense_opt, sparse_opt,
                         width):
    """One pass of ``items`` (this process's batches) by one of ``world`` data-parallel
    processes (torch.distributed, gloo on 127.0.0.1), each with the whole table and
    the whole fc stack; returns the examples this process trained on.

    A step: the processes' batches' table rows are all-gathered (the next step's
    gather travels during this step, as TorchRec's pipelines send a batch's ids
    ahead), every process pools the rows of every batch (the embedding's forward),
    runs the fc stack on its own batch, and all-gathers in one message its pooled
    rows' gradients and its fc gradients; each process then runs the embedding's
    backward (the table's fused update) over every batch's rows with every
    process's gradients, and the fc's Adam step on the summed fc gradients: the
    replicas stay equal, and a step is the synchronous step of the processes'
    batches together (each loss weighted by its share of the examples). The pass
    ends at the first step some process has no batch for."""
    import torch.distributed as dist
    params = list(mlp.parameters())
    n_dense = sum(p.numel() for p in params)
    ids = [torch.empty(1 + BATCH * 26, dtype=torch.int64) for _ in range(2)]
    ids_all = [[torch.empty_like(ids[0]) for _ in range(world)] for _ in range(2)]
    flat = torch.zeros(BATCH * width + n_dense)
    flat_all = [torch.empty_like(flat) for _ in range(world)]

    def send_ids(slot, item):   # n = 0: this process has no batch left
        n = item[3] if item is not None else 0
        ids[slot][0] = n
        if n:
            ids[slot][1:1 + item[0].numel()] = item[0]
        return dist.all_gather(ids_all[slot], ids[slot], async_op=True)

    items = iter(items)
    item, slot, examples = next(items, None), 0, 0
    pending = send_ids(slot, item)
    while True:
        following = next(items, None)   # read while the ids travel
        pending.wait()
        ns = [int(t[0]) for t in ids_all[slot]]
        if min(ns) == 0:
            return examples
        pending = send_ids(1 - slot, following)
        rows, dense, labels, n = item
        total, first = sum(ns), sum(ns[:rank])
        # slot-major, as the pooling takes them: slot 0 of every process's batch first
        rows_all = torch.cat([t[1:1 + 26 * k].view(26, k) for t, k in zip(ids_all[slot], ns)],
                             1).reshape(-1)
        pooled_all = pooled(rows_all, total)
        own = pooled_all.detach()[first:first + n].requires_grad_(True)
        logits = mlp(torch.cat([own, dense], dim=1))
        loss = torch.nn.functional.cross_entropy(logits, labels) * (n / total)
        dense_opt.zero_grad(set_to_none=True)
        if sparse_opt is not None:
            sparse_opt.zero_grad(set_to_none=True)
        loss.backward()
        flat[:n * width] = own.grad.reshape(-1)
        torch.cat([p.grad.reshape(-1) for p in params], out=flat[BATCH * width:])
        dist.all_gather(flat_all, flat)
        pooled_all.backward(torch.cat([t[:k * width].view(k, width)
                                       for t, k in zip(flat_all, ns)]))
        summed = torch.stack([t[BATCH * width:] for t in flat_all]).sum(0)
        at = 0
        for p in params:
            p.grad.copy_(summed[at:at + p.numel()].view_as(p))
            at += p.numel()
        dense_opt.step()
        if sparse_opt is not None:
            sparse_opt.step()
        examples += n
        item, slot = following, 1 - slot


def run_torch(kind, data, args):
    """``train_torch`` in a child process and session of its own (``...-2p``: that
    child starts the second data-parallel process, in its session); ``{"skipped":
    why}`` if its packages are not installed."""
    world = 2 if kind.endswith("-2p") else 1
    threads = 1 if world > 1 or kind.endswith("-hw") else args.torch_threads   # a core a process
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind,
           "--child-data", json.dumps(data), "--torch-threads", str(threads),
           "--sparse-lr", str(args.sparse_lr), "--child-rank", f"0,{world},{_free_port()}",
           "--timeout", str(args.timeout)] + (["--torch-preload"] if args.torch_preload else [])
    p = subprocess.run(cmd, env=_env(threads), capture_output=True, text=True,
                       timeout=args.timeout + 60, start_new_session=True, check=False)
    if p.returncode == 3:
        return {"skipped": p.stdout.strip().splitlines()[-1]}
    if p.returncode:
        raise RuntimeError(f"{kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _peers(argv, world, timeout):
    """Ranks 1.. of a data-parallel trainer, started by rank 0 (``argv``: its own sys.argv,
    script first) in its session, so the processes together get one session's share
    of a loaded machine as pyfleet's launcher and its roles do; ``collect()`` waits for
    them and returns their summaries."""
    at = argv.index("--child-rank") + 1
    _, _, port = argv[at].split(",")
    procs = []
    for rank in range(1, world):
        cmd = [*argv[:at], f"{rank},{world},{port}", *argv[at + 1:]]
        procs.append(subprocess.Popen([sys.executable, *cmd], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))

    def collect():
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=timeout)
                if p.returncode:
                    raise RuntimeError(f"rank {len(outs) + 1} failed:\n{err[-3000:]}")
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return outs
    return collect


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(kind, data, threads, sparse_lr, preload=False, rank_spec="0,1,0",
           timeout=1800.0):
    need = {"torch": ["torch"], "fusedebc": ["torch", "fbgemm_gpu", "torchrec"],
            "fbgemm": ["torch", "fbgemm_gpu"]}[_base(kind)]
    for mod in need:
        try:
            __import__(mod)
        except Exception as e:  # an ABI mismatch raises OSError, not ImportError
            print(f"{mod} not usable: {type(e).__name__}: {str(e)[:200]}")
            return 3
    sys.path.insert(0, str(REPO))
    rank, world, port = (int(x) for x in rank_spec.split(","))
    if world > 1:
        from datetime import timedelta

        import torch.distributed as dist
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        collect = _peers(sys.argv, world, timeout) if rank == 0 else None
        # a peer that died is an error within the timeout, not a hang
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=120))
    r = train_torch(kind, data, threads, sparse_lr, preload, rank, world)
    if world > 1 and rank == 0:   # examples/s of the processes together: all their
        rs = [r, *collect()]      # examples over the longer clock
        r.update(train_examples=sum(x["train_examples"] for x in rs),
                 train_cpu_seconds=sum(x["train_cpu_seconds"] for x in rs),
                 train_seconds=max(x["train_seconds"] for x in rs))
        r["examples_per_sec"] = r["train_examples"] / r["train_seconds"]
    print(json.dumps(r))
    return 0


# ---------------------------------------------------------------- main

def _versions():
    out = {}
    for mod in ("torch", "fbgemm_gpu", "torchrec"):
        p = subprocess.run([sys.executable, "-c", f"import {mod}; print({mod}.__version__)"],
                           capture_output=True, text=True, check=False)
        out[mod] = p.stdout.strip() if p.returncode == 0 else "not usable"
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", nargs="+", default=["async", "sync", "torch", "fusedebc",
                                                  "fbgemm"],
                    choices=[*PYFLEET_RUNS, *TORCH_RUNS])
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--torch-preload", action="store_true",
                    help="the torch trainers read and map every training batch before "
                         "their clock starts (their examples/s is then the step alone; "
                         "pyfleet's runs still read as they train)")
    ap.add_argument("--sparse-lr", type=float, default=0.05,
                    help="row-wise Adagrad's learning rate of the TorchRec and FBGEMM "
                         "tables (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="pyfleet gen-data --seed")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(),
                                                    "pyfleet-bench-vs-torchrec"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a run's --json "
                                                     "file again, and run nothing")
    ap.add_argument("--child", choices=TORCH_RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--child-data", help=argparse.SUPPRESS)
    ap.add_argument("--child-rank", default="0,1,0", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child, json.loads(args.child_data), args.torch_threads,
                      args.sparse_lr, args.torch_preload, args.child_rank, args.timeout)

    if args.report:
        with open(args.report) as f:
            results = json.load(f)["results"]
        _report(results, max(r["round"] for r in results))
        return 0
    data = harness.generated_rows(args.cache, args.rows, args.seed)
    print(f"{args.rows:,} generated rows in {Path(data['train']).parent}; ground-truth test "
          f"AUC {data['truth_auc']:.4f}; {os.cpu_count()} cores; versions "
          f"{_versions()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-torchrec-") as run_root:
        for rnd in range(1, args.rounds + 1):
            for name in args.runs:
                load0 = os.getloadavg()[0]
                r = (run_pyfleet(name, data, run_root, args.timeout) if name in PYFLEET_RUNS
                     else run_torch(name, data, args))
                r.update(round=rnd, run=name, load=(load0, os.getloadavg()[0]))
                results.append(r)
                if "skipped" in r:
                    print(f"  round {rnd} {name:>10}: skipped ({r['skipped']})", flush=True)
                else:
                    print(f"  round {rnd} {name:>10}: {r['examples_per_sec']:>9,.0f} "
                          f"examples/s  test AUC {r['test_auc']:.4f}  load "
                          f"{r['load'][0]:.1f}-{r['load'][1]:.1f}", flush=True)
    _report(results, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": args.rows, "truth_auc": data["truth_auc"],
                       "results": results}, f, indent=1)
    return 0


def _anchor(rows):
    """The round's reference: the fastest TorchRec path, else single-process torch."""
    trec = [r for r in rows if r["run"] in TORCHREC_RUNS and "skipped" not in r]
    if trec:
        best = max(trec, key=lambda r: r["examples_per_sec"])
        return best["run"], best
    plain = [r for r in rows if r["run"] == "torch" and "skipped" not in r]
    return ("torch", plain[0]) if plain else (None, None)


def _train_cpu_ms(r):
    batches = r["train_examples"] / BATCH
    if r["run"] in PYFLEET_RUNS:
        c = r["cpu_seconds"]
        worker = r.get("worker_train_cpu_seconds")
        if worker is None:   # the workers' whole life instead
            worker = c.get("worker_user", 0) + c.get("worker_kernel", 0)
        cpu = worker + c.get("server_user", 0) + c.get("server_kernel", 0)
    else:
        cpu = r["train_cpu_seconds"]
    return cpu / batches * 1e3


def _report(results, rounds):
    print()
    print(f"{'round':>5} {'run':>11} {'examples/s':>11} {'ratio':>6} {'vs':>9} "
          f"{'test AUC':>9} {'AUC diff':>9} {'load':>9} {'cpu ms':>7} {'limit/2c':>9}")
    for rnd in range(1, rounds + 1):
        rows = [r for r in results if r["round"] == rnd]
        name, ref = _anchor(rows)
        for r in rows:
            if "skipped" in r:
                print(f"{rnd:>5} {r['run']:>11} {'skipped':>11}")
                continue
            ratio = f"{r['examples_per_sec'] / ref['examples_per_sec']:>6.2f}" if ref else \
                f"{'-':>6}"
            diff = f"{r['test_auc'] - ref['test_auc']:>+9.4f}" if ref else f"{'-':>9}"
            cpu = _train_cpu_ms(r)
            print(f"{rnd:>5} {r['run']:>11} {r['examples_per_sec']:>11,.0f} {ratio} "
                  f"{name or '-':>9} {r['test_auc']:>9.4f} {diff} "
                  f"{r['load'][0]:>4.1f}-{r['load'][1]:<4.1f} {cpu:>7.2f} "
                  f"{2 * BATCH / cpu * 1e3:>9,.0f}")
    print("(cpu ms: CPU per batch of 512, all threads: the training loop of a torch "
          "process; pyfleet's workers' training loops plus its servers' whole life; "
          "limit/2c: the examples/s two idle cores would give at that CPU: on a loaded "
          "machine the figure that moves least)")
    pf = [r for r in results if r["run"] in PYFLEET_RUNS]
    if not pf:
        return
    print()
    print("CPU per batch of 512 training examples, ms (whole life of every process: "
          "start, train pass, test pass)")
    print(f"{'round':>5} {'run':>11} {'worker':>7} {'w.kern':>7} {'server':>7} "
          f"{'s.kern':>7} {'other':>7} {'total':>7} {'kern %':>7} {'limit/2c':>9}")
    for r in pf:
        c, batches = r["cpu_seconds"], r["train_examples"] / BATCH
        ms = {k: v / batches * 1e3 for k, v in c.items()}
        total = sum(ms.values())
        kern = sum(v for k, v in ms.items() if k.endswith("_kernel"))
        other = ms.get("other_user", 0.0) + ms.get("other_kernel", 0.0)
        print(f"{r['round']:>5} {r['run']:>11} {ms.get('worker_user', 0):>7.2f} "
              f"{ms.get('worker_kernel', 0):>7.2f} {ms.get('server_user', 0):>7.2f} "
              f"{ms.get('server_kernel', 0):>7.2f} {other:>7.2f} {total:>7.2f} "
              f"{kern / total if total else 0:>7.0%} {2 * BATCH / total * 1e3:>9,.0f}")
    print("(worker/server: user time, w.kern/s.kern: kernel time of those processes; "
          "other: the launcher and mpirun; limit/2c: the examples/s two idle cores would "
          "give at that CPU per batch)")


if __name__ == "__main__":
    sys.exit(main())

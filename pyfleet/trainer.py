"""The training job behind ``pyfleet train``: one function per role, driven by a job file.

``pyfleet train`` writes ``job.json`` into the run directory and starts a local
cluster with :func:`pyfleet.launch.launch_local`; every role runs
``python -m pyfleet.trainer RUN_DIR/job.json`` and learns its role from the
launcher's environment contract (``fleet.init()`` with no argument), exactly as
a user's own Fleet script would. The same command runs a role on a real
cluster, with the environment set by mpirun or Kubernetes.

Every worker reads its share of the training files (``Dataset`` with
``worker_index``/``worker_num``), trains the chosen model for ``epochs``
passes, evaluates its share of the test files and writes
``RUN_DIR/worker<i>.json`` (throughput, and the statistics of its test
predictions); worker 0 also writes ``metrics.jsonl`` (one line per progress
report), saves the checkpoint (``RUN_DIR/checkpoint``) after every pass and the
inference model (``RUN_DIR/model``) at the end. :func:`summarize` combines the
workers' files: the test AUC and logloss are computed from every worker's
predictions together, never from worker 0's alone.
"""

import gc
import json
import os
import sys
import time

import numpy as np

__all__ = ["JOB_DEFAULTS", "entry_of", "feed_of", "optimizer_of", "run_role", "summarize",
           "tables_of", "train_local"]

JOB_DEFAULTS = {
    "train": None, "test": None, "format": "criteo", "model": "dnn", "embedding_dim": 16,
    "layers": [256, 128, 64], "lr": 0.001, "batch_size": 512, "epochs": 1, "mode": "async",
    "seed": 0, "run_dir": None, "resume": None, "first_pass": 1, "progress_interval": 2.0,
    "request_timeout": 60.0, "connect_timeout": 120.0, "barrier_timeout": 300.0,
    "heartbeat_timeout": 10.0, "save_model": True, "geo_k_steps": 100,
    "admission_count": None, "show_click": False, "shrink_min_score": None,
    "shrink_decay": 0.98, "shrink_unseen_passes": None, "optimizer": None,
}


def optimizer_of(job):
    """The job's optimizer: ``job["optimizer"]`` is ``{"name": adam|adagrad|sgd|ftrl,
    "learning_rate": ..., <its parameters>}``; without one (older job files),
    Adam at ``job["lr"]``."""
    from pyfleet import optimizer as opt
    spec = dict(job.get("optimizer") or {"name": "adam", "learning_rate": job["lr"]})
    cls = {"adam": opt.Adam, "adagrad": opt.Adagrad, "sgd": opt.SGD, "ftrl": opt.FTRL}
    name = spec.pop("name")
    if name not in cls:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(cls)}")
    return cls[name](**spec)


def feed_of(batch, model):
    """The feed dict of a :class:`pyfleet.data.Batch` for a :mod:`pyfleet.models`
    network: no per-example Python (CSR slots go in as ``(ids, offsets)``)."""
    feed = {model.dense_input.name: batch.dense,
            model.label.name: batch.labels.astype(np.int64).reshape(-1, 1)}
    for var, (ids, offsets) in zip(model.slots, batch.sparse):
        feed[var.name] = (ids, offsets)
    return feed


def _prefetching(batches, exe, program, model):
    """``(batch, feed)`` pairs, each yielded after :meth:`Executor.prefetch` of
    the next one: its ids are deduplicated and (async remote backend) its
    sparse pull started, so that pull travels while this step computes."""
    it = iter(batches)
    batch = next(it, None)
    feed = None if batch is None else feed_of(batch, model)
    if feed is not None:
        exe.prefetch(program, feed)
    while batch is not None:
        nxt = next(it, None)
        nxt_feed = None if nxt is None else feed_of(nxt, model)
        if nxt_feed is not None:
            exe.prefetch(program, nxt_feed)
        yield batch, feed
        batch, feed = nxt, nxt_feed


def _dataset(job, paths, worker_index, worker_num, shuffle=False, prefetch=4):
    from pyfleet.data import Dataset
    return Dataset(paths, format=job["format"], batch_size=job["batch_size"],
                   worker_index=worker_index, worker_num=worker_num, shuffle=shuffle,
                   seed=job["seed"], prefetch=prefetch)


def build_program(job, n_dense, n_slots):
    """``(main, startup, model)`` of the job's network (no optimizer yet)."""
    from pyfleet import fluid, models
    main, startup = fluid.Program(), fluid.Program()
    main.random_seed = startup.random_seed = int(job["seed"])
    with fluid.program_guard(main, startup):
        model = models.build(job["model"], num_dense=n_dense, num_slots=n_slots,
                             embedding_dim=int(job["embedding_dim"]),
                             layers=tuple(int(x) for x in job["layers"]))
    return main, startup, model


def tables_of(job):
    """The table configs of the job's program (``pyfleet._fleet.table_configs``):
    what a checkpoint it resumes from must hold."""
    from pyfleet import fluid
    from pyfleet._fleet import table_configs
    job = {**JOB_DEFAULTS, **job}
    with fluid.unique_name.guard():  # the names a role's first program gets
        main, startup, model = build_program(job, job["n_dense"], job["n_slots"])
        with fluid.program_guard(main, startup):
            optimizer_of(job).minimize(model.avg_cost)
    return table_configs(main, entry_of(job))[0]


def strategy_of(job):
    from pyfleet.config import DistributeTranspilerConfig
    cfg = DistributeTranspilerConfig()
    cfg.mode = job["mode"]
    cfg.geo_k_steps = int(job["geo_k_steps"])
    rt = cfg.runtime
    rt.request_timeout = job["request_timeout"]
    rt.connect_timeout = job["connect_timeout"]
    rt.barrier_timeout = job["barrier_timeout"]
    rt.heartbeat_timeout = job["heartbeat_timeout"]
    return cfg


def show_click_of(batch):
    """``(ids, shows, clicks)`` of a batch: every distinct feature id, the
    instances it appears in (once per appearance), and the clicks among them
    (Paddle's CTR accessor counts). Vectorized over slots and ids."""
    ids = np.concatenate([ids for ids, _ in batch.sparse])
    rows = np.concatenate([np.repeat(np.arange(len(batch)), np.diff(offsets))
                           for _, offsets in batch.sparse])
    uniq, inverse = np.unique(ids, return_inverse=True)
    shows = np.bincount(inverse, minlength=uniq.shape[0]).astype(np.float32)
    clicks = np.bincount(inverse, weights=batch.labels[rows],
                         minlength=uniq.shape[0]).astype(np.float32)
    return uniq, shows, clicks


def _shrink_args(job):
    args = {}
    if job.get("shrink_min_score") is not None:
        args["min_score"] = float(job["shrink_min_score"])
        args["decay"] = float(job.get("shrink_decay", 0.98))
    if job.get("shrink_unseen_passes") is not None:
        args["max_unseen_passes"] = int(job["shrink_unseen_passes"])
    return args


def entry_of(job):
    """The sparse tables' admission policy: ``CountFilterEntry(admission_count)``
    when the job sets one (keys become rows after that many pulls), else None."""
    n = job.get("admission_count")
    if n is None:
        return None
    from pyfleet.entry import CountFilterEntry
    return CountFilterEntry(int(n))


class _Progress:
    """Running loss/AUC and throughput, printed every ``interval`` seconds.

    Predictions are buffered and counted into the statistics a chunk at a
    time (at most ``_CHUNK`` examples, and at every report): the statistics
    are additive, and a few large updates cost a fraction of one per batch."""

    _CHUNK = 1 << 15

    def __init__(self, interval, metrics_path, worker_index):
        from pyfleet.metrics import MetricStats
        self.stats = MetricStats()
        self.window = MetricStats()
        self.interval = float(interval)
        self.metrics = open(metrics_path, "a") if metrics_path else None
        self.worker = worker_index
        self.start = self.last = time.perf_counter()
        self.examples = 0
        self.steps = 0
        self.loss_sum = 0.0
        self._preds, self._labels, self._buffered = [], [], 0

    def update(self, epoch, pred, labels, loss):
        n = labels.shape[0]
        self.examples += n
        self.steps += 1
        self.loss_sum += float(loss) * n
        self._preds.append(pred)
        self._labels.append(labels)
        self._buffered += n
        if self._buffered >= self._CHUNK:
            self.drain()
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.report(epoch, now)

    def drain(self):
        """Count the buffered predictions into ``stats`` and the report window."""
        if not self._preds:
            return
        from pyfleet.metrics import MetricStats
        chunk = MetricStats().update(np.concatenate(self._preds), np.concatenate(self._labels))
        self._preds, self._labels, self._buffered = [], [], 0
        self.stats.merge(chunk)
        self.window.merge(chunk)

    def report(self, epoch, now=None):
        self.drain()
        if self.window.count == 0:
            return
        now = now or time.perf_counter()
        rate = self.examples / max(now - self.start, 1e-9)
        line = {"time": time.time(), "worker": self.worker, "pass": epoch, "step": self.steps,
                "examples": self.examples, "examples_per_sec": rate,
                "loss": self.window.logloss(), "auc": self.stats.auc(),
                "window_auc": self.window.auc()}
        print(f"pass {epoch}  step {self.steps:>6}  examples {self.examples:>10,}  "
              f"{rate:>9,.0f} ex/s  loss {line['loss']:.4f}  auc {line['auc']:.4f}",
              flush=True)
        if self.metrics:
            self.metrics.write(json.dumps(line) + "\n")
            self.metrics.flush()
        from pyfleet.metrics import MetricStats
        self.window = MetricStats()
        self.last = now

    def close(self):
        self.drain()
        if self.metrics:
            self.metrics.close()


def _malformed_of(data):
    """``{"malformed", "first_malformed": ["file:line: reason", ...]}`` of a
    dataset's latest pass."""
    from pyfleet.data.readers import describe_malformed
    st = data.stats()
    return {"malformed": st["malformed"], "first_malformed": describe_malformed(st)}


def run_role(job):
    """Run this process's role (from the environment contract) of the job."""
    from pyfleet import fluid
    from pyfleet import fleet

    job = {**JOB_DEFAULTS, **job}
    run_dir = job["run_dir"]
    n_dense, n_slots = job.get("n_dense"), job.get("n_slots")
    if n_dense is None or n_slots is None:  # servers may not see the data: the CLI fills these
        schema = _dataset(job, job["train"], 0, 1, prefetch=0).schema
        n_dense, n_slots = schema.n_dense, schema.n_slots
    main, startup, model = build_program(job, n_dense, n_slots)
    fleet.init()
    with fluid.program_guard(main, startup):
        fleet.distributed_optimizer(optimizer_of(job), strategy_of(job),
                                    sparse_entry=entry_of(job)).minimize(model.avg_cost)

    if fleet.is_server():
        resume = job["resume"]
        try:
            fleet.init_server(os.path.join(resume, "checkpoint") if resume else None)
        except ValueError as e:  # damaged, incomplete, another model's: it says which file
            raise SystemExit(f"pyfleet server {fleet.server_index()}: cannot load "
                             f"{resume}/checkpoint: {e}") from None
        fleet.run_server()
        return 0

    wi, wn = fleet.worker_index(), fleet.worker_num()
    fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    test_program = main.clone(for_test=True)
    test_program._backend = main._backend
    progress = _Progress(job["progress_interval"],
                         os.path.join(run_dir, "metrics.jsonl") if wi == 0 else None, wi)
    # The program, tables and modules are long-lived: keep the cyclic
    # collector from re-scanning them during every collection of a step's garbage.
    gc.freeze()
    train_seconds = train_cpu = 0.0
    history = []
    # One dataset for every pass: each pass is shuffled by (seed, pass number).
    # A resumed job starts at the pass after its checkpoint's, in the order an
    # uninterrupted run would read it.
    first = int(job["first_pass"])
    data = _dataset(job, job["train"], wi, wn, shuffle=True)
    data.set_pass(first)
    for epoch in range(first, first + int(job["epochs"])):
        t0, c0 = time.perf_counter(), time.process_time()
        for batch, feed in _prefetching(data, exe, main, model):
            loss, pred = exe.run(main, feed=feed, fetch_list=[model.avg_cost, model.predict])
            progress.update(epoch, pred.reshape(-1), batch.labels, loss.reshape(-1)[0])
            if job["show_click"]:
                fleet.push_show_click(*show_click_of(batch))
        train_seconds += time.perf_counter() - t0
        train_cpu += time.process_time() - c0
        progress.report(epoch)
        history.append({"pass": epoch, "examples": progress.examples,
                        "seconds": train_seconds, **_malformed_of(data)})
        fleet.barrier_worker()  # every worker finished the pass: the checkpoint is of it
        if wi == 0:
            if _shrink_args(job):  # end of pass: decay show/click, drop stale rows
                fleet.shrink(**_shrink_args(job))
            fleet.save_persistables(exe, os.path.join(run_dir, "checkpoint"),
                                    meta={"pass": epoch})
    progress.close()

    from pyfleet.metrics import MetricStats
    test_stats = MetricStats()
    preds, labels = [], []
    test_read = {"malformed": 0, "first_malformed": []}
    if job["test"]:
        test_data = _dataset(job, job["test"], wi, wn)
        for batch in test_data:
            (pred,) = exe.run(test_program, feed=feed_of(batch, model),
                              fetch_list=[model.predict])
            preds.append(pred.reshape(-1))
            labels.append(batch.labels)
        if preds:
            test_stats.update(np.concatenate(preds), np.concatenate(labels))
        test_read = _malformed_of(test_data)
    result = {"worker": wi, "examples": progress.examples, "train_seconds": train_seconds,
              "train_cpu_seconds": train_cpu,
              "passes": history, "test_stats": test_stats.to_json(),
              "train_stats": progress.stats.to_json(), "test_read": test_read}
    if preds:
        np.savez(os.path.join(run_dir, f"worker{wi}.test.npz"), pred=np.concatenate(preds),
                 label=np.concatenate(labels))
    if wi == 0:
        result["servers"] = fleet.stats()
        if job["save_model"]:
            try:
                fleet.save_inference_model(exe, os.path.join(run_dir, "model"),
                                           [v.name for v in model.inputs if v is not model.label],
                                           [model.predict])
            except ImportError as e:  # inference export not available in this build
                print(f"inference model not saved: {e}", file=sys.stderr)
    with open(os.path.join(run_dir, f"worker{wi}.json"), "w") as f:
        json.dump(result, f)
    fleet.stop_worker()
    return 0


def train_local(job):
    """Train and test the job's model in this process alone (a :class:`LocalBackend`,
    no servers): the baseline the distributed runs are compared with. Returns
    the summary keys :func:`summarize` gives (``train_examples_per_sec``,
    ``test_auc``, ...) for one worker."""
    from pyfleet import fluid
    from pyfleet.metrics import exact_auc, logloss

    job = {**JOB_DEFAULTS, **job}
    n_dense, n_slots = job.get("n_dense"), job.get("n_slots")
    if n_dense is None or n_slots is None:
        schema = _dataset(job, job["train"], 0, 1, prefetch=0).schema
        n_dense, n_slots = schema.n_dense, schema.n_slots
    main, startup, model = build_program(job, n_dense, n_slots)
    with fluid.program_guard(main, startup):
        optimizer_of(job).minimize(model.avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    progress = _Progress(float("inf"), None, 0)   # the workers' bookkeeping, never printed
    gc.freeze()   # as run_role
    seconds = cpu = 0.0
    data = _dataset(job, job["train"], 0, 1, shuffle=True)  # as run_role: one for every pass
    for epoch in range(1, int(job["epochs"]) + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        for batch in data:
            loss, pred = exe.run(main, feed=feed_of(batch, model),
                                 fetch_list=[model.avg_cost, model.predict])
            progress.update(epoch, pred.reshape(-1), batch.labels, loss.reshape(-1)[0])
        progress.drain()
        seconds += time.perf_counter() - t0
        cpu += time.process_time() - c0
    train, examples = progress.stats, progress.examples
    summary = {"workers": 1, "train_examples": examples, "train_seconds": seconds,
               "train_cpu_seconds": cpu,
               "train_examples_per_sec": examples / max(seconds, 1e-9),
               "train_logloss": train.logloss(), "train_auc": train.auc()}
    if job["test"]:
        test_program = main.clone(for_test=True)
        test_program._backend = main._backend
        preds, labels = [], []
        for batch in _dataset(job, job["test"], 0, 1):
            (pred,) = exe.run(test_program, feed=feed_of(batch, model),
                              fetch_list=[model.predict])
            preds.append(pred.reshape(-1))
            labels.append(batch.labels)
        if preds:
            pred, label = np.concatenate(preds), np.concatenate(labels)
            summary.update(test_examples=int(label.shape[0]),
                           test_auc=float(exact_auc(pred, label)),
                           test_logloss=float(logloss(pred, label)))
    return summary


def summarize(run_dir, workers):
    """Combine every worker's file into the job summary (a JSON-friendly dict)."""
    from pyfleet.metrics import MetricStats, exact_auc, logloss
    results = []
    for i in range(workers):
        with open(os.path.join(run_dir, f"worker{i}.json")) as f:
            results.append(json.load(f))
    test = MetricStats.sum([MetricStats.from_json(r["test_stats"]) for r in results])
    train = MetricStats.sum([MetricStats.from_json(r["train_stats"]) for r in results])
    summary = {"workers": workers, "train_examples": sum(r["examples"] for r in results)}
    seconds = max(r["train_seconds"] for r in results)
    summary["train_seconds"] = seconds
    # CPU of the workers' training loops (all threads: parsing, pushes), summed.
    summary["train_cpu_seconds"] = sum(r.get("train_cpu_seconds", 0.0) for r in results)
    summary["train_examples_per_sec"] = summary["train_examples"] / max(seconds, 1e-9)
    summary["train_logloss"] = train.logloss()
    summary["train_auc"] = train.auc()
    # Malformed lines skipped in the last pass (each worker reads its own share).
    last = [r["passes"][-1] for r in results if r.get("passes")]
    summary["train_malformed"] = sum(p.get("malformed", 0) for p in last)
    summary["first_malformed"] = [m for p in last for m in p.get("first_malformed", [])][:3]
    tests = [r.get("test_read") or {} for r in results]
    summary["test_malformed"] = sum(t.get("malformed", 0) for t in tests)
    summary["first_test_malformed"] = [m for t in tests for m in t.get("first_malformed", [])][:3]
    parts = [np.load(os.path.join(run_dir, f"worker{i}.test.npz"))
             for i in range(workers)
             if os.path.exists(os.path.join(run_dir, f"worker{i}.test.npz"))]
    if parts:
        pred = np.concatenate([p["pred"] for p in parts])
        label = np.concatenate([p["label"] for p in parts])
        summary["test_examples"] = int(label.shape[0])
        summary["test_auc"] = float(exact_auc(pred, label))
        summary["test_auc_bucketed"] = test.auc()
        summary["test_logloss"] = float(logloss(pred, label))
    servers = results[0].get("servers") or []
    rows = {}
    for s in servers:
        for name, t in s.get("tables", {}).items():
            if "rows" in t:
                rows[name] = rows.get(name, 0) + int(t["rows"])
    summary["table_rows"] = rows
    summary["server_rss_bytes"] = [int(s.get("rss_bytes", 0)) for s in servers]
    return summary


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pyfleet.trainer JOB.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        job = json.load(f)
    return run_role(job)


if __name__ == "__main__":
    sys.exit(main())

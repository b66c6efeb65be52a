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
import logging
import os
import shutil
import sys
import time

import numpy as np

from pyfleet import fluid, models
from pyfleet import optimizer as _opt
from pyfleet._atomic import write_json
from pyfleet.config import DistributeTranspilerConfig
from pyfleet.data import DataError, Dataset
from pyfleet.data.readers import describe_malformed
from pyfleet.distributed.fleet import fleet, table_configs
from pyfleet.entry import CountFilterEntry
from pyfleet.metrics import MetricStats, exact_auc, logloss
from pyfleet.service import checkpoint as _checkpoint

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
    "valid_fraction": None, "keep": None, "keep_best": False, "log_level": "info",
}

log = logging.getLogger("pyfleet.trainer")


def optimizer_of(job):
    """The job's optimizer: ``job["optimizer"]`` is ``{"name": adam|adagrad|sgd|ftrl,
    "learning_rate": ..., <its parameters>}``; without one (older job files),
    Adam at ``job["lr"]``."""
    spec = dict(job.get("optimizer") or {"name": "adam", "learning_rate": job["lr"]})
    cls = {"adam": _opt.Adam, "adagrad": _opt.Adagrad, "sgd": _opt.SGD, "ftrl": _opt.FTRL}
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


def _dataset(job, paths, worker_index, worker_num, shuffle=False, prefetch=4, side=None):
    """``side``: "train" or "valid" with ``job["valid_fraction"]``: that side of
    the rows held out (by their content, whatever reads them)."""
    holdout = None
    if side is not None and job.get("valid_fraction"):
        holdout = (float(job["valid_fraction"]), side)
    return Dataset(paths, format=job["format"], batch_size=job["batch_size"],
                   worker_index=worker_index, worker_num=worker_num, shuffle=shuffle,
                   seed=job["seed"], prefetch=prefetch, holdout=holdout)


def build_program(job, n_dense, n_slots):
    """``(main, startup, model)`` of the job's network (no optimizer yet)."""
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
    job = {**JOB_DEFAULTS, **job}
    with fluid.unique_name.guard():  # the names a role's first program gets
        main, startup, model = build_program(job, job["n_dense"], job["n_slots"])
        with fluid.program_guard(main, startup):
            optimizer_of(job).minimize(model.avg_cost)
    return table_configs(main, entry_of(job))[0]


def strategy_of(job):
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
    return CountFilterEntry(int(n))


class _Progress:
    """Running loss/AUC and throughput of this worker.

    Every ``interval`` seconds (and at the end of every pass) the worker's
    cumulative counts are written to ``status_path``
    (``RUN_DIR/progress/worker<i>.json``, replaced whole): ``pyfleet train``
    sums every worker's into one line for the job and into ``metrics.jsonl``.
    The counts are additive (loss sums, AUC bucket counts), so the job's
    figures are exact, not averages of the workers'.

    Predictions are buffered and counted into the statistics a chunk at a
    time (at most ``_CHUNK`` examples, and at every report): a few large
    updates cost a fraction of one per batch."""

    _CHUNK = 1 << 15

    def __init__(self, interval, status_path, worker_index):
        self.stats = MetricStats()
        self.interval = float(interval)
        self.status_path = status_path
        self.worker = worker_index
        self.start = self.last = time.perf_counter()
        self.examples = 0
        self.steps = 0
        self.loss_sum = 0.0
        self.pass_start = 0  # examples before this pass
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
            self.report(epoch, now=now)

    def drain(self):
        """Count the buffered predictions into ``stats``."""
        if not self._preds:
            return
        chunk = MetricStats().update(np.concatenate(self._preds), np.concatenate(self._labels))
        self._preds, self._labels, self._buffered = [], [], 0
        self.stats.merge(chunk)

    def report(self, epoch, now=None, done=False):
        self.drain()
        now = now or time.perf_counter()
        self.last = now
        if not self.status_path:
            return
        status = {"time": time.time(), "worker": self.worker, "pass": epoch,
                  "pass_done": done, "pass_examples": self.examples - self.pass_start,
                  "step": self.steps,
                  "examples": self.examples, "loss_sum": self.loss_sum,
                  "seconds": now - self.start, "stats": self.stats.to_json()}
        _replace_json(self.status_path, status)

    def close(self):
        self.drain()


def _replace_json(path, obj):
    """Replace ``path`` by ``obj`` as JSON (a reader sees the old or the new
    file whole; no fsync: these files only report progress)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


class _Events:
    """Worker 0's announcements of the job's phases, one JSON object a line in
    ``RUN_DIR/progress/events.jsonl``: ``pyfleet train`` prints them as they
    come and records the test results in ``metrics.jsonl``."""

    def __init__(self, path):
        self.path = path

    def __call__(self, event, **fields):
        if self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def _finite(x):
    """A float that JSON (and a manifest's meta) can hold: NaN becomes None."""
    x = float(x)
    return x if np.isfinite(x) else None


def _evaluate(exe, program, model, data):
    """``(pred, label)`` of every example of ``data``."""
    preds, labels = [], []
    for batch in data:
        (pred,) = exe.run(program, feed=feed_of(batch, model), fetch_list=[model.predict])
        preds.append(pred.reshape(-1))
        labels.append(batch.labels)
    if not preds:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    return np.concatenate(preds), np.concatenate(labels)


def _pass_metrics(run_dir, epoch, workers):
    """The test AUC and logloss of pass ``epoch`` over every worker's
    predictions together (exact, not an average of the workers')."""
    parts = [np.load(_test_file(run_dir, epoch, i)) for i in range(workers)]
    pred = np.concatenate([p["pred"] for p in parts])
    label = np.concatenate([p["label"] for p in parts])
    if label.shape[0] == 0:
        return {"pass": epoch, "test_examples": 0, "test_auc": None, "test_logloss": None}
    return {"pass": epoch, "test_examples": int(label.shape[0]),
            "test_auc": _finite(exact_auc(pred, label)),
            "test_logloss": _finite(logloss(pred, label))}


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _test_file(run_dir, epoch, worker):
    return os.path.join(run_dir, "progress", f"test-pass{epoch}.worker{worker}.npz")


def snapshot_checkpoint(src, dst):
    """Copy checkpoint directory ``src`` (its manifest and the generations it
    names) to a new directory ``dst``. Generation files are never rewritten
    once written, so they are hard-linked when the filesystem allows (no
    bytes copied). The copy is assembled under a temporary name, its manifest
    written last, then renamed to ``dst``: ``dst`` exists only complete."""
    manifest = _checkpoint.read_manifest(src)
    if manifest is None:
        raise ValueError(f"{src} holds no checkpoint")
    tmp = f"{dst}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    for gen in manifest["chain"]:
        shutil.copytree(os.path.join(src, gen["dir"]), os.path.join(tmp, gen["dir"]),
                        copy_function=link)
    write_json(os.path.join(tmp, _checkpoint.MANIFEST_NAME), manifest, indent=1)
    os.rename(tmp, dst)


class _Keeper:
    """``--keep K`` and ``--keep-best``: after every pass's save into
    ``RUN_DIR/checkpoint``, a copy in ``RUN_DIR/checkpoints/pass-NNNN`` for the
    last K passes and for the best pass (highest test AUC), which
    ``RUN_DIR/checkpoints/best`` points to (a symbolic link, replaced
    atomically). A resumed run in the same directory continues the count and
    knows the best so far from the best copy's manifest."""

    def __init__(self, run_dir, keep, keep_best):
        self.dir = os.path.join(run_dir, "checkpoints")
        self.keep, self.keep_best = keep, keep_best
        self.best_pass = self.best_auc = None
        if keep_best:
            try:
                m = _checkpoint.read_manifest(os.path.join(self.dir, "best"))
            except ValueError:
                m = None
            meta = (m or {}).get("meta") or {}
            if meta.get("test_auc") is not None:
                self.best_pass, self.best_auc = meta.get("pass"), meta["test_auc"]

    @staticmethod
    def name(epoch):
        return f"pass-{epoch:04d}"

    def after_save(self, src, epoch, auc):
        """Keep what the options ask for; returns ``{"kept": [...], "best": pass}``."""
        if not self.keep and not self.keep_best:
            return {}
        os.makedirs(self.dir, exist_ok=True)
        new_best = self.keep_best and auc is not None and (
            self.best_auc is None or auc > self.best_auc)
        path = os.path.join(self.dir, self.name(epoch))
        if (self.keep or new_best) and not os.path.isdir(path):
            snapshot_checkpoint(src, path)
        if new_best:
            self.best_pass, self.best_auc = epoch, auc
            link = os.path.join(self.dir, "best")
            tmp = f"{link}.tmp.{os.getpid()}"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(self.name(epoch), tmp)
            os.replace(tmp, link)
        passes = sorted(int(d[5:]) for d in os.listdir(self.dir)
                        if d.startswith("pass-") and d[5:].isdigit())
        wanted = set(passes[-self.keep:]) if self.keep else set()
        if self.best_pass is not None:
            wanted.add(self.best_pass)
        for p in passes:
            if p not in wanted:
                shutil.rmtree(os.path.join(self.dir, self.name(p)), ignore_errors=True)
        return {"kept": [p for p in passes if p in wanted], "best": self.best_pass}


def _malformed_of(data):
    """``{"malformed", "first_malformed": ["file:line: reason", ...]}`` of a
    dataset's latest pass."""
    st = data.stats()
    return {"malformed": st["malformed"], "first_malformed": describe_malformed(st)}


def run_role(job):
    """Run this process's role (from the environment contract) of the job."""

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
        where = os.path.join(resume, "checkpoint") if resume else None
        log.info("server %d: %s", fleet.server_index(),
                 f"loading {where}" if where else "starting with fresh parameters")
        try:
            fleet.init_server(where)
        except ValueError as e:  # damaged, incomplete, another model's: it says which file
            raise SystemExit(f"pyfleet server {fleet.server_index()}: cannot load "
                             f"{resume}/checkpoint: {e}") from None
        fleet.run_server()
        log.info("server %d: stopped", fleet.server_index())
        return 0

    wi, wn = fleet.worker_index(), fleet.worker_num()
    fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    test_program = main.clone(for_test=True)
    test_program.set_backend(main.backend)
    progress_dir = os.path.join(run_dir, "progress")
    os.makedirs(progress_dir, exist_ok=True)
    progress = _Progress(job["progress_interval"],
                         os.path.join(progress_dir, f"worker{wi}.json"), wi)
    events = _Events(os.path.join(progress_dir, "events.jsonl") if wi == 0 else None)
    keeper = _Keeper(run_dir, job["keep"], job["keep_best"]) if wi == 0 else None
    # The program, tables and modules are long-lived: keep the cyclic
    # collector from re-scanning them during every collection of a step's garbage.
    gc.freeze()
    train_seconds = train_cpu = 0.0
    history, evaluations = [], []
    # One dataset for every pass: each pass is shuffled by (seed, pass number).
    # A resumed job starts at the pass after its checkpoint's, in the order an
    # uninterrupted run would read it.
    first = int(job["first_pass"])
    last = first + int(job["epochs"]) - 1
    data = _dataset(job, job["train"], wi, wn, shuffle=True, side="train")
    data.set_pass(first)
    if job["test"]:
        test_data = _dataset(job, job["test"], wi, wn)
    elif job.get("valid_fraction"):
        test_data = _dataset(job, job["train"], wi, wn, side="valid")
    else:
        test_data = None
    pred = label = None
    test_read = {"malformed": 0, "first_malformed": []}
    for epoch in range(first, last + 1):
        events("pass", **{"pass": epoch, "last": last})
        log.info("worker %d: pass %d started", wi, epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        progress.pass_start = progress.examples
        for batch, feed in _prefetching(data, exe, main, model):
            loss, out = exe.run(main, feed=feed, fetch_list=[model.avg_cost, model.predict])
            progress.update(epoch, out.reshape(-1), batch.labels, loss.reshape(-1)[0])
            if job["show_click"]:
                fleet.push_show_click(*show_click_of(batch))
        train_seconds += time.perf_counter() - t0
        train_cpu += time.process_time() - c0
        progress.report(epoch, done=True)
        history.append({"pass": epoch, "examples": progress.examples,
                        "loss_sum": progress.loss_sum, "seconds": train_seconds,
                        **_malformed_of(data)})
        log.info("worker %d: pass %d trained, %d examples so far", wi, epoch,
                 progress.examples)
        fleet.barrier_worker()  # every worker finished the pass: the checkpoint is of it
        metrics = None
        if test_data is not None:
            events("test", **{"pass": epoch})
            pred, label = _evaluate(exe, test_program, model, test_data)
            test_read = _malformed_of(test_data)
            if epoch > first:  # worker 0 read it before this pass's first barrier
                _remove(_test_file(run_dir, epoch - 1, wi))
            np.savez(_test_file(run_dir, epoch, wi), pred=pred, label=label)
            fleet.barrier_worker()  # every worker's predictions are written
            if wi == 0:
                metrics = _pass_metrics(run_dir, epoch, wn)
                if epoch == last:
                    for i in range(wn):
                        _remove(_test_file(run_dir, epoch, i))
                evaluations.append(metrics)
                events("tested", **metrics)
                log.info("pass %d: test AUC %s logloss %s (%d examples)", epoch,
                         metrics["test_auc"], metrics["test_logloss"],
                         metrics["test_examples"])
        if wi == 0:
            if _shrink_args(job):  # end of pass: decay show/click, drop stale rows
                fleet.shrink(**_shrink_args(job))
            where = os.path.join(run_dir, "checkpoint")
            events("saving", **{"pass": epoch, "path": where})
            meta = {"pass": epoch}
            if metrics is not None:
                meta.update(test_auc=metrics["test_auc"], test_logloss=metrics["test_logloss"])
            fleet.save_persistables(exe, where, meta=meta)
            kept = keeper.after_save(where, epoch, None if metrics is None
                                     else metrics["test_auc"])
            events("saved", **{"pass": epoch, "path": where, **kept})
            log.info("pass %d: checkpoint saved to %s %s", epoch, where, kept or "")
    progress.close()

    test_stats = MetricStats()
    if pred is not None and pred.shape[0]:
        test_stats.update(pred, label)
    result = {"worker": wi, "examples": progress.examples, "train_seconds": train_seconds,
              "train_cpu_seconds": train_cpu,
              "passes": history, "test_stats": test_stats.to_json(),
              "train_stats": progress.stats.to_json(), "test_read": test_read,
              "evaluations": evaluations}
    if keeper is not None and keeper.best_pass is not None:
        result["best"] = {"pass": keeper.best_pass, "test_auc": keeper.best_auc,
                          "checkpoint": os.path.join(keeper.dir, "best")}
    if pred is not None and pred.shape[0]:
        np.savez(os.path.join(run_dir, f"worker{wi}.test.npz"), pred=pred, label=label)
    if wi == 0:
        result["servers"] = fleet.stats()
        if job["save_model"]:
            where = os.path.join(run_dir, "model")
            events("export", path=where)
            try:
                fleet.save_inference_model(exe, where,
                                           [v.name for v in model.inputs if v is not model.label],
                                           [model.predict])
            except ImportError as e:  # inference export not available in this build
                log.warning("inference model not saved: %s", e)
    with open(os.path.join(run_dir, f"worker{wi}.json"), "w") as f:
        json.dump(result, f)
    fleet.stop_worker()
    return 0


def train_local(job):
    """Train and test the job's model in this process alone (a :class:`LocalBackend`,
    no servers): the baseline the distributed runs are compared with. Returns
    the summary keys :func:`summarize` gives (``train_examples_per_sec``,
    ``test_auc``, ...) for one worker."""

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
        test_program.set_backend(main.backend)
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
    # Each pass's mean training loss over every worker's examples (cumulative sums).
    by_pass = {}
    for r in results:
        seen = loss = 0.0
        for p in r.get("passes", []):
            if "loss_sum" in p:
                n, s = by_pass.get(p["pass"], (0, 0.0))
                by_pass[p["pass"]] = (n + p["examples"] - seen, s + p["loss_sum"] - loss)
                seen, loss = p["examples"], p["loss_sum"]
    summary["train_loss_by_pass"] = {str(k): s / n for k, (n, s) in sorted(by_pass.items())
                                     if n}
    if results[0].get("evaluations"):
        summary["passes"] = results[0]["evaluations"]
    if results[0].get("best"):
        summary["best_pass"] = results[0]["best"]["pass"]
        summary["best_test_auc"] = results[0]["best"]["test_auc"]
        summary["best_checkpoint"] = results[0]["best"]["checkpoint"]
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
    _configure_logging(job.get("log_level") or "info")
    try:
        return run_role(job)
    except DataError as e:  # input that cannot be read: one line naming the file and line
        raise SystemExit(f"pyfleet {_role_label().replace('.', ' ')}: {e}") from None


def _role_label():
    """``server.<i>`` or ``worker.<i>`` from the launcher's environment contract."""
    env = os.environ
    if env.get("PYFLEET_ROLE") == "server" or env.get("TRAINING_ROLE") == "PSERVER":
        return f"server.{env.get('PYFLEET_SERVER_INDEX', '?')}"
    return f"worker.{env.get('PYFLEET_WORKER_INDEX', env.get('PADDLE_TRAINER_ID', '?'))}"


LOG_FORMAT = "%(asctime)s %(levelname)s {role} %(name)s: %(message)s"


def _configure_logging(level):
    """Every role logs with the standard ``logging`` module to stderr (the
    launcher keeps it in RUN_DIR/logs/<role>.log), timestamped and labelled."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=LOG_FORMAT.format(role=_role_label()))


if __name__ == "__main__":
    sys.exit(main())

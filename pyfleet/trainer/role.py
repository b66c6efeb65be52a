"""What each role of a job runs (``python -m pyfleet.trainer JOB`` is :func:`main`), and
:func:`train_local`, the one-process baseline."""

import gc
import json
import logging
import os
import sys
import time

import numpy as np

from pyfleet import fluid
from pyfleet._atomic import WriteError, write_json, writing
from pyfleet.data import DataError
from pyfleet.errors import EndpointInUse, RemoteError
from pyfleet.metrics import MetricStats, exact_auc, logloss
from pyfleet.trainer import mpi as _mpi
from pyfleet.trainer.evaluation import _evaluate, _malformed_of, _pass_metrics, _remove, _test_file
from pyfleet.trainer.job import (
    JOB_DEFAULTS,
    _shrink_args,
    build_program,
    feed_of,
    job_dataset,
    optimizer_of,
    show_click_of,
)
from pyfleet.trainer.keeper import _Keeper
from pyfleet.trainer.progress import _Events, _Progress
from pyfleet.trainer.rounds import Rounds, counters, restore_counters, restore_position

log = logging.getLogger("pyfleet.trainer")


def prefetched_feeds(batches, exe, program, model):
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


def run_role(job):
    """Run this process's role (from the environment contract) of the job."""

    job = {**JOB_DEFAULTS, **job}
    fleet = _mpi.fleet_of(job)  # collective mode: the collective Fleet (no server)
    n_dense, n_slots = job.get("n_dense"), job.get("n_slots")
    if n_dense is None or n_slots is None:  # servers may not see the data: the CLI fills these
        schema = job_dataset(job, job["train"], 0, 1, prefetch=0).schema
        n_dense, n_slots = schema.n_dense, schema.n_slots
    main, startup, model = build_program(job, n_dense, n_slots)
    fleet.init()
    with fluid.program_guard(main, startup):
        _mpi.distributed_optimizer(fleet, job).minimize(model.avg_cost)
    if fleet.is_server():
        return _run_server(fleet, job)
    worker = _Worker(job, fleet, main, model)
    for epoch in range(worker.first, worker.last + 1):
        worker.train_pass(epoch)
        metrics = worker.test_pass(epoch) if worker.test_data is not None else None
        if worker.index == 0:
            worker.end_pass(epoch, metrics)
    return worker.finish()


def _run_server(fleet, job):
    """A server: its tables loaded (--resume's checkpoint, or a restarted job's) or
    started fresh, then served until the workers stop it."""
    resume = job["resume"]
    where = os.path.join(resume, "checkpoint") if resume else None
    restore = os.environ.get("PYFLEET_RESTORE_DIR")
    if restore and os.path.exists(os.path.join(restore, "MANIFEST.json")):
        where = restore  # fleet.init_server loads it (a restarted job)
    log.info("server %d: %s", fleet.server_index(),
             f"loading {where}" if where else "starting with fresh parameters")
    try:
        fleet.init_server(where)
    except ValueError as e:  # damaged, incomplete, another model's: it says which file
        # (or, starting fresh, a table option the tables refuse: a budget below their minimum)
        what = f"cannot load {where}" if where else "cannot start its tables"
        raise SystemExit(f"pyfleet server {fleet.server_index()}: {what}: {e}") from None
    fleet.run_server()
    log.info("server %d: stopped", fleet.server_index())
    return 0


class _Worker:
    """A worker's passes: trained (checkpoint rounds inside a pass), tested, and, by
    worker 0, ended (shrink, checkpoint, the kept copies); then its result file.

    One dataset for every pass: each pass is shuffled by (seed, pass number). A
    resumed job starts at the pass after its checkpoint's, in the order an
    uninterrupted run would read it; a restarted one (PYFLEET_RESTORE_DIR) at its
    checkpoint's position, maybe inside a pass (pyfleet.trainer.rounds)."""

    def __init__(self, job, fleet, main, model):
        self.job, self.fleet, self.main, self.model = job, fleet, main, model
        self.run_dir = run_dir = job["run_dir"]
        self.index, self.count = wi, wn = fleet.worker_index(), fleet.worker_num()
        if job["mode"] != "collective":  # a collective rank has no server to connect to
            fleet.init_worker()
        self.exe = exe = fluid.Executor(fluid.CPUPlace())
        exe.run(fleet.startup_program)
        _mpi.load_replicas(fleet, exe, job, job["resume"] and os.path.join(job["resume"],
                                                                           "checkpoint"))
        self.test_program = main.clone(for_test=True)
        self.test_program.set_backend(main.backend)
        progress_dir = os.path.join(run_dir, "progress")
        os.makedirs(progress_dir, exist_ok=True)
        self.progress = _Progress(job["progress_interval"],
                                  os.path.join(progress_dir, f"worker{wi}.json"), wi)
        self.events = _Events(os.path.join(progress_dir, "events.jsonl") if wi == 0 else None)
        self.keeper = _Keeper(run_dir, job["keep"], job["keep_best"]) if wi == 0 else None
        # The program, tables and modules are long-lived: keep the cyclic
        # collector from re-scanning them during every collection of a step's garbage.
        gc.freeze()
        self.train_seconds = self.train_cpu = 0.0
        self.history, self.evaluations = [], []
        self.last = int(job["first_pass"]) + int(job["epochs"]) - 1
        self.first, self.position = restore_position(job, wi, wn)
        self.auc_names = [v.name for v in model.auc_states]
        # MPI ranks step together (every step all-reduces): a round is asked for a step ahead.
        self.rounds = Rounds(run_dir, wi, wn, job.get("checkpoint_steps"),
                             job.get("checkpoint_seconds"),
                             job["mode"] in ("sync", *_mpi.MPI_MODES), job["barrier_timeout"])
        self._restore()
        self.data = job_dataset(job, job["train"], wi, wn, shuffle=True, side="train")
        self.data.set_pass(self.first)
        if job["test"]:
            self.test_data = job_dataset(job, job["test"], wi, wn)
        elif job.get("valid_fraction"):
            self.test_data = job_dataset(job, job["train"], wi, wn, side="valid")
        else:
            self.test_data = None
        self.pred = self.label = None
        self.test_read = {"malformed": 0, "first_malformed": []}
        self.batches = 0          # of the pass being trained, skipped ones included
        self.pass_clock = None    # perf_counter at the pass's start while it trains

    def _restore(self):
        """A restart's or a --resume's counts and the running AUC's statistics, from its
        checkpoint: they go on from the position."""
        position, progress = self.position, self.progress
        if position is not None:
            progress.examples, progress.steps = position["examples"], position["steps"]
            progress.loss_sum = position["loss_sum"]
            progress.base_examples, progress.base_loss_sum = progress.examples, progress.loss_sum
            self.train_seconds = position["train_seconds"]
            self.history = position["history"]
            self.evaluations = position.get("evaluations", [])
            stats = restore_counters(position)  # the running AUC: the layer's states and ours
            if stats is not None:
                progress.stats = stats
            log.info("worker %d: restored at pass %d batch %d (%d examples of the pass, %d "
                     "in all)", self.index, self.first, position["batches"],
                     position["pass_examples"], position["examples"])

    def state(self):
        """The position a checkpoint round (or the end of a pass) records for a restart."""
        progress, running = self.progress, self.pass_clock
        progress.drain()
        return {"batches": self.batches,
                "examples": progress.examples,
                "pass_examples": progress.examples - progress.pass_start,
                "steps": progress.steps, "loss_sum": progress.loss_sum,
                "train_seconds": self.train_seconds + (
                    0.0 if running is None else time.perf_counter() - running),
                "history": self.history, "evaluations": self.evaluations,
                **counters(progress.stats, self.auc_names)}

    def _save_round(self, meta, mode):
        self.fleet.save_persistables(self.exe, os.path.join(self.run_dir, "checkpoint"),
                                     meta=meta, mode=mode)

    def train_pass(self, epoch):
        """One pass over the training data (from a restart's batch, if inside it)."""
        job, progress, position, wi = self.job, self.progress, self.position, self.index
        self.events("pass", **{"pass": epoch, "last": self.last})
        log.info("worker %d: pass %d started", wi, epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        self.pass_clock = t0
        skip = 0
        if position is not None and epoch == self.first:  # what the checkpoint holds already
            skip = position["batches"]
            progress.pass_start = progress.examples - position["pass_examples"]
        else:
            progress.pass_start = progress.examples
        it = iter(self.data)
        for _ in range(skip):
            next(it)
        self.batches = skip
        log.info("worker %d: pass %d: training from batch %d", wi, epoch, skip)
        self.rounds.start_pass(epoch)
        steps = _mpi.equal_steps(it, _mpi.group_of(self.fleet, job))
        for batch, feed in prefetched_feeds(steps, self.exe, self.main, self.model):
            loss, out = self.exe.run(self.main, feed=feed,
                                     fetch_list=[self.model.avg_cost, self.model.predict])
            progress.update(epoch, out.reshape(-1), batch.labels, loss.reshape(-1)[0])
            if job["show_click"]:
                self.fleet.push_show_click(*show_click_of(batch))
            self.batches += 1
            self.rounds.after_step(self.batches, self.state, self._save_round)
        self.train_seconds += time.perf_counter() - t0
        self.pass_clock = None
        self.train_cpu += time.process_time() - c0
        progress.report(epoch, done=True)
        self.history.append({"pass": epoch, "examples": progress.examples,
                             "loss_sum": progress.loss_sum, "seconds": self.train_seconds,
                             **_malformed_of(self.data)})
        self.rounds.end_pass(self.state)
        self.events("trained", **{"pass": epoch, "examples": progress.examples,
                                  "loss_sum": progress.loss_sum})  # worker 0's counts
        log.info("worker %d: pass %d trained, %d examples so far", wi, epoch,
                 progress.examples)
        self.fleet.barrier_worker()  # every worker finished the pass: the checkpoint is of it

    def test_pass(self, epoch):
        """The pass's test: every worker's predictions written, worker 0's metrics of
        them all (None on the other workers)."""
        run_dir, wi, wn = self.run_dir, self.index, self.count
        self.events("test", **{"pass": epoch})
        self.pred, self.label = _evaluate(self.exe, self.test_program, self.model,
                                          self.test_data)
        self.test_read = _malformed_of(self.test_data)
        if epoch > self.first:  # worker 0 read it before this pass's first barrier
            _remove(_test_file(run_dir, epoch - 1, wi))
        with writing(_test_file(run_dir, epoch, wi)):
            np.savez(_test_file(run_dir, epoch, wi), pred=self.pred, label=self.label)
        self.fleet.barrier_worker()  # every worker's predictions are written
        if wi != 0:
            return None
        metrics = _pass_metrics(run_dir, epoch, wn)
        if epoch == self.last:
            for i in range(wn):
                _remove(_test_file(run_dir, epoch, i))
        self.evaluations.append(metrics)
        self.events("tested", **metrics)
        log.info("pass %d: test AUC %s logloss %s (%d examples)", epoch,
                 metrics["test_auc"], metrics["test_logloss"], metrics["test_examples"])
        return metrics

    def end_pass(self, epoch, metrics):
        """Worker 0 at the end of a pass: decay show/click, drop stale rows, and forget
        admission candidates (else every id seen once per pass is admitted in pass 2);
        the checkpoint saved, the kept copies updated."""
        job = self.job
        if _shrink_args(job) or job.get("admission_count"):
            self.fleet.shrink(**_shrink_args(job))
        where = os.path.join(self.run_dir, "checkpoint")
        self.events("saving", **{"pass": epoch, "path": where})
        meta = {"pass": epoch}
        if metrics is not None:
            meta.update(test_auc=metrics["test_auc"], test_logloss=metrics["test_logloss"])
        nxt = self.rounds.next_pass_position(self.state())  # every worker's counts, for a restart
        if nxt is not None:
            meta["position"] = nxt
        self.fleet.save_persistables(self.exe, where, meta=meta)
        with writing(self.keeper.dir):
            kept = self.keeper.after_save(where, epoch, None if metrics is None
                                          else metrics["test_auc"])
        self.events("saved", **{"pass": epoch, "path": where, **kept})
        log.info("pass %d: checkpoint saved to %s %s", epoch, where, kept or "")

    def finish(self):
        """The worker's result file (worker 0: with the servers' statistics, after the
        inference model is exported); the worker stopped."""
        job, run_dir, wi, pred, label = self.job, self.run_dir, self.index, self.pred, self.label
        self.progress.close()
        test_stats = MetricStats()
        if pred is not None and pred.shape[0]:
            test_stats.update(pred, label)
        result = {"worker": wi, "examples": self.progress.examples,
                  "train_seconds": self.train_seconds, "train_cpu_seconds": self.train_cpu,
                  "passes": self.history, "test_stats": test_stats.to_json(),
                  "restarts": int(os.environ.get("PYFLEET_RESTART_COUNT", "0")),
                  "checkpoint_rounds": self.rounds.summary(),
                  "train_stats": self.progress.stats.to_json(), "test_read": self.test_read,
                  "evaluations": self.evaluations}
        keeper = self.keeper
        if keeper is not None and keeper.best_pass is not None:
            result["best"] = {"pass": keeper.best_pass, "test_auc": keeper.best_auc,
                              "checkpoint": os.path.join(keeper.dir, "best")}
        if pred is not None and pred.shape[0]:
            with writing(os.path.join(run_dir, f"worker{wi}.test.npz")):
                np.savez(os.path.join(run_dir, f"worker{wi}.test.npz"), pred=pred, label=label)
        if wi == 0:
            result["servers"] = self.fleet.stats() if job["mode"] != "collective" else []
            if job["save_model"]:
                self._export_model()
        write_json(os.path.join(run_dir, f"worker{wi}.json"), result)
        if job["mode"] != "collective":
            self.fleet.stop_worker()
        return 0

    def _export_model(self):
        where = os.path.join(self.run_dir, "model")
        self.events("export", path=where)
        model = self.model
        try:
            self.fleet.save_inference_model(self.exe, where,
                                            [v.name for v in model.inputs if v is not model.label],
                                            [model.predict])
        except ImportError as e:  # inference export not available in this build
            log.warning("inference model not saved: %s", e)


def train_local(job):
    """Train and test the job's model in this process alone (a :class:`LocalBackend`,
    no servers): the baseline the distributed runs are compared with. Returns
    the summary keys :func:`summarize` gives (``train_examples_per_sec``,
    ``test_auc``, ...) for one worker."""

    job = {**JOB_DEFAULTS, **job}
    n_dense, n_slots = job.get("n_dense"), job.get("n_slots")
    if n_dense is None or n_slots is None:
        schema = job_dataset(job, job["train"], 0, 1, prefetch=0).schema
        n_dense, n_slots = schema.n_dense, schema.n_slots
    main, startup, model = build_program(job, n_dense, n_slots)
    with fluid.program_guard(main, startup):
        optimizer_of(job).minimize(model.avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    progress = _Progress(float("inf"), None, 0)   # the workers' bookkeeping, never printed
    gc.freeze()   # as run_role
    seconds = cpu = 0.0
    data = job_dataset(job, job["train"], 0, 1, shuffle=True)  # as run_role: one for every pass
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
        for batch in job_dataset(job, job["test"], 0, 1):
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
    except EndpointInUse as e:  # exit 75: a launcher starts the job again, not counting it
        print(f"pyfleet {_role_label().replace('.', ' ')}: {e}", file=sys.stderr)
        return EndpointInUse.EXIT_CODE
    except (DataError, WriteError, RemoteError) as e:
        # Input that cannot be read (one line naming the file and line), a file that
        # cannot be written (a full disk: naming it), a server's refusal (its SAVE on
        # a full disk, naming the file): one line, no traceback.
        raise SystemExit(f"pyfleet {_role_label().replace('.', ' ')}: {e}") from None


def _role_label():
    """``server.<i>`` or ``worker.<i>`` from the launcher's environment contract."""
    env = os.environ
    if env.get("PYFLEET_ROLE") == "server" or env.get("TRAINING_ROLE") == "PSERVER":
        return f"server.{env.get('PYFLEET_SERVER_INDEX', '?')}"
    index = env.get("PYFLEET_WORKER_INDEX", env.get("PADDLE_TRAINER_ID"))
    for rank in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):  # an MPI job's workers
        index = index if index is not None else env.get(rank)
    return f"worker.{'?' if index is None else index}"


LOG_FORMAT = "%(asctime)s %(levelname)s {role} %(name)s: %(message)s"


def _configure_logging(level):
    """Every role logs with the standard ``logging`` module to stderr (the
    launcher keeps it in RUN_DIR/logs/<role>.log), timestamped and labelled."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format=LOG_FORMAT.format(role=_role_label()))

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
    run_dir = job["run_dir"]
    n_dense, n_slots = job.get("n_dense"), job.get("n_slots")
    if n_dense is None or n_slots is None:  # servers may not see the data: the CLI fills these
        schema = job_dataset(job, job["train"], 0, 1, prefetch=0).schema
        n_dense, n_slots = schema.n_dense, schema.n_slots
    main, startup, model = build_program(job, n_dense, n_slots)
    fleet.init()
    with fluid.program_guard(main, startup):
        _mpi.distributed_optimizer(fleet, job).minimize(model.avg_cost)

    if fleet.is_server():
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

    wi, wn = fleet.worker_index(), fleet.worker_num()
    if job["mode"] != "collective":  # a collective rank has no server to connect to
        fleet.init_worker()
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(fleet.startup_program)
    _mpi.load_replicas(fleet, exe, job, job["resume"] and os.path.join(job["resume"],
                                                                       "checkpoint"))
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
    # uninterrupted run would read it; a restarted one (PYFLEET_RESTORE_DIR) at its
    # checkpoint's position, maybe inside a pass (pyfleet.trainer.rounds).
    last = int(job["first_pass"]) + int(job["epochs"]) - 1
    first, position = restore_position(job, wi, wn)
    auc_names = [v.name for v in model.auc_states]
    # MPI ranks step together (every step all-reduces): a round is asked for a step ahead.
    rounds = Rounds(run_dir, wi, wn, job.get("checkpoint_steps"),
                    job.get("checkpoint_seconds"), job["mode"] in ("sync", *_mpi.MPI_MODES),
                    job["barrier_timeout"])
    if position is not None:  # a restart's or a --resume's counts go on from the position
        progress.examples, progress.steps = position["examples"], position["steps"]
        progress.loss_sum = position["loss_sum"]
        progress.base_examples, progress.base_loss_sum = progress.examples, progress.loss_sum
        train_seconds = position["train_seconds"]
        history, evaluations = position["history"], position.get("evaluations", [])
        stats = restore_counters(position)  # the running AUC: the layer's states and ours
        if stats is not None:
            progress.stats = stats
        log.info("worker %d: restored at pass %d batch %d (%d examples of the pass, %d in "
                 "all)", wi, first, position["batches"], position["pass_examples"],
                 position["examples"])
    data = job_dataset(job, job["train"], wi, wn, shuffle=True, side="train")
    data.set_pass(first)
    if job["test"]:
        test_data = job_dataset(job, job["test"], wi, wn)
    elif job.get("valid_fraction"):
        test_data = job_dataset(job, job["train"], wi, wn, side="valid")
    else:
        test_data = None
    pred = label = None
    test_read = {"malformed": 0, "first_malformed": []}
    for epoch in range(first, last + 1):
        events("pass", **{"pass": epoch, "last": last})
        log.info("worker %d: pass %d started", wi, epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        clock = [t0]  # the pass's start while it trains, then None
        batches, skip = 0, 0
        if position is not None and epoch == first:  # what the checkpoint holds already
            skip = position["batches"]
            progress.pass_start = progress.examples - position["pass_examples"]
        else:
            progress.pass_start = progress.examples
        it = iter(data)
        for _ in range(skip):
            next(it)
        batches = skip
        log.info("worker %d: pass %d: training from batch %d", wi, epoch, skip)

        # Late-bound on purpose (B023): the position at the moment a round asks for it.
        def state():
            running = clock[0]  # noqa: B023
            progress.drain()
            return {"batches": batches,  # noqa: B023
                    "examples": progress.examples,
                    "pass_examples": progress.examples - progress.pass_start,
                    "steps": progress.steps, "loss_sum": progress.loss_sum,
                    "train_seconds": train_seconds + (  # noqa: B023
                        0.0 if running is None else time.perf_counter() - running),
                    "history": history, "evaluations": evaluations,
                    **counters(progress.stats, auc_names)}

        def save(meta, mode):
            fleet.save_persistables(exe, os.path.join(run_dir, "checkpoint"), meta=meta,
                                    mode=mode)

        rounds.start_pass(epoch)
        for batch, feed in prefetched_feeds(_mpi.equal_steps(it, _mpi.group_of(fleet, job)), exe,
                                        main, model):
            loss, out = exe.run(main, feed=feed, fetch_list=[model.avg_cost, model.predict])
            progress.update(epoch, out.reshape(-1), batch.labels, loss.reshape(-1)[0])
            if job["show_click"]:
                fleet.push_show_click(*show_click_of(batch))
            batches += 1
            rounds.after_step(batches, state, save)
        train_seconds += time.perf_counter() - t0
        clock[0] = None
        train_cpu += time.process_time() - c0
        progress.report(epoch, done=True)
        history.append({"pass": epoch, "examples": progress.examples,
                        "loss_sum": progress.loss_sum, "seconds": train_seconds,
                        **_malformed_of(data)})
        rounds.end_pass(state)
        events("trained", **{"pass": epoch, "examples": progress.examples,
                             "loss_sum": progress.loss_sum})  # worker 0's cumulative counts
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
            with writing(_test_file(run_dir, epoch, wi)):
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
            # End of pass: decay show/click, drop stale rows, and forget admission
            # candidates (else every id seen once per pass is admitted in pass 2).
            if _shrink_args(job) or job.get("admission_count"):
                fleet.shrink(**_shrink_args(job))
            where = os.path.join(run_dir, "checkpoint")
            events("saving", **{"pass": epoch, "path": where})
            meta = {"pass": epoch}
            if metrics is not None:
                meta.update(test_auc=metrics["test_auc"], test_logloss=metrics["test_logloss"])
            nxt = rounds.next_pass_position(state())  # every worker's counts, for a restart
            if nxt is not None:
                meta["position"] = nxt
            fleet.save_persistables(exe, where, meta=meta)
            with writing(keeper.dir):
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
              "restarts": int(os.environ.get("PYFLEET_RESTART_COUNT", "0")),
              "checkpoint_rounds": rounds.summary(),
              "train_stats": progress.stats.to_json(), "test_read": test_read,
              "evaluations": evaluations}
    if keeper is not None and keeper.best_pass is not None:
        result["best"] = {"pass": keeper.best_pass, "test_auc": keeper.best_auc,
                          "checkpoint": os.path.join(keeper.dir, "best")}
    if pred is not None and pred.shape[0]:
        with writing(os.path.join(run_dir, f"worker{wi}.test.npz")):
            np.savez(os.path.join(run_dir, f"worker{wi}.test.npz"), pred=pred, label=label)
    if wi == 0:
        result["servers"] = fleet.stats() if job["mode"] != "collective" else []
        if job["save_model"]:
            where = os.path.join(run_dir, "model")
            events("export", path=where)
            try:
                fleet.save_inference_model(exe, where,
                                           [v.name for v in model.inputs if v is not model.label],
                                           [model.predict])
            except ImportError as e:  # inference export not available in this build
                log.warning("inference model not saved: %s", e)
    write_json(os.path.join(run_dir, f"worker{wi}.json"), result)
    if job["mode"] != "collective":
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

"""``pyfleet train``'s second step, plan: the run directory (and what ``--overwrite``
would delete in it, refused by name where that holds an input) and the job file's
contents, a resumed run's checkpoint matched against the job's tables and its next
pass found. Nothing is written yet."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import NamedTuple

from pyfleet.cli.modes import check_tables_start
from pyfleet.cli.plot import SIDECAR
from pyfleet.cli.resume import INHERITED
from pyfleet.cli.train_checks import Data, Options
from pyfleet.service import checkpoint as _checkpoint

# What `pyfleet train` writes into a run directory: all that --overwrite may delete.
RUN_FILES = ("checkpoint", "checkpoints", "model", "logs", "progress", "job.json",
             "metrics.jsonl", "summary.json", "training.png", SIDECAR, "tensorboard")
RUN_GLOBS = ("worker[0-9]*.json", "worker[0-9]*.test.npz")
# Keys every job.json `pyfleet train` has written carries: a directory whose job.json
# lacks them was not a pyfleet run, and --overwrite deletes nothing in it.
JOB_MARKS = ("train", "test", "format", "model", "mode", "run_dir", "batch_size", "epochs")


def _is_pyfleet_run(run_dir):
    try:
        with open(os.path.join(run_dir, "job.json")) as f:
            job = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(job, dict) and all(k in job for k in JOB_MARKS)


def _overwrite_plan(run_dir, inputs):
    """The paths ``--overwrite`` would delete in ``run_dir``: only what a pyfleet run
    writes, only when ``run_dir`` holds a pyfleet ``job.json``. ``inputs`` maps a flag to
    the paths it names (data, config, caches); one of them inside a path to delete is
    refused by name, before anything is touched."""
    doomed = [os.path.join(run_dir, name) for name in RUN_FILES]
    for pattern in RUN_GLOBS:
        doomed += glob.glob(os.path.join(run_dir, pattern))
    doomed = [p for p in doomed if os.path.lexists(p)]
    if not doomed:
        return []
    if not _is_pyfleet_run(run_dir):
        raise SystemExit(f"pyfleet train: --overwrite replaces a previous pyfleet run, and "
                         f"{run_dir} holds no pyfleet job.json: nothing was deleted; give a "
                         f"new or empty --run-dir")
    for flag, paths in inputs.items():
        for path in [paths] if isinstance(paths, str) else paths or []:
            real = os.path.realpath(path)
            for p in doomed:
                # a link is removed, not followed: only a path through it is at risk
                gone = os.path.realpath(p) if not os.path.islink(p) else os.path.abspath(p)
                if real == gone or real.startswith(gone.rstrip(os.sep) + os.sep) \
                        or os.path.abspath(path).startswith(os.path.abspath(p) + os.sep):
                    raise SystemExit(f"pyfleet train: --overwrite would delete {p}, which "
                                     f"holds {flag} {path}: nothing was deleted; move it "
                                     f"out of the run directory or give another --run-dir")
    return doomed


def _clear_run_dir(doomed):
    for path in doomed:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)


class Plan(NamedTuple):
    """The job file's contents (``job["run_dir"]``: where the run goes) and the paths
    ``--overwrite`` deletes before the run starts."""
    job: dict
    doomed: list


def plan_job(args, options: Options, data: Data, say) -> Plan:
    """The run directory and the job file of a checked command line."""
    run_dir, doomed = _run_dir_of(args, options, data)
    job = _job_of(args, options, data, run_dir)
    check_tables_start(job)
    if options.resume:  # another model's checkpoint: refused here, not in every server
        _resume_from(args, options, job, say)
    return Plan(job, doomed)


def _run_dir_of(args, options, data):
    """The run directory (absolute), and what --overwrite would delete in it."""
    resume = options.resume
    run_dir = args.run_dir or args.checkpoint_dir or resume or os.path.join(
        "runs", time.strftime("%Y%m%d-%H%M%S"))
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise SystemExit(f"pyfleet train: --run-dir {run_dir} is a file")
    in_place = bool(resume) and os.path.isdir(run_dir) and os.path.samefile(run_dir, resume)
    if args.overwrite and in_place:
        raise SystemExit("pyfleet train: --overwrite would delete the checkpoint --resume "
                         "continues from; give another --run-dir")
    if os.path.isdir(run_dir) and os.listdir(run_dir) and not in_place and not args.overwrite:
        raise SystemExit(f"pyfleet train: --run-dir {run_dir} is not empty (a previous run?): "
                         f"pass --resume {run_dir} to continue it, --overwrite to replace it, "
                         f"or another --run-dir")
    doomed = []
    if args.overwrite and not in_place and os.path.isdir(run_dir):
        doomed = _overwrite_plan(run_dir, {
            "--train": data.train, "--test": data.test, "--config": getattr(args, "config", None),
            "--cache-dir": args.cache_dir, "--spill-dir": args.spill_dir,
            "--curve-dir": args.curve_dir, "--resume": resume})
    return run_dir, doomed


def _job_of(args, options, data, run_dir):
    """The job file's settings (the trainer's JOB_DEFAULTS under them)."""
    from pyfleet.trainer import JOB_DEFAULTS, sparse_lr_of  # lazy: the trainer imports Fluid
    settings = {dest: getattr(args, dest) for dest in INHERITED}
    job = {**JOB_DEFAULTS, "train": data.train, "test": data.test, "format": data.fmt,
            "model": args.model,
            "embedding_dim": args.embedding_dim,
            "layers": options.layers, "optimizer": options.optimizer,
            "lr": options.optimizer["learning_rate"], "batch_size": args.batch_size,
            "sparse_lr": args.sparse_lr,
            "epochs": args.epochs,
            "mode": args.mode, "sparse_mode": args.sparse_mode, "seed": args.seed,
            "run_dir": run_dir, "resume": options.resume,
            "first_pass": 1,
            "n_dense": data.n_dense, "n_slots": data.n_slots,
            "admission_count": args.admission_count, "show_click": args.show_click,
            "shrink_min_score": args.shrink_min_score, "shrink_decay": args.shrink_decay,
            "shrink_unseen_passes": args.shrink_unseen_passes, "settings": settings,
            "storage": args.storage, "save_model": not args.no_model,
            "request_timeout": args.request_timeout,
            "memory_budget": args.memory_budget,
            "spill_dir": None if args.spill_dir is None else os.path.abspath(args.spill_dir),
            "config": getattr(args, "_config", None),
            "valid_fraction": args.valid_fraction, "keep": args.keep,
            "max_line_bytes": args.max_line_bytes, "max_malformed": args.max_malformed,
            "keep_best": args.keep_best, "log_level": args.log_level,
            "checkpoint_steps": args.checkpoint_steps,
            "checkpoint_seconds": options.checkpoint_seconds,
            "progress_interval": args.log_interval}
    job["sparse_lr"] = sparse_lr_of(job)   # the rate in force, written down
    return job


def _resume_from(args, options, job, say):
    """The resumed checkpoint's tables against the job's; the first pass to run."""
    from pyfleet.trainer import tables_of  # lazy: the trainer imports Fluid
    try:
        _checkpoint.check_tables(options.manifest.get("tables") or [], tables_of(job),
                                 f"{options.resume}/checkpoint", extra_ok=False)
    except ValueError as e:
        raise SystemExit(f"pyfleet train: --resume {args.resume}: {e} (--model, "
                         f"--layers, --embedding-dim, --optimizer and the data's "
                         f"features must be those of the run resumed)") from None
    done = (options.manifest.get("meta") or {}).get("pass")
    inside = ((options.manifest.get("meta") or {}).get("position") or {}).get("round")
    if isinstance(done, int) and not isinstance(done, bool) and (
            done >= 1 or (done == 0 and inside)):
        job["first_pass"] = done + 1
        where = (f"inside pass {done + 1} (checkpoint round {inside})" if inside
                 else f"after pass {done}")
        say(f"resuming {where} of {options.resume}: passes {done + 1}..{done + args.epochs}")
    else:  # saved by save_persistables without the trainer's pass number
        say(f"resuming from {options.resume}/checkpoint, which does not say which pass it "
            f"ended: passes are numbered from 1 again")

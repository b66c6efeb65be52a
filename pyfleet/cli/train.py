"""``pyfleet train``: every option and the data checked before any process starts, the
job file written, the local cluster launched and watched, the summary reported."""

import glob
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import time

from pyfleet import _atomic
from pyfleet.cli.data import (
    _check_first_lines,
    _check_whole_files,
    _default_cache_dir,
    _split_paths,
)
from pyfleet.cli.export import model_of_best_pass
from pyfleet.cli.modes import (
    MPI_MODES,
    check_mode_options,
    check_scale_out_options,
    check_tables_start,
)
from pyfleet.cli.monitor import Monitor, count_lines
from pyfleet.cli.plot import SIDECAR, plot_run
from pyfleet.cli.report import (
    QuietLauncher,
    _format_summary,
    _LogFile,
    _one_line,
    _RoleOutput,
    _why_no_example,
)
from pyfleet.cli.resume import INHERITED, _explicit_dests, _inherit, _interrupted, _resumed_settings
from pyfleet.cli.tensorboard import TensorBoard, check_available
from pyfleet.data import synthetic
from pyfleet.data.readers import list_files
from pyfleet.launch.collective import find_mpiexec
from pyfleet.launch.local import launch_local
from pyfleet.service import auth
from pyfleet.service import checkpoint as _checkpoint

# Optimizer flag -> (optimizer parameter, the optimizers that take it).
OPTIMIZER_FLAGS = {
    "beta1": ("beta1", ("adam",)), "beta2": ("beta2", ("adam",)),
    "epsilon": ("epsilon", ("adam", "adagrad", "rmsprop")),
    "initial_accumulator": ("initial_accumulator_value", ("adagrad",)),
    "l1": ("l1", ("ftrl",)), "l2": ("l2", ("ftrl",)), "lr_power": ("lr_power", ("ftrl",)),
    "momentum": ("momentum", ("momentum", "rmsprop")),
    "use_nesterov": ("use_nesterov", ("momentum",)),
    "rho": ("rho", ("rmsprop",)), "centered": ("centered", ("rmsprop",)),
}
DEFAULT_LR = {"adam": 0.001, "adagrad": 0.01, "sgd": 0.01, "ftrl": 0.05, "momentum": 0.01,
              "rmsprop": 0.001}


def _optimizer_of(args):
    """``{"name", **parameters}`` of the chosen optimizer; a parameter of another
    optimizer is refused by name."""
    opt = {"name": args.optimizer, "learning_rate": DEFAULT_LR[args.optimizer]
           if args.lr is None else args.lr}
    for dest, (param, takers) in OPTIMIZER_FLAGS.items():
        value = getattr(args, dest)
        if value is None:
            continue
        if args.optimizer not in takers:
            raise SystemExit(f"pyfleet train: --{dest.replace('_', '-')} is a parameter of "
                             f"{' and '.join(takers)}, not of --optimizer {args.optimizer}")
        opt[param] = value
    from pyfleet.trainer import optimizer_of  # lazy: the trainer imports Fluid
    try:
        optimizer_of({"optimizer": opt})
    except ValueError as e:
        raise SystemExit(f"pyfleet train: --optimizer {args.optimizer}: {e}") from None
    return opt


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


def parse_duration(text, flag):
    """Seconds of ``300``, ``300s``, ``5m`` or ``1.5h``; anything else refused by name."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m or not float(m.group(1)) > 0:
        raise SystemExit(f"pyfleet train: {flag} expects a positive duration such as 300, "
                         f"300s, 5m or 1h, got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def _healing_options(args):
    """Check --checkpoint-steps/-every and --max-restarts/--restart-window; the seconds of
    --checkpoint-every (or None)."""
    if args.checkpoint_steps is not None and args.checkpoint_steps < 1:
        raise SystemExit(f"pyfleet train: --checkpoint-steps must be >= 1, got "
                         f"{args.checkpoint_steps}")
    if args.max_restarts < 0:
        raise SystemExit(f"pyfleet train: --max-restarts must be >= 0, got {args.max_restarts}")
    if not args.restart_window > 0:
        raise SystemExit(f"pyfleet train: --restart-window must be > 0 seconds, got "
                         f"{args.restart_window}")
    if args.checkpoint_every is None:
        return None
    return parse_duration(args.checkpoint_every, "--checkpoint-every")


def cmd_train(args, argv):
    # Deliberately lazy: the trainer imports Fluid and the models, which `pyfleet --help`
    # and `pyfleet gen-data` must not pay for.
    from pyfleet.trainer import JOB_DEFAULTS, summarize

    out = sys.stderr if args.json else sys.stdout  # under --json stdout holds the JSON alone
    cli_log = logging.getLogger("pyfleet.cli")

    def say(text):
        if not args.quiet:
            print(text, file=out, flush=True)
        cli_log.info("%s", text)

    if args.tensorboard:
        check_available()
    resume = os.path.abspath(args.resume) if args.resume else None
    first_pass = 1
    manifest = None
    if resume:
        try:
            manifest = _checkpoint.read_manifest(os.path.join(resume, "checkpoint"))
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: {e}") from None
        if manifest is None:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: no checkpoint there "
                             f"(expected {resume}/checkpoint/MANIFEST.json)")
        job_file = os.path.join(resume, "job.json")
        if os.path.exists(job_file):
            try:
                with open(job_file) as f:
                    old = json.load(f)
            except (OSError, ValueError) as e:
                raise SystemExit(f"pyfleet train: --resume {args.resume}: cannot read "
                                 f"{job_file}: {e}") from None
            _inherit(args, _explicit_dests(args._parser, argv), _resumed_settings(old),
                     job_file)
    check_mode_options(args, _explicit_dests(args._parser, argv))
    if (args.servers < 1 and args.mode != "collective") or args.workers < 1:
        raise SystemExit("pyfleet train: --servers and --workers must be >= 1")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--embedding-dim", args.embedding_dim), ("--rows", args.rows)):
        if value < 1:
            raise SystemExit(f"pyfleet train: {flag} must be >= 1, got {value}")
    if args.lr is not None and (not math.isfinite(args.lr) or args.lr <= 0):
        raise SystemExit(f"pyfleet train: --lr must be a finite number > 0, got {args.lr}")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise SystemExit(f"pyfleet train: --request-timeout must be a finite number > 0, "
                         f"got {args.request_timeout}")
    optimizer = _optimizer_of(args)
    if (args.memory_budget is None) != (args.spill_dir is None):
        raise SystemExit("pyfleet train: --memory-budget and --spill-dir go together "
                         f"(got only {'--memory-budget' if args.spill_dir is None else '--spill-dir'})")
    if args.spill_dir is not None and os.path.exists(args.spill_dir) \
            and not os.path.isdir(args.spill_dir):
        raise SystemExit(f"pyfleet train: --spill-dir {args.spill_dir} is not a directory "
                         f"(the servers' rows beyond --memory-budget go to files in it)")
    if args.storage.endswith("_q8") and args.optimizer not in ("adam", "adagrad"):
        raise SystemExit(f"pyfleet train: --storage {args.storage} keeps Adam's or Adagrad's "
                         f"state in 8 bits; --optimizer {args.optimizer} is not supported by it")
    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        layers = None
    if layers is None or any(n < 1 for n in layers):
        raise SystemExit(f"pyfleet train: --layers must be hidden layer sizes >= 1, separated "
                         f"by commas (e.g. 256,128,64), got {args.layers!r}")
    if args.admission_count is not None and args.admission_count < 1:
        raise SystemExit("pyfleet train: --admission-count must be >= 1")
    if args.shrink_min_score is not None and not args.show_click:
        raise SystemExit("pyfleet train: --shrink-min-score needs --show-click (without "
                         "counts every row scores 0)")
    if not 0.0 < args.shrink_decay <= 1.0:
        raise SystemExit("pyfleet train: --shrink-decay must be in (0, 1]")
    if args.valid_fraction is not None:
        if not 0.0 < args.valid_fraction < 1.0:
            raise SystemExit(f"pyfleet train: --valid-fraction must be in (0, 1), got "
                             f"{args.valid_fraction}")
        if args.test:
            raise SystemExit("pyfleet train: --valid-fraction and --test both name the test "
                             "data: give one")
        if not args.train:
            raise SystemExit("pyfleet train: --valid-fraction needs --train (the generated "
                             "data set has its own test split)")
    if args.keep is not None and args.keep < 1:
        raise SystemExit(f"pyfleet train: --keep must be >= 1, got {args.keep}")
    checkpoint_seconds = _healing_options(args)
    hosts = check_scale_out_options(args)
    if not args.log_interval > 0:
        raise SystemExit(f"pyfleet train: --log-interval must be > 0 seconds, got "
                         f"{args.log_interval}")
    if args.keep_best and args.train and not args.test and args.valid_fraction is None:
        raise SystemExit("pyfleet train: --keep-best needs test data to rank the passes: "
                         "--test or --valid-fraction")
    truth = total_lines = None
    max_line = args.max_line_bytes
    if args.max_malformed is not None and args.max_malformed < 0:
        raise SystemExit(f"pyfleet train: --max-malformed must be >= 0 (0: stop at the first "
                         f"malformed line), got {args.max_malformed}")
    train, test, fmt = _split_paths(args.train), _split_paths(args.test), args.format
    for flag, paths in (("--train", train), ("--test", test)):
        for path in [paths] if isinstance(paths, str) else paths or []:
            if not os.path.exists(path):
                raise SystemExit(f"pyfleet train: {flag}: no such file or directory: {path}")
    if train is not None:  # every file's format and first lines before anything is written
        say(f"checking the data: {args.train}" + (f", {args.test}" if args.test else ""))
        try:
            fmt, schema = _check_first_lines(train, fmt, "--format", max_line=max_line)
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: --train: {e}") from None
        if schema is None:
            raise SystemExit(f"pyfleet train: --train: no data line in {args.train}")
        if test is not None:
            try:
                if args.format == "auto":
                    tfmt, _ = _check_first_lines(test, "auto", "--format", max_line=max_line)
                    if tfmt not in (fmt, "auto"):
                        raise ValueError(f"it looks like {tfmt}, --train like {fmt}: they "
                                         f"must be in the same format")
                _, test_schema = _check_first_lines(test, fmt, "--format", max_line=max_line)
            except (OSError, ValueError) as e:
                raise SystemExit(f"pyfleet train: --test: {e}") from None
            if test_schema is not None and (test_schema.n_dense, test_schema.n_slots) != (
                    schema.n_dense, schema.n_slots):
                raise SystemExit(
                    f"pyfleet train: --test has {test_schema.n_dense} dense features and "
                    f"{test_schema.n_slots} slots read as {fmt}, --train {schema.n_dense} and "
                    f"{schema.n_slots}: they must be in the same format")
        n_dense, n_slots = schema.n_dense, schema.n_slots
        total_lines = _check_whole_files(train, test, fmt, max_line)
    elif test is not None:
        raise SystemExit("pyfleet train: --test needs --train (without --train the generated "
                         "data set's own test split is used)")
    else:
        fmt, n_dense, n_slots = "criteo", synthetic.N_DENSE, synthetic.N_SLOTS
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
            "--train": train, "--test": test, "--config": getattr(args, "config", None),
            "--cache-dir": args.cache_dir, "--spill-dir": args.spill_dir,
            "--curve-dir": args.curve_dir, "--resume": resume})
    settings = {dest: getattr(args, dest) for dest in INHERITED}
    job = {**JOB_DEFAULTS, "train": train, "test": test, "format": fmt, "model": args.model,
           "embedding_dim": args.embedding_dim,
           "layers": layers, "optimizer": optimizer,
           "lr": optimizer["learning_rate"], "batch_size": args.batch_size,
           "epochs": args.epochs,
           "mode": args.mode, "sparse_mode": args.sparse_mode, "seed": args.seed,
           "run_dir": run_dir, "resume": resume,
           "first_pass": first_pass,
           "n_dense": n_dense, "n_slots": n_slots,
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
           "checkpoint_seconds": checkpoint_seconds,
           "progress_interval": args.log_interval}
    check_tables_start(job)
    if resume:  # another model's checkpoint: refused here, not in every server
        from pyfleet.trainer import tables_of  # lazy, as above
        try:
            _checkpoint.check_tables(manifest.get("tables") or [], tables_of(job),
                                     f"{resume}/checkpoint", extra_ok=False)
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: {e} (--model, "
                             f"--layers, --embedding-dim, --optimizer and the data's "
                             f"features must be those of the run resumed)") from None
        done = (manifest.get("meta") or {}).get("pass")
        inside = ((manifest.get("meta") or {}).get("position") or {}).get("round")
        if isinstance(done, int) and not isinstance(done, bool) and (
                done >= 1 or (done == 0 and inside)):
            job["first_pass"] = done + 1
            where = (f"inside pass {done + 1} (checkpoint round {inside})" if inside
                     else f"after pass {done}")
            say(f"resuming {where} of {resume}: passes {done + 1}..{done + args.epochs}")
        else:  # saved by save_persistables without the trainer's pass number
            say(f"resuming from {resume}/checkpoint, which does not say which pass it "
                f"ended: passes are numbered from 1 again")
    if args.emit_k8s is not None:  # the same job, for a cluster: nothing runs here
        from pyfleet.launch.k8s import write_manifests
        path = write_manifests(os.path.abspath(args.emit_k8s), job, args.servers,
                               args.workers, image=args.image,
                               generated=(args.rows, args.seed) if train is None else None)
        print(f"pyfleet train: the job's Kubernetes manifests are in {path} (kubectl apply "
              f"-f {os.path.dirname(path)}; its header says what to build and create first)")
        return 0
    # Workers' save and load requests are confined to the run directory (the
    # servers load --resume's checkpoint themselves, from wherever it is).
    env = dict(os.environ, PYFLEET_CHECKPOINT_DIR=run_dir)
    if args.collective_timeout is not None:  # checked by check_mode_options
        env["PYFLEET_COLLECTIVE_TIMEOUT"] = repr(float(args.collective_timeout))
    if args.curve_dir:
        env["PYFLEET_CURVE_DIR"] = os.path.abspath(args.curve_dir)
        try:  # fail here, not in every role
            auth.server_options_from_env(env)
            auth.client_options_from_env(env)
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --curve-dir: {e}") from None
    if train is None:
        cache = os.path.abspath(args.cache_dir or _default_cache_dir())
        try:
            truth = synthetic.cached(cache, rows=args.rows, seed=args.seed, say=say)
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: cannot generate the data set into {cache}: "
                             f"{e}") from None
        train, test = truth["train"], truth["test"]
        job.update(train=train, test=test)
    try:
        os.makedirs(run_dir, exist_ok=True)
        _clear_run_dir(doomed)
    except OSError as e:
        raise SystemExit(f"pyfleet train: --run-dir: cannot create {run_dir}: {e.strerror}") \
            from None
    job_path = os.path.join(run_dir, "job.json")
    try:  # a full disk: one line naming the file, nothing half-written
        _atomic.write_json(job_path, job, indent=1)
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        handler = _LogFile(os.path.join(run_dir, "logs", "pyfleet.log"))
        # A previous attempt's progress files (a resumed run) must not count in this one.
        shutil.rmtree(os.path.join(run_dir, "progress"), ignore_errors=True)
        os.makedirs(os.path.join(run_dir, "progress"))
    except OSError as e:
        raise SystemExit(f"pyfleet train: {_one_line(e)}") from None
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s pyfleet %(name)s: "
                                           "%(message)s"))
    cli_log.addHandler(handler)
    cli_log.setLevel(args.log_level.upper())
    cli_log.propagate = False
    # Roles run in the run directory: `python -m` puts the working directory
    # first on sys.path, and a source checkout there (where `pip install .`
    # was typed) would shadow the installed package and its compiled modules.
    cmd = [sys.executable, "-m", "pyfleet.trainer", job_path]
    started = time.time()
    try:
        if total_lines is None:
            total_lines = count_lines(list_files(train),
                                      header_lines=1 if fmt == "csv" else 0)
    except (OSError, ValueError):
        total_lines = None
    if total_lines is not None and args.valid_fraction:
        total_lines = int(total_lines * (1 - args.valid_fraction))
    last_pass = job["first_pass"] + args.epochs - 1
    monitor = Monitor(run_dir, args.workers, job["first_pass"], last_pass, total_lines,
                      args.log_interval, say)
    say(f"starting {args.servers} server(s) and {args.workers} worker(s), {args.mode}"
        + (f" (workers through {find_mpiexec()})" if args.mode in MPI_MODES else "")
        + f"; logs in {run_dir}/logs")
    tensorboard = TensorBoard(run_dir) if args.tensorboard else None
    if tensorboard is not None:
        monitor.listeners.append(tensorboard.add)
    monitor.start()
    restarts = []
    try:
        if hosts is not None:
            from pyfleet.launch.hosts import DEFAULT_PORT, launch_hosts
            code = launch_hosts(cmd, args.servers, args.workers, hosts=args.hosts,
                                hostfile=args.hostfile, mode=args.mode, env=env,
                                port=DEFAULT_PORT if args.port is None else args.port,
                                log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                                cwd=run_dir, messages=QuietLauncher(sys.stderr) if args.quiet else out)
        else:
            code = launch_local(lambda role, index: cmd, servers=args.servers,
                                workers=args.workers, env=env,
                                log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                                mode=args.mode, cwd=run_dir, output=_RoleOutput(sys.stderr),
                                messages=QuietLauncher(sys.stderr) if args.quiet else None,
                                max_restarts=args.max_restarts,
                                restart_window=args.restart_window,
                                restore_dir=os.path.join(run_dir, "checkpoint"),
                                restarts=restarts)
    finally:
        monitor.finish()
        if tensorboard is not None:
            tensorboard.close()
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
        print(_interrupted(run_dir, resume, monitor, last_pass, args), file=sys.stderr)
        return code
    if code != 0:
        print(f"pyfleet train: the job failed (exit code {code}); logs in {run_dir}/logs",
              file=sys.stderr)
        return code
    summary = summarize(run_dir, args.workers)
    summary.update({"model": args.model, "servers": args.servers, "workers": args.workers,
                    "mode": args.mode, "run_dir": run_dir, "wall_seconds": time.time() - started,
                    "checkpoint": os.path.join(run_dir, "checkpoint"),
                    "inference_model": None if args.no_model else os.path.join(run_dir, "model"),
                    "restarts": restarts})
    if truth is not None:
        summary["truth_auc_test"] = truth["truth_auc_test"]
        summary["truth_logloss_test"] = truth["truth_logloss_test"]
    if not args.no_model:
        summary["inference_model_pass"] = last_pass
        if args.keep_best and summary.get("best_pass") not in (None, last_pass):
            try:
                model_of_best_pass(run_dir, summary, job, say)
            except (OSError, ValueError) as e:
                print(f"pyfleet train: --keep-best: cannot export the best pass's model: "
                      f"{_one_line(e)}; {run_dir}/model is pass {last_pass}'s",
                      file=sys.stderr)
                return 1
    try:
        plot = plot_run(run_dir, {**job, "servers": args.servers, "workers": args.workers,
                                  "generated": truth is not None},
                        truth_auc=None if truth is None else truth["truth_auc_test"])
        if plot:
            summary["plot"] = plot
        if tensorboard is not None:
            summary["tensorboard"] = tensorboard.path
        _atomic.write_json(os.path.join(run_dir, "summary.json"), summary, indent=1)
    except OSError as e:
        print(f"pyfleet train: {_one_line(e)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_format_summary(summary))
    if summary["train_examples"] == 0:
        why = _why_no_example(summary["train_malformed"], summary["first_malformed"],
                              "the training data has no data line")
        print(f"pyfleet train: no training example was read from {train} ({why}; "
              f"--format is {fmt!r}, see docs/formats.md)", file=sys.stderr)
        return 1
    if test is not None and not summary.get("test_examples"):
        why = _why_no_example(summary["test_malformed"], summary["first_test_malformed"],
                              "it has no data line")
        print(f"pyfleet train: no test example was read from {test} ({why}); the model and "
              f"checkpoint are in {run_dir}", file=sys.stderr)
        return 1
    return 0

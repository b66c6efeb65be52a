"""``pyfleet train`` in four steps: validate (every option and the data checked before
anything is written: :mod:`pyfleet.cli.train_checks`), plan (the run directory and the
job file: :mod:`pyfleet.cli.train_plan`), run (the job file written, the cluster
launched and watched), report (the summary, the plot, the exit code)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from typing import NamedTuple

from pyfleet import _atomic
from pyfleet.cli.data import _default_cache_dir
from pyfleet.cli.export import model_of_best_pass
from pyfleet.cli.modes import MPI_MODES
from pyfleet.cli.monitor import Monitor, count_lines
from pyfleet.cli.plot import plot_run
from pyfleet.cli.report import (
    QuietLauncher,
    _format_summary,
    _LogFile,
    _one_line,
    _RoleOutput,
    _why_no_example,
)
from pyfleet.cli.resume import _interrupted
from pyfleet.cli.tensorboard import TensorBoard
from pyfleet.cli.train_checks import Data, Options, check_data, check_options
from pyfleet.cli.train_plan import Plan, _clear_run_dir, plan_job
from pyfleet.data import synthetic
from pyfleet.data.readers import list_files
from pyfleet.launch.collective import find_mpiexec
from pyfleet.launch.local import launch_local
from pyfleet.service import auth

cli_log = logging.getLogger("pyfleet.cli")


class Run(NamedTuple):
    """What running the job left for the report."""
    code: int                  # the launcher's exit code
    started: float             # time.time() when the roles were launched
    last_pass: int
    truth: dict | None         # the generated data set's ground truth (no --train)
    monitor: Monitor
    tensorboard: TensorBoard | None
    restarts: list             # the roles restarted, as the launcher reported them


def cmd_train(args, argv):
    """``pyfleet train``: validate -> plan -> run -> report."""
    say = _sayer(args)
    options = check_options(args, argv)
    data = check_data(args, say)
    plan = plan_job(args, options, data, say)
    if args.emit_k8s is not None:  # the same job, for a cluster: nothing runs here
        return _emit_k8s(args, plan.job, generated=data.train is None)
    run = _run(args, options, data, plan, say)
    return _report(args, plan.job, run, say)


def _sayer(args):
    """``say(text)``: a line for the user (stderr under --json, which leaves stdout
    to the JSON; nothing under --quiet), and the run's log."""
    out = sys.stderr if args.json else sys.stdout

    def say(text):
        if not args.quiet:
            print(text, file=out, flush=True)
        cli_log.info("%s", text)

    return say


def _emit_k8s(args, job, generated):
    from pyfleet.launch.k8s import write_manifests
    path = write_manifests(os.path.abspath(args.emit_k8s), job, args.servers,
                           args.workers, image=args.image,
                           generated=(args.rows, args.seed) if generated else None)
    print(f"pyfleet train: the job's Kubernetes manifests are in {path} (kubectl apply "
          f"-f {os.path.dirname(path)}; its header says what to build and create first)")
    return 0


def _run(args, options: Options, data: Data, plan: Plan, say) -> Run:
    """The roles' environment, the generated data set if there is no --train, the run
    directory written, then the cluster launched and watched until it ends."""
    job, run_dir = plan.job, plan.job["run_dir"]
    env = _role_env(args, run_dir)
    truth = None
    if data.train is None:
        truth = _generate(args, say)
        job.update(train=truth["train"], test=truth["test"])
    job_path = _write_run_dir(args, job, plan.doomed)
    # Roles run in the run directory: `python -m` puts the working directory
    # first on sys.path, and a source checkout there (where `pip install .`
    # was typed) would shadow the installed package and its compiled modules.
    cmd = [sys.executable, "-m", "pyfleet.trainer", job_path]
    started = time.time()
    last_pass = job["first_pass"] + args.epochs - 1
    monitor = Monitor(run_dir, args.workers, job["first_pass"], last_pass,
                      _total_lines(args, job, data), args.log_interval, say)
    say(f"starting {args.servers} server(s) and {args.workers} worker(s), {args.mode}"
        + (f" (workers through {find_mpiexec()})" if args.mode in MPI_MODES else "")
        + f"; logs in {run_dir}/logs")
    tensorboard = TensorBoard(run_dir) if args.tensorboard else None
    if tensorboard is not None:
        monitor.listeners.append(tensorboard.add)
    monitor.start()
    restarts = []
    try:
        code = _launch(args, options.hosts, cmd, env, run_dir, restarts)
    finally:
        monitor.finish()
        if tensorboard is not None:
            tensorboard.close()
    return Run(code, started, last_pass, truth, monitor, tensorboard, restarts)


def _role_env(args, run_dir):
    """The roles' environment. Workers' save and load requests are confined to the run
    directory (the servers load --resume's checkpoint themselves, from wherever it is)."""
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
    return env


def _generate(args, say):
    """The synthetic data set of --rows and --seed (cached): its paths and ground truth."""
    cache = os.path.abspath(args.cache_dir or _default_cache_dir())
    try:
        return synthetic.cached(cache, rows=args.rows, seed=args.seed, say=say)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet train: cannot generate the data set into {cache}: "
                         f"{e}") from None


def _write_run_dir(args, job, doomed):
    """The run directory made (what --overwrite replaces deleted first), the job file
    written, the logs directory and this process's log opened; the job file's path."""
    run_dir = job["run_dir"]
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
    return job_path


def _total_lines(args, job, data):
    """Training lines a pass reads (for the progress line's % and ETA), or None."""
    total_lines = data.total_lines
    try:
        if total_lines is None:
            total_lines = count_lines(list_files(job["train"]),
                                      header_lines=1 if job["format"] == "csv" else 0)
    except (OSError, ValueError):
        total_lines = None
    if total_lines is not None and args.valid_fraction:
        total_lines = int(total_lines * (1 - args.valid_fraction))
    return total_lines


def _launch(args, hosts, cmd, env, run_dir, restarts):
    """The roles launched until the job ends: the exit code. Across --hosts a
    parameter-server job is one mpirun job (:func:`launch_hosts`); the ranks of a
    collective or hybrid job are always one, supervised here, placed on the hosts by
    mpirun, and a hybrid job's servers run here, on the first host (at --port + i)."""
    out = sys.stderr if args.json else sys.stdout
    if hosts is not None and args.mode not in MPI_MODES:
        from pyfleet.launch.hosts import DEFAULT_PORT, launch_hosts
        return launch_hosts(cmd, args.servers, args.workers, hosts=args.hosts,
                            hostfile=args.hostfile, mode=args.mode, env=env,
                            port=DEFAULT_PORT if args.port is None else args.port,
                            log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                            cwd=run_dir,
                            messages=QuietLauncher(sys.stderr) if args.quiet else out,
                            max_restarts=args.max_restarts,
                            restart_window=args.restart_window,
                            restore_dir=os.path.join(run_dir, "checkpoint"),
                            restarts=restarts)
    return launch_local(lambda role, index: cmd, servers=args.servers,
                        workers=args.workers, env=env,
                        log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                        mode=args.mode, cwd=run_dir, output=_RoleOutput(sys.stderr),
                        messages=QuietLauncher(sys.stderr) if args.quiet else None,
                        max_restarts=args.max_restarts,
                        restart_window=args.restart_window,
                        restore_dir=os.path.join(run_dir, "checkpoint"),
                        restarts=restarts, mpi_hosts=hosts,
                        **({"host": hosts[0], "server_endpoints": None if args.port is None
                            else [f"{hosts[0]}:{args.port + i}" for i in range(args.servers)]}
                           if hosts and args.mode == "hybrid" else {}))


def _report(args, job, run: Run, say):
    """The summary (summary.json, the plot, the table or --json) and the exit code."""
    from pyfleet.trainer import summarize  # lazy: the trainer imports Fluid
    run_dir = job["run_dir"]
    if run.code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
        print(_interrupted(run_dir, job["resume"], run.monitor, run.last_pass, args),
              file=sys.stderr)
        return run.code
    if run.code != 0:
        print(f"pyfleet train: the job failed (exit code {run.code}); logs in {run_dir}/logs",
              file=sys.stderr)
        return run.code
    summary = summarize(run_dir, args.workers)
    summary.update({"model": args.model, "servers": args.servers, "workers": args.workers,
                    "mode": args.mode, "run_dir": run_dir,
                    "wall_seconds": time.time() - run.started,
                    "checkpoint": os.path.join(run_dir, "checkpoint"),
                    "inference_model": None if args.no_model else os.path.join(run_dir, "model"),
                    "restarts": run.restarts})
    if run.truth is not None:
        summary["truth_auc_test"] = run.truth["truth_auc_test"]
        summary["truth_logloss_test"] = run.truth["truth_logloss_test"]
    if not args.no_model and not _keep_best_model(args, job, summary, run.last_pass, say):
        return 1
    if not _write_summary(args, job, summary, run):
        return 1
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        print(_format_summary(summary))
    return _examples_read(job, summary)


def _keep_best_model(args, job, summary, last_pass, say):
    """RUN_DIR/model's pass in the summary; with --keep-best, the best pass's model
    exported over the last one's. False if that failed (said on stderr)."""
    run_dir = job["run_dir"]
    summary["inference_model_pass"] = last_pass
    if args.keep_best and summary.get("best_pass") not in (None, last_pass):
        try:
            model_of_best_pass(run_dir, summary, job, say)
        except (OSError, ValueError) as e:
            print(f"pyfleet train: --keep-best: cannot export the best pass's model: "
                  f"{_one_line(e)}; {run_dir}/model is pass {last_pass}'s",
                  file=sys.stderr)
            return False
    return True


def _write_summary(args, job, summary, run):
    """The training plot and summary.json; False if a write failed (said on stderr)."""
    run_dir = job["run_dir"]
    try:
        plot = plot_run(run_dir, {**job, "servers": args.servers, "workers": args.workers,
                                  "generated": run.truth is not None},
                        truth_auc=None if run.truth is None else run.truth["truth_auc_test"])
        if plot:
            summary["plot"] = plot
        if run.tensorboard is not None:
            summary["tensorboard"] = run.tensorboard.path
        _atomic.write_json(os.path.join(run_dir, "summary.json"), summary, indent=1)
    except OSError as e:
        print(f"pyfleet train: {_one_line(e)}", file=sys.stderr)
        return False
    return True


def _examples_read(job, summary):
    """1 (said on stderr) if no training example, or no test example, was read."""
    train, test, fmt, run_dir = job["train"], job["test"], job["format"], job["run_dir"]
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

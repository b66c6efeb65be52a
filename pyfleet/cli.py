"""The ``pyfleet`` command line.

    pyfleet train [options]      train a CTR model on a local cluster (the main job)
    pyfleet gen-data [options]   write the synthetic Criteo-format data set
    pyfleet predict [options]    score a data file with a saved inference model
    pyfleet keygen DIR           write CURVE key pairs for authenticated clusters

`pyfleet train` with no argument is the embedded default: it generates a
synthetic data set with a known ground truth, starts 1 server and 2 workers on
127.0.0.1, trains the DNN for one pass, evaluates on the held-out split, and
prints a summary (also in RUN_DIR/summary.json).
"""

import argparse
import json
import logging
import math
import os
import re
import shlex
import signal
import sys
import time

from pyfleet._version import __version__
from pyfleet._monitor import Monitor, count_lines
from pyfleet.data import Dataset, _parse, synthetic
from pyfleet.data import files as data_files
from pyfleet.data.readers import describe_malformed, list_files
from pyfleet.launch import HelpFormatter, launch_local
from pyfleet.service import auth
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["main"]

DEFAULT_ROWS = 200_000


def _add_parser(sub, name, help, description):
    return sub.add_parser(name, help=help, description=description,
                          formatter_class=HelpFormatter)


# Settings a resumed run takes from the resumed run's job.json unless given on
# the command line; the first group fixes the parameters a checkpoint holds.
ARCHITECTURE = ("model", "embedding_dim", "layers", "optimizer")
INHERITED = ARCHITECTURE + (
    "train", "test", "format", "rows", "servers", "workers", "mode", "batch_size", "lr",
    "beta1", "beta2", "epsilon", "l1", "l2", "lr_power", "initial_accumulator", "seed",
    "admission_count", "show_click", "shrink_min_score", "shrink_decay",
    "shrink_unseen_passes", "valid_fraction", "keep", "keep_best")

# Optimizer flag -> (optimizer parameter, the optimizers that take it).
OPTIMIZER_FLAGS = {
    "beta1": ("beta1", ("adam",)), "beta2": ("beta2", ("adam",)),
    "epsilon": ("epsilon", ("adam", "adagrad")),
    "initial_accumulator": ("initial_accumulator_value", ("adagrad",)),
    "l1": ("l1", ("ftrl",)), "l2": ("l2", ("ftrl",)), "lr_power": ("lr_power", ("ftrl",)),
}
DEFAULT_LR = {"adam": 0.001, "adagrad": 0.01, "sgd": 0.01, "ftrl": 0.05}


def _train_parser(sub):
    p = _add_parser(sub, "train", "train a CTR model on a local cluster",
                    "Train a CTR model with a local parameter-server cluster on 127.0.0.1.\n"
                    "With no --train, a synthetic data set with a known ground truth is\n"
                    "generated (and cached) first.")
    p.add_argument("--train", help="training data: a file, a directory of shards, or a "
                                   "comma-separated list (default: generated data)")
    p.add_argument("--test", help="held-out data (default: the generated data's test split; "
                                  "none with --train)")
    p.add_argument("--valid-fraction", type=float, default=None, metavar="F",
                   help="hold out about F of the --train rows (chosen by a hash of their "
                        "features) as the test data evaluated after every pass (default: "
                        "none; not with --test)")
    p.add_argument("--format", default="auto", choices=["auto", "criteo", "csv", "slot"],
                   help="data format; auto reads it from each file's first line")
    p.add_argument("--model", default="dnn", choices=["lr", "dnn", "widedeep", "deepfm"],
                   help="the network")
    p.add_argument("--servers", type=int, default=1, help="parameter servers")
    p.add_argument("--workers", type=int, default=2, help="trainer processes")
    p.add_argument("--mode", default="async", choices=["sync", "async", "geo"],
                   help="how workers' gradients reach the servers")
    p.add_argument("--epochs", type=int, default=1,
                   help="passes over the training data (with --resume: passes after the "
                        "checkpoint's)")
    p.add_argument("--batch-size", type=int, default=512, help="examples per step")
    p.add_argument("--embedding-dim", type=int, default=16, help="sparse embedding width")
    p.add_argument("--layers", default="256,128,64",
                   help="hidden layer sizes, comma-separated")
    p.add_argument("--optimizer", default="adam", choices=["adam", "adagrad", "sgd", "ftrl"],
                   help="update rule, applied on the servers")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: adam 0.001, adagrad 0.01, sgd 0.01, "
                        "ftrl 0.05)")
    p.add_argument("--beta1", type=float, default=None, help="adam only (default: 0.9)")
    p.add_argument("--beta2", type=float, default=None, help="adam only (default: 0.999)")
    p.add_argument("--epsilon", type=float, default=None,
                   help="adam and adagrad (default: adam 1e-8, adagrad 1e-6)")
    p.add_argument("--initial-accumulator", type=float, default=None,
                   help="adagrad only: the accumulator's start value (default: 0)")
    p.add_argument("--l1", type=float, default=None, help="ftrl only (default: 0)")
    p.add_argument("--l2", type=float, default=None, help="ftrl only (default: 0)")
    p.add_argument("--lr-power", type=float, default=None,
                   help="ftrl only (default: -0.5)")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help="rows of the generated data set (with no --train)")
    p.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="where generated data sets are kept, one per (rows, seed) "
                        "(default: $PYFLEET_CACHE_DIR, else $XDG_CACHE_HOME/pyfleet, else "
                        "~/.cache/pyfleet)")
    p.add_argument("--run-dir", help="where to write everything; must be empty or new "
                                     "(default: runs/<time>, or the --resume directory)")
    p.add_argument("--checkpoint-dir", help="the same as --run-dir (Paddle's name; default: --run-dir's)")
    p.add_argument("--overwrite", action="store_true",
                   help="reuse a non-empty --run-dir: its previous run's files are deleted "
                        "first (default: refuse it)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a previous run from its checkpoint, with its settings "
                        "(flags given here win; by default the run goes on in RUN_DIR)")
    p.add_argument("--keep", type=int, default=None, metavar="K",
                   help="also keep the checkpoints of the last K passes, in "
                        "RUN_DIR/checkpoints/pass-NNNN (default: only RUN_DIR/checkpoint, the "
                        "latest)")
    p.add_argument("--keep-best", action="store_true",
                   help="also keep the checkpoint of the pass with the highest test AUC, "
                        "RUN_DIR/checkpoints/best (needs test data; default: off)")
    p.add_argument("--seed", type=int, default=0, help="shuffling, initialisation and "
                                                       "generated data")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print no progress and no phase, only warnings, errors and the "
                        "summary (metrics.jsonl and the logs are written all the same; "
                        "default: off)")
    p.add_argument("--log-interval", type=float, default=2.0, metavar="SECONDS",
                   help="seconds between progress lines (and metrics.jsonl records)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"],
                   help="level of the roles' logs, RUN_DIR/logs/<role>.log (warnings and "
                        "errors are also shown on the console)")
    p.add_argument("--json", action="store_true",
                   help="print the summary as JSON, alone on stdout (progress goes to "
                        "stderr)")
    p.add_argument("--curve-dir", default=None, metavar="DIR",
                   help="a 'pyfleet keygen' directory: roles authenticate with CURVE keys "
                        "(sets PYFLEET_CURVE_DIR, docs/operations.md; default: no "
                        "authentication)")
    p.add_argument("--admission-count", type=int, default=None, metavar="N",
                   help="admit a sparse key as a trainable row only once it was pulled N "
                        "times (CountFilterEntry(N)); default: every key on first sight")
    p.add_argument("--show-click", action="store_true",
                   help="send each batch's per-id show/click counts to the servers "
                        "(Paddle's CTR accessor), for --shrink-min-score (default: off)")
    p.add_argument("--shrink-min-score", type=float, default=None, metavar="S",
                   help="at the end of every pass drop rows whose decayed show/click score "
                        "0.1*(show-click)+click is below S (needs --show-click; default: "
                        "keep them)")
    p.add_argument("--shrink-decay", type=float, default=0.98, metavar="D",
                   help="per-pass decay of the show/click counters")
    p.add_argument("--shrink-unseen-passes", type=int, default=None, metavar="T",
                   help="at the end of every pass drop rows not updated for more than T "
                        "passes (default: keep them)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the job after this many seconds (default: no limit)")
    return p


def _split_paths(value):
    """A comma-separated path list as absolute paths (the roles run elsewhere)."""
    if value is None:
        return None
    parts = [os.path.abspath(v) for v in value.split(",") if v]
    return parts[0] if len(parts) == 1 else parts


def _format_summary(s):
    rows = [("test AUC", f"{s['test_auc']:.4f}" if "test_auc" in s else "-"),
            ("test logloss", f"{s['test_logloss']:.4f}" if "test_logloss" in s else "-")]
    if "truth_auc_test" in s:
        rows.append(("ground-truth AUC", f"{s['truth_auc_test']:.4f}"))
    rows += [("train AUC", f"{s['train_auc']:.4f}"),
             ("train logloss", f"{s['train_logloss']:.4f}"),
             ("train examples", f"{s['train_examples']:,}")]
    if s.get("train_malformed"):
        rows.append(("malformed lines skipped", (f"{s['train_malformed']:,} (last pass; "
                                                 f"first: {s['first_malformed'][0]})")))
    if s.get("test_malformed"):
        rows.append(("malformed test lines", (f"{s['test_malformed']:,} (first: "
                                              f"{s['first_test_malformed'][0]})")))
    rows += [("train examples/s", f"{s['train_examples_per_sec']:,.0f}"),
             ("train seconds", f"{s['train_seconds']:.1f}")]
    for name, n in sorted(s.get("table_rows", {}).items()):
        rows.append((f"rows in {name}", f"{n:,}"))
    for i, rss in enumerate(s.get("server_rss_bytes", [])):
        rows.append((f"server {i} memory (RSS)", f"{rss / 2**20:,.1f} MiB"))
    rows += [("model", s["model"]), ("cluster", f"{s['servers']} server(s), "
                                               f"{s['workers']} worker(s), {s['mode']}"),
             ("run directory", s["run_dir"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _plot(run_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        records = [json.loads(x) for x in f if x.strip()]
    lines = [x for x in records if "loss" in x]  # the progress records
    tests = [x for x in records if x.get("test_auc") is not None]
    if not lines:
        return None
    t0 = lines[0]["time"]
    t = [x["time"] - t0 for x in lines]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(t, [x["loss"] for x in lines])
    a.set_xlabel("seconds")
    a.set_ylabel("logloss (window)")
    b.plot(t, [x["auc"] for x in lines], label="train (running)")
    if tests:
        b.plot([x["time"] - t0 for x in tests], [x["test_auc"] for x in tests], "o",
               label="test, after each pass")
        b.legend(loc="lower right")
    b.set_xlabel("seconds")
    b.set_ylabel("running AUC")
    fig.tight_layout()
    out = os.path.join(run_dir, "training.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _explicit_dests(parser, argv):
    """The dests of the options given on the command line ``argv`` (not defaults)."""
    unset = object()
    ns = argparse.Namespace(**{a.dest: unset for a in parser._actions})
    parser.parse_args(argv, ns)
    return {k for k, v in vars(ns).items() if v is not unset}


def _inherit(args, explicit, settings, where):
    """Take the resumed run's ``settings`` for every flag not given; refuse a
    conflicting architecture (the checkpoint holds that network's parameters)."""
    for dest in INHERITED:
        if dest not in settings:
            continue
        if dest in explicit:
            if dest in ARCHITECTURE and getattr(args, dest) != settings[dest]:
                flag = "--" + dest.replace("_", "-")
                raise SystemExit(
                    f"pyfleet train: --resume: {flag} {getattr(args, dest)} conflicts with "
                    f"the run resumed ({settings[dest]} in {where}): its checkpoint holds "
                    f"that network's parameters")
        else:
            setattr(args, dest, settings[dest])


def _resumed_settings(job):
    """The command-line settings of a job.json (older ones lack ``settings``)."""
    if isinstance(job.get("settings"), dict):
        return job["settings"]
    keys = ("model", "embedding_dim", "lr", "batch_size", "mode", "seed", "format",
            "admission_count", "show_click", "shrink_min_score", "shrink_decay",
            "shrink_unseen_passes", "valid_fraction", "keep", "keep_best")
    out = {k: job[k] for k in keys if k in job}
    if isinstance(job.get("layers"), list):
        out["layers"] = ",".join(str(x) for x in job["layers"])
    return out


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
    from pyfleet.trainer import optimizer_of
    try:
        optimizer_of({"optimizer": opt})
    except ValueError as e:
        raise SystemExit(f"pyfleet train: --optimizer {args.optimizer}: {e}") from None
    return opt


FIRST_LINES = 20


def _check_first_lines(paths, fmt, flag):
    """Every input file's format (one for all) and first lines, before any
    process starts: a file whose first lines hold no valid example is refused,
    naming its first bad line. Returns the (resolved) format and schema."""
    schema, requested = None, fmt
    for path in list_files(paths):
        if not data_files.read_first_line(path):
            continue  # an empty file (or shard) adds nothing and breaks nothing
        ds = Dataset(path, format=requested)
        if fmt == "auto":
            fmt = ds.format
        elif ds.format != fmt:
            raise ValueError(f"{path} looks like {ds.format}, the files before it like "
                             f"{fmt}: every file must be in the same format")
        if schema is None:
            schema = ds.schema
        f, raw = data_files.open_data(path)
        try:
            lines = [f.readline(1 << 20) for _ in range(FIRST_LINES + 1)]
        finally:
            f.close()
            if raw is not None:
                raw.close()
        first = 1
        if ds.format == "csv":
            ds._check_header(lines[0].rstrip(b"\r\n"), path)  # the same columns as the first file
            lines, first = lines[1:], 2
        else:
            lines = lines[:-1]
        lines = [x if x.endswith(b"\n") else x + b"\n" for x in lines if x]
        if not lines:
            continue
        r = ds._parse(memoryview(bytearray(b"".join(lines))), 0)
        if r["examples"] == 0 and r["malformed"]:
            bad = int(r["bad_lines"][0]) + first
            raise ValueError(
                f"none of the first {len(lines)} lines of {path} reads as {ds.format} "
                f"({path}:{bad}: {_parse.REASONS[int(r['bad_reasons'][0])]}); see "
                f"docs/formats.md" + ("" if flag is None else ", or pass --format"))
    return fmt, schema


def _check_whole_files(train, test, fmt):
    """Read --train and --test whole when they are small enough to count (a
    truncated gzip file, an unreadable shard or an overlong line is refused by
    name before anything is written); --train's data lines, or None."""
    from pyfleet._monitor import COUNT_LIMIT
    total = None
    for flag, paths in (("--train", train), ("--test", test)):
        if paths is None:
            continue
        try:
            names = list_files(paths)
            if sum(os.path.getsize(f) for f in names) > COUNT_LIMIT:
                continue  # the workers' readers name what they cannot read
            n = data_files.count_data_lines(names, header_lines=1 if fmt == "csv" else 0)
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: {flag}: {e}") from None
        total = n if flag == "--train" else total
    return total


def _default_cache_dir():
    env = os.environ.get("PYFLEET_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pyfleet")


# What `pyfleet train` writes into a run directory (what --overwrite deletes).
RUN_FILES = ("checkpoint", "checkpoints", "model", "logs", "data", "progress", "job.json",
             "metrics.jsonl", "summary.json", "training.png")


def _clear_run_dir(run_dir):
    import glob
    import shutil
    for name in RUN_FILES:
        path = os.path.join(run_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    for path in glob.glob(os.path.join(run_dir, "worker*.json")) + glob.glob(
            os.path.join(run_dir, "worker*.test.npz")):
        os.unlink(path)


def cmd_train(args, argv):
    from pyfleet.trainer import JOB_DEFAULTS, summarize

    out = sys.stderr if args.json else sys.stdout  # under --json stdout holds the JSON alone
    cli_log = logging.getLogger("pyfleet.cli")

    def say(text):
        if not args.quiet:
            print(text, file=out, flush=True)
        cli_log.info("%s", text)

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
    if args.servers < 1 or args.workers < 1:
        raise SystemExit("pyfleet train: --servers and --workers must be >= 1")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--embedding-dim", args.embedding_dim), ("--rows", args.rows)):
        if value < 1:
            raise SystemExit(f"pyfleet train: {flag} must be >= 1, got {value}")
    if args.lr is not None and (not math.isfinite(args.lr) or args.lr <= 0):
        raise SystemExit(f"pyfleet train: --lr must be a finite number > 0, got {args.lr}")
    optimizer = _optimizer_of(args)
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
    if not args.log_interval > 0:
        raise SystemExit(f"pyfleet train: --log-interval must be > 0 seconds, got "
                         f"{args.log_interval}")
    if args.keep_best and args.train and not args.test and args.valid_fraction is None:
        raise SystemExit("pyfleet train: --keep-best needs test data to rank the passes: "
                         "--test or --valid-fraction")
    truth = total_lines = None
    train, test, fmt = _split_paths(args.train), _split_paths(args.test), args.format
    for flag, paths in (("--train", train), ("--test", test)):
        for path in [paths] if isinstance(paths, str) else paths or []:
            if not os.path.exists(path):
                raise SystemExit(f"pyfleet train: {flag}: no such file or directory: {path}")
    if train is not None:  # every file's format and first lines before anything is written
        say(f"checking the data: {args.train}" + (f", {args.test}" if args.test else ""))
        try:
            fmt, schema = _check_first_lines(train, fmt, "--format")
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: --train: {e}") from None
        if schema is None:
            raise SystemExit(f"pyfleet train: --train: no data line in {args.train}")
        if test is not None:
            try:
                if args.format == "auto":
                    tfmt, _ = _check_first_lines(test, "auto", "--format")
                    if tfmt not in (fmt, "auto"):
                        raise ValueError(f"it looks like {tfmt}, --train like {fmt}: they "
                                         f"must be in the same format")
                _, test_schema = _check_first_lines(test, fmt, "--format")
            except (OSError, ValueError) as e:
                raise SystemExit(f"pyfleet train: --test: {e}") from None
            if test_schema is not None and (test_schema.n_dense, test_schema.n_slots) != (
                    schema.n_dense, schema.n_slots):
                raise SystemExit(
                    f"pyfleet train: --test has {test_schema.n_dense} dense features and "
                    f"{test_schema.n_slots} slots read as {fmt}, --train {schema.n_dense} and "
                    f"{schema.n_slots}: they must be in the same format")
        n_dense, n_slots = schema.n_dense, schema.n_slots
        total_lines = _check_whole_files(train, test, fmt)
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
    settings = {dest: getattr(args, dest) for dest in INHERITED}
    job = {**JOB_DEFAULTS, "train": train, "test": test, "format": fmt, "model": args.model,
           "embedding_dim": args.embedding_dim,
           "layers": layers, "optimizer": optimizer,
           "lr": optimizer["learning_rate"], "batch_size": args.batch_size,
           "epochs": args.epochs,
           "mode": args.mode, "seed": args.seed, "run_dir": run_dir, "resume": resume,
           "first_pass": first_pass,
           "n_dense": n_dense, "n_slots": n_slots,
           "admission_count": args.admission_count, "show_click": args.show_click,
           "shrink_min_score": args.shrink_min_score, "shrink_decay": args.shrink_decay,
           "shrink_unseen_passes": args.shrink_unseen_passes, "settings": settings,
           "valid_fraction": args.valid_fraction, "keep": args.keep,
           "keep_best": args.keep_best, "log_level": args.log_level,
           "progress_interval": args.log_interval}
    if resume:  # another model's checkpoint: refused here, not in every server
        from pyfleet.trainer import tables_of
        try:
            _checkpoint.check_tables(manifest.get("tables") or [], tables_of(job),
                                     f"{resume}/checkpoint", extra_ok=False)
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: {e} (--model, "
                             f"--layers, --embedding-dim, --optimizer and the data's "
                             f"features must be those of the run resumed)") from None
        done = (manifest.get("meta") or {}).get("pass")
        if isinstance(done, int) and not isinstance(done, bool) and done >= 1:
            job["first_pass"] = done + 1
            say(f"resuming after pass {done} of {resume}: passes {done + 1}.."
                f"{done + args.epochs}")
        else:  # saved by save_persistables without the trainer's pass number
            say(f"resuming from {resume}/checkpoint, which does not say which pass it "
                f"ended: passes are numbered from 1 again")
    # Workers' save and load requests are confined to the run directory (the
    # servers load --resume's checkpoint themselves, from wherever it is).
    env = dict(os.environ, PYFLEET_CHECKPOINT_DIR=run_dir)
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
        if args.overwrite and not in_place:
            _clear_run_dir(run_dir)
    except OSError as e:
        raise SystemExit(f"pyfleet train: --run-dir: cannot create {run_dir}: {e.strerror}") \
            from None
    job_path = os.path.join(run_dir, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f, indent=1)
    os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
    handler = logging.FileHandler(os.path.join(run_dir, "logs", "pyfleet.log"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s pyfleet %(name)s: "
                                           "%(message)s"))
    cli_log.addHandler(handler)
    cli_log.setLevel(args.log_level.upper())
    cli_log.propagate = False
    # A previous attempt's progress files (a resumed run) must not count in this one.
    import shutil
    shutil.rmtree(os.path.join(run_dir, "progress"), ignore_errors=True)
    os.makedirs(os.path.join(run_dir, "progress"))
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
    say(f"starting {args.servers} server(s) and {args.workers} worker(s), {args.mode}; "
        f"logs in {run_dir}/logs")
    monitor.start()
    try:
        code = launch_local(lambda role, index: cmd, servers=args.servers,
                            workers=args.workers, env=env,
                            log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                            mode=args.mode, cwd=run_dir, output=_RoleOutput(sys.stderr))
    finally:
        monitor.finish()
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
                    "inference_model": os.path.join(run_dir, "model")})
    if truth is not None:
        summary["truth_auc_test"] = truth["truth_auc_test"]
        summary["truth_logloss_test"] = truth["truth_logloss_test"]
    plot = _plot(run_dir)
    if plot:
        summary["plot"] = plot
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
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


class _RoleOutput:
    """Where the launcher writes the roles' output lines (``[worker.0] ...``):
    their DEBUG and INFO log records stay in the role's log file only (the job's
    progress is the monitor's one line); warnings, errors, tracebacks and
    anything else reach ``stream``."""

    _HIDDEN = re.compile(r"^\[\w+\.\d+\] \d{4}-\d\d-\d\d [\d:,]+ (DEBUG|INFO) ")

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if not self._HIDDEN.match(text):
            self.stream.write(text)

    def flush(self):
        self.stream.flush()


def _interrupted(run_dir, resume, monitor, last_pass, args):
    """What an interrupted run kept, and the command that continues it."""
    try:
        m = _checkpoint.read_manifest(os.path.join(run_dir, "checkpoint"))
    except ValueError:
        m = None
    during = (f" during pass {monitor.current_pass}" if monitor.current_pass is not None
              else "")
    if m is None:
        return (f"pyfleet train: interrupted{during}; no pass had finished, so no checkpoint "
                f"was kept (the logs are in {run_dir}/logs)")
    done = (m.get("meta") or {}).get("pass")
    text = f"pyfleet train: interrupted{during}; kept: {run_dir}/checkpoint"
    if isinstance(done, int):
        text += f" (after pass {done})"
        left = last_pass - done
    else:
        left = args.epochs
    if left <= 0:
        return text + "; every pass was trained and saved"
    return (text + f". Continue with:\n  pyfleet train --resume {shlex.quote(run_dir)} "
            f"--epochs {left}")


def _why_no_example(malformed, first, otherwise):
    """Why a data set gave no example: its malformed lines, or ``otherwise``."""
    if not malformed:
        return otherwise
    return f"{malformed:,} malformed line(s), the first: " + "; ".join(first)


def cmd_gen_data(args):
    try:
        info = synthetic.generate(args.out, rows=args.rows, seed=args.seed,
                                  test_fraction=args.test_fraction, train_shards=args.shards)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet gen-data: {e}") from None
    print(json.dumps(info, indent=1))
    return 0


def cmd_predict(args):
    from pyfleet.fluid import inference  # Fluid: loaded by the command that needs it only
    if args.batch_size < 1:
        raise SystemExit(f"pyfleet predict: --batch-size must be >= 1, got {args.batch_size}")
    try:
        model = inference.load(args.model)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: --model {args.model}: {e} (the model/ directory "
                         f"of a pyfleet train run, or fleet.save_inference_model's)") from None
    if not os.path.exists(args.data):
        raise SystemExit(f"pyfleet predict: --data: no such file or directory: {args.data}")
    try:
        fmt, _ = _check_first_lines(args.data, args.format, "--format")
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: --data: {e}") from None
    if fmt == "auto":
        raise SystemExit(f"pyfleet predict: --data: no data line in {args.data}")
    try:
        n = model.predict_file(args.data, args.out, format=fmt,
                               batch_size=args.batch_size, skip_malformed=args.skip_malformed)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: {e}") from None
    st = model.last_file_stats
    print(f"wrote {n:,} predictions to {args.out}")
    if st["malformed"]:
        print(f"skipped {st['malformed']:,} malformed line(s) (first: "
              f"{describe_malformed(st, 1)[0]}): the output has a line per valid example",
              file=sys.stderr)
    if n == 0:
        print(f"pyfleet predict: no example in {args.data}", file=sys.stderr)
        return 1
    return 0


def cmd_keygen(args):
    paths = auth.keygen(args.dir, names=args.names)
    for p in paths:
        print(p)
    return 0


DESCRIPTION = """\
pyfleet: train and use CTR models on a sparse parameter server.

  pyfleet train      train a CTR model on a local cluster (no argument: generated data)
  pyfleet gen-data   write the synthetic Criteo-format data set
  pyfleet predict    score a data file with a saved inference model
  pyfleet keygen     write CURVE key pairs for authenticated clusters

pyfleet COMMAND --help describes each command's options."""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="pyfleet", description=DESCRIPTION,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"pyfleet {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    train = _train_parser(sub)
    g = _add_parser(sub, "gen-data", "write the synthetic Criteo-format data set",
                    "Write train.tsv, test.tsv and truth.json (the ground truth's AUC and\n"
                    "logloss) of the synthetic Criteo-format data set into a directory.")
    g.add_argument("--out", default="pyfleet-data", help="output directory")
    g.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows in all")
    g.add_argument("--seed", type=int, default=0, help="the hidden model and the rows")
    g.add_argument("--test-fraction", type=float, default=0.1,
                   help="share of the rows written to test.tsv")
    g.add_argument("--shards", type=int, default=1,
                   help="training files (more than 1: train/part-NNNNN.tsv)")
    p = _add_parser(sub, "predict", "score a data file with a saved inference model",
                    "Write one click probability per data line of --data, in order.")
    p.add_argument("--model", required=True,
                   help="the model/ directory of a pyfleet train run, or "
                        "fleet.save_inference_model's (required)")
    p.add_argument("--data", required=True, help="the file to score (required)")
    p.add_argument("--format", default="auto", choices=["auto", "criteo", "csv", "slot"],
                   help="data format; auto reads it from the file's first line")
    p.add_argument("--out", default="predictions.txt", help="output file")
    p.add_argument("--batch-size", type=int, default=4096, help="examples per step")
    p.add_argument("--skip-malformed", action="store_true",
                   help="skip malformed lines (default: stop at the first, naming it: a "
                        "skipped line shifts every later prediction against its input line)")
    k = _add_parser(sub, "keygen", "write CURVE key pairs (server and client)",
                    "Write CURVE key pairs into DIR (see docs/operations.md).")
    k.add_argument("dir", help="output directory")
    k.add_argument("--names", nargs="+", default=["server", "client"],
                   help="one key pair per name")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "train":
            args._parser = train
            return cmd_train(args, argv[argv.index("train") + 1:])
        return {"gen-data": cmd_gen_data, "predict": cmd_predict,
                "keygen": cmd_keygen}[args.command](args)
    except KeyboardInterrupt:  # (pyfleet train's roles are stopped by its launcher)
        print(f"pyfleet {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

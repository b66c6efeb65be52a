"""``pyfleet train``'s first step, validate: every option, a resumed run's checkpoint
and the data's format and first lines are checked before anything is written or
started. Each function refuses bad input by name with ``SystemExit``."""

from __future__ import annotations

import json
import math
import os
import re
from typing import NamedTuple

from pyfleet.cli.data import _check_first_lines, _check_whole_files, _split_paths
from pyfleet.cli.modes import check_mode_options, check_scale_out_options
from pyfleet.cli.resume import _explicit_dests, _inherit, _resumed_settings
from pyfleet.cli.tensorboard import check_available
from pyfleet.data import synthetic
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


class Options(NamedTuple):
    """What checking the options computed: the optimizer (``{"name", **parameters}``),
    the hidden layer sizes, ``--checkpoint-every`` in seconds, the hosts (None: this
    machine), and the resumed run (its directory and checkpoint manifest, or None)."""
    optimizer: dict
    layers: list
    checkpoint_seconds: float | None
    hosts: list | None
    resume: str | None
    manifest: dict | None


class Data(NamedTuple):
    """The data as checked: paths (None: generated later), format, the schema's sizes,
    and the training lines counted on the way (None: not counted yet)."""
    train: object
    test: object
    fmt: str
    n_dense: int
    n_slots: int
    total_lines: int | None


def check_options(args, argv) -> Options:
    """Every option of ``pyfleet train`` on its own and with the others; a resumed
    run's job.json is inherited first (options given on the command line win)."""
    if args.tensorboard:
        check_available()
    resume, manifest = read_resume(args, argv)
    check_mode_options(args, _explicit_dests(args._parser, argv))
    _check_numbers(args)
    optimizer = _optimizer_of(args)
    _check_storage(args)
    layers = _layers_of(args)
    _check_row_policies(args)
    _check_passes(args)
    checkpoint_seconds = _healing_options(args)
    hosts = check_scale_out_options(args)
    _check_progress(args)
    return Options(optimizer, layers, checkpoint_seconds, hosts, resume, manifest)


def _check_numbers(args):
    """Role counts, sizes, the learning rate and the request timeout."""
    if (args.servers < 1 and args.mode != "collective") or args.workers < 1:
        raise SystemExit("pyfleet train: --servers and --workers must be >= 1")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--embedding-dim", args.embedding_dim), ("--rows", args.rows)):
        if value < 1:
            raise SystemExit(f"pyfleet train: {flag} must be >= 1, got {value}")
    for flag, value in (("--lr", args.lr), ("--sparse-lr", args.sparse_lr)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise SystemExit(f"pyfleet train: {flag} must be a finite number > 0, got {value}")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):
        raise SystemExit(f"pyfleet train: --request-timeout must be a finite number > 0, "
                         f"got {args.request_timeout}")


def _check_storage(args):
    """The memory budget with its spill directory, and the row storage with the optimizer."""
    if (args.memory_budget is None) != (args.spill_dir is None):
        given = "--memory-budget" if args.spill_dir is None else "--spill-dir"
        raise SystemExit(f"pyfleet train: --memory-budget and --spill-dir go together "
                         f"(got only {given})")
    if args.spill_dir is not None and os.path.exists(args.spill_dir) \
            and not os.path.isdir(args.spill_dir):
        raise SystemExit(f"pyfleet train: --spill-dir {args.spill_dir} is not a directory "
                         f"(the servers' rows beyond --memory-budget go to files in it)")
    if args.storage.endswith("_q8") and args.optimizer not in ("adam", "adagrad"):
        raise SystemExit(f"pyfleet train: --storage {args.storage} keeps Adam's or Adagrad's "
                         f"state in 8 bits; --optimizer {args.optimizer} is not supported by it")


def _check_row_policies(args):
    """Admission and shrink."""
    if args.admission_count is not None and args.admission_count < 1:
        raise SystemExit("pyfleet train: --admission-count must be >= 1")
    if args.shrink_min_score is not None and not args.show_click:
        raise SystemExit("pyfleet train: --shrink-min-score needs --show-click (without "
                         "counts every row scores 0)")
    if not 0.0 < args.shrink_decay <= 1.0:
        raise SystemExit("pyfleet train: --shrink-decay must be in (0, 1]")


def _check_passes(args):
    """The held-out fraction and the checkpoints kept."""
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


def _check_progress(args):
    """The progress interval, and test data for --keep-best to rank the passes."""
    if not args.log_interval > 0:
        raise SystemExit(f"pyfleet train: --log-interval must be > 0 seconds, got "
                         f"{args.log_interval}")
    if args.keep_best and args.train and not args.test and args.valid_fraction is None:
        raise SystemExit("pyfleet train: --keep-best needs test data to rank the passes: "
                         "--test or --valid-fraction")


def read_resume(args, argv):
    """``--resume DIR``: its directory and checkpoint manifest (``(None, None)``
    without it); the run's job.json settings become the defaults of ``args``."""
    resume = os.path.abspath(args.resume) if args.resume else None
    if not resume:
        return None, None
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
    return resume, manifest


def _layers_of(args):
    """``--layers 256,128,64`` as ints, each >= 1."""
    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        layers = None
    if layers is None or any(n < 1 for n in layers):
        raise SystemExit(f"pyfleet train: --layers must be hidden layer sizes >= 1, separated "
                         f"by commas (e.g. 256,128,64), got {args.layers!r}")
    return layers


def check_data(args, say) -> Data:
    """Every input's format and first lines, and the whole files' line limits, before
    anything is written (the generated data set when there is no ``--train``)."""
    total_lines = None
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
    return Data(train, test, fmt, n_dense, n_slots, total_lines)

"""The options of every ``pyfleet`` command (argparse)."""

import argparse
import difflib

from pyfleet._version import __version__
from pyfleet.cli.config import AppendOverride
from pyfleet.cli.units import byte_count
from pyfleet.launch.command import HelpFormatter

DEFAULT_ROWS = 200_000


def _add_parser(sub, name, help, description):
    # allow_abbrev=False: `--epoch 2` is refused (with a suggestion), not taken as --epochs
    return sub.add_parser(name, help=help, description=description,
                          formatter_class=HelpFormatter, allow_abbrev=False)


def unknown_options_message(parser, extra):
    """argparse's "unrecognized arguments" for ``extra``, with the nearest option of
    ``parser`` named for each unknown ``--flag`` (``--trian``: did you mean --train?)."""
    known = [s for s in parser._option_string_actions if s.startswith("--")]
    hints = []
    for token in extra:
        flag = token.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        if not close:  # a prefix (--epoch) is refused, named by the option it begins
            close = [k for k in known if k.startswith(flag)][:1]
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    text = f"unrecognized arguments: {' '.join(extra)}"
    return text + (" (" + "; ".join(hints) + ")" if hints else "")


def _train_parser(sub):
    p = _add_parser(sub, "train", "train a CTR model on a local cluster",
                    "Train a CTR model with a local parameter-server cluster on 127.0.0.1.\n"
                    "With no --train, a synthetic data set with a known ground truth is\n"
                    "generated (and cached) first.")
    _add_input_options(p)
    _add_network_options(p)
    _add_optimizer_options(p)
    _add_run_dir_options(p)
    _add_output_options(p)
    _add_table_options(p)
    _add_job_options(p)
    add_data_options(p)
    add_scale_out_options(p)
    return p


def _add_input_options(p):
    """The training and test data and a settings file."""
    p.add_argument("--config", metavar="FILE",
                   help="read settings from a .toml, .yaml or .json file: the options' "
                        "names as keys (embedding_dim = 8, layers = [256, 128]); options on "
                        "the command line win (default: none)")
    p.add_argument("-o", dest="overrides", action=AppendOverride, default=[],
                   metavar="KEY=VALUE",
                   help="override one setting of --config (repeatable; e.g. -o "
                        "embedding_dim=8; default: none)")
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


def _add_network_options(p):
    """The network, the cluster and the passes."""
    p.add_argument("--model", default="dnn", choices=["lr", "dnn", "widedeep", "deepfm"],
                   help="the network")
    p.add_argument("--servers", type=int, default=1,
                   help="parameter servers (none with --mode collective)")
    p.add_argument("--workers", type=int, default=2, help="trainer processes")
    p.add_argument("--mode", default="async",
                   choices=["sync", "async", "geo", "hybrid", "collective"],
                   help="how workers' gradients reach the servers; hybrid: sparse tables on "
                        "the servers (--sparse-mode), dense parameters all-reduced among the "
                        "workers, one MPI job; collective: no server, every worker a replica "
                        "of the whole model, one MPI job (docs/collective.md)")
    p.add_argument("--sparse-mode", default=None, choices=["sync", "async", "geo"],
                   help="with --mode hybrid: the servers' mode for the sparse tables "
                        "(default: async)")
    p.add_argument("--epochs", type=int, default=1,
                   help="passes over the training data (with --resume: passes after the "
                        "checkpoint's)")
    p.add_argument("--batch-size", type=int, default=512, help="examples per step")
    p.add_argument("--embedding-dim", type=int, default=16, help="sparse embedding width")
    p.add_argument("--layers", default="256,128,64",
                   help="hidden layer sizes, comma-separated")


def _add_optimizer_options(p):
    """The update rule and its parameters."""
    p.add_argument("--optimizer", default="adam",
                   choices=["adam", "adagrad", "sgd", "ftrl", "momentum", "rmsprop"],
                   help="update rule, applied on the servers")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: adam 0.001, adagrad 0.01, sgd 0.01, "
                        "ftrl 0.05, momentum 0.01, rmsprop 0.001)")
    p.add_argument("--sparse-lr", type=float, default=None,
                   help="learning rate of the sparse tables' rows (the embeddings and "
                        "first-order weights) (default: 10x --lr with adam for the models "
                        "but deepfm, else --lr)")
    p.add_argument("--beta1", type=float, default=None, help="adam only (default: 0.9)")
    p.add_argument("--beta2", type=float, default=None, help="adam only (default: 0.999)")
    p.add_argument("--epsilon", type=float, default=None,
                   help="adam, adagrad and rmsprop (default: adam 1e-8, adagrad and "
                        "rmsprop 1e-6)")
    p.add_argument("--initial-accumulator", type=float, default=None,
                   help="adagrad only: the accumulator's start value (default: 0)")
    p.add_argument("--l1", type=float, default=None, help="ftrl only (default: 0)")
    p.add_argument("--l2", type=float, default=None, help="ftrl only (default: 0)")
    p.add_argument("--lr-power", type=float, default=None,
                   help="ftrl only (default: -0.5)")
    p.add_argument("--momentum", type=float, default=None,
                   help="momentum and rmsprop (default: momentum 0.9, rmsprop 0)")
    p.add_argument("--use-nesterov", action="store_true", default=None,
                   help="momentum only: Nesterov's update (default: off)")
    p.add_argument("--rho", type=float, default=None, help="rmsprop only (default: 0.95)")
    p.add_argument("--centered", action="store_true", default=None,
                   help="rmsprop only: normalize by the gradient's variance (default: off)")


def _add_run_dir_options(p):
    """The generated data set, the run directory and its checkpoints."""
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


def _add_output_options(p):
    """What is printed and logged, and the job's keys."""
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
    p.add_argument("--tensorboard", action="store_true",
                   help="also write the progress and every pass's test as TensorBoard "
                        "scalars into RUN_DIR/tensorboard (needs tensorboardX, the "
                        "tensorboard extra; default: off)")
    p.add_argument("--curve-dir", default=None, metavar="DIR",
                   help="a 'pyfleet keygen' directory: roles authenticate with its CURVE "
                        "keys (sets PYFLEET_CURVE_DIR, docs/operations.md; default: a fresh "
                        "key pair for this job, PYFLEET_JOB_KEYS=0 turns that off)")


def _add_table_options(p):
    """The sparse tables: admission, shrink, storage, memory budget."""
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
    p.add_argument("--storage", default="fp32", choices=["fp32", "fp16", "bf16", "fp16_q8", "bf16_q8"],
                   help="how the sparse tables hold rows: fp16/bf16 halve their memory, "
                        "fp16_q8/bf16_q8 also keep Adam/Adagrad state in 8 bits; updates "
                        "rounded stochastically (docs/storage.md)")
    p.add_argument("--memory-budget", type=byte_count, default=None, metavar="BYTES",
                   help="each server's RAM for its sparse rows and their index (e.g. 4G, "
                        "split evenly among the sparse tables); rows beyond it spill to "
                        "--spill-dir, hot rows stay (docs/disk_tier.md; default: all in RAM)")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="the directory on the servers' machines for the rows beyond "
                        "--memory-budget (unnamed files, nothing left after the run; "
                        "default: none, required with --memory-budget)")


def _add_job_options(p):
    """Timeouts, the inference model, checkpoints inside a pass, restarts."""
    p.add_argument("--request-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long a worker waits for a server's answer before calling the "
                        "job failed; a checkpoint save may take 10 times this (raise it for "
                        "tables of tens of GB; default: 60)")
    p.add_argument("--collective-timeout", type=float, default=None, metavar="SECONDS",
                   help="collective and hybrid modes: how long a rank may wait in one "
                        "collective for the others before the MPI job is aborted, naming the "
                        "rank that stalled (PYFLEET_COLLECTIVE_TIMEOUT; default: 60)")
    p.add_argument("--no-model", action="store_true",
                   help="do not export the inference model to RUN_DIR/model at the end "
                        "(it holds every embedding row: as large as the table's weights; "
                        "default: export it)")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the job after this many seconds (default: no limit)")
    p.add_argument("--checkpoint-steps", type=int, default=None, metavar="K",
                   help="also checkpoint inside a pass, every K of worker 0's steps, with "
                        "every worker's position in the pass (default: at pass ends only)")
    p.add_argument("--checkpoint-every", default=None, metavar="DURATION",
                   help="also checkpoint inside a pass every DURATION (300, 300s, 5m, 1h; "
                        "default: at pass ends only)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="when a server or worker dies, restart the whole job from the latest "
                        "checkpoint (and position), at most N times within "
                        "--restart-window; 0: the first death fails the job")
    p.add_argument("--restart-window", type=float, default=3600.0, metavar="SECONDS",
                   help="the window --max-restarts counts restarts in")


def add_data_options(p):
    """``pyfleet train``'s limits on the data it reads."""
    p.add_argument("--max-malformed", type=int, default=None, metavar="N",
                   help="stop the job when a worker's share of the data has more than N "
                        "malformed lines (0: stop at the first); the first is reported when "
                        "it is read (default: skip and count every one)")
    p.add_argument("--max-line-bytes", type=byte_count, default=1 << 20, metavar="BYTES",
                   help="the longest data line read (e.g. 64M); a longer one stops the job, "
                        "naming it (a damaged or binary file) (default: 1M)")


def add_scale_out_options(p):
    """``pyfleet train``'s options for a job past this machine (docs/scaleout.md)."""
    p.add_argument("--hosts", default=None, metavar="H1,H2",
                   help="run the servers and workers on these hosts through mpirun (Open "
                        "MPI, over ssh), placed round-robin; the run directory, data and "
                        "pyfleet must be at the same paths on every host (default: this "
                        "machine only)")
    p.add_argument("--hostfile", default=None, metavar="FILE",
                   help="the same as --hosts, from an Open MPI hostfile (default: none)")
    p.add_argument("--port", type=int, default=None,
                   help="with --hosts: server i listens on its host's PORT+i; a restarted "
                        "or re-placed attempt n of the job on PORT+n*servers+i (default: "
                        "36000)")
    p.add_argument("--emit-k8s", default=None, metavar="DIR",
                   help="write the Kubernetes manifests of this job (Indexed Jobs, a "
                        "headless Service, the run directory on a volume) into DIR and "
                        "exit without training (default: train here)")
    p.add_argument("--image", default=None,
                   help="with --emit-k8s: the container image, built from "
                        "examples/k8s/Dockerfile (default: pyfleet-train:latest)")


DESCRIPTION = """\
pyfleet: train and use CTR models on a sparse parameter server.
`pyfleet train` with no argument trains on generated data; pyfleet COMMAND --help
describes each command's options."""


def subcommand_parser(parser, name, every=False):
    """The subparser of command ``name`` of ``parser`` (None: no such command);
    ``every``: the dict of every command's instead."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices) if every else action.choices.get(name)
    return {} if every else None


def build_parser():
    """``(parser, train)``: the ``pyfleet`` parser and its ``train`` subparser (which
    ``pyfleet train --resume`` asks for the options given on the command line)."""
    parser = argparse.ArgumentParser(prog="pyfleet", description=DESCRIPTION,
                                     formatter_class=HelpFormatter, allow_abbrev=False)
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
                    "Write one click probability per data line of --data, in order (with\n"
                    "--id-column: a CSV 'Id,Predicted', a Kaggle-style submission). Rows\n"
                    "may have no label (Criteo's 39-field test file, a CSV with no label\n"
                    "column); labelled rows also give the AUC and logloss (on stderr).")
    p.add_argument("--model", required=True,
                   help="the model/ directory of a pyfleet train run, or "
                        "fleet.save_inference_model's (required)")
    p.add_argument("--data", required=True,
                   help="the file to score, or - for standard input (required)")
    p.add_argument("--format", default="auto", choices=["auto", "criteo", "csv", "slot"],
                   help="data format; auto reads it from the file's first line")
    p.add_argument("--out", default="predictions.txt",
                   help="output file, or - for standard output")
    p.add_argument("--id-column", default=None, metavar="NAME",
                   help="a CSV column (e.g. Id) copied to the output, which is then a CSV "
                        "with the header 'NAME,Predicted' (default: one probability per "
                        "line, no header)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary on stdout (predictions, format, labelled, and "
                        "auc and logloss for labelled rows; not with --out -)")
    p.add_argument("--batch-size", type=int, default=4096, help="examples per step")
    p.add_argument("--skip-malformed", action="store_true",
                   help="skip malformed lines (default: stop at the first, naming it: a "
                        "skipped line shifts every later prediction against its input line)")
    p.add_argument("--unchecked-model", action="store_true",
                   help="load a model that carries no checksums (Fluid's layout written by "
                        "Paddle, or one whose __model__.json is gone); default: refused")
    from pyfleet.cli.export import add_export_parser
    from pyfleet.cli.plan import add_plan_parser
    add_export_parser(sub, _add_parser)
    add_plan_parser(sub, _add_parser)
    r = _add_parser(sub, "run", "run Fleet-era code unchanged (`paddle` is pyfleet)",
                    "pyfleet run SCRIPT.py [ARGS...] | pyfleet run -m MODULE [ARGS...]:\n"
                    "the script runs with this Python, and `import paddle` (every paddle.*\n"
                    "path) is pyfleet in it and in every Python process it starts.")
    r.add_argument("script", nargs=argparse.REMAINDER, help="the script (or -m MODULE) and "
                   "its arguments")
    from pyfleet.cli.serve import add_serve_parser
    add_serve_parser(sub, _add_parser)
    sv = _add_parser(sub, "server", "run one parameter server",
                     "pyfleet server --index I --num-servers S --workers W [...]: one\n"
                     "parameter server (python -m pyfleet.service is the same; every option:\n"
                     "pyfleet server --help, docs/service.md).")
    sv.add_argument("options", nargs=argparse.REMAINDER, help="the server's options")
    k = _add_parser(sub, "keygen", "write CURVE key pairs (server and client)",
                    "Write CURVE key pairs into DIR (see docs/operations.md).")
    k.add_argument("dir", help="output directory")
    k.add_argument("--names", nargs="+", default=["server", "client"],
                   help="one key pair per name")
    return parser, train

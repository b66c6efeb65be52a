"""The ``pyfleet`` command line.

    pyfleet train [options]      train a CTR model on a local cluster (the main job)
    pyfleet gen-data [options]   write the synthetic Criteo-format data set
    pyfleet predict [options]    score a data file with a saved inference model
    pyfleet keygen DIR           write CURVE key pairs for authenticated clusters

``pyfleet train`` with no argument is the embedded default: it generates a
synthetic data set with a known ground truth, starts 1 server and 2 workers on
127.0.0.1, trains the DNN for one pass, evaluates on the held-out split, and
prints a summary (also in ``RUN_DIR/summary.json``).
"""

import argparse
import json
import math
import os
import sys
import time

from pyfleet.data import Dataset, synthetic
from pyfleet.data.readers import describe_malformed
from pyfleet.launch import launch_local
from pyfleet.service import auth
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["main"]

DEFAULT_ROWS = 200_000


def _train_parser(sub):
    p = sub.add_parser("train", help="train a CTR model on a local cluster",
                       description="Train a CTR model with a local parameter-server cluster "
                                   "on 127.0.0.1. With no data given, a synthetic data set "
                                   "is generated first.")
    p.add_argument("--train", help="training data: a file, a directory of shards, or a "
                                   "comma-separated list (default: generated)")
    p.add_argument("--test", help="held-out data (default: the generated test split)")
    p.add_argument("--format", default="criteo", choices=["criteo", "csv", "slot", "auto"])
    p.add_argument("--model", default="dnn", choices=["lr", "dnn", "widedeep", "deepfm"])
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", default="async", choices=["sync", "async", "geo"])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--layers", default="256,128,64", help="hidden layer sizes")
    p.add_argument("--lr", type=float, default=0.001, help="Adam learning rate")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help="rows of the generated data set (with no --train)")
    p.add_argument("--run-dir", help="where to write everything (default: runs/<time>)")
    p.add_argument("--checkpoint-dir", help="alias of --run-dir's checkpoint location: the "
                                            "run directory to write (kept for Paddle users)")
    p.add_argument("--resume", help="a previous run directory: continue from its checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--curve-dir", default=None, metavar="DIR",
                   help="a 'pyfleet keygen' directory: roles authenticate with CURVE keys "
                        "(sets PYFLEET_CURVE_DIR, docs/operations.md)")
    p.add_argument("--admission-count", type=int, default=None, metavar="N",
                   help="admit a sparse key as a trainable row only once it was pulled N "
                        "times (CountFilterEntry(N)); default: every key on first sight")
    p.add_argument("--show-click", action="store_true",
                   help="send each batch's per-id show/click counts to the servers "
                        "(Paddle's CTR accessor), for --shrink-min-score")
    p.add_argument("--shrink-min-score", type=float, default=None, metavar="S",
                   help="at the end of every pass drop rows whose decayed show/click score "
                        "0.1*(show-click)+click is below S (needs --show-click)")
    p.add_argument("--shrink-decay", type=float, default=0.98, metavar="D",
                   help="per-pass decay of the show/click counters (default 0.98)")
    p.add_argument("--shrink-unseen-passes", type=int, default=None, metavar="T",
                   help="at the end of every pass drop rows not updated for more than T passes")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop the job after this many seconds")
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
        lines = [json.loads(x) for x in f if x.strip()]
    if not lines:
        return None
    t0 = lines[0]["time"]
    t = [x["time"] - t0 for x in lines]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.plot(t, [x["loss"] for x in lines])
    a.set_xlabel("seconds")
    a.set_ylabel("logloss (window)")
    b.plot(t, [x["auc"] for x in lines])
    b.set_xlabel("seconds")
    b.set_ylabel("running AUC")
    fig.tight_layout()
    out = os.path.join(run_dir, "training.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def cmd_train(args):
    # The trainer imports Fluid and Fleet: loaded by the commands that need them only.
    from pyfleet.trainer import JOB_DEFAULTS, summarize

    if args.servers < 1 or args.workers < 1:
        raise SystemExit("pyfleet train: --servers and --workers must be >= 1")
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--embedding-dim", args.embedding_dim), ("--rows", args.rows)):
        if value < 1:
            raise SystemExit(f"pyfleet train: {flag} must be >= 1, got {value}")
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise SystemExit(f"pyfleet train: --lr must be a finite number > 0, got {args.lr}")
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
    resume = os.path.abspath(args.resume) if args.resume else None
    first_pass = 1
    if resume:
        try:
            manifest = _checkpoint.read_manifest(os.path.join(resume, "checkpoint"))
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: {e}") from None
        if manifest is None:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: no checkpoint there "
                             f"(expected {resume}/checkpoint/MANIFEST.json)")
        done = (manifest.get("meta") or {}).get("pass")
        if isinstance(done, int) and not isinstance(done, bool) and done >= 1:
            first_pass = done + 1
            print(f"resuming after pass {done} of {resume}: passes {first_pass}.."
                  f"{done + args.epochs}", flush=True)
        else:  # saved by save_persistables without the trainer's pass number
            print(f"resuming from {resume}/checkpoint, which does not say which pass it "
                  f"ended: passes are numbered from 1 again", flush=True)
    truth = schema = None
    train, test, fmt = _split_paths(args.train), _split_paths(args.test), args.format
    for flag, paths in (("--train", train), ("--test", test)):
        for path in [paths] if isinstance(paths, str) else paths or []:
            if not os.path.exists(path):
                raise SystemExit(f"pyfleet train: {flag}: no such file or directory: {path}")
    if train is not None:  # the schema (and a file it cannot read) before anything is written
        try:
            ds = Dataset(train, format=fmt)
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: --train: {e}") from None
        schema, fmt = ds.schema, ds.format  # "auto" resolved once, for train and test alike
        if test is not None:
            try:
                if args.format == "auto" and Dataset(test, format="auto").format != fmt:
                    raise ValueError(f"it looks like {Dataset(test, format='auto').format}, "
                                     f"--train like {fmt}: they must be in the same format")
                test_schema = Dataset(test, format=fmt).schema
            except (OSError, ValueError) as e:
                raise SystemExit(f"pyfleet train: --test: {e}") from None
            if (test_schema.n_dense, test_schema.n_slots) != (schema.n_dense, schema.n_slots):
                raise SystemExit(
                    f"pyfleet train: --test has {test_schema.n_dense} dense features and "
                    f"{test_schema.n_slots} slots read as {fmt}, --train {schema.n_dense} and "
                    f"{schema.n_slots}: they must be in the same format")
    elif test is not None:
        raise SystemExit("pyfleet train: --test needs --train (without --train the generated "
                         "data set's own test split is used)")
    run_dir = args.run_dir or args.checkpoint_dir or os.path.join(
        "runs", time.strftime("%Y%m%d-%H%M%S"))
    run_dir = os.path.abspath(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"pyfleet train: --run-dir: cannot create {run_dir}: {e.strerror}") \
            from None
    if train is None:
        print(f"generating {args.rows:,} synthetic rows (seed {args.seed}) into "
              f"{run_dir}/data ...", flush=True)
        try:
            truth = synthetic.generate(os.path.join(run_dir, "data"), rows=args.rows,
                                       seed=args.seed)
        except (OSError, ValueError) as e:
            raise SystemExit(f"pyfleet train: cannot generate the data set: {e}") from None
        train, test, fmt = truth["train"], truth["test"], "criteo"
        schema = Dataset(train, format=fmt).schema
    job = {**JOB_DEFAULTS, "train": train, "test": test, "format": fmt, "model": args.model,
           "embedding_dim": args.embedding_dim,
           "layers": layers,
           "lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
           "mode": args.mode, "seed": args.seed, "run_dir": run_dir, "resume": resume,
           "first_pass": first_pass,
           "n_dense": schema.n_dense, "n_slots": schema.n_slots,
           "admission_count": args.admission_count, "show_click": args.show_click,
           "shrink_min_score": args.shrink_min_score, "shrink_decay": args.shrink_decay,
           "shrink_unseen_passes": args.shrink_unseen_passes}
    if resume:  # another model's checkpoint: refused here, not in every server
        from pyfleet.trainer import tables_of
        try:
            _checkpoint.check_tables(manifest.get("tables") or [], tables_of(job),
                                     f"{resume}/checkpoint", extra_ok=False)
        except ValueError as e:
            raise SystemExit(f"pyfleet train: --resume {args.resume}: {e} (--model, "
                             f"--layers, --embedding-dim and the data's features must be "
                             f"those of the run resumed)") from None
    job_path = os.path.join(run_dir, "job.json")
    with open(job_path, "w") as f:
        json.dump(job, f, indent=1)
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
    # Roles run in the run directory: `python -m` puts the working directory
    # first on sys.path, and a source checkout there (where `pip install .`
    # was typed) would shadow the installed package and its compiled modules.
    cmd = [sys.executable, "-m", "pyfleet.trainer", job_path]
    started = time.time()
    code = launch_local(lambda role, index: cmd, servers=args.servers, workers=args.workers,
                        env=env, log_dir=os.path.join(run_dir, "logs"), timeout=args.timeout,
                        mode=args.mode, cwd=run_dir)
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
        print(json.dumps(summary))
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
    try:
        n = model.predict_file(args.data, args.out, format=args.format,
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="pyfleet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    _train_parser(sub)
    g = sub.add_parser("gen-data", help="write the synthetic Criteo-format data set")
    g.add_argument("--out", default="pyfleet-data")
    g.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--test-fraction", type=float, default=0.1)
    g.add_argument("--shards", type=int, default=1)
    p = sub.add_parser("predict", help="score a data file with a saved inference model")
    p.add_argument("--model", required=True, help="a directory from save_inference_model")
    p.add_argument("--data", required=True)
    p.add_argument("--format", default="criteo", choices=["criteo", "csv", "slot", "auto"])
    p.add_argument("--out", default="predictions.txt")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--skip-malformed", action="store_true",
                   help="skip malformed lines (default: stop at the first, naming it: a "
                        "skipped line shifts every later prediction against its input line)")
    k = sub.add_parser("keygen", help="write CURVE key pairs (server and client)")
    k.add_argument("dir")
    k.add_argument("--names", nargs="+", default=["server", "client"])
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return {"train": cmd_train, "gen-data": cmd_gen_data, "predict": cmd_predict,
                "keygen": cmd_keygen}[args.command](args)
    except KeyboardInterrupt:  # (pyfleet train's roles are stopped by its launcher)
        print(f"pyfleet {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``pyfleet predict``: score a data file with a saved inference model."""

import json
import os
import shutil
import sys
import tempfile

from pyfleet.cli.data import _check_first_lines
from pyfleet.data.readers import describe_malformed


def _spool_stdin():
    """``--data -``: standard input copied to a temporary file (the format check and
    the reader read the file's first lines before the whole); its path."""
    with tempfile.NamedTemporaryFile(prefix="pyfleet-predict-", suffix=".data",
                                     delete=False) as f:
        shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
    return f.name


def cmd_predict(args):
    from pyfleet.fluid import inference  # Fluid: loaded by the command that needs it only
    if args.batch_size < 1:
        raise SystemExit(f"pyfleet predict: --batch-size must be >= 1, got {args.batch_size}")
    if args.json and args.out == "-":
        raise SystemExit("pyfleet predict: --json and --out - both write to stdout: give "
                         "--out a file")
    if os.path.isfile(os.path.join(args.model, "MANIFEST.json")):
        raise SystemExit(f"pyfleet predict: --model {args.model} is a checkpoint (tables with "
                         f"their optimizer state), not an inference model: write one with "
                         f"pyfleet export --checkpoint {args.model} --out MODEL, then "
                         f"pyfleet predict --model MODEL")
    try:
        model = inference.load(args.model, unchecked_ok=args.unchecked_model)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: --model {args.model}: {e} (the model/ directory "
                         f"of a pyfleet train run, or fleet.save_inference_model's)") from None
    spooled = _spool_stdin() if args.data == "-" else None
    try:
        return _predict(args, model, spooled or args.data)
    except BrokenPipeError:  # --out - into a reader that stopped early (| head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if spooled:
            os.unlink(spooled)


def _predict(args, model, data):
    name = "standard input" if args.data == "-" else data
    if not os.path.exists(data):
        raise SystemExit(f"pyfleet predict: --data: no such file or directory: {data}")
    try:
        fmt, _ = _check_first_lines(data, args.format, "--format", labels="optional")
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: --data: {e}".replace(data, name)) from None
    if fmt == "auto":
        raise SystemExit(f"pyfleet predict: --data: no data line in {name}")
    try:
        n = model.predict_file(data, args.out, format=fmt, batch_size=args.batch_size,
                               skip_malformed=args.skip_malformed, id_column=args.id_column)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet predict: {e}".replace(data, name)) from None
    st = model.last_file_stats
    out = "standard output" if args.out == "-" else args.out
    summary = {"predictions": n, "out": os.path.abspath(args.out) if args.out != "-" else "-",
               "data": name, "format": st["format"], "labelled": st["labelled"],
               "malformed_skipped": st["malformed"]}
    if "auc" in st:
        summary.update(auc=st["auc"], logloss=st["logloss"])
    info = sys.stderr if args.out == "-" or args.json else sys.stdout
    print(f"wrote {n:,} predictions to {out}", file=info)
    if "auc" in st:
        print(f"labelled rows: AUC {st['auc']:.4f} logloss {st['logloss']:.4f} "
              f"({n:,} examples)", file=sys.stderr)
    if st["malformed"]:
        print(f"skipped {st['malformed']:,} malformed line(s) (first: "
              f"{describe_malformed(st, 1)[0].replace(data, name)}): the output has a line "
              f"per valid example", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=1))
    if n == 0:
        print(f"pyfleet predict: no example in {name}", file=sys.stderr)
        return 1
    return 0

"""``pyfleet predict``: score a data file with a saved inference model."""

import os
import sys

from pyfleet.cli.data import _check_first_lines
from pyfleet.data.readers import describe_malformed


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

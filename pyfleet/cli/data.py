"""``pyfleet gen-data``, and the data checks and paths the other commands share."""

import json
import os

from pyfleet.data import Dataset, _parse, synthetic
from pyfleet.data import files as data_files
from pyfleet.data.files import MAX_LINE_BYTES
from pyfleet.data.readers import list_files


def _split_paths(value):
    """A comma-separated path list as absolute paths (the roles run elsewhere)."""
    if value is None:
        return None
    parts = [os.path.abspath(v) for v in value.split(",") if v]
    return parts[0] if len(parts) == 1 else parts


FIRST_LINES = 20


def _check_first_lines(paths, fmt, flag, labels="required", max_line=MAX_LINE_BYTES):
    """Every input file's format (one for all) and first lines, before any
    process starts: a file whose first lines hold no valid example is refused,
    naming its first bad line. Returns the (resolved) format and schema."""
    schema, requested = None, fmt
    for path in list_files(paths):
        if not data_files.read_first_line(path, max_line):
            continue  # an empty file (or shard) adds nothing and breaks nothing
        ds = Dataset(path, format=requested, labels=labels, max_line_bytes=max_line)
        if labels == "required" and ds.format == "criteo" and \
                not data_files.criteo_labelled(path):
            raise ValueError(f"{path}:1: 39 fields, the unlabelled rows of Criteo's test "
                             f"file: training needs the label first (pyfleet predict reads "
                             f"such files)")
        if fmt == "auto":
            fmt = ds.format
        elif ds.format != fmt:
            raise ValueError(f"{path} looks like {ds.format}, the files before it like "
                             f"{fmt}: every file must be in the same format")
        if schema is None:
            schema = ds.schema
        f, raw = data_files.open_data(path)
        try:
            lines = [f.readline(max_line or -1) for _ in range(FIRST_LINES + 1)]
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
                f"docs/formats.md" + _format_hint(path, requested, flag))
    return fmt, schema


def _format_hint(path, requested, flag):
    """What to do about the format: pass one (auto guessed wrong), or the one the file
    looks like (the one given is not it)."""
    if flag is None:
        return ""
    if requested == "auto":
        return f", or pass {flag}"
    try:
        seen = data_files.detect_format(path)
    except (OSError, ValueError):
        seen = None
    if seen and seen != requested:
        return f"; it looks like {seen}: pass {flag} {seen} (or {flag} auto)"
    return f"; {flag} {requested} was given ({flag} auto reads the format from the file)"


def _check_whole_files(train, test, fmt, max_line=MAX_LINE_BYTES):
    """Read --train and --test whole when they are small enough to count (a
    truncated gzip file, an unreadable shard or an overlong line is refused by
    name before anything is written); --train's data lines, or None."""
    from pyfleet.cli.monitor import COUNT_LIMIT
    total = None
    for flag, paths in (("--train", train), ("--test", test)):
        if paths is None:
            continue
        try:
            names = list_files(paths)
            if sum(os.path.getsize(f) for f in names) > COUNT_LIMIT:
                continue  # the workers' readers name what they cannot read
            n = data_files.count_data_lines(names, header_lines=1 if fmt == "csv" else 0,
                                            max_line=max_line)
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


def cmd_gen_data(args):
    try:
        info = synthetic.generate(args.out, rows=args.rows, seed=args.seed,
                                  test_fraction=args.test_fraction, train_shards=args.shards)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet gen-data: {e}") from None
    print(json.dumps(info, indent=1))
    return 0

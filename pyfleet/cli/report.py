"""What ``pyfleet train`` shows: the summary table, the roles' console lines, why a
data set gave no example (the training plot: :mod:`pyfleet.cli.plot`)."""

import contextlib
import errno
import logging
import re
import sys

from pyfleet._extras import install_hint


def _death(r):
    """One restart of the summary: the role, its host (a job across hosts) and how it
    died."""
    host = r.get("host")
    where = f" on {host}" if host and host not in r["description"] else ""
    return f"{r['role']}{where} {r['description']}"


def _format_summary(s):
    rows = [("test AUC", f"{s['test_auc']:.4f}" if "test_auc" in s else "-"),
            ("test logloss", f"{s['test_logloss']:.4f}" if "test_logloss" in s else "-")]
    if s.get("test_calibration") is not None:  # TorchRec's calibration and NE
        rows.append(("test calibration", f"{s['test_calibration']:.4f} (predicted / actual "
                                          f"CTR)"))
    if s.get("test_ne") is not None:
        rows.append(("test normalized entropy", f"{s['test_ne']:.4f} (logloss / the "
                                                 f"actual CTR's entropy)"))
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
    if s.get("restarts"):
        rows.append(("restarts", f"{len(s['restarts'])} (" + ", ".join(
            _death(r) for r in s["restarts"]) + ")"))
    if s.get("checkpoint_rounds", {}).get("rounds"):
        c = s["checkpoint_rounds"]
        rows.append(("checkpoints in passes", f"{c['rounds']}, pausing the job "
                     f"{c['pause_seconds_total']:.1f} s in all (at most "
                     f"{c['pause_seconds_max']:.2f} s)"))
    for name, n in sorted(s.get("table_rows", {}).items()):
        rows.append((f"rows in {name}", f"{n:,}"))
    peaks = s.get("server_peak_rss_bytes", [])
    spilled = s.get("server_spilled_rows", [])
    for i, rss in enumerate(s.get("server_rss_bytes", [])):
        peak = f", peak {peaks[i] / 2**20:,.1f} MiB" if i < len(peaks) and peaks[i] > 0 else ""
        rows.append((f"server {i} memory (RSS)", f"{rss / 2**20:,.1f} MiB{peak}"))
        if i < len(spilled) and spilled[i]:
            rows.append((f"server {i} rows on disk", f"{spilled[i]:,}"))
    rows += [("model", s["model"]), ("cluster", f"{s['servers']} server(s), "
                                               f"{s['workers']} worker(s), {s['mode']}"),
             ("run directory", s["run_dir"]),
             ("plot", s.get("plot") or f"none (needs matplotlib: {install_hint('plot')})")]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


class _RoleOutput:
    """Where the launcher writes the roles' output lines (``[worker.0] ...``):
    their DEBUG and INFO log records stay in the role's log file only (the job's
    progress is the monitor's one line); warnings, errors, tracebacks and
    anything else reach ``stream``."""

    _HIDDEN = re.compile(r"^\[\w+(\.\d+)?\] \d{4}-\d\d-\d\d [\d:,]+ (DEBUG|INFO) ")

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if not self._HIDDEN.match(text):
            self.stream.write(text)

    def flush(self):
        self.stream.flush()


def _why_no_example(malformed, first, otherwise):
    """Why a data set gave no example: its malformed lines, or ``otherwise``."""
    if not malformed:
        return otherwise
    return f"{malformed:,} malformed line(s), the first: " + "; ".join(first)


def _one_line(e):
    """An OSError in one line, naming its file (a full disk: "No space left on device")."""
    if e.filename is not None and not str(e).startswith("cannot "):
        return f"cannot write {e.filename}: {e.strerror}" if e.errno in _WRITE_ERRNOS else \
            f"{e.filename}: {e.strerror}"
    return str(e)


_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


class _LogFile(logging.FileHandler):
    """``RUN_DIR/logs/pyfleet.log``: a write that fails (a full disk) is reported
    once, in one line naming the file, and the log is no longer written there
    (``logging`` would print a traceback for every record)."""

    def handleError(self, record):
        e = sys.exc_info()[1]
        if self.stream is None or not isinstance(e, OSError):
            return super().handleError(record)
        why = e.strerror or str(e)
        print(f"pyfleet train: cannot write {self.baseFilename}: {why}; the job's log is no "
              f"longer written there", file=sys.stderr, flush=True)
        stream, self.stream = self.stream, None
        self.emit = lambda record: None
        with contextlib.suppress(OSError):
            stream.close()


class QuietLauncher:
    """The launcher's lines under --quiet: its start line (where the roles are) is
    dropped, its reports of failures, stops and restarts go to ``stream``."""

    START = re.compile(r"pyfleet\.launch: (\d+ server\(s\)|no server, )[^\n]* worker\(s\)")

    def __init__(self, stream=None):
        self.stream = stream

    def write(self, text):
        if self.stream is not None and not self.START.match(text):
            self.stream.write(text)
        return len(text)

    def flush(self):
        if self.stream is not None:
            self.stream.flush()

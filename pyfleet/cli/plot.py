"""``RUN_DIR/training.png``: what a ``pyfleet train`` run did, in one picture.

Left, the training logloss of each progress window; right, the running training
AUC, every pass's test AUC and, for generated data, the ground truth's test AUC
(the best any model can do); both against the examples trained, with the pass
boundaries as dashed lines and a title saying what ran. Next to the PNG,
``training.plot.json`` lists what was drawn, read back from the figure's own
artists (every line's label and points, the boundaries, the title): the tests,
and anyone scripting over runs, check it without decoding pixels.

matplotlib is optional (the ``plot`` extra): without it no picture is drawn.
"""

import json
import os

from pyfleet import _atomic

PNG, SIDECAR = "training.png", "training.plot.json"


def _records(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return [], []
    with open(path) as f:
        records = [json.loads(x) for x in f if x.strip()]
    # A run resumed in place appends to the file, its counts starting again from 0:
    # its examples are drawn after the first run's.
    offset, last = 0, 0
    for x in records:
        if x.get("examples") is None:
            continue
        if "loss" in x:
            if x["examples"] < last:
                offset += last
            last = x["examples"]
        x["examples"] += offset
    lines = [x for x in records if "loss" in x and x.get("examples") is not None]
    tests = [x for x in records if x.get("test_auc") is not None]
    return lines, tests


def _pass_ends(lines, tests):
    """``{pass: examples trained at its end}``: from its test record or a progress line
    at 100% of it; else (a pass too short for a progress line) from a known pass end,
    every pass reading the same data."""
    ends = {}
    for x in lines:
        if x.get("pass_fraction") == 1.0:
            ends[x["pass"]] = max(ends.get(x["pass"], 0), x["examples"])
    for x in tests:
        if x.get("examples") is not None:
            ends[x["pass"]] = x["examples"]
    passes = sorted({x["pass"] for x in lines} | {x["pass"] for x in tests})
    if ends:
        known = max(ends)
        first = passes[0]
        per_pass = ends[known] / (known - first + 1)
        for p in passes:
            ends.setdefault(p, per_pass * (p - first + 1))
    return ends


def title_of(job):
    """What ran, in one line: model, network, optimizer, cluster, data."""
    opt = job.get("optimizer") or {}
    name = opt.get("name", "?") if isinstance(opt, dict) else str(opt)
    lr = opt.get("learning_rate") if isinstance(opt, dict) else job.get("lr")
    layers = job.get("layers")
    layers = "-".join(map(str, layers)) if isinstance(layers, (list, tuple)) else layers
    data = "generated data" if job.get("generated") else os.path.basename(
        str(job.get("train") if not isinstance(job.get("train"), list) else job["train"][0]))
    return (f"{job.get('model', '?')} (emb {job.get('embedding_dim', '?')}, layers {layers}), "
            f"{name} lr {lr}, {job.get('servers', '?')} server(s) x "
            f"{job.get('workers', '?')} worker(s) {job.get('mode', '?')}, {data}")


def _drawn(fig):
    """What the figure holds: per axes, its labelled lines (x, y), its vertical
    boundaries, its axis labels; and the title."""
    out = {"title": fig._suptitle.get_text() if fig._suptitle else "", "axes": []}
    for ax in fig.axes:
        lines, vlines = {}, []
        for ln in ax.get_lines():
            x, y = [float(v) for v in ln.get_xdata()], [float(v) for v in ln.get_ydata()]
            if ln.get_gid() == "pass boundary":
                vlines.append(x[0])
            else:
                lines[ln.get_label()] = {"x": x, "y": y}
        out["axes"].append({"xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                            "lines": lines, "pass_boundaries": vlines})
    return out


def plot_run(run_dir, job, truth_auc=None):
    """Draw ``run_dir``'s metrics into ``training.png`` (and write what it drew into
    ``training.plot.json``); the PNG's path, or None without matplotlib or metrics."""
    try:  # optional, and slow to import: only when a run ends, if installed
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    lines, tests = _records(run_dir)
    if not lines:
        return None
    ends = _pass_ends(lines, tests)
    x = [r["examples"] for r in lines]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.2))
    a.plot(x, [r["loss"] for r in lines], label="train logloss (window)")
    b.plot(x, [r["auc"] for r in lines], label="train AUC (running)")
    if tests:
        b.plot([ends.get(r["pass"], 0) for r in tests],
               [r["test_auc"] for r in tests], "o", color="C3", label="test AUC after each pass")
    if truth_auc is not None:
        b.axhline(truth_auc, color="C2", linestyle=":", label="ground truth's test AUC")
    cal = [r for r in lines if r.get("calibration") is not None]
    c.plot([r["examples"] for r in cal], [r["calibration"] for r in cal],
           label="train calibration (running)")
    tested = [r for r in tests if r.get("test_calibration") is not None]
    if tested:
        c.plot([ends.get(r["pass"], 0) for r in tested], [r["test_calibration"] for r in tested],
               "o", color="C3", label="test calibration after each pass")
    c.axhline(1.0, color="C2", linestyle=":", label="calibrated")
    for ax in (a, b, c):
        for _pass, end in sorted(ends.items())[:-1]:
            ax.axvline(end, color="grey", linestyle="--", linewidth=0.8, gid="pass boundary")
        ax.set_xlabel("examples trained")
        ax.set_xlim(left=0)
        ax.legend(loc="best", fontsize="small")
    a.set_ylabel("logloss")
    b.set_ylabel("AUC")
    c.set_ylabel("predicted / actual CTR")
    fig.suptitle(title_of(job), fontsize="medium")
    fig.tight_layout()
    out = os.path.join(run_dir, PNG)
    with _atomic.atomic_open(out, "wb") as f:
        fig.savefig(f, dpi=100, format="png")
    drawn = _drawn(fig)
    plt.close(fig)
    _atomic.write_json(os.path.join(run_dir, SIDECAR), drawn, indent=1)
    return out

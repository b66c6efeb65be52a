"""``pyfleet train --resume``: the settings a resumed run inherits, and what an interrupted
run kept and how to continue it."""

import argparse
import os
import shlex

from pyfleet.service import checkpoint as _checkpoint

# Settings a resumed run takes from the resumed run's job.json unless given on
# the command line; the first group fixes the parameters a checkpoint holds.
ARCHITECTURE = ("model", "embedding_dim", "layers", "optimizer")
INHERITED = ARCHITECTURE + (
    "train", "test", "format", "rows", "servers", "workers", "mode", "sparse_mode",
    "batch_size", "lr", "sparse_lr",
    "beta1", "beta2", "epsilon", "l1", "l2", "lr_power", "initial_accumulator", "momentum",
    "use_nesterov", "rho", "centered", "seed",
    "admission_count", "show_click", "shrink_min_score", "shrink_decay",
    "shrink_unseen_passes", "valid_fraction", "keep", "keep_best", "checkpoint_steps",
    "checkpoint_every", "max_restarts", "restart_window", "storage", "memory_budget",
    "spill_dir")


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
        out = dict(job["settings"])
    else:
        keys = ("model", "embedding_dim", "lr", "batch_size", "mode", "seed", "format",
                "admission_count", "show_click", "shrink_min_score", "shrink_decay",
                "shrink_unseen_passes", "valid_fraction", "keep", "keep_best",
                "checkpoint_steps", "checkpoint_every", "max_restarts", "restart_window")
        out = {k: job[k] for k in keys if k in job}
        if isinstance(job.get("layers"), list):
            out["layers"] = ",".join(str(x) for x in job["layers"])
    lr = out.get("lr", job.get("lr"))
    if "sparse_lr" not in job and out.get("sparse_lr") is None and lr is not None:
        # A run from before --sparse-lr trained its tables at the optimizer's rate: it
        # goes on at that rate, not at today's default for new runs.
        out["sparse_lr"] = lr
    return out


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
    inside = ((m.get("meta") or {}).get("position") or {}).get("round")
    text = f"pyfleet train: interrupted{during}; kept: {run_dir}/checkpoint"
    if isinstance(done, int) and inside:
        text += f" (inside pass {done + 1}: every worker's position in it)"
        left = last_pass - done
    elif isinstance(done, int):
        text += f" (after pass {done})"
        left = last_pass - done
    else:
        left = args.epochs
    if left <= 0:
        return text + "; every pass was trained and saved"
    return (text + f". Continue with:\n  pyfleet train --resume {shlex.quote(run_dir)} "
            f"--epochs {left}")

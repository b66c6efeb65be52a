"""``pyfleet export``: the inference model of a checkpoint (``pyfleet predict``'s
``--model``, ``pyfleet serve``'s model directory).

A checkpoint (``RUN_DIR/checkpoint``, ``RUN_DIR/checkpoints/best``, ``.../pass-NNNN``)
holds every table with its optimizer state, shard by shard; an inference model holds
the network and the weights only. The network is rebuilt from the run's ``job.json``
(found beside the checkpoint, or ``--job``), the checkpoint read into a local program
(:mod:`pyfleet.distributed.local_checkpoint`, every file's checksum checked), and the
model written as ``pyfleet train`` writes ``RUN_DIR/model``: to a temporary directory
beside ``--out``, then renamed.
"""

import json
import os
import shutil
import tempfile

__all__ = ["cmd_export", "export_checkpoint", "find_job_file", "model_of_best_pass"]


def find_job_file(checkpoint):
    """The ``job.json`` of the run ``checkpoint`` belongs to (its directory's, or the
    one above ``checkpoints/``), or None."""
    here = os.path.realpath(checkpoint)
    for up in (os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
        path = os.path.join(up, "job.json")
        if os.path.isfile(path):
            return path
    return None


def export_checkpoint(checkpoint, out, job):
    """Write the inference model of ``checkpoint`` (a job's tables) to ``out`` (must not
    exist, or be an empty directory); ``job``: the run's settings (job.json)."""
    from pyfleet import fluid
    from pyfleet.trainer import JOB_DEFAULTS
    from pyfleet.trainer.job import build_program, optimizer_of
    job = {**JOB_DEFAULTS, **job}
    main, startup, model = build_program(job, job["n_dense"], job["n_slots"])
    with fluid.program_guard(main, startup):
        optimizer_of(job).minimize(model.avg_cost)
    exe = fluid.Executor(fluid.CPUPlace())
    exe.run(startup)
    fluid.io.load_persistables(exe, checkpoint, main)
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
    try:
        fluid.io.save_inference_model(tmp, [v.name for v in model.inputs
                                            if v is not model.label],
                                      [model.predict], exe, main)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked by the caller): replaced by the rename
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def model_of_best_pass(run_dir, summary, job, say):
    """--keep-best: RUN_DIR/model becomes the best pass's inference model (exported from
    checkpoints/best), replacing the last pass's."""
    model = os.path.join(run_dir, "model")
    say(f"pass {summary['best_pass']} had the best test AUC: exporting its model to {model}")
    fresh = export_checkpoint(summary["best_checkpoint"], os.path.join(run_dir, ".model-best"),
                              job)
    old = os.path.join(run_dir, ".model-last")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(model):
        os.replace(model, old)
    os.replace(fresh, model)
    shutil.rmtree(old, ignore_errors=True)
    summary["inference_model_pass"] = summary["best_pass"]


def cmd_export(args):
    from pyfleet.service import checkpoint as _checkpoint
    ckpt = args.checkpoint
    try:
        manifest = _checkpoint.read_manifest(ckpt)
    except ValueError as e:
        raise SystemExit(f"pyfleet export: --checkpoint {ckpt}: {e}") from None
    if manifest is None:
        raise SystemExit(f"pyfleet export: --checkpoint {ckpt}: no checkpoint there "
                         f"(expected {os.path.join(ckpt, _checkpoint.MANIFEST_NAME)}: a "
                         f"pyfleet train run's checkpoint/ or checkpoints/best)")
    job_file = args.job or find_job_file(ckpt)
    if job_file is None:
        raise SystemExit(f"pyfleet export: no job.json beside {ckpt} (the run's settings "
                         f"build the network): give --job RUN_DIR/job.json")
    try:
        with open(job_file) as f:
            job = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet export: --job {job_file}: {e}") from None
    if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        raise SystemExit(f"pyfleet export: --out {args.out} exists and is not an empty "
                         f"directory (nothing was written)")
    try:
        out = export_checkpoint(ckpt, args.out, job)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pyfleet export: {ckpt}: {e}") from None
    meta = manifest.get("meta") or {}
    what = f"pass {meta['pass']}" if isinstance(meta.get("pass"), int) else "the checkpoint"
    auc = f" (test AUC {meta['test_auc']:.4f})" if isinstance(meta.get("test_auc"), float) \
        else ""
    print(f"pyfleet export: the inference model of {what}{auc} is in {out} (pyfleet predict "
          f"--model {out})")
    return 0


def add_export_parser(sub, add_parser):
    p = add_parser(sub, "export", "write the inference model of a checkpoint",
                   "Write the inference model (pyfleet predict --model, pyfleet serve) of a\n"
                   "checkpoint: RUN_DIR/checkpoint, RUN_DIR/checkpoints/best or a kept\n"
                   "pass, with the network of the run's job.json.")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="the checkpoint directory (its MANIFEST.json; required)")
    p.add_argument("--out", required=True, metavar="MODEL",
                   help="the model directory to write: new or empty (required)")
    p.add_argument("--job", default=None, metavar="FILE",
                   help="the run's job.json (default: the one beside the checkpoint)")
    return p

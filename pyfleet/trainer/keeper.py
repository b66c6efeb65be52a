"""``--keep K`` and ``--keep-best``: copies of the checkpoint a pass saved."""

import os
import shutil

from pyfleet._atomic import fsync_dir, write_json
from pyfleet.service import checkpoint as _checkpoint


def snapshot_checkpoint(src, dst):
    """Copy checkpoint directory ``src`` (its manifest and the generations it
    names) to a new directory ``dst``. Generation files are never rewritten
    once written, so they are hard-linked when the filesystem allows (no
    bytes copied). The copy is assembled under a temporary name, its manifest
    written last, then renamed to ``dst``: ``dst`` exists only complete."""
    manifest = _checkpoint.read_manifest(src)
    if manifest is None:
        raise ValueError(f"{src} holds no checkpoint")
    tmp = f"{dst}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    for gen in manifest["chain"]:
        shutil.copytree(os.path.join(src, gen["dir"]), os.path.join(tmp, gen["dir"]),
                        copy_function=link)
    for name in manifest.get("beside") or {}:  # checksummed with the manifest: copied
        shutil.copy2(os.path.join(src, name), os.path.join(tmp, name))
    write_json(os.path.join(tmp, _checkpoint.MANIFEST_NAME), manifest, indent=1)
    os.rename(tmp, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))  # the rename commits the copy


class _Keeper:
    """``--keep K`` and ``--keep-best``: after every pass's save into
    ``RUN_DIR/checkpoint``, a copy in ``RUN_DIR/checkpoints/pass-NNNN`` for the
    last K passes and for the best pass (highest test AUC), which
    ``RUN_DIR/checkpoints/best`` points to (a symbolic link, replaced
    atomically). A resumed run in the same directory continues the count and
    knows the best so far from the best copy's manifest."""

    def __init__(self, run_dir, keep, keep_best):
        self.dir = os.path.join(run_dir, "checkpoints")
        self.keep, self.keep_best = keep, keep_best
        self.best_pass = self.best_auc = None
        if keep_best:
            try:
                m = _checkpoint.read_manifest(os.path.join(self.dir, "best"))
            except ValueError:
                m = None
            meta = (m or {}).get("meta") or {}
            if meta.get("test_auc") is not None:
                self.best_pass, self.best_auc = meta.get("pass"), meta["test_auc"]

    @staticmethod
    def name(epoch):
        return f"pass-{epoch:04d}"

    def after_save(self, src, epoch, auc):
        """Keep what the options ask for; returns ``{"kept": [...], "best": pass}``."""
        if not self.keep and not self.keep_best:
            return {}
        os.makedirs(self.dir, exist_ok=True)
        new_best = self.keep_best and auc is not None and (
            self.best_auc is None or auc > self.best_auc)
        path = os.path.join(self.dir, self.name(epoch))
        if (self.keep or new_best) and not os.path.isdir(path):
            snapshot_checkpoint(src, path)
        if new_best:
            self.best_pass, self.best_auc = epoch, auc
            link = os.path.join(self.dir, "best")
            tmp = f"{link}.tmp.{os.getpid()}"
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(self.name(epoch), tmp)
            os.replace(tmp, link)
        passes = sorted(int(d[5:]) for d in os.listdir(self.dir)
                        if d.startswith("pass-") and d[5:].isdigit())
        wanted = set(passes[-self.keep:]) if self.keep else set()
        if self.best_pass is not None:
            wanted.add(self.best_pass)
        for p in passes:
            if p not in wanted:
                shutil.rmtree(os.path.join(self.dir, self.name(p)), ignore_errors=True)
        return {"kept": [p for p in passes if p in wanted], "best": self.best_pass}

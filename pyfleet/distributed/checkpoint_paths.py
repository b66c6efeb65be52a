"""Where a worker's checkpoint paths go: every save/load path is confined to the
checkpoint root (``$PYFLEET_CHECKPOINT_DIR`` or the directory the process started
in), as :mod:`pyfleet.distributed.fleet`'s module doc says; and the ``model_dir``
a server's ``init_server`` loads (its own, so it may lie outside that root)."""

import os

from pyfleet.fluid.io import check_local_path
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["checkpoint_root", "load_model_dir", "relative_to_root"]


def checkpoint_root():
    """The directory every save/load path is confined to (see the module doc)."""
    return os.path.realpath(os.environ.get("PYFLEET_CHECKPOINT_DIR") or os.getcwd())


def relative_to_root(dirname):
    """``(path relative to the root, real path)`` of ``dirname``, which must be inside the
    checkpoint root (ValueError naming both otherwise)."""
    root = checkpoint_root()
    path = os.path.realpath(os.path.join(root, check_local_path(dirname, "dirname")))
    if os.path.commonpath([path, root]) != root or path == root:
        raise ValueError(f"checkpoint directory {os.fspath(dirname)!r} must be inside the "
                         f"checkpoint root {root} (set PYFLEET_CHECKPOINT_DIR to change it)")
    return os.path.relpath(path, root), path


def load_model_dir(server, model_dir, tables):
    """Load ``model_dir`` (one checkpoint, or the list of its parts) into ``server``,
    each part's manifest checked against the program's ``tables`` first; returns
    ``{table: rows read}``."""
    dirs = model_dir if isinstance(model_dir, (list, tuple)) else [model_dir]
    paths = [os.path.realpath(os.path.join(checkpoint_root(), os.fspath(d))) for d in dirs]
    for path, d in zip(paths, dirs):
        m = _checkpoint.read_manifest(path)
        if m is None:
            raise ValueError(f"model_dir {os.fspath(d)!r} has no {_checkpoint.MANIFEST_NAME}: "
                             f"an incomplete save, or not a fleet checkpoint")
        _checkpoint.check_tables(m.get("tables") or [], tables, os.fspath(d))
    # Loaded relative to the deepest directory holding them all.
    base = os.path.commonpath([os.path.dirname(p) for p in paths])
    rels = [os.path.relpath(p, base) for p in paths]
    return server.load_checkpoint(rels if isinstance(model_dir, (list, tuple)) else rels[0],
                                  root=base)

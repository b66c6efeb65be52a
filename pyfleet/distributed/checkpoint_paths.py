"""Where a worker's checkpoint paths go: every save/load path is confined to the
checkpoint root (``$PYFLEET_CHECKPOINT_DIR`` or the directory the process started
in), as :mod:`pyfleet.distributed.fleet`'s module doc says."""

import os

from pyfleet.fluid.io import check_local_path

__all__ = ["checkpoint_root", "relative_to_root"]


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

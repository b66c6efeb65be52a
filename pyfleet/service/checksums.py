"""The checksums of a checkpoint's files (layout in :mod:`pyfleet.service.checkpoint`).

:func:`seal` records, in a manifest about to be committed, the size and sha256
of every file of its newest generation (the shards, the dense blocks, the
servers' ``server<i>-of-<S>.json``), of every file beside the manifest
(``"beside"``: the saving worker's ``<name>.state.npy``) and of the manifest's
own body (``body_sha256``, :func:`pyfleet._atomic.body_digest`);
:func:`check_beside` checks the files beside a manifest being read. Nothing is
hashed through a symbolic link.
"""

import hashlib
import os

from pyfleet._atomic import BODY_KEY, body_digest

__all__ = ["MANIFEST_NAME", "check_beside", "file_info", "seal"]

_CHUNK = 1 << 20
MANIFEST_NAME = "MANIFEST.json"  # the commit point of a checkpoint directory


def file_info(path):
    """``{"sha256", "bytes"}`` of a file (read in bounded chunks)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                break
            h.update(b)
            n += len(b)
    return {"sha256": h.hexdigest(), "bytes": n}


def _files(path):
    """The regular files of directory ``path`` (no link, no hidden temporary)."""
    return [n for n in sorted(os.listdir(path)) if not n.startswith(".")
            and not os.path.islink(os.path.join(path, n))
            and os.path.isfile(os.path.join(path, n))]


def seal(path, manifest):
    """Record the checksums of ``manifest`` (in place) for checkpoint dir
    ``path``: every file of its newest generation's directory not yet listed,
    every file beside the manifest, then the body's own. Returns the manifest."""
    gen = manifest["chain"][-1]
    gdir = os.path.join(path, gen["dir"])
    if os.path.isdir(gdir) and not os.path.islink(gdir):
        for name in _files(gdir):
            gen["files"].setdefault(name, file_info(os.path.join(gdir, name)))
    manifest["beside"] = {n: file_info(os.path.join(path, n)) for n in _files(path)
                          if n != MANIFEST_NAME}
    manifest[BODY_KEY] = body_digest(manifest)
    return manifest


def check_beside(path, mpath, manifest):
    """Refuse (ValueError naming the file) a file listed ``"beside"`` manifest
    ``mpath`` of checkpoint dir ``path`` that is missing or differs from its
    checksum."""
    beside = manifest.get("beside") or {}
    if not isinstance(beside, dict):
        raise ValueError(f"{mpath}: 'beside' must be an object")
    for name, want in sorted(beside.items()):
        if not isinstance(name, str) or os.path.basename(name) != name or \
                name.startswith(".") or not isinstance(want, dict):
            raise ValueError(f"{mpath}: 'beside' lists a bad file name {name!r}")
        f = os.path.join(path, name)
        if os.path.islink(f) or not os.path.isfile(f):
            raise ValueError(f"checkpoint {path}: file {name} is missing (or a link)")
        got = file_info(f)
        if got["bytes"] != want.get("bytes") or got["sha256"] != want.get("sha256"):
            raise ValueError(f"checkpoint {path}: file {name} is damaged (its size or sha256 "
                             f"differs from the manifest)")

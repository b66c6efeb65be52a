"""Fleet saves and loads at ``hdfs:``/``afs:`` paths, as PSLib's Fleet took them.

Fluid 1.x's PSLib Fleet saved and loaded its model at ``hdfs:``/``afs:``
paths (``fleet.save_persistables(dirname="hdfs:/...")``,
``save_inference_model``, ``load_model``) by shelling out to ``hadoop fs``;
its transpiler Fleet and ``fluid.io`` wrote local files only. pyfleet's Fleet
takes such paths in :meth:`save_persistables`, :meth:`save_inference_model`,
:meth:`load_persistables` and :meth:`init_server`, through
:class:`pyfleet.fluid.hadoop.HadoopFS` configured by
``fleet.set_hdfs_config(fs_name, fs_ugi, **other Hadoop settings)``:

- a save is made as usual into a staging directory under the checkpoint
  root (where the servers write), then uploaded: a checkpoint's new
  generation and scope-state files first, ``MANIFEST.json`` last (the commit
  point, as locally; the generations it no longer names are removed after),
  an inference model's files with ``__model__.json`` last. Generation names
  continue the remote directory's, so an upload never overwrites a
  generation the current manifest names. ``mode="delta"`` is refused by
  name (a chain's previous save would have to be local);
- a load downloads ``MANIFEST.json``, the generations its chain names and
  the scope-state files (a worker outside hybrid mode: only the manifest and
  its state files) into a staging directory, loads that, and removes it.

The staging directory (``<checkpoint root>/.hdfs-staging/<pid>-<n>``) is
removed afterwards, also when the transfer fails. Servers and the saving
worker share the checkpoint root, as for a local save.
"""

import functools
import inspect
import itertools
import os
import re
import shutil

from pyfleet.fluid import hadoop
from pyfleet.service import checkpoint as _checkpoint

__all__ = ["install"]

_GEN = re.compile(r"g\d{6,}-(full|delta)")
_STATE = _checkpoint.STATE_SUFFIX
_counter = itertools.count()


def _fs(fleet_):
    cfg = dict(fleet_._hdfs_config or {})
    return hadoop.HadoopFS(cfg.pop("fs_name", None), cfg.pop("fs_ugi", None), configs=cfg)


def _join(remote, name):
    return f"{remote.rstrip('/')}/{name}"


class _Staging:
    """A fresh staging directory under the checkpoint root, removed on exit."""

    def __init__(self, root):
        self.path = os.path.join(root, ".hdfs-staging", f"{os.getpid()}-{next(_counter)}")

    def __enter__(self):
        os.makedirs(self.path)
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)


def _download_checkpoint(fs, remote, local, tables=True):
    """MANIFEST.json, the state files and (``tables``) the generations of its
    chain of checkpoint ``remote`` into the new directory ``local``."""
    os.makedirs(local)
    if not fs.exists(_join(remote, _checkpoint.MANIFEST_NAME)):
        raise ValueError(f"{remote!r} has no {_checkpoint.MANIFEST_NAME}: an incomplete "
                         f"save, or not a fleet checkpoint")
    fs.get(_join(remote, _checkpoint.MANIFEST_NAME), os.path.join(local,
                                                                  _checkpoint.MANIFEST_NAME))
    # its own body checked now; the files beside it once they are here too
    manifest = _checkpoint.read_manifest(local, beside=False)
    names = [n for n in fs.ls(remote) if n.endswith(_STATE)]
    newest = manifest["chain"][-1]
    if tables:
        names += [g["dir"] for g in manifest["chain"]]
    elif manifest.get("state_dir") == newest["dir"]:   # the scope state only
        os.makedirs(os.path.join(local, newest["dir"]))
        names += [f"{newest['dir']}/{n}" for n in newest["files"] if n.endswith(_STATE)]
    for name in names:
        fs.get(_join(remote, name), os.path.join(local, name))


def _taking_remote(method, name, remote_call):
    """``method`` whose argument ``name`` (a path, or a list of them) may be
    remote: then ``remote_call(self, method, bound arguments, value)`` runs it."""
    sig = inspect.signature(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        ba = sig.bind(self, *args, **kwargs)
        ba.apply_defaults()
        value = ba.arguments[name]
        dirs = value if isinstance(value, (list, tuple)) else [value]
        if not any(hadoop.is_remote(d) for d in dirs):
            return method(*ba.args, **ba.kwargs)
        return remote_call(self, method, ba, value)
    return call


def _save_persistables(root):
    def save(self, method, ba, remote):
        if ba.arguments.get("mode") == "delta":
            raise ValueError(f"save_persistables(mode='delta') to {remote!r}: a delta extends "
                             f"the previous save of a local directory; save full to HDFS/AFS, "
                             f"or deltas locally")
        fs = _fs(self)
        existing = fs.ls(remote) if fs.exists(remote) else []
        with _Staging(root()) as stage:
            for name in existing:   # numbered after them: nothing named is overwritten
                if _GEN.fullmatch(name):
                    os.makedirs(os.path.join(stage, name))
            ba.arguments["dirname"] = stage
            manifest = method(*ba.args, **ba.kwargs)
            keep = {g["dir"] for g in manifest["chain"]}
            fs.mkdir(remote)
            for name in sorted(os.listdir(stage)):
                if name != _checkpoint.MANIFEST_NAME and (name in keep or name.endswith(_STATE)):
                    fs.put(os.path.join(stage, name), _join(remote, name))
            fs.put(os.path.join(stage, _checkpoint.MANIFEST_NAME),
                   _join(remote, _checkpoint.MANIFEST_NAME))
        for name in existing:
            if _GEN.fullmatch(name) and name not in keep:
                fs.rm(_join(remote, name))
        return manifest
    return save


def _save_inference_model(root):
    def save(self, method, ba, remote):
        fs = _fs(self)
        with _Staging(root()) as stage:
            local = ba.arguments["dirname"] = os.path.join(stage, "model")
            result = method(*ba.args, **ba.kwargs)
            fs.mkdir(remote)
            # pyfleet's description last: it says the model is complete
            for name in sorted(os.listdir(local), key=lambda n: n == "__model__.json"):
                fs.put(os.path.join(local, name), _join(remote, name))
        return result
    return save


def _load(root, name, tables):
    def load(self, method, ba, value):
        fs = _fs(self)
        with _Staging(root()) as stage:
            local = []
            for i, d in enumerate(value if isinstance(value, (list, tuple)) else [value]):
                if hadoop.is_remote(d):
                    local.append(os.path.join(stage, str(i)))
                    _download_checkpoint(fs, d, local[-1], tables(self))
                else:
                    local.append(d)
            ba.arguments[name] = local if isinstance(value, (list, tuple)) else local[0]
            return method(*ba.args, **ba.kwargs)
    return load


def install(fleet_class, checkpoint_root):
    """Let ``fleet_class``'s saves and loads take ``hdfs:``/``afs:`` paths (see the
    module doc); ``checkpoint_root()`` is where staging directories go."""
    root = checkpoint_root
    for method, name, remote_call in (
            ("save_persistables", "dirname", _save_persistables(root)),
            ("save_inference_model", "dirname", _save_inference_model(root)),
            ("init_server", "model_dir", _load(root, "model_dir", lambda self: True)),
            ("load_persistables", "dirname",
             _load(root, "dirname", lambda self: self._strategy.hybrid))):
        setattr(fleet_class, method,
                _taking_remote(getattr(fleet_class, method), name, remote_call))

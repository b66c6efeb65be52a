"""A Fleet checkpoint read into a local program: ``fluid.io.load_persistables`` of a
directory ``fleet.save_persistables`` wrote.

Fluid's infer scripts build the network in a plain program and load the
training job's checkpoint with ``fluid.io.load_persistables(exe, dirname,
main_program)`` (or ``load_vars``/``load_params``/``fluid.load``) to evaluate
without servers. :func:`load_checkpoint` does that for a checkpoint directory
(``MANIFEST.json``; layout in :mod:`pyfleet.service.checkpoint`): the manifest's
chain (a full save, then its deltas) is replayed, every file checked against
its sha256 first; every sparse table is read from all servers' shard files
(any number of servers) and every dense parameter assembled from the saved
blocks, into the program's :class:`~pyfleet.fluid.backend.LocalBackend`, each
table with its saved optimizer (and its state), initializer and seed, so a key
the model never saw gets the row a server would have made for it.

Importing this module registers the reader with :mod:`pyfleet.fluid.io`; the
``pyfleet.fluid`` facade imports it.
"""

import os

import numpy as np

from pyfleet import optimizer as _optimizer
from pyfleet.errors import ConfigError
from pyfleet.fluid import io as _io
from pyfleet.fluid.backend import LocalBackend
from pyfleet.service import checkpoint as _checkpoint
from pyfleet.table import DenseTable, SparseTable

__all__ = ["is_checkpoint", "load_checkpoint", "state_dir"]


def is_checkpoint(dirname):
    """True when ``dirname`` holds a committed Fleet checkpoint (its manifest)."""
    return os.path.isfile(os.path.join(os.fspath(dirname), _checkpoint.MANIFEST_NAME))


def _form(p):
    if p.is_sparse_table:
        return {"kind": "sparse", "name": p.name, "dim": int(p.dim)}
    return {"kind": "dense", "name": p.name, "shape": [int(s) for s in p.shape]}


def load_checkpoint(dirname, program, params):
    """Load ``params`` (parameters of ``program``) from Fleet checkpoint
    ``dirname`` into the program's local backend; returns ``{table: rows}``.
    A checkpoint lacking one of them, or holding it with another dim or shape,
    is a ValueError naming it; a damaged file a ValueError naming the file."""
    backend = program.backend
    if not isinstance(backend, LocalBackend):
        raise ConfigError(f"fluid.io loads a fleet checkpoint into a local program (whose "
                          f"parameters live in this process); this program's parameters "
                          f"live in {type(backend).__name__}: on a fleet job the servers "
                          f"load it with fleet.init_server(model_dir)")
    path = os.path.realpath(os.fspath(dirname))
    manifest = _checkpoint.read_manifest(path)
    if manifest is None:
        raise ValueError(f"{dirname!r} has no {_checkpoint.MANIFEST_NAME}: not a fleet "
                         f"checkpoint, or an incomplete save")
    params = list(params)
    _checkpoint.check_tables(manifest.get("tables") or [], [_form(p) for p in params],
                             os.fspath(dirname))
    saved = {t["name"]: t for t in manifest["tables"]}
    configs = []
    for p in params:
        cfg = saved[p.name]
        opt = _optimizer.from_config(cfg["optimizer"])
        if p.is_sparse_table:  # replaces the table: no row trained since survives
            # The servers' regularizer is left out: a local program's
            # executor regularizes the gradients itself (LocalBackend).
            backend.sparse[p.name] = SparseTable.from_config({**cfg, "name": p.name,
                                                              "regularizer": None})
        else:
            shape = tuple(int(s) for s in cfg["shape"])
            backend.dense[p.name] = DenseTable(shape, opt, initial=np.zeros(shape, np.float32),
                                               name=p.name)
        configs.append(cfg)
    # Imported here: the fluid facade imports this module, possibly while
    # collective_backend (which imports fluid) is itself being imported.
    from pyfleet.distributed.collective_backend import checkpoint_registry
    registry = checkpoint_registry(backend, configs)
    return _checkpoint.load_server(registry, os.path.dirname(path), os.path.basename(path))


def state_dir(dirname):
    """Where Fleet checkpoint ``dirname`` keeps the saving worker's scope state
    (its files checked against the manifest first)."""
    path = os.fspath(dirname)
    return _checkpoint.state_dir(path, _checkpoint.read_manifest(path))


_io.register_checkpoint_reader(is_checkpoint, load_checkpoint, state_dir)

"""One served model version: an inference model directory loaded for serving.

The directory is read by the loader ``pyfleet predict`` uses
(:func:`pyfleet.fluid.inference.load_program`: its file checks, checksums and
layouts), then every sparse table's rows move into a C++
:class:`pyfleet.table.SparseTable` in the storage type the model was trained
in (or ``storage``), with the disk tier of training past ``memory_budget``
(split evenly among the sparse tables, as ``pyfleet train`` splits a
server's). Rows move page by page, as numpy arrays into one C++ call each;
an id the model never saw is answered with the table's initial row for it
(its initializer and seed), as the servers in training would have created it.

Thread safety: :meth:`ModelVersion.predict` must be called from one thread at
a time (the server's one model thread); loading may run in another thread.
"""

import os

import numpy as np

from pyfleet import initializer as _init
from pyfleet.fluid.backend import Backend
from pyfleet.fluid.frozen import sha256_file
from pyfleet.fluid.inference import (
    FLUID_MODEL_FILENAME,
    MODEL_FILENAME,
    Predictor,
    load_program,
)
from pyfleet.optimizer import SGD
from pyfleet.table import STORAGE_TYPES, SparseTable

__all__ = ["MODEL_FILES", "ModelVersion", "is_model_dir", "model_digest"]

# The files whose presence says a model directory is complete (written last):
# pyfleet's JSON description, or Fluid's program file of a directory Fluid wrote.
MODEL_FILES = (MODEL_FILENAME, FLUID_MODEL_FILENAME)
_PAGE_ROWS = 1 << 16


def _model_file(path):
    """The file that commits the model directory ``path``, or None. pyfleet writes
    Fluid's ``__model__`` before its own ``__model__.json``: a directory holding
    ``.npy`` files beside ``__model__`` alone is one pyfleet is still writing."""
    if os.path.isfile(os.path.join(path, MODEL_FILENAME)):
        return os.path.join(path, MODEL_FILENAME)
    fluid = os.path.join(path, FLUID_MODEL_FILENAME)
    try:
        if os.path.isfile(fluid) and not any(n.endswith(".npy") for n in os.listdir(path)):
            return fluid
    except OSError:
        pass
    return None


def is_model_dir(path):
    """Whether ``path`` holds a committed model (see :func:`model_digest`)."""
    return _model_file(path) is not None


def model_digest(path):
    """The first 12 hex digits of the sha256 of the model description: it
    records every file's checksum, so a new model is a new digest."""
    p = _model_file(path)
    if p is None:
        raise ValueError(f"{path} holds no complete model ({' or '.join(MODEL_FILES)})")
    return sha256_file(p)[:12]


def _serving_storage(storage):
    """A table's storage for serving: its weights' type (the _q8 types keep only
    optimizer state in 8 bits, and a served table has none)."""
    return storage[:-3] if storage.endswith("_q8") else storage


class _ServingBackend(Backend):
    """Read-only parameters: dense arrays and sparse rows in C++ tables.

    A step gets the dense arrays themselves, not copies (a copy of every weight
    matrix was a fifth of a one-row step): they are made read-only, so a kernel
    that wrote into one would raise instead of changing the served model."""

    def __init__(self, dense, tables):
        self.dense = {}
        for name, value in dense.items():
            value = np.asarray(value).view()
            value.flags.writeable = False
            self.dense[name] = value
        self.tables = tables

    def _refuse(self, *_):
        raise ValueError("a served model is read-only: it cannot create, train or save "
                         "parameters")

    create_sparse = create_dense = push_sparse = push_dense = set_dense = _refuse

    def pull_dense(self, name):
        try:
            return self.dense[name]
        except KeyError:
            raise ValueError(f"the served model has no parameter {name!r}") from None

    def pull_sparse(self, name, keys, create=True):  # never creates: read-only
        try:
            table = self.tables[name]
        except KeyError:
            raise ValueError(f"the served model has no sparse table {name!r}") from None
        return table.pull(np.ascontiguousarray(keys, dtype=np.uint64), create=False)


def _fill(table, keys, weights):
    """Give ``table`` exactly the rows ``weights`` of ``keys``: one add from the
    initial rows, then an exact correction (``got + (w - got)`` is ``w`` when
    the two are this close) of the rows whose float sum numpy finds inexact:
    only those are read back, so a spilled table is not read twice."""
    for a in range(0, keys.shape[0], _PAGE_ROWS):
        k = np.ascontiguousarray(keys[a:a + _PAGE_ROWS])
        w = np.ascontiguousarray(weights[a:a + _PAGE_ROWS], dtype=np.float32)
        init = table.initial_values(k)
        delta = w - init
        table.add(k, delta)
        bad = np.flatnonzero(((init + delta) != w).any(axis=1))
        if bad.shape[0]:
            got = table.pull(k[bad], create=False)
            table.add(k[bad], w[bad] - got)


class ModelVersion:
    """A model directory loaded for serving.

    ``name``: how responses and /metrics call it. ``storage``: None (the
    type the model records, fp32 if none) or one of ``fp32``, ``fp16``,
    ``bf16``. ``memory_budget`` (bytes, all sparse tables together) and
    ``spill_dir``: the disk tier, both or neither. ``slots``: the slot names
    of slot-format requests (:class:`pyfleet.serving.rows.RowSchema`).
    ``unchecked_ok``: load a model without checksums (see
    :func:`pyfleet.fluid.inference.load_program`). Raises ValueError naming
    what is wrong with the directory."""

    def __init__(self, dirname, name=None, storage=None, memory_budget=None, spill_dir=None,
                 unchecked_ok=False):
        self.dirname = os.path.abspath(dirname)
        self.digest = model_digest(dirname)
        self.name = name or f"{os.path.basename(self.dirname)}@{self.digest}"
        program, feeds, fetches = load_program(dirname, program_only_ok=False,
                                               unchecked_ok=unchecked_ok)
        frozen = program.backend
        predictor = Predictor(program, feeds, fetches)  # its feed rules, as predict_file's
        configs = frozen.sparse_configs
        missing = [p.name for p in program.all_parameters()
                   if p.is_sparse_table and p.name not in configs]
        if missing:
            raise ValueError(f"{dirname}: the network reads sparse table(s) {missing} that "
                             f"the model's files do not hold (Fluid's files alone cannot hold "
                             f"a table indexed by 64-bit ids)")
        n_sparse = max(len(configs), 1)
        self.tables = {}
        for tname, cfg in configs.items():
            kind = _serving_storage(storage or cfg.get("storage", "fp32"))
            if kind not in STORAGE_TYPES:
                raise ValueError(f"sparse table {tname!r}: storage {kind!r} is not one of "
                                 f"{', '.join(STORAGE_TYPES)}")
            table = SparseTable(int(cfg["dim"]), SGD(1.0),
                                initializer=_init.from_config(cfg["initializer"]),
                                seed=int(cfg["seed"]), name=tname, storage=kind,
                                memory_budget=None if memory_budget is None
                                else int(memory_budget) // n_sparse,
                                spill_dir=spill_dir)
            _fill(table, *frozen.sparse_rows(tname))
            self.tables[tname] = table
        program.set_backend(_ServingBackend(frozen.dense, self.tables))
        del frozen  # its copies of the rows go: the tables hold them now
        self._predictor = predictor
        self.program = program
        block = program.global_block()
        self.slot_feeds = [n for n in feeds if block.var(n).lod_level >= 1]
        self.dense_feeds = [n for n in feeds if block.var(n).lod_level == 0]
        if len(self.dense_feeds) != 1:
            raise ValueError(f"{dirname}: a served model is fed by one dense input and its "
                             f"sparse slots; this one is fed by {feeds}")
        self.n_dense = int(block.var(self.dense_feeds[0]).shape[-1])
        self.n_slots = len(self.slot_feeds)

    def predict(self, batch):
        """float64 ``[B]``: the click probability of every example of ``batch``
        (the first fetch's last column, as ``pyfleet predict`` writes it)."""
        out = self._predictor.predict(self._predictor._feed_of_batch(batch))[0]
        prob = np.asarray(out, dtype=np.float64).reshape(len(batch), -1)[:, -1]
        if not np.isfinite(prob).all():
            raise ValueError(f"model {self.name} predicts NaN or infinity for row "
                             f"{int(np.argmin(np.isfinite(prob))) + 1}")
        return prob

    def table_stats(self):
        """``{table: (rows in RAM, rows on disk)}``."""
        out = {}
        for tname, t in self.tables.items():
            s = t.stats()
            on_disk = int(s.get("spilled_rows", 0))
            out[tname] = (len(t) - on_disk, on_disk)
        return out

    def info(self):
        return {"name": self.name, "path": self.dirname, "digest": self.digest,
                "tables": {n: {"rows": len(t), "storage": t.storage,
                               "memory_budget": t.memory_budget}
                           for n, t in self.tables.items()},
                "n_dense": self.n_dense, "n_slots": self.n_slots}

"""Prediction models: one format, written by :func:`save` and read by :func:`load_program`.

``fluid.io.save_inference_model``, ``fleet.save_inference_model``, ``pyfleet
train`` and :func:`save` all write a prediction directory::

    __model__.json          the network pruned to the targets (Program.to_dict), the
                            feed and fetch names, and an "inference" section listing
                            the files below with each sparse table's dim, initializer,
                            seed and storage type, and the sha256 of every file; written
                            last, so its presence means complete
    <param>.npy             each dense weight the network reads (numpy format)
    <table>.keys.npy        uint64[n]: every key of each sparse table the network reads
    <table>.weights.npy     float32[n, dim]: their embedding rows (optimizer state dropped)
    __model__, <var name>   Fluid's layout of the same model (or ``model_filename`` and
                            ``params_filename``): :mod:`pyfleet.fluid.fluid_model`

Nothing is pickled; every ``.npy`` is read with ``allow_pickle=False``. Loading
checks each file before it allocates anything for it: its ``.npy`` header's dtype
and shape against the model (a header claiming (10**12, 16) is refused by name,
never allocated), its size against its header (a truncated file), then its sha256
against the one recorded; ``__model__.json`` carries the sha256 of its own body
(``body_sha256``) too, and a description without checksums (edited, or written
before they were recorded) loads only with ``unchecked_ok=True``. A parameter
holding NaN or infinity is refused by name, and ``predict_file`` refuses a
non-finite prediction. A ``program_only`` save writes ``__model__.json`` without
the "inference" section: its parameters are then the ``<name>.npy``/``<name>.table`` files
``fluid.io.save_persistables`` writes into the same directory (the form
``fluid.io.save_inference_model`` also wrote with ``model_filename``,
``params_filename`` or a non-local backend before: such directories still load).

A key the model never saw predicts with the row a server would have created
for it: the table's initializer applied with its seed (a pure function of
seed and key, ``SparseTable.initial_values``), never zeros.

Where the parameters come from is a *source*:
:class:`~pyfleet.fluid.backend.LocalSource` (an in-process
:class:`pyfleet.fluid.backend.LocalBackend`, ``backend.inference_source()``) or
:class:`RemoteSource` (the parameter servers of a Fleet job: sparse rows are
streamed from every server in bounded pages with ``Client.export_sparse``,
dense values come from ``Client.pull_dense``). Memory while saving is one page
per table; a loaded :class:`Predictor` maps the weights, holds 16 bytes a row.

Thread safety: :func:`save` must not run concurrently with training on the
same parameters if a consistent snapshot is wanted (rows pushed during the
save may or may not be included). A :class:`Predictor` is not thread-safe;
load one per thread (or guard it).
"""

import json
import logging
import os
import shutil
import sys
import warnings

import numpy as np

from pyfleet import _atomic, metrics
from pyfleet.data.scoring import score_file
from pyfleet.endpoint import check_file_name
from pyfleet.errors import UncheckedModelWarning
from pyfleet.fluid import fluid_model, fluid_proto
from pyfleet.fluid.backend import LocalBackend, LocalSource, param_path
from pyfleet.fluid.executor import Executor
from pyfleet.fluid.framework import Parameter, Program, Variable, default_main_program
from pyfleet.fluid.frozen import (
    PAGE_ROWS,
    FrozenBackend,
    check_finite,
    frozen_backend,
    sha256_file,
)
from pyfleet.fluid.tensor import Scope

__all__ = ["FLUID_MODEL_FILENAME", "INFERENCE_FORMAT", "MODEL_FILENAME", "LocalSource", "Predictor", "RemoteSource",
           "load", "load_program", "read_model_desc", "resolve_program", "save"]

MODEL_FILENAME = "__model__.json"
FLUID_MODEL_FILENAME = fluid_model.FLUID_MODEL_FILENAME
INFERENCE_FORMAT = "pyfleet-inference"
INFERENCE_VERSION = 1
_PAGE_ROWS = PAGE_ROWS  # rows a page, saving and checking
_log = logging.getLogger("pyfleet.inference")


def resolve_program(program):
    """The :class:`Program` ``program`` stands for: itself, a CompiledProgram's
    program, or (None) the default main program. ValueError for anything else."""
    program = program or default_main_program()
    program = getattr(program, "_program", program)  # fluid.CompiledProgram
    if not isinstance(program, Program):
        raise ValueError(f"main_program must be a fluid.Program, got {program!r}")
    return program


class RemoteSource:
    """Parameters held by the servers of a Fleet job, through a connected
    :class:`pyfleet.service.client.Client`; ``table_configs`` is the job's table list
    (``pyfleet.distributed.fleet.table_configs``), which gives each sparse table's
    initializer and seed."""

    def __init__(self, client, table_configs, page_rows=_PAGE_ROWS):
        self.client = client
        self.page_rows = int(page_rows)
        self.configs = {c["name"]: c for c in table_configs if c.get("kind") == "sparse"}

    def dense(self, name):
        return self.client.pull_dense(name)

    def sparse_config(self, param):
        cfg = self.configs.get(param.name)
        if cfg is None:
            raise ValueError(f"sparse table {param.name!r} is not in the job's table configs "
                             f"(known: {sorted(self.configs)})")
        return {"dim": int(cfg["dim"]), "initializer": cfg["initializer"],
                "seed": int(cfg["seed"]), "storage": cfg.get("storage", "fp32")}

    def sparse_pages(self, name):
        return self.client.export_sparse(name, page_rows=self.page_rows)


def _write_rows(dirname, name, dim, pages):
    """Stream ``pages`` of (keys, weights) into ``<name>.keys.npy`` and
    ``<name>.weights.npy`` through raw temporary files (bounded memory)."""
    kpath = os.path.join(dirname, name + ".keys.npy")
    wpath = os.path.join(dirname, name + ".weights.npy")
    kraw, wraw = f"{kpath}.raw.{os.getpid()}", f"{wpath}.raw.{os.getpid()}"
    n = 0
    try:
        with open(kraw, "wb") as fk, open(wraw, "wb") as fw:
            for keys, weights in pages:
                keys = np.ascontiguousarray(keys, dtype="<u8").reshape(-1)
                weights = np.ascontiguousarray(weights, dtype="<f4")
                if weights.shape != (keys.shape[0], dim):
                    raise ValueError(f"table {name!r}: a page of {keys.shape[0]} keys came with "
                                     f"weights of shape {weights.shape}, expected dim {dim}")
                # write(), not tofile(): a full disk is ENOSPC naming the file
                with _atomic.writing(kpath):
                    fk.write(keys)
                with _atomic.writing(wpath):
                    fw.write(weights)
                n += keys.shape[0]
            with _atomic.writing(kpath):
                fk.flush()
            with _atomic.writing(wpath):
                fw.flush()
        if n:
            keys = np.memmap(kraw, dtype="<u8", mode="r", shape=(n,))
            weights = np.memmap(wraw, dtype="<f4", mode="r", shape=(n, dim))
        else:
            keys, weights = np.empty(0, "<u8"), np.empty((0, dim), "<f4")
        _atomic.save_npy(kpath, keys)
        _atomic.save_npy(wpath, weights)
        del keys, weights
    finally:
        for p in (kraw, wraw):
            if os.path.exists(p):
                os.remove(p)
    return n, os.path.basename(kpath), os.path.basename(wpath)


def _prune(program, feed_names, targets):
    """The ops computing ``targets`` from ``feed_names`` and parameters (an
    auc op only for an auc target: its counts start at zero in the loading
    scope); ValueError naming a variable that is neither fed nor computed."""
    wanted = {t.name for t in targets}
    keep = []
    for op in reversed(program.global_block().ops):
        if op.type == "auc" and op.output("AUC")[0].name not in wanted:
            continue
        if any(v.name in wanted for v in op.output_vars()):
            keep.append(op)
            wanted.update(v.name for v in op.input_vars())
    keep.reverse()
    produced = {v.name for op in keep for v in op.output_vars()}
    for op in keep:
        for v in op.input_vars():
            if v.name not in produced and not isinstance(v, Parameter) and \
                    v.name not in feed_names:
                raise ValueError(f"target needs {v.name!r}, which is neither fed "
                                 f"({sorted(feed_names)}) nor computed")
    return keep


def _write_params(dirname, ops, source):
    """The "inference" section, after writing every parameter ``ops`` read."""
    used = {}
    for op in ops:
        for v in op.input_vars():
            if isinstance(v, Parameter):
                used.setdefault(v.name, v)
    section = {"format": INFERENCE_FORMAT, "version": INFERENCE_VERSION,
               "dense": {}, "sparse": {}}
    for p in used.values():
        path = param_path(dirname, p)  # also refuses names unfit for a file
        if p.is_sparse_table:
            cfg = source.sparse_config(p)
            rows, kfile, wfile = _write_rows(dirname, p.name, cfg["dim"],
                                             source.sparse_pages(p.name))
            section["sparse"][p.name] = {**cfg, "rows": rows, "keys": kfile, "weights": wfile}
        else:
            value = np.asarray(source.dense(p.name), dtype=np.float32)
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"parameter {p.name!r} has shape {tuple(p.shape)}, the "
                                 f"source gave {value.shape}")
            _atomic.save_npy(path, value)
            section["dense"][p.name] = os.path.basename(path)
    files = list(section["dense"].values()) + [
        t[k] for t in section["sparse"].values() for k in ("keys", "weights")]
    section["sha256"] = {f: sha256_file(os.path.join(dirname, f)) for f in files}
    return section


def save(dirname, program, feeded_var_names, target_vars, source, model_filename=None,
         params_filename=None):
    """Write a prediction directory (see the module doc) for ``target_vars``
    computed from ``feeded_var_names``, with parameters from ``source`` (None:
    the program only). ``model_filename`` names Fluid's program file (default
    ``__model__``), ``params_filename`` the one file holding every Fluid
    tensor (default: one file per variable). Returns the target names. Raises
    ValueError if a target needs a variable that is neither fed nor computed."""
    program = resolve_program(program)
    if isinstance(feeded_var_names, str):
        feeded_var_names = [feeded_var_names]
    if isinstance(target_vars, (Variable, str)):
        target_vars = [target_vars]
    feed_names = list(feeded_var_names)
    block = program.global_block()
    feed_vars = [block.var(n) for n in feed_names]
    targets = [block.var(t.name if isinstance(t, Variable) else t) for t in target_vars]
    model_file = check_file_name(os.path.basename(model_filename or FLUID_MODEL_FILENAME),
                                  "model_filename")
    if params_filename is not None:
        params_filename = check_file_name(os.path.basename(params_filename),
                                          "params_filename")
    if MODEL_FILENAME in (model_file, params_filename) or model_file == params_filename:
        raise ValueError(f"model_filename={model_filename!r}, params_filename="
                         f"{params_filename!r}: each names its own file, and "
                         f"{MODEL_FILENAME} is pyfleet's")
    ops = _prune(program, set(feed_names), targets)
    desc = program.to_dict(ops)
    for op in desc["ops"]:   # Fluid's inference program runs dropout/batch_norm as tests
        if "is_test" in op["attrs"]:
            op["attrs"] = {**op["attrs"], "is_test": True}
    desc["feed"] = feed_names
    desc["fetch"] = [t.name for t in targets]
    program_bytes = fluid_proto.mark_program(
        fluid_model.program_to_desc(ops, feed_vars, targets), MODEL_FILENAME)
    created = not os.path.isdir(dirname)
    os.makedirs(dirname, exist_ok=True)
    try:
        # The parameters first: the model file says the directory is complete.
        fluid = {"model": model_file}
        if source is not None:
            section = _write_params(dirname, ops, source)
            fluid.update(fluid_model.write_params(dirname, ops, section, params_filename))
            desc["inference"] = section
        with _atomic.atomic_open(os.path.join(dirname, model_file), "wb") as f:
            f.write(program_bytes)
        if source is not None:
            for fname in [model_file] + fluid["files"]:
                section["sha256"][fname] = sha256_file(os.path.join(dirname, fname))
        desc["fluid"] = fluid
        desc[_atomic.BODY_KEY] = _atomic.body_digest(desc)  # the body's own, checked on load
        _atomic.write_json(os.path.join(dirname, MODEL_FILENAME), desc)
    except BaseException:
        if created:  # nothing of a failed save stays (a full disk gets its space back)
            shutil.rmtree(dirname, ignore_errors=True)
        raise
    return [t.name for t in targets]


class Predictor:
    """A loaded prediction model (see :func:`load`). Attributes: ``program``,
    ``feed_names``, ``fetch_names``, ``tables`` (``{name: rows}``)."""

    def __init__(self, program, feed_names, fetch_names):
        backend = program.backend
        self.program = program
        self.feed_names = list(feed_names)
        self.fetch_names = list(fetch_names)
        self.tables = {n: int(v[0].shape[0]) for n, v in backend.sparse.items()}
        self.last_file_stats = None  # the reader's counts of predict_file's last file
        self._exe = Executor()
        self._scope = Scope()
        block = program.global_block()
        self._fetch = [block.var(n) for n in self.fetch_names]

    def predict(self, feed):
        """``[output per fetch name]`` (numpy) for ``feed`` ``{name: value}``
        (values as for ``Executor.run``: arrays, LoDTensors or CSR
        ``(ids, offsets)`` tuples). Every feed name is required."""
        missing = [n for n in self.feed_names if n not in feed]
        if missing:
            raise ValueError(f"feed is missing {missing} (the model reads {self.feed_names})")
        return self._exe.run(self.program, feed=feed, fetch_list=self._fetch,
                             scope=self._scope)

    def _feed_of_batch(self, batch):
        block = self.program.global_block()
        slots = [n for n in self.feed_names if block.var(n).lod_level >= 1]
        others = [n for n in self.feed_names if block.var(n).lod_level == 0]
        if len(slots) != len(batch.sparse):
            raise ValueError(f"the model reads {len(slots)} sparse slots, the data has "
                             f"{len(batch.sparse)}")
        if len(others) != 1:
            raise ValueError(f"predict_file needs a model fed by one dense input and the "
                             f"sparse slots; it is fed by {self.feed_names}")
        feed = {others[0]: batch.dense}
        for name, (ids, offsets) in zip(slots, batch.sparse):
            feed[name] = (ids, offsets)
        return feed

    def predict_file(self, path, out_path, format="criteo", batch_size=4096,
                     skip_malformed=False, id_column=None):
        """Score every example of ``path`` (read by :class:`pyfleet.data.Dataset`
        in ``format``, with its default dense transform, as ``pyfleet train``
        reads; unlabelled rows too: Criteo's 39-field test file, a CSV with no
        label column) and write one probability per data line (the first fetch's
        last column) to ``out_path`` (``"-"``: stdout), in order. With
        ``id_column`` (a CSV column, e.g. ``"Id"``) the output is a CSV
        ``Id,Predicted`` with the id of each line. Returns the rows written.

        A malformed line is a ValueError naming the file and line, and nothing
        is written: a skipped line would shift every later prediction against
        its input line. ``skip_malformed=True`` skips them instead (the output
        then has a line per valid example); :attr:`last_file_stats` is the
        reader's counts (``malformed``, ``first_malformed``...) of the file, with
        ``labelled`` and, for labelled rows, the exact ``auc`` and the ``logloss``."""
        probs, labels = [], []

        def run(out):
            return score_file(path, out, lambda b: self.predict(self._feed_of_batch(b))[0],
                              format=format, batch_size=batch_size,
                              strict=not skip_malformed, id_column=id_column,
                              labelled_batches=lambda p, y: (probs.append(p),
                                                             labels.append(y)))
        if os.fspath(out_path) == "-":
            stats = run(sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with _atomic.atomic_open(out_path, "wb") as f:
                stats = run(f)
        if probs:
            p, y = np.concatenate(probs), np.concatenate(labels)
            stats.update(auc=metrics.exact_auc(p, y), logloss=metrics.logloss(p, y))
        self.last_file_stats = stats
        return stats["rows"]


def read_model_desc(path):
    """The JSON model description at ``path``; ValueError naming it if missing or bad."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no inference model at {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a valid model description: {e}") from None


def _check_section(path, section):
    if not isinstance(section, dict) or section.get("format") != INFERENCE_FORMAT:
        raise ValueError(f"{path} was not written by pyfleet.inference.save or "
                         "fluid.io.save_inference_model with its parameters (a program_only "
                         "model loads with fluid.io.load_inference_model)")
    if section.get("version") != INFERENCE_VERSION:
        raise ValueError(f"{path}: inference format version {section.get('version')!r} is not "
                         f"supported (expected {INFERENCE_VERSION})")


def _check_unmarked(path, data, unchecked_ok, warn_unchecked):
    """Refuse (ValueError) or warn of Fluid's model file ``path`` (bytes ``data``),
    read because no pyfleet description of it is beside it: see :func:`load_program`."""
    if unchecked_ok:
        return
    mark = fluid_proto.read_mark(data)
    if mark is not None and mark["intact"]:
        raise ValueError(f"{path} was written by pyfleet with the checksums of the model's "
                         f"files in {mark['checksums']}, which is missing or describes "
                         f"another model file (deleted or replaced?): nothing can check "
                         f"this model; refused (load it with unchecked_ok=True, or "
                         f"--unchecked-model, only if you trust it)")
    why = (f"{path} is a model in Fluid's layout with no checksums pyfleet can check "
           f"(written by Paddle, or edited since pyfleet wrote it)")
    if not warn_unchecked:
        raise ValueError(f"{why}: refused (load it with unchecked_ok=True, or "
                         f"--unchecked-model, only if you trust it)")
    warnings.warn(f"{why}: loaded unchecked", UncheckedModelWarning, stacklevel=5)


def _load_fluid(dirname, path, params_filename, unchecked_ok, warn_unchecked):
    """``(program, feeds, fetches)`` of a directory in Fluid's own layout."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"no inference model at {path}") from None
    _check_unmarked(path, data, unchecked_ok, warn_unchecked)
    program, feeds, fetches, values = fluid_model.load_dir(dirname, path, Program,
                                                           params_filename, data=data)
    for name, value in values.items():
        if value.dtype.kind == "f":
            check_finite(value, f"parameter {name!r}")
    program.set_backend(FrozenBackend(values, {}, {}))
    return program, feeds, fetches


def load_program(dirname, model_filename=None, program_only_ok=True, params_filename=None,
                 unchecked_ok=False, warn_unchecked=False):
    """``(program, feed names, fetch names)`` of a prediction directory, the
    program's backend set to its parameters. pyfleet's ``__model__.json`` is
    read when present: read-only rows and values of its "inference" section
    or, for a model saved without it (``program_only``; refused with
    ``program_only_ok=False``), a :class:`LocalBackend` loaded from the
    ``<name>.npy``/``<name>.table`` files beside it. A directory in Fluid's
    layout alone (written by Fluid: ``__model__`` or ``model_filename``, its
    tensor files or ``params_filename``) is read from those. ValueError
    naming a missing or malformed file.

    ``__model__.json`` carries the sha256 of its own body and of every file
    the save wrote (pyfleet's and Fluid's): each is checked before it is used;
    a description without them is refused unless ``unchecked_ok=True``. So is a
    directory in Fluid's layout without ``__model__.json`` (nothing checks its
    files): when its program carries pyfleet's mark
    (:func:`pyfleet.fluid.fluid_proto.mark_program`), the checksums were
    deleted; without one it was written by Paddle (or edited), and with
    ``warn_unchecked`` (Fluid's ``load_inference_model``, which must open
    Paddle's models) it loads with an :class:`UncheckedModelWarning` instead."""
    json_path = os.path.join(dirname, MODEL_FILENAME)
    if model_filename is None:
        path = json_path if os.path.exists(json_path) else os.path.join(
            dirname, FLUID_MODEL_FILENAME)
    else:
        path = os.path.join(dirname, os.path.basename(model_filename))
    if not fluid_model.is_json(path):
        desc = read_model_desc(json_path) if os.path.exists(json_path) else {}
        if desc.get("fluid", {}).get("model") != os.path.basename(path):
            return _load_fluid(dirname, path, params_filename, unchecked_ok, warn_unchecked)
        path = json_path   # written by pyfleet: its own description is complete
    desc = read_model_desc(path)
    section = desc.get("inference")  # its files' checksums, and the body's own
    if section is not None or not program_only_ok:
        _check_section(path, section)  # whose file it is, before whether it is intact
    _atomic.check_body(path, desc, unchecked_ok,
                       complete=not isinstance(section, dict) or "sha256" in section)
    if section is None and program_only_ok:
        program = Program.from_dict(desc)
        backend = LocalBackend()
        backend.load(dirname, program.all_parameters())
    else:
        program = Program.from_dict(desc)
        backend = frozen_backend(dirname, section, program)
    program.set_backend(backend)
    return program, list(desc.get("feed", [])), list(desc.get("fetch", []))


def load(dirname, model_filename=None, params_filename=None, unchecked_ok=False):
    """A :class:`Predictor` for a directory :func:`save` wrote with its
    parameters (no server needed), or one in Fluid's layout. Raises
    ValueError naming a missing, malformed or damaged file (``unchecked_ok``:
    see :func:`load_program`)."""
    program, feeds, fetches = load_program(dirname, model_filename, program_only_ok=False,
                                           params_filename=params_filename,
                                           unchecked_ok=unchecked_ok)
    return Predictor(program, feeds, fetches)

"""``fluid.io``: save and load persistables and inference models.

Parameters go through the program's backend (:meth:`Backend.save` /
:meth:`Backend.load`): one file per parameter, ``<name>.npy`` (dense, numpy
format, loaded with ``allow_pickle=False``) or ``<name>.table`` (a sparse
table file with optimizer state); the persistable scope state (auc counters)
as ``<name>.state.npy``. An inference model is the one prediction format of
:mod:`pyfleet.fluid.inference` (its writer and its reader). Nothing is
pickled. Files are written to a temporary name and renamed.

Not thread-safe with a concurrently training executor on the same program.
"""

import os

import numpy as np

from pyfleet import _atomic
from pyfleet.endpoint import check_file_name
from pyfleet.fluid import fluid_model, inference
from pyfleet.fluid.backend import param_path
from pyfleet.fluid.framework import Parameter, Program, Variable
from pyfleet.fluid.inference import MODEL_FILENAME, resolve_program
from pyfleet.fluid.reader import DataLoader, PyReader
from pyfleet.fluid.tensor import global_scope
from pyfleet.optimizer import SGD

__all__ = [
    "MODEL_FILENAME",
    "DataLoader",
    "PyReader",
    "check_local_path",
    "is_parameter",
    "is_persistable",
    "load",
    "load_inference_model",
    "load_params",
    "load_persistables",
    "load_scope_state",
    "load_vars",
    "register_checkpoint_reader",
    "save",
    "save_inference_model",
    "save_params",
    "save_persistables",
    "save_scope_state",
    "save_vars",
]


_REMOTE_SCHEMES = ("hdfs:", "afs:", "viewfs:")


def check_local_path(path, what="path"):
    """``path`` as a local path; a Hadoop URI (``hdfs:``, ``afs:``,
    ``viewfs:``) is a ValueError naming HDFS: ``fluid.io`` reads and writes
    local (or mounted) file systems, as Fluid's save and load ops did."""
    text = os.fspath(path)
    if isinstance(text, str) and text.lower().startswith(_REMOTE_SCHEMES):
        raise ValueError(f"{what} {text!r} is an HDFS/AFS path: fluid.io reads and writes "
                         f"local paths (as Fluid's did); fleet.save_persistables, "
                         f"save_inference_model, load_persistables, init_server and Dataset "
                         f"file lists take hdfs:/afs: paths (through the hadoop command)")
    return text


def _state_path(dirname, name):
    return os.path.join(dirname, check_file_name(name, "variable name") + ".state.npy")


# (is_mine(dirname), load(dirname, program, params), state_dir(dirname))
_CHECKPOINT_READERS = []


def register_checkpoint_reader(is_mine, load, state_dir=None):
    """Let ``load(dirname, program, params)`` read the directories
    ``is_mine(dirname)`` accepts (a Fleet checkpoint: registered by
    :mod:`pyfleet.distributed.local_checkpoint`, which the facade imports);
    ``state_dir(dirname)``: where such a directory keeps its scope state files
    (default: ``dirname`` itself)."""
    _CHECKPOINT_READERS.append((is_mine, load, state_dir))


def _state_dir(dirname):
    for is_mine, _, state_dir in _CHECKPOINT_READERS:
        if state_dir is not None and is_mine(dirname):
            return state_dir(dirname)
    return dirname


def is_parameter(var):
    """Fluid's predicate: a trainable parameter (dense or sparse table)."""
    return isinstance(var, Parameter)


def is_persistable(var):
    """Fluid's predicate: a variable kept across runs (parameters, auc states)."""
    return bool(getattr(var, "persistable", False))


def _fluid_files(dirname, params, filename):
    """The ``params`` to read from Fluid's tensor files: all with ``filename``
    (Fluid's combined form), else those without a pyfleet file but with a file
    named after them (what Fluid's ``save_vars`` writes)."""
    if filename is not None:
        return list(params)
    return [p for p in params if not os.path.exists(param_path(dirname, p)) and
            os.path.isfile(os.path.join(dirname, check_file_name(p.name, "variable name")))]


def _load_fluid_tensors(dirname, program, params, filename):
    """Read Fluid's tensor files of the dense ``params`` into the program's backend."""
    sparse = [p.name for p in params if p.is_sparse_table]
    if sparse:
        raise ValueError(f"{dirname}: sparse tables {sparse} are read from pyfleet's "
                         f"<name>.table files, not Fluid's tensor files")
    order = sorted(params, key=lambda p: p.name)   # Fluid's combined file: by name
    values = fluid_model.read_params(
        dirname, [(p.name, p.dtype.name, list(p.shape)) for p in order], filename)
    backend = program.backend
    for p in order:
        try:
            backend.set_dense(p.name, values[p.name])
        except (KeyError, ValueError):   # not created yet (a parsed program)
            backend.create_dense(p.name, values[p.name], SGD(1.0))


def _load_parameters(dirname, program, params, filename=None):
    params = list(params)
    if not params:
        return
    fluid_params = _fluid_files(dirname, params, filename)
    if fluid_params:
        _load_fluid_tensors(dirname, program, fluid_params, filename)
        params = [p for p in params if p not in fluid_params]
        if not params:
            return
    for is_mine, load, _ in _CHECKPOINT_READERS:
        if is_mine(dirname):
            load(dirname, program, params)
            return
    program.backend.load(dirname, params)


def _select(program, vars, predicate, what):
    """The program's variables ``vars`` (Variables or names) or, without them,
    those ``predicate`` accepts (default: every persistable one)."""
    if vars is None:
        predicate = predicate or is_persistable
        return [v for v in program.list_vars() if predicate(v)]
    by_name = {}
    for x in program.list_vars():
        by_name.setdefault(x.name, x)
    out = []
    for v in [vars] if isinstance(vars, (str, Variable)) else vars:
        name = v if isinstance(v, str) else v.name
        if name not in by_name:
            raise ValueError(f"{what}: variable {name!r} is not in the program")
        out.append(by_name[name])
    return out


def save_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None):
    """Save the program's variables ``vars`` (or those ``predicate`` accepts):
    parameters through the program's backend, persistable scope state (auc
    counters) as ``<name>.state.npy``. ``filename`` (Fluid's one-file form) is
    refused: every parameter is one file (a sparse table with its optimizer state)."""
    if filename is not None:
        raise ValueError(f"filename={filename!r}: pyfleet saves one file per variable "
                         f"(sparse tables with their optimizer state); leave filename=None")
    check_local_path(dirname, "dirname")
    program = resolve_program(main_program)
    dirname = program.backend.save_dir(dirname)  # a Fleet worker: the checkpoint root's
    chosen = _select(program, vars, predicate, "save_vars")
    params = [v for v in chosen if isinstance(v, Parameter)]
    # A Fleet worker's save is a checkpoint holding the auc counters already
    # (written before its manifest is committed): not a second time after it.
    if not (params and program.backend.save(dirname, params)):
        save_scope_state(dirname, chosen)


def _scope_state_vars(program_or_vars):
    vs = program_or_vars.list_vars() if isinstance(program_or_vars, Program) else program_or_vars
    return [v for v in vs if getattr(v, "persistable", False) and not isinstance(v, Parameter)]


def save_scope_state(dirname, program_or_vars):
    """Write the persistable scope state (auc counters: the persistable
    variables that are no parameters) of a program, or of the variables
    given, held in the global scope, as ``<name>.state.npy`` in ``dirname``
    (``fleet.save_persistables`` writes them into a checkpoint's new generation).
    Returns the names written."""
    scope = global_scope()
    os.makedirs(dirname, exist_ok=True)
    written = []
    for v in _scope_state_vars(program_or_vars):
        if v.name in scope.vars and v.name not in written:
            _atomic.save_npy(_state_path(dirname, v.name), scope.vars[v.name])
            written.append(v.name)
    return written


def load_scope_state(dirname, program_or_vars):
    """Read back what :func:`save_scope_state` wrote into the global scope; a
    state without a file keeps its value. A file of another shape than the
    value it replaces is a ValueError naming it. Returns the names read."""
    scope = global_scope()
    read = []
    for v in _scope_state_vars(program_or_vars):
        path = _state_path(dirname, v.name)
        if v.name in read or not os.path.exists(path):
            continue
        value = np.load(path, allow_pickle=False)
        old = scope.vars.get(v.name)
        if old is not None and np.shape(old) != value.shape:
            raise ValueError(f"{path} holds shape {value.shape}, the scope's {v.name!r} has "
                             f"shape {np.shape(old)}: a checkpoint of another model")
        scope.vars[v.name] = value
        read.append(v.name)
    return read


def load_vars(executor, dirname, main_program=None, vars=None, predicate=None, filename=None):
    """Load what :func:`save_vars` (or ``fleet.save_persistables``: a Fleet
    checkpoint, sparse tables included, into a local program) wrote, the
    persistable scope state (auc counters) included; a state without a file
    keeps its value."""
    check_local_path(dirname, "dirname")
    program = resolve_program(main_program)
    chosen = _select(program, vars, predicate, "load_vars")
    _load_parameters(dirname, program, [v for v in chosen if isinstance(v, Parameter)],
                     filename)
    load_scope_state(_state_dir(dirname), chosen)


def save_params(executor, dirname, main_program=None, filename=None):
    """Save every parameter of the program (dense values and sparse tables);
    on a Fleet worker's program, the servers save them (``fleet.save_persistables``)."""
    save_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename)


def load_params(executor, dirname, main_program=None, filename=None):
    load_vars(executor, dirname, main_program, predicate=is_parameter, filename=filename)


def save_persistables(executor, dirname, main_program=None, filename=None):
    """Save the parameters and the persistable scope state (auc counters). On a
    Fleet worker's program the parameters are saved by the servers, as
    ``fleet.save_persistables`` does (a checkpoint directory; the auc counters
    of this worker are committed with it)."""
    save_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename)


def load_persistables(executor, dirname, main_program=None, filename=None):
    """Load what :func:`save_persistables` wrote, or a Fleet checkpoint (sparse
    tables included) into a local program, to evaluate or serve without servers."""
    load_vars(executor, dirname, main_program, predicate=is_persistable, filename=filename)


def save(program, model_path):
    """Fluid 1.6's ``fluid.save``: the persistables into the directory
    ``<model_path>.pdparams`` (as :func:`save_persistables`; on a Fleet worker a
    checkpoint the servers write) and the network into ``<model_path>.pdmodel``
    (JSON). The optimizer state travels in the parameter files (Fluid's
    ``.pdopt`` has no separate file here)."""
    model_path = check_local_path(model_path, "model_path")
    if not isinstance(program, Program):
        raise TypeError(f"fluid.save(program, model_path): program must be a Program, "
                        f"got {type(program).__name__}")
    parent = os.path.dirname(model_path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    save_persistables(None, model_path + ".pdparams", program)
    _atomic.write_json(model_path + ".pdmodel", program.to_dict())


def load(program, model_path, executor=None, var_list=None):
    """Fluid 1.6's ``fluid.load``: the persistables :func:`save` wrote into
    ``program`` (``var_list``: only those variables)."""
    model_path = check_local_path(model_path, "model_path")
    if not isinstance(program, Program):
        raise TypeError(f"fluid.load(program, model_path): program must be a Program, "
                        f"got {type(program).__name__}")
    dirname = model_path + ".pdparams"
    if not os.path.isdir(dirname):
        raise ValueError(f"fluid.load: {dirname} does not exist (written by "
                         f"fluid.save(program, {model_path!r}))")
    if var_list is None:
        load_persistables(executor, dirname, program)
    else:
        load_vars(executor, dirname, program, vars=var_list)


def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None,
                         model_filename=None, params_filename=None,
                         export_for_deployment=True, program_only=False):
    """Write the program pruned to ``target_vars`` and the parameters it uses
    (:func:`pyfleet.fluid.inference.save`): Fluid's layout (``__model__``, or
    ``model_filename``, a ProgramDesc; one tensor file per persistable, or
    every one in ``params_filename``) beside pyfleet's own description
    (``__model__.json`` and its ``.npy`` files). Returns the target variable
    names. A Fleet worker's program gets its parameters from the servers
    (what ``fleet.save_inference_model`` writes). ``export_for_deployment=False``
    (Fluid's whole-program save for further training) is refused by name."""
    if not export_for_deployment:
        raise ValueError("save_inference_model(export_for_deployment=False) saves Fluid's "
                         "training program for further training: use "
                         "fluid.io.save_persistables (or fluid.save) for that")
    check_local_path(dirname, "dirname")
    program = resolve_program(main_program)
    if isinstance(target_vars, Variable):
        target_vars = [target_vars]
    source = None if program_only else program.backend.inference_source()
    return inference.save(dirname, program, feeded_var_names, list(target_vars), source,
                          model_filename=model_filename, params_filename=params_filename)


def load_inference_model(dirname, executor, model_filename=None, params_filename=None,
                         pserver_endpoints=None):
    """``[program, feed_target_names, fetch_targets]`` as Fluid returns them; the
    program computes only and holds the model's parameters
    (:func:`pyfleet.fluid.inference.load_program`: pyfleet's description when
    present, else Fluid's ``__model__``/``model_filename`` and tensor files or
    ``params_filename``). A directory in Fluid's layout alone (Paddle's
    models carry no checksums) loads with an
    :class:`~pyfleet.errors.UncheckedModelWarning`; one pyfleet wrote whose
    checksums were deleted is refused. ``pserver_endpoints`` (Fluid's distributed
    lookup table served by parameter servers at prediction time) is refused by name."""
    if pserver_endpoints:
        raise ValueError(f"load_inference_model(pserver_endpoints={pserver_endpoints!r}): "
                         f"the model directory holds every embedding row; load it without "
                         f"pserver_endpoints")
    check_local_path(dirname, "dirname")
    if not os.path.isdir(dirname):
        raise ValueError(f"There is no directory named {os.fspath(dirname)!r}")
    program, feeds, fetches = inference.load_program(dirname, model_filename,
                                                     params_filename=params_filename,
                                                     warn_unchecked=True)
    block = program.global_block()
    return [program, feeds, [block.var(n) for n in fetches]]


# Fluid 1.8's fluid.io also holds the reader decorators and program queries.
from pyfleet.fluid import io_readers as _io_readers  # noqa: E402
from pyfleet.fluid import refusals as _refusals  # noqa: E402
from pyfleet.fluid.io_readers import *  # noqa: E402,F403

__all__ += _io_readers.__all__
_refusals.install(globals(), "paddle.fluid.io")

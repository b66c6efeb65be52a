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
from pyfleet.fluid import inference
from pyfleet.fluid.framework import Parameter, Variable
from pyfleet.fluid.inference import MODEL_FILENAME, resolve_program
from pyfleet.fluid.reader import DataLoader, PyReader
from pyfleet.fluid.tensor import global_scope

__all__ = [
    "DataLoader",
    "MODEL_FILENAME",
    "PyReader",
    "load_inference_model",
    "load_params",
    "load_persistables",
    "save_inference_model",
    "save_params",
    "save_persistables",
]


_REMOTE_SCHEMES = ("hdfs:", "afs:", "viewfs:")


def check_local_path(path, what="path"):
    """``path`` as a local path; a Hadoop URI (``hdfs:``, ``afs:``,
    ``viewfs:``) is a ValueError naming HDFS: pyfleet reads and writes local or
    mounted file systems only (``fleet.set_hdfs_config`` is recorded, not used)."""
    text = os.fspath(path)
    if isinstance(text, str) and text.lower().startswith(_REMOTE_SCHEMES):
        raise ValueError(f"{what} {text!r} is an HDFS/AFS path: pyfleet has no HDFS client "
                         f"(fleet.set_hdfs_config only records its arguments); mount the "
                         f"file system, or copy to and from a local directory")
    return text


def _state_path(dirname, name):
    return os.path.join(dirname, check_file_name(name, "variable name") + ".state.npy")


def save_params(executor, dirname, main_program=None, filename=None):
    """Save every parameter of the program (dense values and sparse tables)."""
    program = resolve_program(main_program)
    program.backend.save(dirname, program.all_parameters())


def load_params(executor, dirname, main_program=None, filename=None):
    program = resolve_program(main_program)
    program.backend.load(dirname, program.all_parameters())


def save_persistables(executor, dirname, main_program=None, filename=None):
    """Save the parameters and the persistable scope state (auc counters)."""
    check_local_path(dirname, "dirname")
    program = resolve_program(main_program)
    save_params(executor, dirname, program)
    scope = global_scope()
    for v in program.list_vars():
        if v.persistable and not isinstance(v, Parameter) and v.name in scope.vars:
            _atomic.save_npy(_state_path(dirname, v.name), scope.vars[v.name])


def load_persistables(executor, dirname, main_program=None, filename=None):
    program = resolve_program(main_program)
    load_params(executor, dirname, program)
    scope = global_scope()
    for v in program.list_vars():
        if v.persistable and not isinstance(v, Parameter):
            path = _state_path(dirname, v.name)
            if os.path.exists(path):
                scope.vars[v.name] = np.load(path, allow_pickle=False)


def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None,
                         model_filename=None, params_filename=None,
                         export_for_deployment=True, program_only=False):
    """Write the program pruned to ``target_vars`` and the parameters it uses
    (:func:`pyfleet.fluid.inference.save`; ``params_filename`` is accepted for
    Fluid's signature, the parameters are always one file each). Returns the
    target variable names. A fleet program's parameters live on the servers:
    its backend refuses, naming ``fleet.save_inference_model``."""
    program = resolve_program(main_program)
    if isinstance(target_vars, Variable):
        target_vars = [target_vars]
    source = None if program_only else program.backend.inference_source()
    return inference.save(dirname, program, feeded_var_names, list(target_vars), source,
                          model_filename=model_filename)


def load_inference_model(dirname, executor, model_filename=None, params_filename=None,
                         pserver_endpoints=None):
    """``[program, feed_names, fetch_vars]``; the program computes only and
    holds the model's parameters (:func:`pyfleet.fluid.inference.load_program`)."""
    program, feeds, fetches = inference.load_program(dirname, model_filename)
    block = program.global_block()
    return [program, feeds, [block.var(n) for n in fetches]]

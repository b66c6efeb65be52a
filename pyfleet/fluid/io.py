"""``fluid.io``: save and load persistables and inference models.

Parameters go through the program's backend (:meth:`Backend.save` /
:meth:`Backend.load`): one file per parameter, ``<name>.npy`` (dense, numpy
format, loaded with ``allow_pickle=False``) or ``<name>.table`` (a sparse
table file with optimizer state). An inference model adds ``__model__.json``:
the pruned program as JSON (:meth:`Program.to_dict`). Nothing is pickled.
Files are written to a temporary name and renamed.

Not thread-safe with a concurrently training executor on the same program.
"""

import json
import os

import numpy as np

from pyfleet.fluid import framework
from pyfleet.fluid.framework import Parameter, Program, Variable
from pyfleet.fluid.reader import PyReader

__all__ = [
    "MODEL_FILENAME",
    "PyReader",
    "load_inference_model",
    "load_params",
    "load_persistables",
    "save_inference_model",
    "save_params",
    "save_persistables",
]

MODEL_FILENAME = "__model__.json"


def _program(main_program):
    program = main_program or framework.default_main_program()
    program = getattr(program, "_program", program)
    if not isinstance(program, Program):
        raise ValueError(f"main_program must be a fluid.Program, got {program!r}")
    return program


def _state_path(dirname, name):
    if not name or name.startswith(".") or "/" in name or os.sep in name:
        raise ValueError(f"variable name {name!r} cannot be used as a file name")
    return os.path.join(dirname, name + ".state.npy")


def save_params(executor, dirname, main_program=None, filename=None):
    """Save every parameter of the program (dense values and sparse tables)."""
    program = _program(main_program)
    program._get_backend().save(dirname, program.all_parameters())


def load_params(executor, dirname, main_program=None, filename=None):
    program = _program(main_program)
    program._get_backend().load(dirname, program.all_parameters())


def save_persistables(executor, dirname, main_program=None, filename=None):
    """Save the parameters and the persistable scope state (auc counters)."""
    from pyfleet.fluid.backend import _save_npy_atomic
    program = _program(main_program)
    save_params(executor, dirname, program)
    scope = framework.global_scope()
    for v in program.list_vars():
        if v.persistable and not isinstance(v, Parameter) and v.name in scope.vars:
            _save_npy_atomic(_state_path(dirname, v.name), scope.vars[v.name])


def load_persistables(executor, dirname, main_program=None, filename=None):
    program = _program(main_program)
    load_params(executor, dirname, program)
    scope = framework.global_scope()
    for v in program.list_vars():
        if v.persistable and not isinstance(v, Parameter):
            path = _state_path(dirname, v.name)
            if os.path.exists(path):
                scope.vars[v.name] = np.load(path, allow_pickle=False)


def _prune(program, feed_names, targets):
    ops = program.global_block().ops
    wanted = {t.name for t in targets}
    keep = []
    for op in reversed(ops):
        if op.type == "auc":
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


def save_inference_model(dirname, feeded_var_names, target_vars, executor, main_program=None,
                         model_filename=None, params_filename=None,
                         export_for_deployment=True, program_only=False):
    """Write the program pruned to ``target_vars`` and the parameters it uses.

    Returns the target variable names."""
    program = _program(main_program)
    if isinstance(feeded_var_names, str):
        feeded_var_names = [feeded_var_names]
    if isinstance(target_vars, Variable):
        target_vars = [target_vars]
    from pyfleet.fluid.backend import LocalBackend
    backend = program._get_backend()
    if (not program_only and model_filename is None and params_filename is None
            and isinstance(backend, LocalBackend)):
        # The self-contained format `pyfleet predict` and pyfleet.inference read.
        from pyfleet import inference
        return inference.save(dirname, program, list(feeded_var_names), list(target_vars),
                              inference.LocalSource(backend))
    feed_names = list(feeded_var_names)
    block = program.global_block()
    for n in feed_names:
        block.var(n)
    targets = [block.var(t.name if isinstance(t, Variable) else t) for t in target_vars]
    ops = _prune(program, set(feed_names), targets)
    desc = program.to_dict(ops)
    desc["feed"] = feed_names
    desc["fetch"] = [t.name for t in targets]
    created = not os.path.isdir(dirname)
    os.makedirs(dirname, exist_ok=True)
    if not program_only:  # the parameters first: a model file says the directory is complete
        used = {v.name: v for op in ops for v in op.input_vars() if isinstance(v, Parameter)}
        try:
            program._get_backend().save(dirname, list(used.values()))
        except BaseException:
            if created and not os.listdir(dirname):
                os.rmdir(dirname)
            raise
    write_json_atomic(os.path.join(dirname, model_filename or MODEL_FILENAME), desc)
    return [t.name for t in targets]


def write_json_atomic(path, obj):
    """Write ``obj`` as JSON to a temporary name, fsync, rename onto ``path``."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_model_desc(path):
    """The JSON model description at ``path``; ValueError naming it if missing or bad."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise ValueError(f"no inference model at {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a valid model description: {e}") from None


def load_inference_model(dirname, executor, model_filename=None, params_filename=None,
                         pserver_endpoints=None):
    """``[program, feed_names, fetch_vars]``; the program computes only and
    holds its parameters in a fresh :class:`LocalBackend`."""
    from pyfleet.fluid.backend import LocalBackend
    desc = read_model_desc(os.path.join(dirname, model_filename or MODEL_FILENAME))
    if "inference" in desc:  # written by pyfleet.inference (fleet or local)
        from pyfleet import inference
        p = inference.load(dirname)
        block = p.program.global_block()
        return [p.program, list(p.feed_names), [block.var(n) for n in p.fetch_names]]
    program = Program.from_dict(desc)
    backend = LocalBackend()
    backend.load(dirname, program.all_parameters())
    program._backend = backend
    block = program.global_block()
    return [program, list(desc.get("feed", [])), [block.var(n) for n in desc.get("fetch", [])]]

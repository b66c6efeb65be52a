"""``fluid.contrib.utils.lookup_table_utils``: how Fluid 1.5's CTR infer
scripts loaded a model trained on parameter servers into a local program.

In Fluid a distributed lookup table had to be converted into a local sparse
lookup and loaded from the pservers' shards. In pyfleet a program's sparse
tables already run locally, and ``fluid.io.load_persistables`` reads a Fleet
checkpoint (sparse tables included) into a local program, so these functions
are that load, with their arguments checked.
"""

import os

from pyfleet.fluid import io as _io
from pyfleet.fluid.framework import Program, Variable

__all__ = ["convert_dist_to_sparse_program", "load_persistables_for_increment",
           "load_persistables_for_inference"]


def _program(program, what):
    program = getattr(program, "_program", program)
    if not isinstance(program, Program):
        raise TypeError(f"{what}: program must be a fluid.Program, got {program!r}")
    return program


def _table(program, var, what):
    name = var.name if isinstance(var, Variable) else str(var)
    tables = [p.name for p in program.sparse_tables()]
    if name not in tables:
        raise ValueError(f"{what}: {name!r} is not a sparse table of this program (its "
                         f"sparse tables: {tables})")
    return name


def convert_dist_to_sparse_program(program):
    """The program itself: its distributed lookup tables already run as local
    sparse lookups in pyfleet (Fluid rewrote them into ``lookup_sparse_table``)."""
    return _program(program, "convert_dist_to_sparse_program")


def load_persistables_for_inference(dirname, executor, program, lookup_table_var_name):
    """Load a checkpoint written by ``fleet.save_persistables`` or
    ``fluid.io.save_persistables`` (``dirname``), sparse table
    ``lookup_table_var_name`` included, into ``program``; returns ``program``."""
    program = _program(program, "load_persistables_for_inference")
    _table(program, lookup_table_var_name, "load_persistables_for_inference")
    _io.load_persistables(executor, dirname, program)
    return program


def load_persistables_for_increment(dirname, executor, program, lookup_table_var,
                                    lookup_table_var_path):
    """Load a checkpoint into ``program`` to continue training it. pyfleet's
    checkpoints hold the sparse table beside the dense parameters, so
    ``lookup_table_var_path`` must lie inside ``dirname`` (a table stored
    elsewhere, as Fluid's pserver shards were, is refused by name)."""
    program = _program(program, "load_persistables_for_increment")
    _table(program, lookup_table_var, "load_persistables_for_increment")
    if lookup_table_var_path is not None:
        root = os.path.realpath(dirname)
        path = os.path.realpath(lookup_table_var_path)
        if path != root and not path.startswith(root + os.sep):
            raise ValueError(f"load_persistables_for_increment: lookup_table_var_path "
                             f"{lookup_table_var_path!r} is outside {dirname!r}; a pyfleet "
                             "checkpoint holds its sparse tables in its own directory")
    _io.load_persistables(executor, dirname, program)

"""The JSON description of a program (``Program.to_dict`` / ``Program.from_dict``).

A description is ``{"format", "version", "random_seed", "vars", "ops"}``:
every variable with its shape, dtype and flags (a parameter also with its
initializer and optimizer as config records), and the operators in order
with their inputs and outputs by name and their attributes. Nothing is
pickled; a description of another format or version is refused.

This module reaches programs only through their methods (``global_block``,
``create_parameter``, ``create_var``, ``append_op``), so the graph module
can use it without a circle.
"""

from pyfleet import initializer as _init
from pyfleet import optimizer as _opt
from pyfleet.fluid import ops as _ops

__all__ = ["PROGRAM_FORMAT", "PROGRAM_FORMAT_VERSION", "from_dict", "known_op_types", "to_dict"]

PROGRAM_FORMAT = "pyfleet.fluid.program"
PROGRAM_FORMAT_VERSION = 1


def _is_parameter(v):
    return getattr(v, "is_sparse_table", None) is not None


def to_dict(program, ops=None):
    """The description of ``program`` (or of the subset ``ops`` and the
    variables they use): variables, parameters with their initializer, seed
    and optimizer, operators in order."""
    block = program.global_block()
    ops = block.ops if ops is None else ops
    used = {}
    for op in ops:
        for v in op.input_vars() + op.output_vars():
            used[v.name] = v
    if ops is block.ops:
        used.update((n, v) for n, v in block.vars.items() if not n.endswith("@GRAD"))
    out_vars = []
    for v in used.values():
        d = {"name": v.name, "shape": None if v.shape is None else list(v.shape),
             "dtype": v.dtype.name, "lod_level": v.lod_level, "persistable": v.persistable,
             "stop_gradient": v.stop_gradient, "is_data": v.is_data}
        if _is_parameter(v):
            opt = v.optimizer
            d["parameter"] = {"trainable": v.trainable, "learning_rate": v.learning_rate,
                              "is_sparse_table": v.is_sparse_table,
                              "initializer": v.initializer.to_config(),
                              "optimizer": None if opt is None else opt.to_config()}
        out_vars.append(d)
    out_ops = [{"type": op.type,
                "inputs": {k: [v.name for v in vs] for k, vs in op.inputs.items()},
                "outputs": {k: [v.name for v in vs] for k, vs in op.outputs.items()},
                "attrs": op.attrs} for op in ops]
    return {"format": PROGRAM_FORMAT, "version": PROGRAM_FORMAT_VERSION,
            "random_seed": int(program.random_seed), "vars": out_vars, "ops": out_ops}


def known_op_types():
    """The op types a program may hold: every kernel's, the lookups and auc."""
    return set(_ops.FORWARD) | {"lookup_table", "auc"}


def from_dict(d, program_class):
    """A new ``program_class()`` rebuilt from :func:`to_dict` output (no
    optimizer attached; parameters keep their recorded optimizer in
    ``_saved_optimizer``)."""
    if not isinstance(d, dict) or d.get("format") != PROGRAM_FORMAT:
        raise ValueError("not a pyfleet.fluid program description")
    if d.get("version") != PROGRAM_FORMAT_VERSION:
        raise ValueError(f"program description version {d.get('version')!r} is not "
                         f"supported (expected {PROGRAM_FORMAT_VERSION})")
    p = program_class()
    p.random_seed = int(d.get("random_seed", 0))
    block = p.global_block()
    for v in d["vars"]:
        if "parameter" in v:
            meta = v["parameter"]
            par = block.create_parameter(
                v["name"], v["shape"], v["dtype"], _init.from_config(meta["initializer"]),
                meta["trainable"], meta["learning_rate"], meta["is_sparse_table"])
            par._saved_optimizer = (None if meta.get("optimizer") is None
                                    else _opt.from_config(meta["optimizer"]))
        else:
            block.create_var(v["name"], v["shape"], v["dtype"], v["lod_level"],
                             v["persistable"], v["stop_gradient"], v["is_data"])
    known = known_op_types()
    for op in d["ops"]:
        if op["type"] not in known:
            raise ValueError(f"program description has unknown op type {op['type']!r}")
        block.append_op(op["type"],
                        {k: [block.var(n) for n in ns] for k, ns in op["inputs"].items()},
                        {k: [block.var(n) for n in ns] for k, ns in op["outputs"].items()},
                        op["attrs"])
    return p

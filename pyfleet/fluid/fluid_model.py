"""Fluid 1.x's model directory: pyfleet programs as ProgramDesc bytes and back,
and the tensor files of a model's persistable variables.

What ``fluid.io.save_inference_model`` of Fluid 1.5-1.8 wrote, and what
Paddle's inference tools open::

    __model__      the program (``model_filename``): one block; its variables
                   (name, type, persistable, dtype, dims, lod_level); ``feed`` ops
                   first (one per input, attribute ``col``), the network's ops,
                   ``fetch`` ops last
    <var name>     one tensor file per persistable variable, or every one in a
                   single ``params_filename`` file, concatenated in order of name

The byte formats are :mod:`pyfleet.fluid.fluid_proto`'s. A sparse table is
written as Fluid's dense ``[vocab, dim]`` tensor (rows never trained hold the
initial row a server would create for that id) when its ids fit its declared
vocabulary and the tensor is at most :data:`FLUID_TABLE_MAX_BYTES`; otherwise it
is left out of Fluid's files (named in a warning and in ``__model__.json``).
"""

import logging
import os
import shutil

import numpy as np

from pyfleet import _atomic
from pyfleet import initializer as _init
from pyfleet.endpoint import check_file_name
from pyfleet.fluid import program_desc
from pyfleet.fluid.fluid_proto import (
    A_BOOLEAN,
    A_BOOLEANS,
    A_FLOAT,
    A_FLOATS,
    A_INT,
    A_INTS,
    A_LONG,
    A_LONGS,
    A_STRING,
    A_STRINGS,
    FEED_MINIBATCH,
    FETCH_LIST,
    LOD_TENSOR,
    RAW,
    SELECTED_ROWS,
    ProgramDescError,
    decode_program,
    dtype_of,
    encode_program,
    read_tensor,
    tensor_header,
    var_type_of,
    write_tensor,
)
from pyfleet.optimizer import SGD
from pyfleet.table import SparseTable

__all__ = ["FLUID_MODEL_FILENAME", "FLUID_TABLE_MAX_BYTES", "desc_to_program", "is_json",
           "load_dir", "parse", "program_to_desc", "read_params", "write_params"]

FLUID_MODEL_FILENAME = "__model__"
# A sparse table is written as Fluid's dense [vocab, dim] tensor up to this size.
FLUID_TABLE_MAX_BYTES = 4 << 30
_PAGE_ROWS = 65536
_log = logging.getLogger("pyfleet.inference")


def _is_parameter(v):
    return getattr(v, "is_sparse_table", None) is not None


# Attributes Fluid keeps for its own bookkeeping (roles, call stacks): dropped on read.
_BOOKKEEPING = frozenset({"op_role", "op_role_var", "op_namescope", "op_callstack",
                          "op_device", "with_quant_attr"})
_DTYPE_ATTRS = frozenset({"dtype", "in_dtype", "out_dtype"})
# Attributes Fluid declares as float that a Python caller may give as an int.
_FLOAT_ATTRS = frozenset({"scale", "bias", "epsilon", "momentum", "dropout_prob", "value",
                          "min", "max", "alpha", "beta", "threshold", "slope", "offset",
                          "pad_value", "lambda", "delta", "factor"})
# Attributes of another width than an int's natural one (Fluid 1.8's op makers).
_ATTR_TYPES = {("lookup_table", "padding_idx"): A_LONG,
               ("lookup_table_v2", "padding_idx"): A_LONG,
               ("fill_constant", "shape"): A_LONGS}


def _attr(op_type, name, value):
    """``(AttrType, value)`` of a pyfleet attribute, None to leave it out."""
    if value is None:
        return None
    forced = _ATTR_TYPES.get((op_type, name))
    if forced is not None:
        return forced, ([int(x) for x in value] if forced == A_LONGS else int(value))
    if name in _DTYPE_ATTRS and isinstance(value, str):
        return A_INT, var_type_of(value)
    if isinstance(value, (bool, np.bool_)):
        return A_BOOLEAN, bool(value)
    if isinstance(value, (int, np.integer)):
        if name in _FLOAT_ATTRS:
            return A_FLOAT, float(value)
        return (A_INT if -(1 << 31) <= value < 1 << 31 else A_LONG), int(value)
    if isinstance(value, (float, np.floating)):
        return A_FLOAT, float(value)
    if isinstance(value, str):
        return A_STRING, value
    if isinstance(value, (list, tuple)):
        vals = list(value)
        if all(isinstance(x, (bool, np.bool_)) for x in vals) and vals:
            return A_BOOLEANS, [bool(x) for x in vals]
        if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in vals):
            wide = any(not -(1 << 31) <= x < 1 << 31 for x in vals)
            return (A_LONGS if wide else A_INTS), [int(x) for x in vals]
        if all(isinstance(x, (int, float, np.integer, np.floating)) for x in vals):
            return A_FLOATS, [float(x) for x in vals]
        if all(isinstance(x, str) for x in vals):
            return A_STRINGS, vals
    raise ProgramDescError(f"op {op_type!r}: attribute {name!r} = {value!r} has no Fluid "
                           f"attribute type")


# Outputs Fluid's kernels require that pyfleet's ops do not produce (an argmax,
# a shape record, a mask, batch_norm's updated statistics): written as
# variables of their own (or, for batch_norm's statistics, the inputs they
# update, as Fluid does), dropped again on read.
_EXTRA_OUTPUTS = {"sequence_pool": ("MaxIndex",), "reshape2": ("XShape",),
                  "transpose2": ("XShape",), "dropout": ("Mask",),
                  "batch_norm": ("MeanOut", "VarianceOut", "SavedMean", "SavedVariance")}


def _extra_outputs(op, out_name, in_vars, x):
    """``({slot: [name]}, [var entries])`` Fluid needs beside ``op``'s outputs."""
    slots, new = {}, []
    shape = [-1] if x.shape is None else [int(d) for d in x.shape]

    def var(slot, dtype, dims):
        name = f"{out_name}.{slot}"
        slots[slot] = [name]
        new.append({"name": name, "type": LOD_TENSOR, "persistable": False, "dtype": dtype,
                    "dims": dims, "lod_level": 0})
    if op.type == "sequence_pool":
        var("MaxIndex", np.dtype(np.int32), shape)
    elif op.type in ("reshape2", "transpose2"):
        var("XShape", x.dtype, [0] + shape)
    elif op.type == "dropout":
        var("Mask", np.dtype(np.uint8), shape)
    elif op.type == "batch_norm":
        slots["MeanOut"] = [in_vars["Mean"][0].name]
        slots["VarianceOut"] = [in_vars["Variance"][0].name]
        channels = list(in_vars["Scale"][0].shape)
        var("SavedMean", np.dtype(np.float32), channels)
        var("SavedVariance", np.dtype(np.float32), channels)
    return slots, new


def _fluid_attrs(op, attrs):
    """``attrs`` as Fluid's kernels of an inference program read them: every
    ``is_test`` true, a reduction's ``dim`` a list, a cast's ``in_dtype``."""
    if "is_test" in attrs:
        attrs["is_test"] = True
    if op.type.startswith("reduce_") and "dim" in attrs:
        dim = attrs["dim"]
        attrs["reduce_all"] = bool(attrs.get("reduce_all")) or dim is None
        attrs["dim"] = [0] if dim is None else [int(d) for d in np.atleast_1d(dim)]
    if op.type == "cast":
        attrs["in_dtype"] = op.inputs["X"][0].dtype.str


def _var_entry(v):
    shape = [-1] if v.shape is None else [int(s) for s in v.shape]
    return {"name": v.name, "type": LOD_TENSOR, "persistable": bool(v.persistable),
            "dtype": v.dtype, "dims": shape, "lod_level": int(v.lod_level)}


def program_to_desc(ops, feed_vars, fetch_vars):
    """The ProgramDesc bytes Fluid's ``save_inference_model`` writes for ``ops``
    (pyfleet operators, in order) fed by ``feed_vars`` and fetching
    ``fetch_vars``: the feed and fetch holders, every variable the ops use,
    ``feed`` ops (``col`` i), the ops, ``fetch`` ops. ``lookup_table`` with
    ``keep_last_dim`` (``fluid.embedding``) is Fluid's ``lookup_table_v2``."""
    used = {v.name: v for v in feed_vars}
    for op in ops:
        for v in op.input_vars() + op.output_vars():
            used.setdefault(v.name, v)
    for v in fetch_vars:
        used.setdefault(v.name, v)
    holders = [{"name": "feed", "type": FEED_MINIBATCH, "persistable": True},
               {"name": "fetch", "type": FETCH_LIST, "persistable": True}]
    extra_vars = []
    out_ops = [{"type": "feed", "inputs": {"X": ["feed"]}, "outputs": {"Out": [v.name]},
                "attrs": {"col": (A_INT, i)}} for i, v in enumerate(feed_vars)]
    for op in ops:
        attrs = dict(op.attrs)
        op_type = op.type
        if op_type == "lookup_table":
            if attrs.pop("keep_last_dim", False):
                op_type = "lookup_table_v2"
            if attrs.get("padding_idx") is None:
                attrs["padding_idx"] = -1
        _fluid_attrs(op, attrs)
        enc = {}
        for name, value in attrs.items():
            a = _attr(op_type, name, value)
            if a is not None:
                enc[name] = a
        outputs = {k: [v.name for v in vs] for k, vs in op.outputs.items()}
        if op.type in _EXTRA_OUTPUTS:
            first_out = next(iter(op.outputs.values()))[0].name
            x = next(iter(op.inputs.values()))[0]
            slots, new = _extra_outputs(op, first_out, op.inputs, x)
            outputs.update((k, v) for k, v in slots.items() if k not in outputs)
            extra_vars.extend(new)
        out_ops.append({"type": op_type,
                        "inputs": {k: [v.name for v in vs] for k, vs in op.inputs.items()},
                        "outputs": outputs, "attrs": enc})
    out_ops += [{"type": "fetch", "inputs": {"X": [v.name]}, "outputs": {"Out": ["fetch"]},
                 "attrs": {"col": (A_INT, i)}} for i, v in enumerate(fetch_vars)]
    block = {"idx": 0, "parent_idx": -1,
             "vars": holders + [_var_entry(v) for v in used.values()] + extra_vars,
             "ops": out_ops}
    return encode_program([block])


def desc_to_program(data, program_class, known_ops, constant_initializer):
    """``(program, feed names, fetch names, persistables)`` of ProgramDesc bytes:
    a new ``program_class()`` holding the ops between the feed and fetch ops
    (``known_ops``: the op types pyfleet can run; another is a ProgramDescError
    naming it), each persistable tensor variable a (non-trainable) dense
    parameter, ``persistables`` ``[(name, dtype, dims)]`` in the order Fluid
    saves them (by name)."""
    blocks, version = decode_program(data)
    if len(blocks) > 1:
        raise ProgramDescError(f"the program has {len(blocks)} blocks (control flow: while, "
                               f"conditional_block...): pyfleet runs single-block programs")
    block = blocks[0]
    p = program_class()
    pb = p.global_block()
    holders = set()
    persistables = []
    for v in block["vars"]:
        if v["type"] in (FEED_MINIBATCH, FETCH_LIST, RAW):
            holders.add(v["name"])
            continue
        if v["type"] not in (LOD_TENSOR, SELECTED_ROWS) or v["dtype"] is None:
            raise ProgramDescError(f"variable {v['name']!r} has type {v['type']}: pyfleet "
                                   f"reads tensor variables only")
        if v["persistable"]:
            if not v["dims"] or any(d < 0 for d in v["dims"]):
                raise ProgramDescError(f"persistable variable {v['name']!r} has dims "
                                       f"{v['dims']}: a saved tensor's are known")
            pb.create_parameter(v["name"], v["dims"], v["dtype"], constant_initializer,
                                trainable=False)
            persistables.append((v["name"], v["dtype"], list(v["dims"])))
        else:
            pb.create_var(v["name"], v["dims"], v["dtype"], v["lod_level"])
    feeds, fetches = {}, {}
    for op in block["ops"]:
        attrs = {k: v for k, (_, v) in op["attrs"].items() if k not in _BOOKKEEPING}
        if op["type"] in ("feed", "fetch"):
            key, slot, into = (("outputs", "Out", feeds) if op["type"] == "feed"
                               else ("inputs", "X", fetches))
            names = op[key].get(slot) or []
            col = attrs.get("col", len(into))
            if len(names) != 1 or not isinstance(col, int) or col in into:
                raise ProgramDescError(f"a {op['type']} op with {slot}={names} and col={col!r}: "
                                       f"one variable and a column of its own expected")
            into[col] = names[0]
            continue
        op_type = op["type"]
        if op_type in ("lookup_table", "lookup_table_v2"):
            attrs["keep_last_dim"] = op_type == "lookup_table_v2"
            op_type = "lookup_table"
            pad = attrs.get("padding_idx", -1)
            if not isinstance(pad, int):
                raise ProgramDescError(f"op {op['type']!r}: padding_idx {pad!r} is no integer")
            attrs["padding_idx"] = None if pad < 0 else pad
            attrs.setdefault("is_sparse", False)
            attrs.setdefault("is_distributed", False)
        for name in _DTYPE_ATTRS & set(attrs):
            if isinstance(attrs[name], int):
                attrs[name] = dtype_of(attrs[name]).str
        if op_type not in known_ops:
            raise ProgramDescError(f"op {op['type']!r} has no pyfleet kernel (the program's "
                                   f"ops: {sorted({o['type'] for o in block['ops']})})")
        slots = {}
        for key in ("inputs", "outputs"):
            slots[key] = {}
            for slot, names in op[key].items():
                if key == "outputs" and slot in _EXTRA_OUTPUTS.get(op_type, ()):
                    continue
                missing = [n for n in names if not pb.has_var(n)]
                if missing:
                    raise ProgramDescError(f"op {op['type']!r} uses {missing}, not declared "
                                           f"in the block")
                slots[key][slot] = [pb.var(n) for n in names]
        pb.append_op(op_type, slots["inputs"], slots["outputs"], attrs)
    persistables.sort(key=lambda t: t[0])
    return (p, [feeds[i] for i in sorted(feeds)], [fetches[i] for i in sorted(fetches)],
            persistables, version)


def parse(binary_str, program_class):
    """``Program.parse_from_string``: the program of ProgramDesc bytes, its
    feed and fetch ops kept as ``_feed_target_names``/``_fetch_target_names``;
    its persistable variables are dense parameters without values until
    ``fluid.io.load_persistables`` reads their tensor files. ValueError for
    bytes that are not a program pyfleet can run."""
    try:
        p, feeds, fetches, _, _ = desc_to_program(
            binary_str, program_class, program_desc.known_op_types(), _init.Constant(0.0))
    except ProgramDescError as e:
        raise ValueError(f"Program.parse_from_string: {e}") from None
    p._feed_target_names, p._fetch_target_names = feeds, fetches
    return p


def _fluid_table(dirname, fname, p, cfg, kfile, wfile):
    """Write sparse table ``p`` (its rows in ``kfile``/``wfile``) as Fluid's dense
    ``[vocab, dim]`` tensor ``fname``: a row the table never created holds the
    initial row a server would create for that id. Returns None, or why the
    table cannot be written so (the file is then not written)."""
    vocab, dim = int(p.shape[0]), int(cfg["dim"])
    if vocab * dim * 4 > FLUID_TABLE_MAX_BYTES:
        return (f"[{vocab}, {dim}] float32 is {vocab * dim * 4:,} bytes, over "
                f"FLUID_TABLE_MAX_BYTES ({FLUID_TABLE_MAX_BYTES:,})")
    keys = np.load(os.path.join(dirname, kfile), mmap_mode="r", allow_pickle=False)
    if keys.shape[0] and int(keys.max()) >= vocab:
        return (f"it holds ids up to {int(keys.max())}, beyond its declared vocabulary "
                f"{vocab} (Fluid's table is indexed by id)")
    weights = np.load(os.path.join(dirname, wfile), mmap_mode="r", allow_pickle=False)
    order = np.argsort(keys, kind="stable")
    skeys = np.asarray(keys)[order]
    init = SparseTable(dim, SGD(1.0), initializer=_init.from_config(cfg["initializer"]),
                       seed=int(cfg["seed"]), name=p.name)
    with _atomic.atomic_open(os.path.join(dirname, fname), "wb") as f:
        f.write(tensor_header(np.float32, (vocab, dim)))
        for a in range(0, vocab, _PAGE_ROWS):
            b = min(a + _PAGE_ROWS, vocab)
            ids = np.arange(a, b, dtype=np.uint64)
            block = init.initial_values(ids).astype("<f4", copy=False)
            lo, hi = np.searchsorted(skeys, [a, b])
            if hi > lo:
                block[skeys[lo:hi].astype(np.int64) - a] = weights[order[lo:hi]]
            f.write(np.ascontiguousarray(block).tobytes())
    return None


def _scope_value(v):
    """A persistable non-parameter variable's value for Fluid's files (an auc
    op's counters): zeros of its shape, as the loading scope starts them."""
    if v.shape is None or any(int(s) < 0 for s in v.shape):
        raise ValueError(f"persistable variable {v.name!r} has shape {v.shape}: Fluid's "
                         f"files need a known shape")
    return np.zeros(v.shape, dtype=v.dtype)


def write_params(dirname, ops, section, params_filename):
    """Fluid's tensor files of every persistable variable ``ops`` use (one file
    per variable, named after it, or every one in ``params_filename`` by order
    of name), from the files of ``section`` just written. Returns ``{"params",
    "files", "tables_left_out"}``."""
    used = {}
    for op in ops:
        for v in op.input_vars():
            if v.persistable:
                used.setdefault(v.name, v)
    files, left_out = [], {}
    values = {}
    for name in sorted(used):
        v = used[name]
        if _is_parameter(v) and v.is_sparse_table:
            cfg = section["sparse"][name]
            if params_filename is None:
                fname = check_file_name(name, "parameter name")
                why = _fluid_table(dirname, fname, v, cfg, cfg["keys"], cfg["weights"])
                if why is None:
                    files.append(fname)
                else:
                    left_out[name] = why
            else:
                values[name] = ("table", v, cfg)
        elif _is_parameter(v):
            values[name] = ("array", np.load(os.path.join(dirname, section["dense"][name]),
                                             allow_pickle=False))
        else:
            values[name] = ("array", _scope_value(v))
    if params_filename is None:
        for name, (_, value) in values.items():
            fname = check_file_name(name, "variable name")
            with _atomic.atomic_open(os.path.join(dirname, fname), "wb") as f:
                write_tensor(f, value)
            files.append(fname)
    else:
        tables = {n: t for n, t in values.items() if t[0] == "table"}
        for name, (_, v, cfg) in tables.items():   # a table goes in whole or not at all
            why = _fluid_table(dirname, f".{name}.fluid.tmp", v, cfg, cfg["keys"],
                               cfg["weights"])
            if why is not None:
                left_out[name] = why
        try:
            with _atomic.atomic_open(os.path.join(dirname, params_filename), "wb") as f:
                for name, entry in values.items():
                    if entry[0] == "array":
                        write_tensor(f, entry[1])
                    elif name not in left_out:
                        with open(os.path.join(dirname, f".{name}.fluid.tmp"), "rb") as src:
                            shutil.copyfileobj(src, f, 1 << 20)
        finally:
            for name in tables:
                tmp = os.path.join(dirname, f".{name}.fluid.tmp")
                if os.path.exists(tmp):
                    os.remove(tmp)
        files.append(params_filename)
    for name, why in left_out.items():  # recorded in __model__.json; hashed ids are the norm
        _log.info("inference model %s: sparse table %r is not in Fluid's parameter "
                     "files (%s); pyfleet's own files hold it", dirname, name, why)
    return {"params": params_filename, "files": files, "tables_left_out": left_out}


def read_params(dirname, persistables, params_filename=None):
    """``{name: array}`` of Fluid's tensor files for ``persistables`` (``[(name,
    dtype, dims)]``, in order of name): one file per variable, or all in
    ``params_filename``. Each header is checked against the program before its
    values are allocated; ValueError naming the file."""
    values = {}
    if params_filename is not None:
        path = os.path.join(dirname, check_file_name(os.path.basename(params_filename),
                                                     "params_filename"))
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed by the with below)
        except FileNotFoundError:
            raise ValueError(f"parameter file {path} is missing") from None
        with f:
            for name, dtype, dims in persistables:
                values[name], _ = read_tensor(
                    f, f"{path} (variable {name!r})", dtype, dims)
            if f.read(1):
                raise ValueError(f"{path} holds more than the program's {len(persistables)} "
                                 f"persistable variables (another model's parameters?)")
        return values
    for name, dtype, dims in persistables:
        path = os.path.join(dirname, check_file_name(name, "variable name"))
        try:
            with open(path, "rb") as f:
                values[name], _ = read_tensor(f, path, dtype, dims)
        except FileNotFoundError:
            raise ValueError(f"parameter file {path} of variable {name!r} is missing") from None
    return values


def is_json(path):
    """True for pyfleet's JSON description, False for ProgramDesc bytes."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"{"
    except FileNotFoundError:
        raise ValueError(f"no inference model at {path}") from None


def load_dir(dirname, path, program_class, params_filename=None, data=None):
    """``(program, feed names, fetch names, {name: array})`` of the Fluid model
    file ``path`` (``data``: its bytes, when already read) and its tensor files in
    ``dirname``; ValueError naming ``path``."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    try:
        program, feeds, fetches, persistables, _ = desc_to_program(
            data, program_class, program_desc.known_op_types(), _init.Constant(0.0))
        values = read_params(dirname, persistables, params_filename)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return program, feeds, fetches, values

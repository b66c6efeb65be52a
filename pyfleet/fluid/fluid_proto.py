"""Fluid 1.x's file formats: ProgramDesc protobuf bytes and tensor files.

What ``fluid.io.save_inference_model`` of Fluid 1.5-1.8 wrote, and what Paddle's
inference tools open::

    __model__      the program, a ``paddle.framework.proto.ProgramDesc`` message
                   (framework.proto): one block; its variables (name, type,
                   persistable, dtype, dims, lod_level); ``feed`` ops first (one per
                   input, attribute ``col``), the network's ops, ``fetch`` ops last
    <var name>     one file per persistable variable, or every one in a single
                   ``params_filename`` file, concatenated in order of name

A tensor file (Fluid's ``SerializeToStream`` of a LoDTensor), little-endian::

    uint32   version (0)
    uint64   lod levels; per level: uint64 byte size, then that many bytes of
             uint64 offsets
    uint32   tensor version (0)
    int32    byte size of the TensorDesc message that follows
    bytes    TensorDesc (data_type, dims)
    bytes    the values, C order

The protobuf wire encoding is written here (about 200 lines for the eight
message types of a ProgramDesc) rather than taken from the ``protobuf``
package: pyfleet's run-time dependencies are numpy and pyzmq, and a further
compiled dependency, with its own version constraints, for one file format
is weight every user would carry. Unknown fields are skipped when reading, as
protobuf does; every length is checked against the bytes present before
anything is allocated for it.

A program pyfleet writes ends with its *mark* (:func:`mark_program`): field
:data:`MARK_FIELD` of the ProgramDesc, which Paddle's framework.proto does not
define (protobuf parsers, Paddle's included, skip a field they do not know),
holding JSON: the file beside it that carries the checksums of the model's
files, and the sha256 of the program bytes before the mark. A loader that
finds an intact mark knows pyfleet wrote the program with checksums, so a
deleted checksum file is seen; a program Paddle wrote has no mark.
"""

import hashlib
import json
import os
import struct

import numpy as np

from pyfleet.fluid.proto_wire import (
    ProgramDescError,
    f_bytes,
    f_float,
    f_str,
    f_varint,
    fields,
    int32,
    one,
    repeated_floats,
    repeated_varints,
    signed,
    sub,
    subs,
    text,
)

__all__ = [
    "FEED_MINIBATCH",
    "FETCH_LIST",
    "LOD_TENSOR",
    "MARK_FIELD",
    "ProgramDescError",
    "decode_program",
    "dtype_of",
    "encode_program",
    "mark_program",
    "read_mark",
    "read_tensor",
    "tensor_header",
    "var_type_of",
    "write_tensor",
]

# VarType.Type (framework.proto)
_DTYPES = {0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32",
           6: "float64", 20: "uint8", 21: "int8"}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
LOD_TENSOR, SELECTED_ROWS, FEED_MINIBATCH, FETCH_LIST, RAW = 7, 8, 9, 10, 17
# AttrType
(A_INT, A_FLOAT, A_STRING, A_INTS, A_FLOATS, A_STRINGS, A_BOOLEAN, A_BOOLEANS, A_BLOCK,
 A_LONG, A_BLOCKS, A_LONGS) = range(12)

_MAX_DESC = 1 << 20   # a TensorDesc is a few bytes; a claimed megabyte is damage


def dtype_of(code):
    """The numpy dtype of a VarType.Type code; ProgramDescError for others."""
    try:
        return np.dtype(_DTYPES[int(code)])
    except KeyError:
        raise ProgramDescError(f"data type {code} is not a tensor element type") from None


def var_type_of(dtype):
    """The VarType.Type code of a numpy dtype."""
    try:
        return _CODES[np.dtype(dtype)]
    except KeyError:
        raise ProgramDescError(f"dtype {np.dtype(dtype)} has no Fluid tensor type") from None


# ------------------------------------------------------------------- ProgramDesc <-> dict
def _encode_tensor_desc(dtype_code, dims):
    return f_varint(1, dtype_code) + b"".join(f_varint(2, d) for d in dims)


def _encode_var(v):
    vtype = v.get("type", LOD_TENSOR)
    body = f_varint(1, vtype)
    if vtype in (LOD_TENSOR, SELECTED_ROWS):
        tdesc = _encode_tensor_desc(var_type_of(v["dtype"]), v["dims"])
        if vtype == LOD_TENSOR:
            body += f_bytes(3, f_bytes(1, tdesc) + f_varint(2, v.get("lod_level", 0)))
        else:
            body += f_bytes(2, tdesc)
    out = f_str(1, v["name"]) + f_bytes(2, body)
    if v.get("persistable"):
        out += f_varint(3, 1)
    if v.get("need_check_feed"):
        out += f_varint(4, 1)
    return out


# AttrType -> (its field of OpDesc.Attr, the field's encoder, repeated)
_ATTR_FIELDS = {A_INT: (3, f_varint, False), A_FLOAT: (4, f_float, False),
                A_STRING: (5, f_str, False), A_INTS: (6, f_varint, True),
                A_FLOATS: (7, f_float, True), A_STRINGS: (8, f_str, True),
                A_BOOLEAN: (10, f_varint, False), A_BOOLEANS: (11, f_varint, True),
                A_BLOCK: (12, f_varint, False), A_LONG: (13, f_varint, False),
                A_BLOCKS: (14, f_varint, True), A_LONGS: (15, f_varint, True)}


def _encode_attr(name, atype, value):
    try:
        field, enc, repeated = _ATTR_FIELDS[atype]
    except KeyError:
        raise ProgramDescError(f"attribute {name!r}: type {atype} is not Fluid's") from None
    values = value if repeated else [value]
    return f_str(1, name) + f_varint(2, atype) + b"".join(enc(field, x) for x in values)


def _encode_op(op):
    out = f_str(3, op["type"])
    for field, key in ((1, "inputs"), (2, "outputs")):
        for slot, names in op[key].items():
            out += f_bytes(field, f_str(1, slot) + b"".join(f_str(2, n) for n in names))
    for name, (atype, value) in op["attrs"].items():
        out += f_bytes(4, _encode_attr(name, atype, value))
    return out


def encode_program(blocks, version=0):
    """The ProgramDesc bytes of ``blocks``: ``[{"idx", "parent_idx", "vars",
    "ops"}]``, a var ``{"name", "type", "persistable", "dtype", "dims",
    "lod_level"}``, an op ``{"type", "inputs": {slot: [names]}, "outputs",
    "attrs": {name: (AttrType, value)}}``."""
    out = b""
    for b in blocks:
        body = f_varint(1, b.get("idx", 0)) + f_varint(2, b.get("parent_idx", -1))
        body += b"".join(f_bytes(3, _encode_var(v)) for v in b["vars"])
        body += b"".join(f_bytes(4, _encode_op(op)) for op in b["ops"])
        out += f_bytes(1, body)
    return out + f_bytes(4, f_varint(1, version))


# A ProgramDesc field number far above Paddle's own (1 to 5): pyfleet's mark.
MARK_FIELD = 1001


def mark_program(data, checksums_file):
    """ProgramDesc bytes ``data`` followed by pyfleet's mark: ``checksums_file``
    (a file name beside the program) holds the checksums of the model's files."""
    data = bytes(data)
    mark = {"checksums": checksums_file, "program_sha256": hashlib.sha256(data).hexdigest()}
    return data + f_bytes(MARK_FIELD, json.dumps(mark, sort_keys=True).encode())


def read_mark(data):
    """The mark ``{"checksums": file name, "intact": bool}`` a program ends with,
    or None (no mark: a program pyfleet did not write). ``intact``: the program
    bytes before the mark are the ones it was made for (False: edited since, or
    saved again by another tool)."""
    data = bytes(data)
    try:
        items = fields(memoryview(data), "ProgramDesc")
    except ProgramDescError:
        return None
    if not items or items[-1][:2] != (MARK_FIELD, 2):
        return None
    try:
        mark = json.loads(items[-1][2])
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("checksums"), str):
        return None
    body = data[:len(data) - len(f_bytes(MARK_FIELD, items[-1][2]))]
    return {"checksums": mark["checksums"],
            "intact": hashlib.sha256(body).hexdigest() == mark.get("program_sha256")}


def _decode_tensor_desc(data, what):
    items = fields(data, what)
    code = one(items, 1)
    if code is None:
        raise ProgramDescError(f"{what}: TensorDesc without data_type")
    return {"dtype": dtype_of(code).name, "dims": [signed(d) for d in
                                                   repeated_varints(items, 2, what)]}


def _decode_var(data):
    items = fields(data, "VarDesc")
    name = one(items, 1, kind=bytes)
    vt = sub(items, 2)
    if name is None or vt is None:
        raise ProgramDescError("VarDesc without name or type")
    name = text(name, "VarDesc.name")
    what = f"variable {name!r}"
    titems = fields(vt, what)
    var = {"name": name, "type": one(titems, 1, LOD_TENSOR),
           "persistable": bool(one(items, 3, 0)),
           "need_check_feed": bool(one(items, 4, 0)), "dtype": None, "dims": None,
           "lod_level": 0}
    lod = sub(titems, 3)
    if lod is not None:
        litems = fields(lod, what)
        t = sub(litems, 1)
        if t is not None:
            var.update(_decode_tensor_desc(t, what))
        var["lod_level"] = int32(one(litems, 2, 0))
    sel = sub(titems, 2)
    if sel is not None:
        var.update(_decode_tensor_desc(sel, what))
    return var


def _decode_attr(data, op_type):
    items = fields(data, f"an attribute of op {op_type!r}")
    name = text(one(items, 1, b""), "OpDesc.Attr.name")
    atype = one(items, 2)
    what = f"attribute {name!r} of op {op_type!r}"
    if atype == A_INT:
        value = int32(one(items, 3, 0))
    elif atype == A_FLOAT:
        raw = one(items, 4, 0)
        value = struct.unpack("<f", struct.pack("<I", raw))[0]
    elif atype == A_STRING:
        value = text(one(items, 5, b""), what)
    elif atype == A_INTS:
        value = [int32(x) for x in repeated_varints(items, 6, what)]
    elif atype == A_FLOATS:
        value = repeated_floats(items, 7)
    elif atype == A_STRINGS:
        value = [text(v, what) for f, _, v in items if f == 8]
    elif atype == A_BOOLEAN:
        value = bool(one(items, 10, 0))
    elif atype == A_BOOLEANS:
        value = [bool(x) for x in repeated_varints(items, 11, what)]
    elif atype == A_BLOCK:
        value = int32(one(items, 12, 0))
    elif atype == A_LONG:
        value = signed(one(items, 13, 0))
    elif atype == A_BLOCKS:
        value = [int32(x) for x in repeated_varints(items, 14, what)]
    elif atype == A_LONGS:
        value = [signed(x) for x in repeated_varints(items, 15, what)]
    else:
        raise ProgramDescError(f"{what}: attribute type {atype} is not Fluid's")
    return name, atype, value


def _decode_op(data):
    items = fields(data, "OpDesc")
    op_type = text(one(items, 3, b""), "OpDesc.type")
    op = {"type": op_type, "inputs": {}, "outputs": {}, "attrs": {}}
    for field, key in ((1, "inputs"), (2, "outputs")):
        for v in subs(items, field):
            vi = fields(v, f"an argument of op {op_type!r}")
            slot = text(one(vi, 1, b""), "OpDesc.Var.parameter")
            op[key][slot] = [text(a, "OpDesc.Var.arguments") for g, _, a in vi if g == 2]
    for v in subs(items, 4):
        name, atype, value = _decode_attr(v, op_type)
        op["attrs"][name] = (atype, value)
    return op


def decode_program(data):
    """``(blocks, version)`` of ProgramDesc bytes (the structure
    :func:`encode_program` takes); ProgramDescError for bytes that are not one."""
    if isinstance(data, str):
        raise ProgramDescError("a ProgramDesc is bytes, got str")
    data = memoryview(bytes(data))
    items = fields(data, "ProgramDesc")
    blocks = []
    for f, w, v in items:
        if f == 1 and w == 2:
            bi = fields(v, "BlockDesc")
            blocks.append({"idx": int32(one(bi, 1, 0)), "parent_idx": int32(one(bi, 2, 0)),
                           "vars": [_decode_var(x) for x in subs(bi, 3)],
                           "ops": [_decode_op(x) for x in subs(bi, 4)]})
    if not blocks:
        raise ProgramDescError("no block: not a Fluid ProgramDesc")
    version = sub(items, 4)
    version = 0 if version is None else signed(one(fields(version, "Version"), 1, 0))
    return blocks, version


# -------------------------------------------------------------------------- tensor files
def tensor_header(dtype, dims, lod=()):
    """The bytes of a tensor file before its values (see the module doc)."""
    out = struct.pack("<IQ", 0, len(lod))
    for level in lod:
        level = np.ascontiguousarray(level, dtype="<u8")
        out += struct.pack("<Q", level.nbytes) + level.tobytes()
    desc = _encode_tensor_desc(var_type_of(dtype), [int(d) for d in dims])
    return out + struct.pack("<Ii", 0, len(desc)) + desc


def write_tensor(f, value, lod=()):
    """Write ``value`` (a numpy array) to the binary file ``f`` as one tensor."""
    value = np.ascontiguousarray(value)
    f.write(tensor_header(value.dtype, value.shape, lod))
    f.write(value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes())


def _read_exact(f, n, what):
    data = f.read(n)
    if len(data) != n:
        raise ProgramDescError(f"{what}: truncated ({len(data)} of {n} bytes)")
    return data


def read_tensor(f, what, dtype=None, shape=None):
    """``(array, lod)`` of the next tensor in the binary file ``f``. Its header is
    checked before the values are allocated: versions, the descriptor's size,
    ``dtype``/``shape`` when given (None in ``shape``: any), and that the file
    holds as many bytes as the header claims."""
    version, levels = struct.unpack("<IQ", _read_exact(f, 12, what))
    if version != 0:
        raise ProgramDescError(f"{what}: tensor version {version} (Fluid writes 0)")
    remaining = _remaining(f)
    if levels > 64:
        raise ProgramDescError(f"{what}: {levels} LoD levels claimed")
    lod = []
    for _ in range(levels):
        (size,) = struct.unpack("<Q", _read_exact(f, 8, what))
        if size % 8 or (remaining is not None and size > remaining):
            raise ProgramDescError(f"{what}: a LoD level of {size} bytes")
        lod.append(np.frombuffer(_read_exact(f, size, what), dtype="<u8").astype(np.int64))
    tversion, dsize = struct.unpack("<Ii", _read_exact(f, 8, what))
    if tversion != 0:
        raise ProgramDescError(f"{what}: tensor version {tversion} (Fluid writes 0)")
    if not 0 < dsize <= _MAX_DESC:
        raise ProgramDescError(f"{what}: a TensorDesc of {dsize} bytes")
    desc = _decode_tensor_desc(_read_exact(f, dsize, what), what)
    dt = np.dtype(desc["dtype"]).newbyteorder("<")
    dims = desc["dims"]
    if any(d < 0 for d in dims):
        raise ProgramDescError(f"{what}: dims {dims} are not a stored tensor's")
    if dtype is not None and np.dtype(dtype) != np.dtype(desc["dtype"]):
        raise ProgramDescError(f"{what}: holds {desc['dtype']}, expected {np.dtype(dtype)}")
    if shape is not None and (len(shape) != len(dims) or any(
            w is not None and w != g for w, g in zip(shape, dims))):
        raise ProgramDescError(f"{what}: holds shape {tuple(dims)}, expected "
                               f"{tuple('n' if w is None else w for w in shape)}")
    nbytes = int(np.prod(dims, dtype=np.float64)) * dt.itemsize
    remaining = _remaining(f)
    if remaining is not None and nbytes > remaining:
        raise ProgramDescError(f"{what}: its header {tuple(dims)} {desc['dtype']} needs "
                               f"{nbytes:,} bytes, {remaining:,} remain (a truncated or "
                               f"damaged file)")
    values = np.frombuffer(_read_exact(f, nbytes, what), dtype=dt).reshape(dims)
    return values.astype(dt.newbyteorder("="), copy=True), lod


def _remaining(f):
    try:
        return os.fstat(f.fileno()).st_size - f.tell()
    except (AttributeError, OSError, ValueError):
        try:
            pos = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(pos)
            return end - pos
        except (AttributeError, OSError, ValueError):
            return None

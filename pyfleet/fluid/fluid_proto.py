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


class ProgramDescError(ValueError):
    """Bytes that are not a ProgramDesc (or tensor file) this module can read."""


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


# ----------------------------------------------------------------------- wire encoding
def _varint(n):
    n = int(n)
    if n < 0:
        n += 1 << 64   # int32/int64/enum negatives: ten bytes, two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field, wire):
    return _varint((field << 3) | wire)


def _f_varint(field, n):
    return _tag(field, 0) + _varint(n)


def _f_bytes(field, data):
    return _tag(field, 2) + _varint(len(data)) + data


def _f_str(field, s):
    return _f_bytes(field, s.encode())


def _f_float(field, x):
    return _tag(field, 5) + struct.pack("<f", x)


def _read_varint(buf, pos, what):
    """``(value, next position)`` of the varint at ``buf[pos]``."""
    shift = result = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ProgramDescError(f"{what}: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProgramDescError(f"{what}: varint longer than ten bytes")


def _fields(buf, what):
    """``[(field, wire type, value)]`` of one message: ints for varints and fixed
    fields, bytes for length-delimited ones."""
    out = []
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _read_varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos, what)
            out.append((field, 0, value))
        elif wire == 2:
            size, pos = _read_varint(buf, pos, what)
            if size > n - pos:
                raise ProgramDescError(f"{what}: field {field} claims {size} bytes, "
                                       f"{n - pos} remain")
            out.append((field, 2, bytes(buf[pos:pos + size])))
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if n - pos < width:
                raise ProgramDescError(f"{what}: truncated fixed-width field {field}")
            out.append((field, wire, struct.unpack_from("<Q" if wire == 1 else "<I",
                                                        buf, pos)[0]))
            pos += width
        else:
            raise ProgramDescError(f"{what}: wire type {wire} of field {field} is not "
                                   f"protobuf's")
    return out


def _signed(n):
    return n - (1 << 64) if n >= 1 << 63 else n


def _int32(n):
    n = _signed(n)
    return n - (1 << 32) if n >= 1 << 31 else n


def _repeated_varints(items, field, what):
    """Values of a repeated varint field, packed or not."""
    out = []
    for f, w, v in items:
        if f != field:
            continue
        if w == 0:
            out.append(v)
        elif w == 2:
            pos = 0
            while pos < len(v):
                value, pos = _read_varint(v, pos, what)
                out.append(value)
    return out


def _repeated_floats(items, field):
    out = []
    for f, w, v in items:
        if f != field:
            continue
        if w == 5:
            out.append(struct.unpack("<f", struct.pack("<I", v))[0])
        elif w == 2:
            out.extend(np.frombuffer(v, dtype="<f4").astype(float).tolist())
    return out


def _one(items, field, default=None, kind=None):
    """The last value of scalar ``field`` (protobuf's rule), checked to be of
    its wire kind: ``bytes`` (length-delimited) or ``int`` (the default unless
    ``default`` is bytes)."""
    kind = kind or (bytes if isinstance(default, bytes) else int)
    value = default
    for f, w, v in items:
        if f == field:
            if (w == 2) != (kind is bytes):
                raise ProgramDescError(f"field {field} has wire type {w}, not its type's")
            value = v
    return value


def _sub(items, field):
    """The last length-delimited value of ``field`` (a sub-message), or None."""
    value = None
    for f, w, v in items:
        if f == field:
            if w != 2:
                raise ProgramDescError(f"field {field} has wire type {w}: a message's is 2")
            value = v
    return value


def _subs(items, field):
    """Every value of repeated message ``field``."""
    if any(f == field and w != 2 for f, w, _ in items):
        raise ProgramDescError(f"field {field} has a wire type other than a message's")
    return [v for f, _, v in items if f == field]


def _text(b, what):
    try:
        return b.decode()
    except (AttributeError, UnicodeDecodeError):
        raise ProgramDescError(f"{what}: a string field is not UTF-8") from None


# ------------------------------------------------------------------- ProgramDesc <-> dict
def _encode_tensor_desc(dtype_code, dims):
    return _f_varint(1, dtype_code) + b"".join(_f_varint(2, d) for d in dims)


def _encode_var(v):
    vtype = v.get("type", LOD_TENSOR)
    body = _f_varint(1, vtype)
    if vtype in (LOD_TENSOR, SELECTED_ROWS):
        tdesc = _encode_tensor_desc(var_type_of(v["dtype"]), v["dims"])
        if vtype == LOD_TENSOR:
            body += _f_bytes(3, _f_bytes(1, tdesc) + _f_varint(2, v.get("lod_level", 0)))
        else:
            body += _f_bytes(2, tdesc)
    out = _f_str(1, v["name"]) + _f_bytes(2, body)
    if v.get("persistable"):
        out += _f_varint(3, 1)
    if v.get("need_check_feed"):
        out += _f_varint(4, 1)
    return out


# AttrType -> (its field of OpDesc.Attr, the field's encoder, repeated)
_ATTR_FIELDS = {A_INT: (3, _f_varint, False), A_FLOAT: (4, _f_float, False),
                A_STRING: (5, _f_str, False), A_INTS: (6, _f_varint, True),
                A_FLOATS: (7, _f_float, True), A_STRINGS: (8, _f_str, True),
                A_BOOLEAN: (10, _f_varint, False), A_BOOLEANS: (11, _f_varint, True),
                A_BLOCK: (12, _f_varint, False), A_LONG: (13, _f_varint, False),
                A_BLOCKS: (14, _f_varint, True), A_LONGS: (15, _f_varint, True)}


def _encode_attr(name, atype, value):
    try:
        field, enc, repeated = _ATTR_FIELDS[atype]
    except KeyError:
        raise ProgramDescError(f"attribute {name!r}: type {atype} is not Fluid's") from None
    values = value if repeated else [value]
    return _f_str(1, name) + _f_varint(2, atype) + b"".join(enc(field, x) for x in values)


def _encode_op(op):
    out = _f_str(3, op["type"])
    for field, key in ((1, "inputs"), (2, "outputs")):
        for slot, names in op[key].items():
            out += _f_bytes(field, _f_str(1, slot) + b"".join(_f_str(2, n) for n in names))
    for name, (atype, value) in op["attrs"].items():
        out += _f_bytes(4, _encode_attr(name, atype, value))
    return out


def encode_program(blocks, version=0):
    """The ProgramDesc bytes of ``blocks``: ``[{"idx", "parent_idx", "vars",
    "ops"}]``, a var ``{"name", "type", "persistable", "dtype", "dims",
    "lod_level"}``, an op ``{"type", "inputs": {slot: [names]}, "outputs",
    "attrs": {name: (AttrType, value)}}``."""
    out = b""
    for b in blocks:
        body = _f_varint(1, b.get("idx", 0)) + _f_varint(2, b.get("parent_idx", -1))
        body += b"".join(_f_bytes(3, _encode_var(v)) for v in b["vars"])
        body += b"".join(_f_bytes(4, _encode_op(op)) for op in b["ops"])
        out += _f_bytes(1, body)
    return out + _f_bytes(4, _f_varint(1, version))


# A ProgramDesc field number far above Paddle's own (1 to 5): pyfleet's mark.
MARK_FIELD = 1001


def mark_program(data, checksums_file):
    """ProgramDesc bytes ``data`` followed by pyfleet's mark: ``checksums_file``
    (a file name beside the program) holds the checksums of the model's files."""
    data = bytes(data)
    mark = {"checksums": checksums_file, "program_sha256": hashlib.sha256(data).hexdigest()}
    return data + _f_bytes(MARK_FIELD, json.dumps(mark, sort_keys=True).encode())


def read_mark(data):
    """The mark ``{"checksums": file name, "intact": bool}`` a program ends with,
    or None (no mark: a program pyfleet did not write). ``intact``: the program
    bytes before the mark are the ones it was made for (False: edited since, or
    saved again by another tool)."""
    data = bytes(data)
    try:
        items = _fields(memoryview(data), "ProgramDesc")
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
    body = data[:len(data) - len(_f_bytes(MARK_FIELD, items[-1][2]))]
    return {"checksums": mark["checksums"],
            "intact": hashlib.sha256(body).hexdigest() == mark.get("program_sha256")}


def _decode_tensor_desc(data, what):
    items = _fields(data, what)
    code = _one(items, 1)
    if code is None:
        raise ProgramDescError(f"{what}: TensorDesc without data_type")
    return {"dtype": dtype_of(code).name, "dims": [_signed(d) for d in
                                                   _repeated_varints(items, 2, what)]}


def _decode_var(data):
    items = _fields(data, "VarDesc")
    name = _one(items, 1, kind=bytes)
    vt = _sub(items, 2)
    if name is None or vt is None:
        raise ProgramDescError("VarDesc without name or type")
    name = _text(name, "VarDesc.name")
    what = f"variable {name!r}"
    titems = _fields(vt, what)
    var = {"name": name, "type": _one(titems, 1, LOD_TENSOR),
           "persistable": bool(_one(items, 3, 0)),
           "need_check_feed": bool(_one(items, 4, 0)), "dtype": None, "dims": None,
           "lod_level": 0}
    lod = _sub(titems, 3)
    if lod is not None:
        litems = _fields(lod, what)
        t = _sub(litems, 1)
        if t is not None:
            var.update(_decode_tensor_desc(t, what))
        var["lod_level"] = _int32(_one(litems, 2, 0))
    sel = _sub(titems, 2)
    if sel is not None:
        var.update(_decode_tensor_desc(sel, what))
    return var


def _decode_attr(data, op_type):
    items = _fields(data, f"an attribute of op {op_type!r}")
    name = _text(_one(items, 1, b""), "OpDesc.Attr.name")
    atype = _one(items, 2)
    what = f"attribute {name!r} of op {op_type!r}"
    if atype == A_INT:
        value = _int32(_one(items, 3, 0))
    elif atype == A_FLOAT:
        raw = _one(items, 4, 0)
        value = struct.unpack("<f", struct.pack("<I", raw))[0]
    elif atype == A_STRING:
        value = _text(_one(items, 5, b""), what)
    elif atype == A_INTS:
        value = [_int32(x) for x in _repeated_varints(items, 6, what)]
    elif atype == A_FLOATS:
        value = _repeated_floats(items, 7)
    elif atype == A_STRINGS:
        value = [_text(v, what) for f, _, v in items if f == 8]
    elif atype == A_BOOLEAN:
        value = bool(_one(items, 10, 0))
    elif atype == A_BOOLEANS:
        value = [bool(x) for x in _repeated_varints(items, 11, what)]
    elif atype == A_BLOCK:
        value = _int32(_one(items, 12, 0))
    elif atype == A_LONG:
        value = _signed(_one(items, 13, 0))
    elif atype == A_BLOCKS:
        value = [_int32(x) for x in _repeated_varints(items, 14, what)]
    elif atype == A_LONGS:
        value = [_signed(x) for x in _repeated_varints(items, 15, what)]
    else:
        raise ProgramDescError(f"{what}: attribute type {atype} is not Fluid's")
    return name, atype, value


def _decode_op(data):
    items = _fields(data, "OpDesc")
    op_type = _text(_one(items, 3, b""), "OpDesc.type")
    op = {"type": op_type, "inputs": {}, "outputs": {}, "attrs": {}}
    for field, key in ((1, "inputs"), (2, "outputs")):
        for v in _subs(items, field):
            vi = _fields(v, f"an argument of op {op_type!r}")
            slot = _text(_one(vi, 1, b""), "OpDesc.Var.parameter")
            op[key][slot] = [_text(a, "OpDesc.Var.arguments") for g, _, a in vi if g == 2]
    for v in _subs(items, 4):
        name, atype, value = _decode_attr(v, op_type)
        op["attrs"][name] = (atype, value)
    return op


def decode_program(data):
    """``(blocks, version)`` of ProgramDesc bytes (the structure
    :func:`encode_program` takes); ProgramDescError for bytes that are not one."""
    if isinstance(data, str):
        raise ProgramDescError("a ProgramDesc is bytes, got str")
    data = memoryview(bytes(data))
    items = _fields(data, "ProgramDesc")
    blocks = []
    for f, w, v in items:
        if f == 1 and w == 2:
            bi = _fields(v, "BlockDesc")
            blocks.append({"idx": _int32(_one(bi, 1, 0)), "parent_idx": _int32(_one(bi, 2, 0)),
                           "vars": [_decode_var(x) for x in _subs(bi, 3)],
                           "ops": [_decode_op(x) for x in _subs(bi, 4)]})
    if not blocks:
        raise ProgramDescError("no block: not a Fluid ProgramDesc")
    version = _sub(items, 4)
    version = 0 if version is None else _signed(_one(_fields(version, "Version"), 1, 0))
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

"""Protobuf's wire encoding, as much of it as Fluid's ProgramDesc needs: varints, tags,
length-delimited and fixed-width fields written, and a message's bytes read back into
``(field, wire type, value)`` items with every length checked against the bytes present
before anything is allocated for it. Written here rather than taken from the
``protobuf`` package (see :mod:`pyfleet.fluid.fluid_proto`, its one user)."""

import struct

import numpy as np

__all__ = [
    "ProgramDescError",
    "f_bytes",
    "f_float",
    "f_str",
    "f_varint",
    "fields",
    "int32",
    "one",
    "read_varint",
    "repeated_floats",
    "repeated_varints",
    "signed",
    "sub",
    "subs",
    "tag",
    "text",
    "varint",
]


class ProgramDescError(ValueError):
    """Bytes that are not a ProgramDesc (or tensor file) this module can read."""


def varint(n):
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


def tag(field, wire):
    return varint((field << 3) | wire)


def f_varint(field, n):
    return tag(field, 0) + varint(n)


def f_bytes(field, data):
    return tag(field, 2) + varint(len(data)) + data


def f_str(field, s):
    return f_bytes(field, s.encode())


def f_float(field, x):
    return tag(field, 5) + struct.pack("<f", x)


def read_varint(buf, pos, what):
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


def fields(buf, what):
    """``[(field, wire type, value)]`` of one message: ints for varints and fixed
    fields, bytes for length-delimited ones."""
    out = []
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos, what)
            out.append((field, 0, value))
        elif wire == 2:
            size, pos = read_varint(buf, pos, what)
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


def signed(n):
    return n - (1 << 64) if n >= 1 << 63 else n


def int32(n):
    n = signed(n)
    return n - (1 << 32) if n >= 1 << 31 else n


def repeated_varints(items, field, what):
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
                value, pos = read_varint(v, pos, what)
                out.append(value)
    return out


def repeated_floats(items, field):
    out = []
    for f, w, v in items:
        if f != field:
            continue
        if w == 5:
            out.append(struct.unpack("<f", struct.pack("<I", v))[0])
        elif w == 2:
            out.extend(np.frombuffer(v, dtype="<f4").astype(float).tolist())
    return out


def one(items, field, default=None, kind=None):
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


def sub(items, field):
    """The last length-delimited value of ``field`` (a sub-message), or None."""
    value = None
    for f, w, v in items:
        if f == field:
            if w != 2:
                raise ProgramDescError(f"field {field} has wire type {w}: a message's is 2")
            value = v
    return value


def subs(items, field):
    """Every value of repeated message ``field``."""
    if any(f == field and w != 2 for f, w, _ in items):
        raise ProgramDescError(f"field {field} has a wire type other than a message's")
    return [v for f, _, v in items if f == field]


def text(b, what):
    try:
        return b.decode()
    except (AttributeError, UnicodeDecodeError):
        raise ProgramDescError(f"{what}: a string field is not UTF-8") from None

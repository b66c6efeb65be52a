# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Compiled CTR text parsers and the feature hash.

Every parser takes one buffer holding many complete lines and fills
preallocated numpy arrays in a single call that releases the GIL: no Python
object is made per line or per field. The callers in :mod:`pyfleet.data.readers`
cut files into such buffers; the definitions of the hash and of the formats are
in ``docs/formats.md``.

Thread safety: the functions keep no state and allocate their outputs;
concurrent calls are safe and parse in parallel (the GIL is released while
scanning).
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy
from libc.math cimport log1p, pow, isfinite

import numpy as np

cdef extern from *:
    """
    #include <string.h>
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    #error "pyfleet's parsers read 8-byte words as little-endian"
    #endif
    #define PF_SEED 0xcbf29ce484222325ULL
    #define PF_SLOT_STEP 0x9e3779b97f4a7c15ULL
    #define PF_MIX_M1 0xbf58476d1ce4e5b9ULL
    #define PF_MIX_M2 0x94d049bb133111ebULL
    #define PF_ONES 0x0101010101010101ULL
    #define PF_HIGHS 0x8080808080808080ULL
    #define PF_MANT_LIMIT 100000000000000000ULL
    static inline uint64_t pf_load64(const uint8_t* p) { uint64_t w; memcpy(&w, p, 8); return w; }
    static inline int pf_ctz64(uint64_t x) { return __builtin_ctzll(x); }
    """
    const uint64_t PF_SEED
    const uint64_t PF_SLOT_STEP
    const uint64_t PF_MIX_M1
    const uint64_t PF_MIX_M2
    const uint64_t PF_ONES
    const uint64_t PF_HIGHS
    const uint64_t PF_MANT_LIMIT
    uint64_t pf_load64(const uint8_t* p) noexcept nogil
    int pf_ctz64(uint64_t x) noexcept nogil

# Reasons a line is rejected; the readers turn the codes into these words.
REASONS = {1: "wrong field count", 2: "bad label", 3: "bad dense value", 4: "bad slot token"}
cdef enum:
    R_FIELDS = 1
    R_LABEL = 2
    R_DENSE = 3
    R_TOKEN = 4

# Column kinds of a delimited (TSV/CSV) schema.
KIND_IGNORE = 0
KIND_LABEL = 1
KIND_DENSE = 2
KIND_SLOT = 3

# Dense transforms.
TRANSFORMS = {"none": 0, "log": 1, "minmax": 2}

# Counters every parser fills, in this order.
COUNTERS = ("lines", "blank", "examples", "malformed", "other_shard", "ignored_tokens")
cdef enum:
    C_LINES = 0
    C_BLANK = 1
    C_OK = 2
    C_BAD = 3
    C_SHARD = 4
    C_IGNORED = 5
    N_COUNTERS = 6

cdef double[23] POW10
for _i in range(23):
    POW10[_i] = 10.0 ** _i

# log1p of small integers, the bulk of Criteo's count features: a lookup instead of
# a libm call per value, with bit-identical results.
cdef float[4096] LOG1P_INT
for _i in range(4096):
    LOG1P_INT[_i] = <float>log1p(<double>_i)


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    x ^= x >> 30
    x *= PF_MIX_M1
    x ^= x >> 27
    x *= PF_MIX_M2
    x ^= x >> 31
    return x


cdef inline uint64_t slot_salt(uint64_t slot) noexcept nogil:
    return (slot + 1) * PF_SLOT_STEP



cdef uint64_t[9] LOW_MASK
for _i in range(9):
    LOW_MASK[_i] = (((<uint64_t>1) << (8 * _i)) - 1) if _i < 8 else ~(<uint64_t>0)


cdef inline uint64_t hash_start(uint64_t n, uint64_t salt) noexcept nogil:
    """The hash state before the words of an n-byte value in the slot with this salt;
    also the id of the empty value."""
    return mix64((PF_SEED ^ n) + salt)


cdef inline uint64_t hash_words(uint64_t h, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """h = mix64(h ^ w) for each little-endian 8-byte word w of p[:n], the last one
    zero-extended."""
    cdef uint64_t w
    cdef Py_ssize_t i
    while n >= 8:
        h = mix64(h ^ pf_load64(p))
        p += 8
        n -= 8
    if n:
        w = 0
        for i in range(n):
            w |= (<uint64_t>p[i]) << (8 * i)
        h = mix64(h ^ w)
    return h


cdef inline uint64_t hash_value(const uint8_t* p, Py_ssize_t n, uint64_t salt) noexcept nogil:
    return hash_words(hash_start(<uint64_t>n, salt), p, n)


cdef inline uint64_t zero_bytes(uint64_t x) noexcept nogil:
    """High bit set in the lowest byte of x that is zero (higher flags may be false)."""
    return (x - PF_ONES) & ~x & PF_HIGHS


cdef inline const uint8_t* find_delim(const uint8_t* p, const uint8_t* e,
                                      const uint8_t* bufend, uint8_t delim,
                                      uint64_t dmask) noexcept nogil:
    """First delim in [p, e), or e."""
    cdef uint64_t t
    while p + 8 <= bufend and p < e:
        t = zero_bytes(pf_load64(p) ^ dmask)
        if t:
            p += pf_ctz64(t) >> 3
            return p if p < e else e
        p += 8
    while p < e and p[0] != delim:
        p += 1
    return p if p < e else e


cdef inline uint64_t scan_field_hash(const uint8_t** pp, const uint8_t* e,
                                     const uint8_t* bufend, uint8_t delim, uint64_t dmask,
                                     const uint64_t* start, uint64_t salt) noexcept nogil:
    """The id of the field at *pp (up to delim or e); *pp moves to its end. start[n]
    is hash_start(n, salt) for n <= 8: a field of at most 8 bytes (every Criteo
    categorical value) costs one word load and one mix."""
    cdef const uint8_t* p = pp[0]
    cdef const uint8_t* q
    cdef Py_ssize_t lim = e - p, k
    cdef uint64_t w, t
    if p + 9 <= bufend:
        w = pf_load64(p)
        t = zero_bytes(w ^ dmask)
        k = (pf_ctz64(t) >> 3) if t else 8
        if k > lim:
            k = lim
        if k < 8 or lim == 8 or p[8] == delim:
            pp[0] = p + k
            return mix64(start[k] ^ (w & LOW_MASK[k])) if k else start[0]
    q = find_delim(p, e, bufend, delim, dmask)
    pp[0] = q
    return hash_value(p, q - p, salt)


def _start_table(int n_slots):
    """uint64[n_slots, 9]: hash_start(n, slot_salt(s)) for n = 0..8."""
    out = np.empty((max(n_slots, 1), 9), dtype=np.uint64)
    cdef uint64_t[:, ::1] o = out
    cdef int s, n
    for s in range(n_slots):
        for n in range(9):
            o[s, n] = hash_start(n, slot_salt(s))
    return out


def feature_hash(slot, value):
    """The 64-bit id of raw value bytes in a slot (defined in ``docs/formats.md``).

    ``h = mix64((SEED ^ len(value)) + (slot + 1) * 0x9E3779B97F4A7C15)``, then
    ``h = mix64(h ^ w)`` for each little-endian 8-byte word ``w`` of the value
    (the last one zero-extended); the id is ``h``. Arithmetic is modulo 2**64,
    ``mix64`` is the splitmix64 finalizer and ``SEED = 0xCBF29CE484222325``.
    ``value`` is ``bytes`` or ``str`` (UTF-8); an empty value gives the slot's
    missing id. Returns a Python ``int`` in ``[0, 2**64)``.
    """
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"feature_hash: value must be bytes or str, got {type(value).__name__}")
    if not 0 <= slot < (1 << 32):
        raise ValueError(f"feature_hash: slot must be in [0, 2**32), got {slot!r}")
    cdef bytes b = bytes(value)
    cdef const uint8_t* p = b
    return int(hash_value(p, len(b), slot_salt(<uint64_t>slot)))


def missing_ids(int n_slots):
    """uint64[n_slots]: the id of an empty value in each slot (``feature_hash(s, b"")``)."""
    out = np.empty(n_slots, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef int s
    for s in range(n_slots):
        o[s] = hash_start(0, slot_salt(s))
    return out


cdef inline int scan_number(const uint8_t* p, const uint8_t* e, const uint8_t** stop,
                            double* out) noexcept nogil:
    """Parse a decimal number starting at p, stopping at the first byte that cannot
    continue it (*stop). Returns 0 for a number, 1 when nothing was consumed (an
    empty field), -1 for a broken number ("-", "1e", "1e+", overflow)."""
    cdef const uint8_t* s = p
    cdef bint neg = False
    cdef uint64_t mant = 0
    cdef int ndig = 0, exp10 = 0, ex = 0, exdig = 0
    cdef bint exneg = False
    cdef double v
    if p < e and (p[0] == 45 or p[0] == 43):  # '-' '+'
        neg = p[0] == 45
        p += 1
    # Digits beyond the 18th significant one only scale the value.
    while p < e and <unsigned int>(p[0] - 48) <= 9:
        if mant < PF_MANT_LIMIT:
            mant = mant * 10 + (p[0] - 48)
        else:
            exp10 += 1
        ndig += 1
        p += 1
    if p < e and p[0] == 46:  # '.'
        p += 1
        while p < e and <unsigned int>(p[0] - 48) <= 9:
            if mant < PF_MANT_LIMIT:
                mant = mant * 10 + (p[0] - 48)
                exp10 -= 1
            ndig += 1
            p += 1
    stop[0] = p
    if ndig == 0:
        return 1 if p == s else -1
    if p < e and (p[0] == 101 or p[0] == 69):  # 'e' 'E'
        p += 1
        if p < e and (p[0] == 45 or p[0] == 43):
            exneg = p[0] == 45
            p += 1
        while p < e and 48 <= p[0] <= 57:
            if ex < 100000:
                ex = ex * 10 + (p[0] - 48)
            exdig += 1
            p += 1
        stop[0] = p
        if exdig == 0:
            return -1
        exp10 += -ex if exneg else ex
    v = <double>mant
    if mant == 0 or exp10 == 0:
        pass
    elif 0 < exp10 <= 22:
        v = v * POW10[exp10]
    elif -22 <= exp10 < 0:
        v = v / POW10[-exp10]
    else:
        v = v * pow(10.0, exp10)
    if not isfinite(v):
        return -1
    out[0] = -v if neg else v
    return 0


cdef inline float transform_dense(double v, int transform, const double* dmin,
                                  const double* dscale, int j) noexcept nogil:
    cdef int iv
    if transform == 1:
        if v <= 0:
            return 0.0
        if v < 4096:
            iv = <int>v
            if iv == v:
                return LOG1P_INT[iv]
        return <float>log1p(v)
    if transform == 2:
        return <float>((v - dmin[j]) * dscale[j])
    return <float>v


cdef inline bint owned(int64_t line, int64_t mod, int64_t rem) noexcept nogil:
    return mod <= 1 or line % mod == rem


cdef inline const uint8_t* line_end(const uint8_t* p, const uint8_t* end,
                                    const uint8_t** next_line) noexcept nogil:
    """End of the line at p (before "\\n" or "\\r\\n"); *next_line is after its newline."""
    cdef const uint8_t* q = <const uint8_t*>memchr(p, 10, end - p)
    if q == NULL:
        q = end
        next_line[0] = end
    else:
        next_line[0] = q + 1
    if q > p and (q - 1)[0] == 13:
        q -= 1
    return q


cdef int parse_delimited_line(const uint8_t* p, const uint8_t* e, const uint8_t* bufend,
                              uint8_t delim, uint64_t dmask,
                              const int8_t* kind, const int32_t* index, int n_cols,
                              int transform, const double* dmin, const double* dscale,
                              const uint64_t* salt, const uint64_t* start,
                              float* label, float* dense,
                              uint64_t* ids) noexcept nogil:
    cdef int c = 0, st
    cdef int8_t k
    cdef const uint8_t* q
    cdef double v
    cdef uint64_t m
    while True:
        k = kind[c]
        if k == 3:
            ids[index[c]] = scan_field_hash(&p, e, bufend, delim, dmask,
                                            start + 9 * index[c], salt[index[c]])
        elif k == 2:
            # Most dense fields are short plain counts: read them without the
            # general number scanner's sign, fraction and exponent branches.
            q = p
            m = 0
            while q < e and <unsigned int>(q[0] - 48) <= 9:
                m = m * 10 + (q[0] - 48)
                q += 1
            if q - p <= 9 and (q == e or q[0] == delim):
                if q == p:
                    dense[index[c]] = 0.0
                elif transform == 1 and m < 4096:
                    dense[index[c]] = LOG1P_INT[m]
                else:
                    dense[index[c]] = transform_dense(<double>m, transform, dmin, dscale,
                                                      index[c])
                p = q
            else:
                st = scan_number(p, e, &q, &v)
                if st < 0 or (q < e and q[0] != delim):
                    return R_DENSE
                dense[index[c]] = 0.0 if st else transform_dense(v, transform, dmin, dscale,
                                                                 index[c])
                p = q
        elif k == 1:
            st = scan_number(p, e, &q, &v)
            if st != 0 or (q < e and q[0] != delim) or not (0.0 <= v <= 1.0):
                return R_LABEL
            label[0] = <float>v
            p = q
        else:
            p = find_delim(p, e, bufend, delim, dmask)
        c += 1
        if p >= e:
            return 0 if c == n_cols else R_FIELDS
        if c == n_cols:
            return R_FIELDS
        p += 1


def parse_delimited(const uint8_t[::1] buf, int delim, const int8_t[::1] kind,
                    const int32_t[::1] index, int n_dense, int n_slots,
                    str dense_transform="log", dense_min=None, dense_max=None,
                    int64_t line_base=0, int64_t shard_mod=1, int64_t shard_rem=0):
    """Parse the complete lines of ``buf`` (TSV or CSV without quoting, no header).

    Column ``c`` is ignored, the label, dense column ``index[c]`` or slot
    ``index[c]`` as ``kind[c]`` is 0, 1, 2 or 3 (no label column: unlabelled
    rows, with label 0); a line must have exactly
    ``len(kind)`` fields. With ``shard_mod > 1`` only lines whose global number
    ``line_base + i`` is ``shard_rem`` modulo ``shard_mod`` are parsed.

    Returns a dict: ``labels`` float32[n], ``dense`` float32[n, n_dense],
    ``ids`` uint64[n, n_slots] (n = examples kept, rows in line order),
    ``bad_lines`` int64 (0-based line numbers within ``buf``), ``bad_reasons``
    int8 (codes of :data:`REASONS`) and the :data:`COUNTERS`. Blank lines are
    counted and skipped; the last line needs no newline.
    """
    cdef Py_ssize_t n = buf.shape[0]
    cdef int n_cols = kind.shape[0]
    if index.shape[0] != n_cols or n_cols == 0:
        raise ValueError("parse_delimited: kind and index must be non-empty and of equal length")
    _check_columns(np.asarray(kind), np.asarray(index), n_dense, n_slots)
    cdef int transform = _transform_code(dense_transform)
    dmin, dscale = _minmax(transform, n_dense, dense_min, dense_max)
    cdef const double[::1] dmin_v = dmin
    cdef const double[::1] dscale_v = dscale
    cdef Py_ssize_t max_lines = _count_lines(buf)
    # Every field of a kept line is written, so the rows need no clearing (but the
    # labels of unlabelled rows, with no label column, are 0).
    labels = (np.empty if (np.asarray(kind) == KIND_LABEL).any() else np.zeros)(
        max_lines, dtype=np.float32)
    dense = np.empty((max_lines, n_dense), dtype=np.float32)
    ids = np.empty((max_lines, n_slots), dtype=np.uint64)
    bad_lines = np.empty(max_lines, dtype=np.int64)
    bad_reasons = np.empty(max_lines, dtype=np.int8)
    counters = np.zeros(N_COUNTERS, dtype=np.int64)
    salt_arr = np.array([slot_salt(k) for k in range(n_slots)], dtype=np.uint64)
    cdef const uint64_t[:, ::1] start_v = _start_table(n_slots)
    cdef float[::1] lab_v = labels
    cdef float[:, ::1] den_v = dense
    cdef uint64_t[:, ::1] ids_v = ids
    cdef int64_t[::1] badl_v = bad_lines
    cdef int8_t[::1] badr_v = bad_reasons
    cdef int64_t[::1] cnt = counters
    cdef const uint64_t[::1] salt_v = salt_arr
    cdef float dummy_dense = 0
    cdef uint64_t dummy_id = 0
    cdef float* dptr = &den_v[0, 0] if n_dense and max_lines else &dummy_dense
    cdef uint64_t* iptr = &ids_v[0, 0] if n_slots and max_lines else &dummy_id
    cdef const uint8_t* p
    cdef const uint8_t* end
    cdef const uint8_t* e
    cdef const uint8_t* nxt
    cdef int64_t li = 0, n_ok = 0, n_bad = 0
    cdef int rc
    cdef uint64_t dmask = PF_ONES * <uint8_t>delim
    cdef const double* dmin_p = &dmin_v[0] if n_dense else NULL
    cdef const double* dscale_p = &dscale_v[0] if n_dense else NULL
    cdef const uint64_t* salt_p = &salt_v[0] if n_slots else NULL
    if n:
        p = &buf[0]
        end = p + n
        with nogil:
            while p < end:
                e = line_end(p, end, &nxt)
                if not owned(line_base + li, shard_mod, shard_rem):
                    cnt[C_SHARD] += 1
                elif e == p:
                    cnt[C_BLANK] += 1
                else:
                    rc = parse_delimited_line(
                        p, e, end, <uint8_t>delim, dmask, &kind[0], &index[0], n_cols, transform,
                        dmin_p, dscale_p, salt_p, &start_v[0, 0], &lab_v[n_ok],
                        dptr + (n_ok * n_dense if n_dense else 0),
                        iptr + (n_ok * n_slots if n_slots else 0))
                    if rc == 0:
                        n_ok += 1
                    else:
                        badl_v[n_bad] = li
                        badr_v[n_bad] = <int8_t>rc
                        n_bad += 1
                li += 1
                p = nxt
    cnt[C_LINES] = li
    cnt[C_OK] = n_ok
    cnt[C_BAD] = n_bad
    out = {"labels": labels[:n_ok], "dense": dense[:n_ok], "ids": ids[:n_ok],
           "bad_lines": bad_lines[:n_bad], "bad_reasons": bad_reasons[:n_bad]}
    for i, name in enumerate(COUNTERS):
        out[name] = int(counters[i])
    return out


cdef inline bint is_space(uint8_t b) noexcept nogil:
    return b == 32 or b == 9


cdef inline int find_slot(const uint8_t* name, Py_ssize_t n, const uint8_t* names,
                          const int32_t* name_off, int n_slots, int guess) noexcept nogil:
    cdef int s, k
    cdef Py_ssize_t ln
    # Slots usually come in order, so the next slot or the same one is tried first.
    for k in range(n_slots + 2):
        if k == 0:
            s = guess + 1
        elif k == 1:
            s = guess
        else:
            s = k - 2
        if s < 0 or s >= n_slots:
            continue
        ln = name_off[s + 1] - name_off[s]
        if ln == n and memcmp(name, names + name_off[s], n) == 0:
            return s
    return -1


def parse_slots(const uint8_t[::1] buf, slot_names, int n_dense,
                bytes label_name=b"click", bytes dense_name=b"dense_feature",
                str dense_transform="none", dense_min=None, dense_max=None,
                int64_t line_base=0, int64_t shard_mod=1, int64_t shard_rem=0):
    """Parse the complete lines of ``buf`` in PaddleRec's slot format.

    A line is whitespace-separated ``name:value`` tokens: exactly one
    ``<label_name>:<number in [0,1]>``, exactly ``n_dense``
    ``<dense_name>:<number>`` (in column order), and any number of
    ``<slot>:<decimal id>`` for the slots in ``slot_names`` (bytes), each of
    which may repeat. A slot absent from a line gets its missing id; tokens of
    other names are ignored and counted.

    Returns a dict: ``labels`` float32[n], ``dense`` float32[n, n_dense],
    ``offsets`` int64[n + 1, n_slots] (row i of slot s owns ids
    ``slot_ids[s][offsets[i, s]:offsets[i + 1, s]]``), ``ids`` uint64 (all
    slots, slot-major), ``slot_starts`` int64[n_slots + 1] (slot s is
    ``ids[slot_starts[s]:slot_starts[s + 1]]``), ``bad_lines``,
    ``bad_reasons`` and the :data:`COUNTERS`, as :func:`parse_delimited`.
    """
    cdef int n_slots = len(slot_names)
    names_cat = b"".join(slot_names)
    name_off_arr = np.zeros(n_slots + 1, dtype=np.int32)
    name_off_arr[1:] = np.cumsum([len(name) for name in slot_names])
    if n_slots == 0 or any(len(name) == 0 for name in slot_names):
        raise ValueError("parse_slots: slot names must be non-empty bytes, at least one")
    cdef const uint8_t[::1] names_v = memoryview(names_cat).cast("B")
    cdef const int32_t[::1] name_off = name_off_arr
    cdef int transform = _transform_code(dense_transform)
    dmin, dscale = _minmax(transform, n_dense, dense_min, dense_max)
    cdef const double[::1] dmin_v = dmin
    cdef const double[::1] dscale_v = dscale
    cdef Py_ssize_t n = buf.shape[0]
    cdef Py_ssize_t max_lines = _count_lines(buf)
    cdef Py_ssize_t max_tokens = _count_byte(buf, 58) + max_lines * n_slots
    labels = np.empty(max_lines, dtype=np.float32)
    dense = np.zeros((max_lines, n_dense), dtype=np.float32)
    offsets = np.zeros((max_lines + 1, n_slots), dtype=np.int64)
    tok_slot = np.empty(max_tokens, dtype=np.int32)
    tok_id = np.empty(max_tokens, dtype=np.uint64)
    bad_lines = np.empty(max_lines, dtype=np.int64)
    bad_reasons = np.empty(max_lines, dtype=np.int8)
    counters = np.zeros(N_COUNTERS, dtype=np.int64)
    salt_arr = np.array([slot_salt(k) for k in range(n_slots)], dtype=np.uint64)
    miss_arr = missing_ids(n_slots)
    cdef float[::1] lab_v = labels
    cdef float[:, ::1] den_v = dense
    cdef int64_t[:, ::1] off_v = offsets
    cdef int32_t[::1] ts_v = tok_slot
    cdef uint64_t[::1] ti_v = tok_id
    cdef int64_t[::1] badl_v = bad_lines
    cdef int8_t[::1] badr_v = bad_reasons
    cdef int64_t[::1] cnt = counters
    cdef const uint64_t[::1] salt_v = salt_arr
    cdef const uint64_t[::1] miss_v = miss_arr
    cdef const uint8_t* lab_name = label_name
    cdef const uint8_t* den_name = dense_name
    cdef Py_ssize_t lab_len = len(label_name), den_len = len(dense_name)
    cdef const uint8_t* p
    cdef const uint8_t* end
    cdef const uint8_t* e
    cdef const uint8_t* nxt
    cdef const uint8_t* t
    cdef const uint8_t* colon
    cdef const uint8_t* q
    cdef int64_t li = 0, n_ok = 0, n_bad = 0, ntok = 0, line_tok, ignored, ti
    cdef int rc, s, guess, nd, st
    cdef bint have_label
    cdef double v
    cdef int64_t* row
    cdef const double* dmin_p = &dmin_v[0] if n_dense else NULL
    cdef const double* dscale_p = &dscale_v[0] if n_dense else NULL
    if n and max_lines:
        p = &buf[0]
        end = p + n
        with nogil:
            while p < end:
                e = line_end(p, end, &nxt)
                if not owned(line_base + li, shard_mod, shard_rem):
                    cnt[C_SHARD] += 1
                    li += 1
                    p = nxt
                    continue
                while p < e and is_space(p[0]):
                    p += 1
                if p == e:
                    cnt[C_BLANK] += 1
                    li += 1
                    p = nxt
                    continue
                row = &off_v[n_ok + 1, 0]
                for s in range(n_slots):
                    row[s] = 0
                rc = 0
                line_tok = ntok
                ignored = 0
                have_label = False
                nd = 0
                guess = -1
                while p < e:
                    t = p
                    colon = NULL
                    while p < e and not is_space(p[0]):
                        if p[0] == 58:  # ':'
                            if colon != NULL:
                                break
                            colon = p
                        p += 1
                    if colon == NULL or colon == t or (p < e and not is_space(p[0])):
                        rc = R_TOKEN
                        break
                    if colon - t == lab_len and memcmp(t, lab_name, lab_len) == 0:
                        st = scan_number(colon + 1, p, &q, &v)
                        if have_label or st != 0 or q != p or not (0.0 <= v <= 1.0):
                            rc = R_LABEL
                            break
                        lab_v[n_ok] = <float>v
                        have_label = True
                    elif colon - t == den_len and memcmp(t, den_name, den_len) == 0:
                        if nd >= n_dense:
                            rc = R_FIELDS
                            break
                        st = scan_number(colon + 1, p, &q, &v)
                        if st < 0 or q != p:
                            rc = R_DENSE
                            break
                        den_v[n_ok, nd] = 0.0 if st else transform_dense(
                            v, transform, dmin_p, dscale_p, nd)
                        nd += 1
                    else:
                        s = find_slot(t, colon - t, &names_v[0], &name_off[0], n_slots, guess)
                        if s < 0:
                            ignored += 1
                        else:
                            guess = s
                            q = colon + 1
                            if q == p:
                                rc = R_TOKEN
                                break
                            while q < p and 48 <= q[0] <= 57:
                                q += 1
                            if q != p:
                                rc = R_TOKEN
                                break
                            ts_v[ntok] = s
                            ti_v[ntok] = hash_value(colon + 1, p - colon - 1, salt_v[s])
                            ntok += 1
                            row[s] += 1
                    while p < e and is_space(p[0]):
                        p += 1
                if rc == 0 and not have_label:
                    rc = R_LABEL
                if rc == 0 and nd != n_dense:
                    rc = R_FIELDS
                if rc == 0:
                    for s in range(n_slots):
                        if row[s] == 0:
                            ts_v[ntok] = s
                            ti_v[ntok] = miss_v[s]
                            ntok += 1
                            row[s] = 1
                    cnt[C_IGNORED] += ignored
                    n_ok += 1
                else:
                    ntok = line_tok
                    badl_v[n_bad] = li
                    badr_v[n_bad] = <int8_t>rc
                    n_bad += 1
                li += 1
                p = nxt
    cnt[C_LINES] = li
    cnt[C_OK] = n_ok
    cnt[C_BAD] = n_bad
    offsets = offsets[:n_ok + 1]
    totals = offsets.sum(axis=0)
    np.cumsum(offsets, axis=0, out=offsets)
    slot_starts = np.zeros(n_slots + 1, dtype=np.int64)
    np.cumsum(totals, out=slot_starts[1:])
    ids = np.empty(ntok, dtype=np.uint64)
    cursor = slot_starts[:n_slots].copy()
    cdef int64_t[::1] cur_v = cursor
    cdef uint64_t[::1] ids_v = ids
    with nogil:
        for ti in range(ntok):
            s = ts_v[ti]
            ids_v[cur_v[s]] = ti_v[ti]
            cur_v[s] += 1
    out = {"labels": labels[:n_ok], "dense": dense[:n_ok], "offsets": offsets, "ids": ids,
           "slot_starts": slot_starts, "bad_lines": bad_lines[:n_bad],
           "bad_reasons": bad_reasons[:n_bad]}
    for i, name in enumerate(COUNTERS):
        out[name] = int(counters[i])
    return out


cdef Py_ssize_t _count_byte(const uint8_t[::1] buf, int byte):
    cdef Py_ssize_t n = buf.shape[0], c = 0
    if n == 0:
        return 0
    cdef const uint8_t* p = &buf[0]
    cdef const uint8_t* q
    cdef const uint8_t* end = p + n
    with nogil:
        while p < end:
            q = <const uint8_t*>memchr(p, byte, end - p)
            if q == NULL:
                break
            c += 1
            p = q + 1
    return c


cdef Py_ssize_t _count_lines(const uint8_t[::1] buf):
    """Lines in buf: newlines, plus one if the last line has none."""
    cdef Py_ssize_t n = buf.shape[0]
    if n == 0:
        return 0
    return _count_byte(buf, 10) + (buf[n - 1] != 10)


def _check_columns(kind, index, int n_dense, int n_slots):
    """Each dense column and slot must be filled by exactly one field: the parser
    writes through these indices without further checks."""
    if (kind == KIND_LABEL).sum() > 1:
        raise ValueError("parse_delimited: at most one column may be the label (none: "
                         "unlabelled rows, whose labels read as 0)")
    for k, n, what in ((KIND_DENSE, n_dense, "dense"), (KIND_SLOT, n_slots, "slot")):
        if sorted(index[kind == k].tolist()) != list(range(n)):
            raise ValueError(f"parse_delimited: the {what} columns must map onto 0..{n - 1} "
                             f"exactly once")
    if ((kind < 0) | (kind > KIND_SLOT)).any():
        raise ValueError("parse_delimited: column kinds must be 0..3")


def check_dense_transform(str name, int n_dense, dense_min=None, dense_max=None):
    """Raise ValueError unless the transform name and its min/max fit n_dense columns."""
    _minmax(_transform_code(name), n_dense, dense_min, dense_max)


def _transform_code(str name):
    try:
        return TRANSFORMS[name]
    except KeyError:
        raise ValueError(f"dense_transform must be one of {sorted(TRANSFORMS)}, got {name!r}") \
            from None


def _minmax(int transform, int n_dense, dense_min, dense_max):
    """(min, 1 / (max - min)) as float64[n_dense]; a column with max <= min scales to 0."""
    if transform != 2:
        return np.zeros(max(n_dense, 1)), np.zeros(max(n_dense, 1))
    if dense_min is None or dense_max is None:
        raise ValueError('dense_transform="minmax" needs dense_min and dense_max')
    lo = np.asarray(dense_min, dtype=np.float64).reshape(-1)
    hi = np.asarray(dense_max, dtype=np.float64).reshape(-1)
    if lo.shape[0] != n_dense or hi.shape[0] != n_dense:
        raise ValueError(f"dense_min and dense_max must have {n_dense} values each, "
                         f"got {lo.shape[0]} and {hi.shape[0]}")
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
        raise ValueError("dense_min and dense_max must be finite")
    width = hi - lo
    scale = np.zeros(n_dense)
    np.divide(1.0, width, out=scale, where=width > 0)
    return np.ascontiguousarray(lo), scale


cdef inline uint8_t* put_int(uint8_t* o, int64_t x) noexcept nogil:
    cdef uint8_t[20] tmp
    cdef int n = 0
    cdef uint64_t u
    if x < 0:
        o[0] = 45
        o += 1
        u = (<uint64_t>0) - <uint64_t>x
    else:
        u = <uint64_t>x
    while True:
        tmp[n] = <uint8_t>(48 + u % 10)
        n += 1
        u //= 10
        if u == 0:
            break
    while n:
        n -= 1
        o[0] = tmp[n]
        o += 1
    return o


def format_criteo_tsv(const uint8_t[::1] labels, const int64_t[:, ::1] dense,
                      const uint8_t[:, ::1] dense_missing, const uint32_t[:, ::1] cat,
                      const uint8_t[:, ::1] cat_missing):
    """Criteo TSV text of n rows: ``label \\t I1..I13 \\t C1..C26 \\n``, each categorical
    value as 8 lowercase hex digits; a missing value is an empty field. Labels are
    0 or 1; the dense and categorical arrays have 13 and 26 columns."""
    cdef Py_ssize_t n = labels.shape[0], i, j
    if (dense.shape[0] != n or dense_missing.shape[0] != n or cat.shape[0] != n
            or cat_missing.shape[0] != n or dense.shape[1] != 13 or dense_missing.shape[1] != 13
            or cat.shape[1] != 26 or cat_missing.shape[1] != 26):
        raise ValueError("format_criteo_tsv: expected n labels, [n, 13] dense and [n, 26] "
                         "categorical arrays")
    out = np.empty(n * (2 + 13 * 21 + 26 * 9) + 1, dtype=np.uint8)
    cdef uint8_t[::1] o_v = out
    cdef uint8_t* o = &o_v[0]
    cdef uint8_t* start = o
    cdef const char* hexd = b"0123456789abcdef"
    cdef uint32_t v
    cdef int k
    with nogil:
        for i in range(n):
            o[0] = 49 if labels[i] else 48
            o += 1
            for j in range(13):
                o[0] = 9
                o += 1
                if not dense_missing[i, j]:
                    o = put_int(o, dense[i, j])
            for j in range(26):
                o[0] = 9
                o += 1
                if not cat_missing[i, j]:
                    v = cat[i, j]
                    for k in range(8):
                        o[k] = hexd[(v >> (28 - 4 * k)) & 15]
                    o += 8
            o[0] = 10
            o += 1
    return out[:o - start].tobytes()


# ---- Fluid's MultiSlot text: per line, per variable, a count then that many values ----

cdef extern from "stdlib.h" nogil:
    double strtod(const char* s, char** end)

cdef inline bint _ms_space(uint8_t c) noexcept nogil:
    return c == 32 or c == 9 or c == 13 or c == 11 or c == 12


cdef inline Py_ssize_t _ms_token(const uint8_t* b, Py_ssize_t p, Py_ssize_t e,
                                 Py_ssize_t* start) noexcept nogil:
    """Skip blanks from ``p`` (within ``[p, e)``); the next token's start in ``start``
    and its end returned (``start[0] == e`` when the line has no more tokens)."""
    while p < e and _ms_space(b[p]):
        p += 1
    start[0] = p
    while p < e and not _ms_space(b[p]):
        p += 1
    return p


cdef inline int _ms_uint(const uint8_t* b, Py_ssize_t s, Py_ssize_t e, uint64_t* out) noexcept nogil:
    """A decimal integer token (optional sign) as its two's complement bits: 0 when
    it is one and fits (up to 2^64 - 1, down to -2^63), else 1."""
    cdef bint neg = False
    cdef uint64_t v = 0, d
    if s < e and (b[s] == 45 or b[s] == 43):
        neg = b[s] == 45
        s += 1
    if s >= e:
        return 1
    while s < e:
        d = <uint64_t>b[s] - 48
        if d > 9 or v > (0xFFFFFFFFFFFFFFFFULL - d) // 10:
            return 1
        v = v * 10 + d
        s += 1
    if neg:
        if v > 0x8000000000000000ULL:
            return 1
        v = (~v) + 1
    out[0] = v
    return 0


cdef inline int _ms_float(const uint8_t* b, Py_ssize_t s, Py_ssize_t e, double* out) noexcept nogil:
    cdef char tmp[64]
    cdef char* end
    cdef Py_ssize_t n = e - s
    if n <= 0 or n >= 64:
        return 1
    memcpy(tmp, b + s, n)
    tmp[n] = 0
    out[0] = strtod(tmp, &end)
    return 0 if end == tmp + n else 1


def parse_multislot_text(const uint8_t[::1] buf, const int8_t[::1] is_float):
    """Parse Fluid's MultiSlot text (:mod:`pyfleet.data.multislot`): per non-blank
    line, for each of the ``len(is_float)`` variables in order, a count ``c`` then
    ``c`` values, integers (their int64 bits; up to 2^64 - 1 as uint64 bits) or,
    where ``is_float[j]``, floats. Two passes over the buffer without the GIL.

    Returns ``(n, lens, values)``: ``n`` lines, ``lens`` int64[n_vars, n], and per
    variable one int64 or float64 array of its values in line order. A bad line
    raises ValueError ``(code, line, var, token)`` args for the caller to word:
    code 1 too few variables on the line, 2 values left after the last one, 3 a
    count that is not a whole number, 4 a value that is not a number."""
    cdef Py_ssize_t nb = buf.shape[0], nv = is_float.shape[0]
    cdef const uint8_t* b = &buf[0] if nb else NULL
    totals_arr = np.zeros(max(nv, 1), dtype=np.int64)
    cdef int64_t[::1] totals = totals_arr
    cdef Py_ssize_t p = 0, e, q, s, t, i, j, n = 0
    cdef const uint8_t* nxt
    cdef int64_t c, k
    cdef int err = 0
    cdef Py_ssize_t err_line = 0, err_var = 0, err_s = 0, err_e = 0
    cdef uint64_t u
    cdef double f
    with nogil:   # pass 1: lines, counts, structure
        while p < nb and not err:
            e = line_end(b + p, b + nb, &nxt) - b
            q = _ms_token(b, p, e, &s)
            if s < e:
                q = p
                for j in range(nv):
                    q = _ms_token(b, q, e, &s)
                    if s == e:
                        err, err_line, err_var = 1, n + 1, j
                        break
                    if _ms_uint(b, s, q, &u) or b[s] == 45 or u > <uint64_t>(e - p):
                        err, err_line, err_var, err_s, err_e = 3, n + 1, j, s, q
                        break
                    c = <int64_t>u
                    totals[j] += c
                    for k in range(c):
                        q = _ms_token(b, q, e, &s)
                        if s == e:
                            err, err_line, err_var = 1, n + 1, j + 1
                            break
                    if err:
                        break
                if not err:
                    t = _ms_token(b, q, e, &s)
                    if s < e:
                        k = 0
                        while s < e:
                            k += 1
                            t = _ms_token(b, t, e, &s)
                        err, err_line, err_var, err_s = 2, n + 1, nv, k
                n += 1
            p = nxt - b
    if err:
        raise ValueError(err, err_line, err_var,
                         bytes(buf[err_s:err_e]) if err in (3, 4) else err_s)
    lens_arr = np.empty((nv, n), dtype=np.int64)
    cdef int64_t[:, ::1] lens = lens_arr
    values = [np.empty(totals[j], dtype=np.float64 if is_float[j] else np.int64)
              for j in range(nv)]
    fill_arr = np.zeros(max(nv, 1), dtype=np.int64)
    cdef int64_t[::1] fill = fill_arr
    ptr_arr = np.array([v.ctypes.data for v in values] or [0], dtype=np.uintp)
    cdef const size_t[::1] ptrs = ptr_arr
    p = 0
    i = 0
    with nogil:   # pass 2: the values
        while p < nb and not err:
            e = line_end(b + p, b + nb, &nxt) - b
            q = _ms_token(b, p, e, &s)
            if s < e:
                q = p
                for j in range(nv):
                    q = _ms_token(b, q, e, &s)
                    _ms_uint(b, s, q, &u)
                    c = <int64_t>u
                    lens[j, i] = c
                    for k in range(c):
                        q = _ms_token(b, q, e, &s)
                        if is_float[j]:
                            if _ms_float(b, s, q, &f):
                                err = 4
                            else:
                                (<double*>ptrs[j])[fill[j]] = f
                        elif _ms_uint(b, s, q, &u):
                            err = 4
                        else:
                            (<int64_t*>ptrs[j])[fill[j]] = <int64_t>u
                        if err:
                            err_line, err_var, err_s, err_e = i + 1, j, s, q
                            break
                        fill[j] += 1
                    if err:
                        break
                i += 1
            p = nxt - b
    if err:
        raise ValueError(err, err_line, err_var, bytes(buf[err_s:err_e]))
    return n, lens_arr, values

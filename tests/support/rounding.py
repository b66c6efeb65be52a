"""A plain numpy reference of the compact rows' rounding rule (row_encoding.h):
the random bits of an update, stochastic and nearest rounding to fp16/bf16,
and equal keys' gradients summed in the core's order."""

import numpy as np

U64 = np.uint64
MASK64 = (1 << 64) - 1
ROUND_SALT = 0x7a3b9c1d5e6f8091
ROUND_STEP = 0x9E3779B97F4A7C15


def mix64(x):
    x = np.asarray(x, dtype=U64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> U64(30))
        x = x * U64(0xbf58476d1ce4e5b9)
        x = x ^ (x >> U64(27))
        x = x * U64(0x94d049bb133111eb)
        return x ^ (x >> U64(31))


def round_bits(seed, key, count, n):
    """The uint16 random bits of elements 0..n-1 of one update of one row:
    four 32-bit xorshift lanes seeded from z and mix64(z + step), lowest bit
    set, eight draws (each lane's low then high half) per step."""
    salt = mix64(U64(seed & MASK64) ^ U64(ROUND_SALT))
    z = mix64(mix64(salt ^ U64(key)) ^ U64(count))
    with np.errstate(over="ignore"):
        z2 = mix64(z + U64(ROUND_STEP))
    x = np.array([z, z >> U64(32), z2, z2 >> U64(32)], U64).astype(np.uint32) | np.uint32(1)
    out = []
    for _ in range((n + 7) // 8):
        x ^= x << np.uint32(13)
        x ^= x >> np.uint32(17)
        x ^= x << np.uint32(5)
        lanes = x.astype(np.uint64)
        out.append(np.stack([lanes & U64(0xFFFF), lanes >> U64(16)], axis=1).reshape(-1))
    return np.concatenate(out or [np.zeros(0, U64)])[:n].astype(np.uint16)


def half_stochastic(v, r):
    """r / 2^16 is a fraction of the result's ulp added before truncation: a
    normal half adds r's top 13 bits to its 13 dropped bits; a subnormal one
    is floor(|v| * 2^24 + r / 2^16), here in integers: |v| * 2^24 = sig / 2^shift."""
    a = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    sign = (a >> np.uint64(16)) & np.uint64(0x8000)
    a &= np.uint64(0x7FFFFFFF)
    r = r.astype(np.uint64) & np.uint64(0xFFFF)
    normal = np.minimum(((a + (r >> np.uint64(3))) >> np.uint64(13)) - np.uint64(112 << 10),
                        np.uint64(0x7BFF))
    e = a >> np.uint64(23)
    sig = (a & np.uint64(0x7FFFFF)) | np.where(e != 0, np.uint64(0x800000), np.uint64(0))
    shift = np.minimum(np.uint64(126) - np.maximum(e, np.uint64(1)), np.uint64(48))
    frac16 = ((sig & ((np.uint64(1) << shift) - np.uint64(1))) << np.uint64(16)) >> shift
    sub = (sig >> shift) + ((r + frac16) >> np.uint64(16))
    special = np.where(a > np.uint64(0x7F800000), np.uint64(0x7E00), np.uint64(0x7C00))
    out = np.where(a >= np.uint64(0x7F800000), special,
                   np.where(a >= np.uint64(0x38800000), normal, sub))
    return (sign | out).astype(np.uint16)


def bf16_stochastic(v, r):
    b = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    a = b & np.uint64(0x7FFFFFFF)
    kept = (b >> np.uint64(16)) | np.where(a > np.uint64(0x7F800000), np.uint64(0x40),
                                            np.uint64(0))
    b = (b + (r.astype(np.uint64) & np.uint64(0xFFFF))) >> np.uint64(16)
    over = (b & np.uint64(0x7FFF)) >= np.uint64(0x7F80)
    b = np.where(over, (b & np.uint64(0x8000)) | np.uint64(0x7F7F), b)
    return np.where(a >= np.uint64(0x7F800000), kept, b).astype(np.uint16)


def widen(kind, h):
    if kind == "fp16":
        return h.view(np.float16).astype(np.float32)
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def nearest(kind, v):
    """Round to nearest even and back (numpy's own float16 cast for fp16)."""
    v = np.asarray(v, dtype=np.float32)
    if kind == "fp16":
        return v.astype(np.float16).astype(np.float32)
    b = v.view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return widen(kind, b.astype(np.uint16))


def stochastic(kind, v, r):
    return widen(kind, half_stochastic(v, r) if kind == "fp16" else bf16_stochastic(v, r))


def summed_like_core(keys, grads):
    """Equal keys' gradients summed in the core's order: the first occurrence,
    then the others from the last one back (bit-exact float sums)."""
    where = {}
    for i, k in enumerate(keys.tolist()):
        where.setdefault(k, []).append(i)
    out = {}
    for k, idx in where.items():
        g = grads[idx[0]].copy()
        for i in reversed(idx[1:]):
            g += grads[i]
        out[k] = g
    return out




# ---- 8-bit block-quantised state (row_q8.h) ----

Q8_BLOCK = 16


def bf16_ceil(a):
    """The smallest bf16 >= a >= 0 (at most the largest finite bf16), as a float32."""
    b = np.asarray(a, np.float32).reshape(1).view(np.uint32).astype(np.uint64)
    b = np.where(b & np.uint64(0xFFFF), (b | np.uint64(0xFFFF)) + np.uint64(1), b)
    b = np.minimum(b, np.uint64(0x7F7F0000))
    return b.astype(np.uint32).view(np.float32)[0]


def q8_round_trip(head, dim, signed_vectors, r=None):
    """What a q8 row's state head decodes to after it is stored: per block of
    each dim-vector, scale = bf16 ceiling of max |x| (root vectors: of
    sqrt(x)); y = x * (k / scale) + (u + b), clamped to [1, 255] (signed,
    b = 128, k = 127) or [0, 255] (root, b = 0, k = 255), code = trunc(y) - b,
    u = r / 2^16 or 1/2; Adam's m code is 0 wherever v's code is 0. Decoded:
    code * (scale / k), squared for root vectors. All in float32."""
    f32 = np.float32
    head = np.asarray(head, f32)
    nvec = head.size // dim
    codes = np.zeros(head.size, f32)
    steps = np.zeros(head.size, f32)
    u = np.full(head.size, f32(0.5)) if r is None else r.astype(f32) * f32(2.0**-16)
    for j in range(nvec):
        sgn = j < signed_vectors
        k, b, lo_c = (f32(127), f32(128), f32(1)) if sgn else (f32(255), f32(0), f32(0))
        for lo in range(0, dim, Q8_BLOCK):
            sl = slice(j * dim + lo, j * dim + min(dim, lo + Q8_BLOCK))
            x = head[sl] if sgn else np.sqrt(np.where(head[sl] > 0, head[sl], f32(0)))
            scale = bf16_ceil(np.max(np.abs(x), initial=f32(0)))
            if scale == 0:
                continue
            y = x * f32(k / scale) + (u[sl] + b)
            codes[sl] = np.trunc(np.minimum(np.maximum(y, lo_c), f32(255))) - b
            steps[sl] = f32(scale / k)
    for k in range(signed_vectors):
        if signed_vectors + k < nvec:
            m = slice(k * dim, (k + 1) * dim)
            v = slice((signed_vectors + k) * dim, (signed_vectors + k + 1) * dim)
            codes[m] = np.where(codes[v] == 0, f32(0), codes[m])
    out = codes * steps
    for j in range(signed_vectors, nvec):
        sl = slice(j * dim, (j + 1) * dim)
        out[sl] = out[sl] * out[sl]
    return out


def pow_count(b, n):
    """b^n in float32 by repeated squaring, as row_q8.h's PowCount."""
    r, b = np.float32(1), np.float32(b)
    while n:
        if n & 1:
            r = np.float32(r * b)
        b = np.float32(b * b)
        n >>= 1
    return r

#include "pyfleet/row_q8.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"
#include "row_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyfleet {

namespace {

// A q8 state row is read and written as whole 4-byte words (relaxed
// atomics; rows are 4-byte aligned): a concurrent push may mix words of two
// updates, never tear one. On x86-64 (not under ThreadSanitizer) the
// 8-byte-aligned pairs of words are one 8-byte access written in asm (opaque
// to the compiler, so no C++ data race is formed; an aligned 8-byte access
// is single-copy atomic, so no word is split), as row_storage.cc's Load16s.
inline void LoadWords(const void* p, size_t bytes, uint8_t* out) {
  auto* w = const_cast<uint32_t*>(static_cast<const uint32_t*>(p));
  const size_t n = bytes / 4;
  size_t i = 0;
  auto one = [&](size_t k) {
    const uint32_t v = std::atomic_ref<uint32_t>(w[k]).load(std::memory_order_relaxed);
    std::memcpy(out + 4 * k, &v, 4);
  };
#ifdef PYFLEET_VECTOR_ROW_COPY
  if (n != 0 && reinterpret_cast<uintptr_t>(w) % 8 != 0) one(i++);
  for (; i + 2 <= n; i += 2) {
    uint64_t v;
    asm volatile("movq %1, %0" : "=r"(v) : "m"(*reinterpret_cast<const uint64_t*>(w + i)));
    std::memcpy(out + 4 * i, &v, 8);
  }
#endif
  for (; i < n; ++i) one(i);
}
inline void StoreWords(void* p, const uint8_t* in, size_t bytes) {
  auto* w = static_cast<uint32_t*>(p);
  const size_t n = bytes / 4;
  size_t i = 0;
  auto one = [&](size_t k) {
    uint32_t v;
    std::memcpy(&v, in + 4 * k, 4);
    std::atomic_ref<uint32_t>(w[k]).store(v, std::memory_order_relaxed);
  };
#ifdef PYFLEET_VECTOR_ROW_COPY
  if (n != 0 && reinterpret_cast<uintptr_t>(w) % 8 != 0) one(i++);
  for (; i + 2 <= n; i += 2) {
    uint64_t v;
    std::memcpy(&v, in + 4 * i, 8);
    asm volatile("movq %1, %0" : "=m"(*reinterpret_cast<uint64_t*>(w + i)) : "r"(v));
  }
#endif
  for (; i < n; ++i) one(i);
}

// The row's bytes on the stack for rows up to kStack bytes, else on the heap.
constexpr size_t kStack = 1024;
struct RowBuf {
  explicit RowBuf(size_t bytes) {
    if (bytes > kStack) heap.resize(bytes);
    p = bytes > kStack ? heap.data() : stack;
  }
  uint8_t stack[kStack];
  std::vector<uint8_t> heap;
  uint8_t* p;
};

// The smallest bf16 >= a (a >= 0), at most the largest finite bf16.
inline uint16_t Bf16Ceil(float a) {
  uint32_t b = FloatBits(a);
  if (b & 0xffffu) b = (b | 0xffffu) + 1u;
  if (b > 0x7f7f0000u) b = 0x7f7f0000u;
  return static_cast<uint16_t>(b >> 16);
}

inline uint16_t LoadScale(const uint8_t* p) {
  uint16_t s;
  std::memcpy(&s, p, 2);
  return s;
}

}  // namespace

RowLayout TableRowLayout(StorageKind storage, size_t dim, const OptimizerConfig& opt) {
  ValidateStorage(storage);
  const size_t state_dim = OptimizerStateDim(opt, dim);
  const RowLayout probe(storage, dim, state_dim, 0);
  if (!probe.q8()) return RowLayout(storage, dim, state_dim, OptimizerStateTail(opt));
  switch (opt.kind) {
    case OptimizerKind::kAdam: return RowLayout(storage, dim, state_dim, 2, 1);
    case OptimizerKind::kAdagrad: return RowLayout(storage, dim, state_dim, 0, 0);
    default: break;
  }
  ThrowInvalid("storage ", StorageName(storage), " quantises Adam's or Adagrad's state to 8 bits; ",
               OptimizerName(opt.kind), " is not supported by it (use ",
               StorageName(probe.weight_kind()), " for 16-bit rows)");
  return RowLayout();
}

#ifdef PYFLEET_ROW_SIMD
namespace {

// A full block of 16 codes decoded four lanes at a time: the scalar loop's
// conversion and multiplies (no other operation, so the same bits).
inline void DecodeBlock16(const uint8_t* c, float scale, bool sgn, float* o) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  const __m128i lo16 = _mm_unpacklo_epi8(x, x), hi16 = _mm_unpackhi_epi8(x, x);
  const __m128i q[4] = {_mm_unpacklo_epi16(lo16, lo16), _mm_unpackhi_epi16(lo16, lo16),
                        _mm_unpacklo_epi16(hi16, hi16), _mm_unpackhi_epi16(hi16, hi16)};
  // Each 32-bit lane holds its byte four times: shifted down by 24 it is the
  // byte sign-extended (signed codes) or zero-extended (root codes).
  if (sgn) {
    const __m128 step = _mm_set1_ps(scale / 127.f);
    for (int k = 0; k < 4; ++k) {
      _mm_storeu_ps(o + 4 * k, _mm_mul_ps(_mm_cvtepi32_ps(_mm_srai_epi32(q[k], 24)), step));
    }
  } else {
    const __m128 step = _mm_set1_ps(scale / 255.f);
    for (int k = 0; k < 4; ++k) {
      const __m128 v = _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(q[k], 24)), step);
      _mm_storeu_ps(o + 4 * k, _mm_mul_ps(v, v));
    }
  }
}


// Eight codes (in the low 64 bits of x) decoded, the same conversion and
// multiplies as DecodeBlock16 eight lanes at a time. No FMA in the target:
// q * q stays a separate multiply, nothing is contracted.
__attribute__((target("avx2"))) inline void Decode8Avx2(__m128i x, __m256 step, bool sgn,
                                                        float* o) {
  if (sgn) {
    _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), step));
  } else {
    const __m256 q = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)), step);
    _mm256_storeu_ps(o, _mm256_mul_ps(q, q));
  }
}

// A q8 state head of nv vectors of full blocks: codes c[nv * dim] (block
// after block), then their bf16 scales in the same order, decoded into sf.
void DecodeFull(const uint8_t* c, const uint8_t* scales, size_t nv, size_t ns, size_t dim,
                float* sf) {
  const size_t blocks = dim / kQ8Block;
  for (size_t j = 0; j < nv; ++j) {
    const bool sgn = j < ns;
    for (size_t b = 0; b < blocks; ++b, c += kQ8Block, sf += kQ8Block, scales += 2) {
      DecodeBlock16(c, Bf16ToFloat(LoadScale(scales)), sgn, sf);
    }
  }
}

__attribute__((target("avx2"))) void DecodeFullAvx2(const uint8_t* c, const uint8_t* scales,
                                                    size_t nv, size_t ns, size_t dim,
                                                    float* sf) {
  const size_t blocks = dim / kQ8Block;
  for (size_t j = 0; j < nv; ++j) {
    const bool sgn = j < ns;
    for (size_t b = 0; b < blocks; ++b, c += kQ8Block, sf += kQ8Block, scales += 2) {
      const float scale = Bf16ToFloat(LoadScale(scales));
      const __m256 step = _mm256_set1_ps(sgn ? scale / 127.f : scale / 255.f);
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
      Decode8Avx2(x, step, sgn, sf);
      Decode8Avx2(_mm_unpackhi_epi64(x, x), step, sgn, sf + 8);
    }
  }
}

}  // namespace
#endif

void Q8LoadState(const RowLayout& l, const void* s, float* sf) {
  const size_t bytes = l.state_bytes();
  if (bytes == 0) return;
#ifdef PYFLEET_ROW_SIMD
  if (l.dim % kQ8Block == 0 && bytes <= kStack) {
    alignas(16) uint8_t row[kStack];
    LoadWords(s, bytes, row);
    const size_t nv = l.q8_vectors();
    const uint8_t* scales = row + nv * l.dim;
    if (RowAvx2()) return DecodeFullAvx2(row, scales, nv, l.q8_signed, l.dim, sf);
    return DecodeFull(row, scales, nv, l.q8_signed, l.dim, sf);
  }
#endif
  RowBuf buf(bytes);
  LoadWords(s, bytes, buf.p);
  const size_t dim = l.dim, blocks = l.q8_blocks();
  const uint8_t* scales = buf.p + l.state_head();
  for (size_t j = 0; j < l.q8_vectors(); ++j) {
    const bool sgn = j < l.q8_signed;
    const uint8_t* codes = buf.p + j * dim;
    float* out = sf + j * dim;
    for (size_t b = 0; b < blocks; ++b) {
      const float scale = Bf16ToFloat(LoadScale(scales + 2 * (j * blocks + b)));
      const size_t lo = b * kQ8Block, n = std::min(dim - lo, kQ8Block);
      const uint8_t* c = codes + lo;
      float* o = out + lo;
#ifdef PYFLEET_ROW_SIMD
      if (n == kQ8Block) {
        DecodeBlock16(c, scale, sgn, o);
        continue;
      }
#endif
      if (sgn) {
        const float step = scale / 127.f;
        for (size_t i = 0; i < n; ++i) o[i] = static_cast<float>(static_cast<int8_t>(c[i])) * step;
      } else {
        const float step = scale / 255.f;
        for (size_t i = 0; i < n; ++i) {
          const float q = static_cast<float>(c[i]) * step;
          o[i] = q * q;
        }
      }
    }
  }
}

namespace {

// Codes n <= kQ8Block elements x (signed: the values; root: their square
// roots) of one block; returns the block's bf16 scale. u[i] + bias is exact
// in fp32 (16 fraction bits, 8 integer bits), so y is one rounding of
// x * inv + u + bias, truncated (y >= 0: floor) after the clamp.
inline uint16_t CodeBlock(const float* x, const float* u, size_t n, bool sgn, uint8_t* codes) {
  float a = 0.f;
  for (size_t i = 0; i < n; ++i) {
    const float v = std::fabs(x[i]);  // root: x >= 0 already
    a = v > a ? v : a;
  }
  const uint16_t sc = Bf16Ceil(a);
  const float scale = Bf16ToFloat(sc);
  if (scale == 0.f) {
    for (size_t i = 0; i < n; ++i) codes[i] = 0;
    return sc;
  }
  const float inv = (sgn ? 127.f : 255.f) / scale;
  const float bias = sgn ? 128.f : 0.f, lo = sgn ? 1.f : 0.f, hi = sgn ? 255.f : 255.f;
  int32_t c[kQ8Block];
  for (size_t i = 0; i < n; ++i) {
    float y = x[i] * inv + (u[i] + bias);
    y = y < lo ? lo : y;
    y = y > hi ? hi : y;
    c[i] = static_cast<int32_t>(y);
  }
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(c[i] - static_cast<int32_t>(bias));
  return sc;
}

#ifdef PYFLEET_ROW_SIMD
// CodeBlock for a full block of 16, four lanes at a time, in the same fp32
// operations and order (SSE2 only, so nothing is contracted into an FMA):
// the elements (signed: in; root: sqrt(max(in, 0)), NaN -> 0 as the scalar
// select), their largest |x| (max over lanes equals the running max: NaN
// never wins either), y = x * inv + (u + bias) clamped with the scalar's
// comparisons (a NaN y passes both, as there), truncated, minus bias, low
// byte. r null: u = 1/2.
inline uint16_t CodeBlock16(const float* in, const uint16_t* r, bool sgn, uint8_t* codes) {
  __m128 x[4];
  __m128 a = _mm_setzero_ps();
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  for (int k = 0; k < 4; ++k) {
    const __m128 v = _mm_loadu_ps(in + 4 * k);
    x[k] = sgn ? v : _mm_sqrt_ps(_mm_max_ps(v, _mm_setzero_ps()));
    a = _mm_max_ps(_mm_and_ps(x[k], abs_mask), a);  // |x| > a ? |x| : a
  }
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ps(a, _mm_shuffle_ps(a, a, 1));
  const uint16_t sc = Bf16Ceil(_mm_cvtss_f32(a));
  const float scale = Bf16ToFloat(sc);
  if (scale == 0.f) {
    std::memset(codes, 0, kQ8Block);
    return sc;
  }
  const __m128 inv = _mm_set1_ps((sgn ? 127.f : 255.f) / scale);
  const __m128 bias = _mm_set1_ps(sgn ? 128.f : 0.f);
  const __m128 lo = _mm_set1_ps(sgn ? 1.f : 0.f), hi = _mm_set1_ps(255.f);
  const __m128i ibias = _mm_set1_epi32(sgn ? 128 : 0), low_byte = _mm_set1_epi32(0xff);
  __m128i c[4];
  for (int k = 0; k < 4; ++k) {
    __m128 u;
    if (r) {
      const __m128i ri = _mm_unpacklo_epi16(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + 4 * k)), _mm_setzero_si128());
      u = _mm_mul_ps(_mm_cvtepi32_ps(ri), _mm_set1_ps(0x1p-16f));
    } else {
      u = _mm_set1_ps(0.5f);
    }
    __m128 y = _mm_add_ps(_mm_mul_ps(x[k], inv), _mm_add_ps(u, bias));
    y = _mm_max_ps(lo, y);  // lo > y ? lo : y, i.e. y < lo ? lo : y
    y = _mm_min_ps(hi, y);  // hi < y ? hi : y, i.e. y > hi ? hi : y
    c[k] = _mm_and_si128(_mm_sub_epi32(_mm_cvttps_epi32(y), ibias), low_byte);
  }
  const __m128i packed =
      _mm_packus_epi16(_mm_packs_epi32(c[0], c[1]), _mm_packs_epi32(c[2], c[3]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), packed);
  return sc;
}
#endif


#ifdef PYFLEET_ROW_SIMD
// CodeBlock16 eight lanes at a time, the same fp32 operations in the same
// order (no FMA in the target, so no multiply-add is contracted), the
// lanes' maximum taken in the same operand order (a NaN |x| never wins).
__attribute__((target("avx2"))) inline __m256i Code8Avx2(__m256 x, __m256 u, __m256 inv,
                                                         __m256 bias, __m256 lo, __m256 hi,
                                                         __m256i ibias) {
  __m256 y = _mm256_add_ps(_mm256_mul_ps(x, inv), _mm256_add_ps(u, bias));
  y = _mm256_min_ps(hi, _mm256_max_ps(lo, y));  // as CodeBlock16's clamp
  return _mm256_and_si256(_mm256_sub_epi32(_mm256_cvttps_epi32(y), ibias),
                          _mm256_set1_epi32(0xff));
}

__attribute__((target("avx2"))) inline uint16_t CodeBlock16Avx2(const float* in,
                                                                const uint16_t* r, bool sgn,
                                                                uint8_t* codes) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 x0 = _mm256_loadu_ps(in), x1 = _mm256_loadu_ps(in + 8);
  if (!sgn) {
    x0 = _mm256_sqrt_ps(_mm256_max_ps(x0, zero));
    x1 = _mm256_sqrt_ps(_mm256_max_ps(x1, zero));
  }
  const __m256 a8 = _mm256_max_ps(_mm256_and_ps(x1, abs_mask),
                                  _mm256_max_ps(_mm256_and_ps(x0, abs_mask), zero));
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ps(a, _mm_shuffle_ps(a, a, 1));
  const uint16_t sc = Bf16Ceil(_mm_cvtss_f32(a));
  const float scale = Bf16ToFloat(sc);
  if (scale == 0.f) {
    std::memset(codes, 0, kQ8Block);
    return sc;
  }
  const __m256 inv = _mm256_set1_ps((sgn ? 127.f : 255.f) / scale);
  const __m256 bias = _mm256_set1_ps(sgn ? 128.f : 0.f);
  const __m256 lo = _mm256_set1_ps(sgn ? 1.f : 0.f), hi = _mm256_set1_ps(255.f);
  const __m256i ibias = _mm256_set1_epi32(sgn ? 128 : 0);
  __m256 ub0 = _mm256_set1_ps(0.5f), ub1 = ub0;
  if (r) {
    const __m256 k16 = _mm256_set1_ps(0x1p-16f);
    ub0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(r)))), k16);
    ub1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(r + 8)))), k16);
  }
  const __m256i c0 = Code8Avx2(x0, ub0, inv, bias, lo, hi, ibias);
  const __m256i c1 = Code8Avx2(x1, ub1, inv, bias, lo, hi, ibias);
  // packs works within 128-bit halves: [c0 0-3, c1 0-3 | c0 4-7, c1 4-7];
  // the permute puts c0's eight before c1's.
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xd8);
  const __m128i packed =
      _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), packed);
  return sc;
}

// Codes nv vectors of full blocks of sf (the draws r, or to nearest when r
// is null) into c[nv * dim] and their scales, block after block.
void EncodeFull(const float* sf, const uint16_t* r, size_t nv, size_t ns, size_t dim,
                uint8_t* c, uint8_t* scales) {
  const size_t blocks = dim / kQ8Block;
  for (size_t j = 0; j < nv; ++j) {
    const bool sgn = j < ns;
    for (size_t b = 0; b < blocks; ++b, c += kQ8Block, sf += kQ8Block, scales += 2) {
      const uint16_t sc = CodeBlock16(sf, r, sgn, c);
      std::memcpy(scales, &sc, 2);
      if (r) r += kQ8Block;
    }
  }
}

__attribute__((target("avx2"))) void EncodeFullAvx2(const float* sf, const uint16_t* r,
                                                    size_t nv, size_t ns, size_t dim,
                                                    uint8_t* c, uint8_t* scales) {
  const size_t blocks = dim / kQ8Block;
  for (size_t j = 0; j < nv; ++j) {
    const bool sgn = j < ns;
    for (size_t b = 0; b < blocks; ++b, c += kQ8Block, sf += kQ8Block, scales += 2) {
      const uint16_t sc = CodeBlock16Avx2(sf, r, sgn, c);
      std::memcpy(scales, &sc, 2);
      if (r) r += kQ8Block;
    }
  }
}
#endif

// Adam: no m where v is 0 (signed vector k pairs with root vector ns + k)
// in a state head of nv vectors of dim codes.
void ClearSignedWhereRootZero(uint8_t* codes, size_t nv, size_t ns, size_t dim) {
  for (size_t k = 0; k < ns && ns + k < nv; ++k) {
    uint8_t* m = codes + k * dim;
    const uint8_t* v = codes + (ns + k) * dim;
    size_t i = 0;
#ifdef PYFLEET_ROW_SIMD
    for (; i + 16 <= dim; i += 16) {
      const __m128i vz = _mm_cmpeq_epi8(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)), _mm_setzero_si128());
      __m128i* mi = reinterpret_cast<__m128i*>(m + i);
      _mm_storeu_si128(mi, _mm_andnot_si128(vz, _mm_loadu_si128(mi)));
    }
#endif
    for (; i < dim; ++i) m[i] = v[i] == 0 ? 0 : m[i];
  }
}

}  // namespace

void Q8StoreState(const RowLayout& l, const float* sf, void* s, const uint16_t* r) {
  const size_t bytes = l.state_bytes();
  if (bytes == 0) return;
#ifdef PYFLEET_ROW_SIMD
  if (l.dim % kQ8Block == 0 && bytes <= kStack) {
    alignas(16) uint8_t row[kStack];
    const size_t nv = l.q8_vectors(), head = nv * l.dim;
    uint8_t* scales = row + head;
    // The last word's padding after the scales (0 to 3 bytes).
    for (size_t i = head + 2 * nv * (l.dim / kQ8Block); i < bytes; ++i) row[i] = 0;
    if (RowAvx2()) {
      EncodeFullAvx2(sf, r, nv, l.q8_signed, l.dim, row, scales);
    } else {
      EncodeFull(sf, r, nv, l.q8_signed, l.dim, row, scales);
    }
    ClearSignedWhereRootZero(row, nv, l.q8_signed, l.dim);
    StoreWords(s, row, bytes);
    return;
  }
#endif
  RowBuf buf(bytes);
  std::memset(buf.p + l.state_head(), 0, bytes - l.state_head());
  const size_t dim = l.dim, blocks = l.q8_blocks();
  uint8_t* scales = buf.p + l.state_head();
  float x[kQ8Block], u[kQ8Block];
  for (size_t j = 0; j < l.q8_vectors(); ++j) {
    const bool sgn = j < l.q8_signed;
    const float* in = sf + j * dim;
    for (size_t b = 0; b < blocks; ++b) {
      const size_t lo = b * kQ8Block, n = std::min(dim - lo, kQ8Block);
#ifdef PYFLEET_ROW_SIMD
      if (n == kQ8Block) {
        const uint16_t sc =
            CodeBlock16(in + lo, r ? r + j * dim + lo : nullptr, sgn, buf.p + j * dim + lo);
        std::memcpy(scales + 2 * (j * blocks + b), &sc, 2);
        continue;
      }
#endif
      // Branch-free loops (they vectorise: sqrtps, cvtdq2ps).
      if (sgn) {
        for (size_t i = 0; i < n; ++i) x[i] = in[lo + i];
      } else {
        for (size_t i = 0; i < n; ++i) {
          const float v = in[lo + i];
          x[i] = std::sqrt(v > 0.f ? v : 0.f);
        }
      }
      if (r) {
        const uint16_t* rr = r + j * dim + lo;
        for (size_t i = 0; i < n; ++i) u[i] = static_cast<float>(rr[i]) * 0x1p-16f;
      } else {
        for (size_t i = 0; i < n; ++i) u[i] = 0.5f;
      }
      const uint16_t sc = CodeBlock(x, u, n, sgn, buf.p + j * dim + lo);
      std::memcpy(scales + 2 * (j * blocks + b), &sc, 2);
    }
  }
  ClearSignedWhereRootZero(buf.p, l.q8_vectors(), l.q8_signed, dim);
  StoreWords(s, buf.p, bytes);
}

void Q8DerivedTail(const OptimizerConfig& opt, uint32_t count, float* tail) {
  if (opt.kind != OptimizerKind::kAdam) return;
  // PowCount of both betas in one loop: each takes the same steps.
  float r1 = 1.f, r2 = 1.f, b1 = opt.beta1, b2 = opt.beta2;
  for (uint64_t n = uint64_t{count} + 1; n != 0; n >>= 1) {
    if (n & 1) {
      r1 *= b1;
      r2 *= b2;
    }
    b1 *= b1;
    b2 *= b2;
  }
  tail[0] = r1;
  tail[1] = r2;
}

}  // namespace pyfleet

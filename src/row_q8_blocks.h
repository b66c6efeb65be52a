// The block kernels of the q8 state codec (row_q8.h states the rule): a
// block's scale, its 16 codes decoded and coded four lanes at a time (SSE2)
// or eight (AVX2), and a state row's words read and written whole, for
// row_q8.cc (a row's state loaded into and stored from fp32 scratch).
// Every form computes the scalar rule's bits: the same fp32 operations in
// the same order, nothing contracted into an FMA (no FMA target anywhere).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "pyfleet/row_encoding.h"
#include "row_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyfleet::q8 {

// A q8 state row is read and written as whole 4-byte words (relaxed
// atomics; rows are 4-byte aligned): a concurrent push may mix words of two
// updates, never tear one. On x86-64 (not under ThreadSanitizer) the
// 8-byte-aligned pairs of words are one 8-byte access written in asm (opaque
// to the compiler, so no C++ data race is formed; an aligned 8-byte access
// is single-copy atomic, so no word is split), as row_encoding.cc's Load16s.
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

// Rows whose state is at most this many bytes are staged on the stack.
constexpr size_t kStack = 1024;

inline uint16_t LoadScale(const uint8_t* p) {
  uint16_t s;
  std::memcpy(&s, p, 2);
  return s;
}

// The smallest bf16 >= a (a >= 0), at most the largest finite bf16.
inline uint16_t Bf16Ceil(float a) {
  uint32_t b = FloatBits(a);
  if (b & 0xffffu) b = (b | 0xffffu) + 1u;
  if (b > 0x7f7f0000u) b = 0x7f7f0000u;
  return static_cast<uint16_t>(b >> 16);
}

// A block's scale from its largest |x| a: the bf16 stored (bits), and the
// factor k / S its elements are coded with (k = 127 signed, 255 root). S is
// 0 exactly when bits is 0 (a = 0): the block's codes are then all 0 and
// inv (Inf) is not used. Every codec's scale setup, so every codec's bits.
struct BlockScale {
  uint16_t bits;
  float inv;
};
inline BlockScale ScaleOf(float a, bool sgn) {
  const uint16_t sc = Bf16Ceil(a);
  return {sc, (sgn ? 127.f : 255.f) / Bf16ToFloat(sc)};
}

// Adam: no m where v is 0 (signed vector k pairs with root vector ns + k)
// in a state head of nv vectors of dim codes.
inline void ClearSignedWhereRootZero(uint8_t* codes, size_t nv, size_t ns, size_t dim) {
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

#ifdef PYFLEET_ROW_SIMD
// ScaleOf the largest of four lanes' |x| (a NaN never wins, as in the
// running max of the scalar loop).
inline BlockScale ScaleOfLanes(__m128 a, bool sgn) {
  a = _mm_max_ps(a, _mm_movehl_ps(a, a));
  a = _mm_max_ps(a, _mm_shuffle_ps(a, a, 1));
  return ScaleOf(_mm_cvtss_f32(a), sgn);
}

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

// The scalar CodeBlock for a full block of 16, four lanes at a time (SSE2):
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
  const BlockScale s = ScaleOfLanes(a, sgn);
  if (s.bits == 0) {
    std::memset(codes, 0, kQ8Block);
    return 0;
  }
  const __m128 inv = _mm_set1_ps(s.inv);
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
  return s.bits;
}

// Eight codes (in the low 64 bits of x) decoded, the same conversion and
// multiplies as DecodeBlock16 eight lanes at a time. No FMA in the target:
// q * q stays a separate multiply, nothing is contracted.
__attribute__((target("avx2"))) inline __m256 Decode8Avx2(__m128i x, __m256 step, bool sgn) {
  if (sgn) return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), step);
  const __m256 q = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)), step);
  return _mm256_mul_ps(q, q);
}

// A block's 16 codes at c with its bf16 scale, decoded into x[0] (elements
// 0-7) and x[1] (8-15).
__attribute__((target("avx2"))) inline void Decode16Avx2(const uint8_t* c, uint16_t scale,
                                                         bool sgn, __m256* x) {
  const float s = Bf16ToFloat(scale);
  const __m256 step = _mm256_set1_ps(sgn ? s / 127.f : s / 255.f);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  x[0] = Decode8Avx2(q, step, sgn);
  x[1] = Decode8Avx2(_mm_unpackhi_epi64(q, q), step, sgn);
}

// CodeBlock16 eight lanes at a time, the same fp32 operations in the same
// order, the lanes' maximum taken in the same operand order (a NaN |x|
// never wins), on a block held in x[0] and x[1] (signed: the values; root:
// sqrt(max(v, 0)) of the values already). Returns the scale's bits.
__attribute__((target("avx2"))) inline __m256i Code8Avx2(__m256 x, __m256 u, __m256 inv,
                                                         __m256 bias, __m256 lo, __m256 hi,
                                                         __m256i ibias) {
  __m256 y = _mm256_add_ps(_mm256_mul_ps(x, inv), _mm256_add_ps(u, bias));
  y = _mm256_min_ps(hi, _mm256_max_ps(lo, y));  // as CodeBlock16's clamp
  return _mm256_and_si256(_mm256_sub_epi32(_mm256_cvttps_epi32(y), ibias),
                          _mm256_set1_epi32(0xff));
}

__attribute__((target("avx2"))) inline uint16_t Code16Avx2(const __m256* x, const uint16_t* r,
                                                           bool sgn, uint8_t* codes) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 a8 =
      _mm256_max_ps(_mm256_and_ps(x[1], abs_mask),
                    _mm256_max_ps(_mm256_and_ps(x[0], abs_mask), _mm256_setzero_ps()));
  __m128 a = _mm_max_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
  const BlockScale s = ScaleOfLanes(a, sgn);
  if (s.bits == 0) {
    std::memset(codes, 0, kQ8Block);
    return 0;
  }
  const __m256 inv = _mm256_set1_ps(s.inv);
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
  const __m256i c0 = Code8Avx2(x[0], ub0, inv, bias, lo, hi, ibias);
  const __m256i c1 = Code8Avx2(x[1], ub1, inv, bias, lo, hi, ibias);
  // packs works within 128-bit halves: [c0 0-3, c1 0-3 | c0 4-7, c1 4-7];
  // the permute puts c0's eight before c1's.
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(c0, c1), 0xd8);
  const __m128i packed =
      _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), packed);
  return s.bits;
}

// The root form's coded element: sqrt(max(v, 0)) (NaN -> 0), as CodeBlock16.
__attribute__((target("avx2"))) inline __m256 RootOf(__m256 v) {
  return _mm256_sqrt_ps(_mm256_max_ps(v, _mm256_setzero_ps()));
}
#endif

}  // namespace pyfleet::q8

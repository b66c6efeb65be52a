// Four-lane SSE2 forms of row_encoding.h's conversions, for the row codecs
// and the pull path. SSE2 is part of x86-64, so nothing here needs a build
// flag or a runtime check; elsewhere PYFLEET_ROW_SIMD is undefined and the
// callers use the scalar rule. Each function computes exactly what the
// scalar rule computes, lane by lane (the tests compare both with numpy).
#pragma once

// Whether rows that pushes may be writing (Hogwild) may be copied with
// vector loads and stores written in asm: x86-64, and not under
// ThreadSanitizer (whose race model needs to see every access; it gets the
// relaxed-atomic loops, the same values).
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define PYFLEET_VECTOR_ROW_COPY 1
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#undef PYFLEET_VECTOR_ROW_COPY
#endif
#endif
#endif

#if defined(__x86_64__)
#define PYFLEET_ROW_SIMD 1
#include <emmintrin.h>

#include <cstdint>

#include "pyfleet/row_encoding.h"

namespace pyfleet {

// Whether the AVX2 forms of the row codecs run (row_encoding.cc's 16-bit
// loads and stores, row_q8.cc's blocks): the CPU has AVX2 and F16C (checked
// at run time; the build assumes x86-64's SSE2 only) and the environment
// variable PYFLEET_NO_AVX2 is unset, empty or "0" (the tests set it to run
// the SSE2 forms, which compute the same bits).
// Set when the library is loaded; hidden, so read without a GOT lookup.
extern const bool kRowAvx2 __attribute__((visibility("hidden")));
inline bool RowAvx2() { return kRowAvx2; }

namespace simd {

inline __m128i Select(__m128i mask, __m128i yes, __m128i no) {
  return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no));
}

// Four 16-bit elements (zero-extended in 32-bit lanes) -> four floats, as
// row_encoding.h's scalar rule: bf16 is a shift; fp16 rebiases the exponent,
// converts a subnormal's mantissa as an integer, maps exponent 31 to Inf/NaN.
template <StorageKind S>
inline __m128 Widen4(__m128i x) {
  if constexpr (S == StorageKind::kBF16) {
    return _mm_castsi128_ps(_mm_slli_epi32(x, 16));
  } else {
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(x, _mm_set1_epi32(0x8000)), 16);
    const __m128i mag = _mm_slli_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7fff)), 13);
    const __m128i exp = _mm_and_si128(x, _mm_set1_epi32(0x7c00));
    const __m128i normal = _mm_add_epi32(mag, _mm_set1_epi32(112 << 23));
    const __m128 sub = _mm_mul_ps(_mm_cvtepi32_ps(_mm_and_si128(x, _mm_set1_epi32(0x3ff))),
                                  _mm_set1_ps(0x1p-24f));
    const __m128i big = _mm_or_si128(mag, _mm_set1_epi32(0x7f800000));
    const __m128i bits =
        Select(_mm_cmpeq_epi32(exp, _mm_set1_epi32(0x7c00)), big,
               Select(_mm_cmpeq_epi32(exp, _mm_setzero_si128()), _mm_castps_si128(sub), normal));
    return _mm_castsi128_ps(_mm_or_si128(bits, sign));
  }
}

// Four floats and their 16 random bits (zero-extended in 32-bit lanes) ->
// four 16-bit results in 32-bit lanes: NarrowStochastic lane by lane.
template <StorageKind S>
inline __m128i NarrowStochastic4(__m128 v, __m128i r) {
  const __m128i bits = _mm_castps_si128(v);
  const __m128i a = _mm_and_si128(bits, _mm_set1_epi32(0x7fffffff));
  const __m128i special = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f7fffff));  // Inf/NaN
  const __m128i nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000));
  if constexpr (S == StorageKind::kBF16) {
    __m128i b = _mm_srli_epi32(_mm_add_epi32(bits, r), 16);  // no carry out: bits < 0xff800000
    const __m128i over =
        _mm_cmpgt_epi32(_mm_and_si128(b, _mm_set1_epi32(0x7fff)), _mm_set1_epi32(0x7f7f));
    b = Select(over, _mm_or_si128(_mm_and_si128(b, _mm_set1_epi32(0x8000)),
                                  _mm_set1_epi32(0x7f7f)), b);
    const __m128i kept = _mm_or_si128(_mm_srli_epi32(bits, 16),
                                      _mm_and_si128(nan, _mm_set1_epi32(0x40)));
    return Select(special, kept, b);
  } else {
    const __m128i sign = _mm_and_si128(_mm_srli_epi32(bits, 16), _mm_set1_epi32(0x8000));
    // A normal half: r's top 13 bits into the 13 dropped bits, saturating.
    __m128i hn = _mm_sub_epi32(_mm_srli_epi32(_mm_add_epi32(a, _mm_srli_epi32(r, 3)), 13),
                               _mm_set1_epi32(112 << 10));
    hn = Select(_mm_cmpgt_epi32(hn, _mm_set1_epi32(0x7bff)), _mm_set1_epi32(0x7bff), hn);
    // A subnormal half: floor(x + r / 2^16) with x = |f| * 2^24 (exact, < 2^10)
    // = floor(x) + (r + floor(frac(x) * 2^16) >= 2^16), every step exact.
    const __m128 x = _mm_mul_ps(_mm_castsi128_ps(a), _mm_set1_ps(0x1p24f));
    const __m128i n = _mm_cvttps_epi32(x);
    const __m128 frac = _mm_sub_ps(x, _mm_cvtepi32_ps(n));
    const __m128i t = _mm_cvttps_epi32(_mm_mul_ps(frac, _mm_set1_ps(0x1p16f)));
    const __m128i up = _mm_cmpgt_epi32(_mm_add_epi32(r, t), _mm_set1_epi32(0xffff));
    const __m128i hs = _mm_sub_epi32(n, up);
    const __m128i normal = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x387fffff));
    const __m128i inf_nan = Select(nan, _mm_set1_epi32(0x7e00), _mm_set1_epi32(0x7c00));
    return _mm_or_si128(sign, Select(special, inf_nan, Select(normal, hn, hs)));
  }
}

// Four 32-bit lanes holding 16-bit values -> their low 16 bits, packed in
// the low 64 bits (sign-extended first so the saturating pack keeps them).
inline __m128i Pack4(__m128i x) {
  const __m128i s = _mm_srai_epi32(_mm_slli_epi32(x, 16), 16);
  return _mm_packs_epi32(s, s);
}

}  // namespace simd
}  // namespace pyfleet
#endif

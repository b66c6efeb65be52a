// Copy kernels of the sparse table's paths: whole-float loads and stores of
// rows that pushes may be writing (Hogwild), cache-line prefetches, and the
// row copies of a pull (fp32 rows, and 16-bit rows widened on the way).
// Beside row_simd.h, whose conversions the compact copies use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "pyfleet/row_encoding.h"
#include "row_simd.h"

namespace pyfleet {

// The intentional Hogwild races go through relaxed atomics: defined
// behaviour, plain moves on x86, and invisible to ThreadSanitizer.
inline float LoadRelaxed(const float* p) {
  return std::atomic_ref<float>(*const_cast<float*>(p)).load(std::memory_order_relaxed);
}
inline void StoreRelaxed(float* p, float v) {
  std::atomic_ref<float>(*p).store(v, std::memory_order_relaxed);
}
template <typename T>
inline T LoadField(T* p) {
  return std::atomic_ref<T>(*p).load(std::memory_order_relaxed);
}
template <typename T>
inline void StoreField(T* p, T v) {
  std::atomic_ref<T>(*p).store(v, std::memory_order_relaxed);
}

// Prefetches [p, p + bytes). With write = true, with intent to write: the
// lines arrive ready to be modified, so an update's stores need no second
// trip for ownership (x86 without PRFCHW decodes prefetchw as a no-op).
// Every cache line the span touches: a row that is not line-aligned (a
// state row of 36, 72 or 136 bytes) may straddle one more line than
// bytes / 64.
inline void PrefetchSpan(const void* p, size_t bytes, bool write = false) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
  for (uintptr_t at = first; at < end; at += 64) {
    const char* line = reinterpret_cast<const char*>(at);
    if (!write) {
      __builtin_prefetch(line);
    } else {
#if defined(__x86_64__)
      asm volatile("prefetchw %0" : : "m"(*line));
#else
      __builtin_prefetch(line, 1);
#endif
    }
  }
}

// dst[0, D) = src[0, D) for a row that pushes may be writing (Hogwild): each
// float is read whole. D > 0 is a multiple of 4 and src is 16-byte aligned
// (rows are dim * 4 bytes apart from a page-aligned start). On x86-64 the
// copy is 16-byte aligned SSE loads written in asm: opaque to the compiler
// (so no C++ data race is formed) and never splitting a float (an aligned
// 16-byte load is done in at most two aligned 8-byte halves); a quarter of
// the loads of the relaxed-atomic loop, which made most of a pull's
// instructions. Elsewhere, and under TSan, that loop.
template <size_t D>
inline void CopyRowRelaxed(float* dst, const float* src) {
  static_assert(D > 0 && D % 4 == 0);
#ifdef PYFLEET_VECTOR_ROW_COPY
#pragma GCC unroll 16
  for (size_t c = 0; c < D; c += 4) {
    __m128 v;
    asm volatile("movaps %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const __m128*>(src + c)));
    _mm_storeu_ps(dst + c, v);
  }
#else
#pragma GCC unroll 64
  for (size_t c = 0; c < D; ++c) dst[c] = LoadRelaxed(src + c);
#endif
}

#ifdef PYFLEET_VECTOR_ROW_COPY
// Eight 16-bit elements at p (16-byte aligned) in one load written in asm,
// as CopyRowRelaxed's.
inline __m128i LoadHalves8(const char* p) {
  __m128i v;
  asm volatile("movdqa %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const __m128i*>(p)));
  return v;
}
// Whether a lane of x, fp16 magnitudes (sign cleared), is a NaN.
inline bool AnyHalfNaN(__m128i x) {
  return _mm_movemask_epi8(_mm_cmpgt_epi16(x, _mm_set1_epi16(0x7c00))) != 0;
}
// dst[0, 8) = the halves of v by vcvtph2ps (VEX-128 in asm, for the reason
// CopyCompactRowRelaxed gives).
inline void WidenHalves8F16C(__m128i v, float* dst) {
  __m128 lo, hi;
  asm("vcvtph2ps %1, %0" : "=x"(lo) : "x"(v));
  asm("vcvtph2ps %1, %0" : "=x"(hi) : "x"(_mm_unpackhi_epi64(v, v)));
  _mm_storeu_ps(dst, lo);
  _mm_storeu_ps(dst + 4, hi);
}
// The same by the SSE2 form, which keeps a NaN's bits.
inline void WidenHalves8(__m128i v, float* dst) {
  const __m128i z = _mm_setzero_si128();
  _mm_storeu_ps(dst, simd::Widen4<StorageKind::kFP16>(_mm_unpacklo_epi16(v, z)));
  _mm_storeu_ps(dst + 4, simd::Widen4<StorageKind::kFP16>(_mm_unpackhi_epi16(v, z)));
}
#endif

// CopyRowRelaxed for a compact row: the D 16-bit elements are read whole the
// same way (D % 8 == 0, so rows are 16-byte aligned), then widened.
template <size_t D, StorageKind S>
inline void CopyCompactRowRelaxed(float* dst, const char* src) {
  static_assert(D > 0 && D % 8 == 0 && S != StorageKind::kFP32);
#ifdef PYFLEET_VECTOR_ROW_COPY
  if constexpr (S == StorageKind::kFP16) {
    // With F16C (RowAvx2 implies it) the halves are widened in the register
    // they were loaded into, in this loop: the call per row through the PLT
    // to WidenN, its dispatch and the round trip through a buffer made an
    // fp16 pull ~25% slower than a bf16 one. The conversions are VEX-128 in
    // asm (this function is built for SSE2 only; VEX-128 leaves no upper
    // state dirty), and a group holding a NaN takes the SSE2 form, as
    // WidenHalvesF16C does (vcvtph2ps quiets a signalling NaN). One NaN test
    // covers 16 halves (the larger magnitude of each pair of lanes): a test
    // per 8 cost a cache-resident pull ~5% against bf16's shift.
    if (RowAvx2()) {
      size_t c = 0;
#pragma GCC unroll 8
      for (; c + 16 <= D; c += 16) {
        const __m128i v0 = LoadHalves8(src + 2 * c), v1 = LoadHalves8(src + 2 * c + 16);
        const __m128i m = _mm_set1_epi16(0x7fff);
        if (__builtin_expect(!AnyHalfNaN(_mm_max_epi16(_mm_and_si128(v0, m),
                                                       _mm_and_si128(v1, m))),
                             1)) {
          WidenHalves8F16C(v0, dst + c);
          WidenHalves8F16C(v1, dst + c + 8);
        } else {
          WidenHalves8(v0, dst + c);
          WidenHalves8(v1, dst + c + 8);
        }
      }
      if constexpr (D % 16 != 0) {
        const __m128i v = LoadHalves8(src + 2 * c);
        if (__builtin_expect(!AnyHalfNaN(_mm_and_si128(v, _mm_set1_epi16(0x7fff))), 1)) {
          WidenHalves8F16C(v, dst + c);
        } else {
          WidenHalves8(v, dst + c);
        }
      }
      return;
    }
  }
#endif
  alignas(16) uint16_t buf[D];
#ifdef PYFLEET_VECTOR_ROW_COPY
#pragma GCC unroll 16
  for (size_t c = 0; c < D; c += 8) {
    __m128i v;
    asm volatile("movdqa %1, %0" : "=x"(v) : "m"(*reinterpret_cast<const __m128i*>(src + 2 * c)));
    _mm_store_si128(reinterpret_cast<__m128i*>(buf + c), v);
  }
#else
  const uint16_t* p = reinterpret_cast<const uint16_t*>(src);
#pragma GCC unroll 64
  for (size_t c = 0; c < D; ++c) buf[c] = LoadField(const_cast<uint16_t*>(p + c));
#endif
#ifdef PYFLEET_ROW_SIMD
  if constexpr (S == StorageKind::kFP16) {
    WidenN(S, buf, D, dst);  // F16C where the CPU has it
    return;
  }
  for (size_t c = 0; c < D; c += 8) {
    const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(buf + c));
    _mm_storeu_ps(dst + c, simd::Widen4<S>(_mm_unpacklo_epi16(v, _mm_setzero_si128())));
    _mm_storeu_ps(dst + c + 4, simd::Widen4<S>(_mm_unpackhi_epi16(v, _mm_setzero_si128())));
  }
#else
  for (size_t c = 0; c < D; ++c) dst[c] = WidenElem(S, buf[c]);
#endif
}

}  // namespace pyfleet

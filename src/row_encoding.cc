#include "pyfleet/row_encoding.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"
#include "pyfleet/internal/row_q8.h"
#include "row_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyfleet {

#ifdef PYFLEET_ROW_SIMD
namespace {
bool DetectRowAvx2() {
  const char* off = std::getenv("PYFLEET_NO_AVX2");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
         !(off && *off && std::strcmp(off, "0") != 0);
}
}  // namespace
const bool kRowAvx2 = DetectRowAvx2();
#endif

namespace {

// Rows are Hogwild: every element is read and written whole (relaxed atomics).
inline uint16_t Load16(const void* p, size_t i) {
  return std::atomic_ref<uint16_t>(const_cast<uint16_t*>(static_cast<const uint16_t*>(p))[i])
      .load(std::memory_order_relaxed);
}
inline void Store16(void* p, size_t i, uint16_t v) {
  std::atomic_ref<uint16_t>(static_cast<uint16_t*>(p)[i]).store(v, std::memory_order_relaxed);
}
inline float Load32(const void* p, size_t i) {
  return std::atomic_ref<float>(const_cast<float*>(static_cast<const float*>(p))[i])
      .load(std::memory_order_relaxed);
}
inline void Store32(void* p, size_t i, float v) {
  std::atomic_ref<float>(static_cast<float*>(p)[i]).store(v, std::memory_order_relaxed);
}

// Rows are converted in chunks on the stack: one update's elements, and a
// vector loop over them instead of one call per element.
constexpr size_t kChunk = 64;

#ifdef PYFLEET_ROW_SIMD
// fp16 rounding with F16C where the CPU has it (checked at run time: the
// build assumes only x86-64's SSE2). A group of four normal halves is r's
// top 13 bits added to the magnitudes and one conversion rounding toward
// zero, which drops the 13 bits and saturates at 65504 like the rule; a
// group with a subnormal, zero, Inf or NaN takes the SSE2 form.
bool HasF16C() {
  static const bool has = __builtin_cpu_supports("f16c");
  return has;
}

// Four halves of v[0, 4) with the draws r[0, 4), in the low 64 bits.
__attribute__((target("f16c"))) inline __m128i NarrowHalves4F16C(const float* v,
                                                                  const uint16_t* r) {
  {
    const __m128 x = _mm_loadu_ps(v);
    const __m128i ri = _mm_unpacklo_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r)), _mm_setzero_si128());
    const __m128i a = _mm_and_si128(_mm_castps_si128(x), _mm_set1_epi32(0x7fffffff));
    const __m128i normal = _mm_andnot_si128(_mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f7fffff)),
                                            _mm_cmpgt_epi32(a, _mm_set1_epi32(0x387fffff)));
    __m128i h;
    if (_mm_movemask_ps(_mm_castsi128_ps(normal)) == 0xf) {
      const __m128i added = _mm_add_epi32(_mm_castps_si128(x), _mm_srli_epi32(ri, 3));
      h = _mm_cvtps_ph(_mm_castsi128_ps(added), _MM_FROUND_TO_ZERO);
    } else {
      h = simd::Pack4(simd::NarrowStochastic4<StorageKind::kFP16>(x, ri));
    }
    return h;
  }
}

__attribute__((target("f16c"))) void NarrowHalvesF16C(const float* v, const uint16_t* r,
                                                       size_t n, uint16_t* out) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), NarrowHalves4F16C(v + i, r + i));
  }
  for (; i < n; ++i) out[i] = HalfRound(v[i], r[i], false);
}
#endif

#ifdef PYFLEET_ROW_SIMD
// fp16 widening with F16C, eight at a time: exact like the rule, except that
// the instruction quiets a signalling NaN, so a group holding any NaN takes
// the SSE2 form (NaN bits are kept as they are).
__attribute__((target("f16c"))) void WidenHalvesF16C(const uint16_t* h, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7fff)),
                                        _mm_set1_epi16(0x7c00));
    if (_mm_movemask_epi8(nan) == 0) {
      _mm_storeu_ps(out + i, _mm_cvtph_ps(x));
      _mm_storeu_ps(out + i + 4, _mm_cvtph_ps(_mm_unpackhi_epi64(x, x)));
    } else {
      const __m128i z = _mm_setzero_si128();
      _mm_storeu_ps(out + i, simd::Widen4<StorageKind::kFP16>(_mm_unpacklo_epi16(x, z)));
      _mm_storeu_ps(out + i + 4, simd::Widen4<StorageKind::kFP16>(_mm_unpackhi_epi16(x, z)));
    }
  }
  for (; i < n; ++i) out[i] = HalfToFloat(h[i]);
}
#endif

template <StorageKind S>
void WidenElems(const uint16_t* h, size_t n, float* out) {
  size_t i = 0;
#ifdef PYFLEET_ROW_SIMD
  if constexpr (S == StorageKind::kFP16) {
    if (HasF16C()) return WidenHalvesF16C(h, n, out);
  }
  for (; i + 4 <= n; i += 4) {
    const __m128i x = _mm_unpacklo_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(h + i)), _mm_setzero_si128());
    _mm_storeu_ps(out + i, simd::Widen4<S>(x));
  }
#endif
  for (; i < n; ++i) out[i] = WidenElem(S, h[i]);
}

#ifdef PYFLEET_ROW_SIMD
// Four 16-bit results of v[0, 4) with the draws r[0, 4) (SSE2), in the low
// 64 bits.
template <StorageKind S>
inline __m128i Narrow4(const float* v, const uint16_t* r) {
  {
    const __m128i ri = _mm_unpacklo_epi16(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r)), _mm_setzero_si128());
    const __m128 x = _mm_loadu_ps(v);
    if constexpr (S == StorageKind::kBF16) {
      // Four finite values below the largest finite bf16's rounding range
      // (the common case): the rule is the add and the shift alone, and no
      // carry reaches the sign. The arithmetic shift sign-extends the kept
      // half, so the saturating pack keeps it exactly.
      const __m128i a = _mm_and_si128(_mm_castps_si128(x), _mm_set1_epi32(0x7fffffff));
      if (_mm_movemask_ps(_mm_castsi128_ps(_mm_cmplt_epi32(a, _mm_set1_epi32(0x7f7f0000)))) ==
          0xf) {
        const __m128i b = _mm_srai_epi32(_mm_add_epi32(_mm_castps_si128(x), ri), 16);
        return _mm_packs_epi32(b, b);
      }
    }
    return simd::Pack4(simd::NarrowStochastic4<S>(x, ri));
  }
}
#endif

template <StorageKind S>
void NarrowElems(const float* v, const uint16_t* r, size_t n, uint16_t* out) {
  size_t i = 0;
#ifdef PYFLEET_ROW_SIMD
  if constexpr (S == StorageKind::kFP16) {
    if (HasF16C()) return NarrowHalvesF16C(v, r, n, out);
  }
  for (; i + 4 <= n; i += 4) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), Narrow4<S>(v + i, r + i));
  }
#endif
  for (; i < n; ++i) out[i] = NarrowStochastic(S, v[i], r[i]);
}


// out[0, n) = the 16-bit elements at p, each read whole. On x86-64 the
// 8-byte-aligned groups of four are one 8-byte load in asm (opaque to the
// compiler, so no C++ data race is formed; an aligned 8-byte access is
// single-copy atomic, so no element is split): a quarter of the loads.
inline void Load16s(const void* p, size_t n, uint16_t* out) {
  size_t i = 0;
#ifdef PYFLEET_VECTOR_ROW_COPY
  const auto* q = static_cast<const uint16_t*>(p);
  for (; i < n && reinterpret_cast<uintptr_t>(q + i) % 8 != 0; ++i) out[i] = Load16(p, i);
  for (; i + 4 <= n; i += 4) {
    uint64_t v;
    asm volatile("movq %1, %0" : "=r"(v) : "m"(*reinterpret_cast<const uint64_t*>(q + i)));
    std::memcpy(out + i, &v, sizeof(v));
  }
#endif
  for (; i < n; ++i) out[i] = Load16(p, i);
}

// The stores of Load16s: p[0, n) = in[0, n), each element written whole.
inline void Store16s(void* p, const uint16_t* in, size_t n) {
  size_t i = 0;
#ifdef PYFLEET_VECTOR_ROW_COPY
  auto* q = static_cast<uint16_t*>(p);
  for (; i < n && reinterpret_cast<uintptr_t>(q + i) % 8 != 0; ++i) Store16(p, i, in[i]);
  for (; i + 4 <= n; i += 4) {
    uint64_t v;
    std::memcpy(&v, in + i, sizeof(v));
    asm volatile("movq %1, %0" : "=m"(*reinterpret_cast<uint64_t*>(q + i)) : "r"(v));
  }
#endif
  for (; i < n; ++i) Store16(p, i, in[i]);
}

#ifdef PYFLEET_VECTOR_ROW_COPY
// Four 16-bit elements at q (8-byte aligned) in one 8-byte load written in
// asm, as Load16s, but straight into a vector register.
inline __m128i Load4Relaxed(const uint16_t* q) {
  __m128i x;
  asm volatile("movq %1, %0" : "=x"(x) : "m"(*reinterpret_cast<const uint64_t*>(q)));
  return x;
}

// LoadElems without the round trip through a buffer on the stack: the
// elements up to an 8-byte boundary one by one, then four per load widened
// in the register (bf16: the shift of Widen4; fp16: LoadHalvesF16C), the
// rest one by one. The same loads and the same conversions, so the same bits.
template <StorageKind S>
inline size_t LoadHead(const uint16_t* q, size_t n, float* out) {
  size_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(q + i) % 8 != 0; ++i) {
    out[i] = WidenElem(S, Load16(q, i));
  }
  return i;
}

__attribute__((target("f16c"))) void LoadHalvesF16C(const uint16_t* q, size_t n, float* out) {
  size_t i = LoadHead<StorageKind::kFP16>(q, n, out);
  for (; i + 4 <= n; i += 4) {
    const __m128i x = Load4Relaxed(q + i);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7fff)),
                                        _mm_set1_epi16(0x7c00));
    // Only the low four lanes were loaded (the upper ones are zero).
    if (_mm_movemask_epi8(nan) == 0) {
      _mm_storeu_ps(out + i, _mm_cvtph_ps(x));
    } else {
      _mm_storeu_ps(out + i,
                    simd::Widen4<StorageKind::kFP16>(_mm_unpacklo_epi16(x, _mm_setzero_si128())));
    }
  }
  for (; i < n; ++i) out[i] = HalfToFloat(Load16(q, i));
}

// Eight 16-bit elements at q (8-byte aligned) in two 8-byte loads written
// in asm (VEX forms: no SSE/AVX transition in the AVX2 loops).
__attribute__((target("avx2"))) inline __m128i Load8Relaxed(const uint16_t* q) {
  __m128i x;
  asm volatile("vmovq %1, %0\n\tvmovhps %2, %0, %0"
               : "=&x"(x)
               : "m"(*reinterpret_cast<const uint64_t*>(q)),
                 "m"(*reinterpret_cast<const uint64_t*>(q + 4)));
  return x;
}

// Eight elements (one a NaN) by the SSE2 form. Out of line: its constants
// stay out of the common loop. Built for AVX2 like its caller, so its
// operations are VEX forms: legacy SSE ones, reached from the AVX2 loop with
// the upper halves of the ymm registers dirty and no vzeroupper before the
// call, cost a state transition each way (here some 200 ns a call).
template <StorageKind S>
__attribute__((noinline, target("avx2,f16c"))) void Widen8Rare(__m128i x, float* out) {
  const __m128i z = _mm_setzero_si128();
  _mm_storeu_ps(out, simd::Widen4<S>(_mm_unpacklo_epi16(x, z)));
  _mm_storeu_ps(out + 4, simd::Widen4<S>(_mm_unpackhi_epi16(x, z)));
}

// LoadElems eight lanes at a time with AVX2 (and F16C for fp16; NaN groups
// take the SSE2 form as LoadHalvesF16C): the same loads, the same bits.
template <StorageKind S>
__attribute__((target("avx2,f16c"))) void LoadElemsAvx2(const uint16_t* q, size_t n,
                                                       float* out) {
  size_t i = LoadHead<S>(q, n, out);
  for (; i + 8 <= n; i += 8) {
    const __m128i x = Load8Relaxed(q + i);
    if constexpr (S == StorageKind::kBF16) {
      _mm256_storeu_ps(out + i,
                       _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16)));
    } else {
      const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7fff)),
                                          _mm_set1_epi16(0x7c00));
      if (_mm_movemask_epi8(nan) == 0) {
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(x));
      } else {
        Widen8Rare<S>(x, out + i);
      }
    }
  }
  if (i + 4 <= n) {
    const __m128i x = _mm_unpacklo_epi16(Load4Relaxed(q + i), _mm_setzero_si128());
    _mm_storeu_ps(out + i, simd::Widen4<S>(x));
    i += 4;
  }
  for (; i < n; ++i) out[i] = WidenElem(S, Load16(q, i));
}

template <StorageKind S>
void LoadElems(const void* p, size_t n, float* out) {
  const auto* q = static_cast<const uint16_t*>(p);
  if (RowAvx2()) return LoadElemsAvx2<S>(q, n, out);
  if constexpr (S == StorageKind::kFP16) {
    if (HasF16C()) return LoadHalvesF16C(q, n, out);
  }
  size_t i = LoadHead<S>(q, n, out);
  for (; i + 4 <= n; i += 4) {
    _mm_storeu_ps(out + i, simd::Widen4<S>(_mm_unpacklo_epi16(Load4Relaxed(q + i),
                                                               _mm_setzero_si128())));
  }
  for (; i < n; ++i) out[i] = WidenElem(S, Load16(q, i));
}
#else
template <StorageKind S>
void LoadElems(const void* p, size_t n, float* out) {
  uint16_t h[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t len = std::min(kChunk, n - c);
    Load16s(static_cast<const uint16_t*>(p) + c, len, h);
    WidenElems<S>(h, len, out + c);
  }
}
#endif

// The draws of elements [e0, e0 + n) of the stream z (n <= kChunk): whole
// steps of the generator, eight draws each, into buf; returns where element
// e0's draw is. Four 32-bit xorshift lanes (13, 17, 5), seeded from z and
// Mix64(z + kRoundStep) with their lowest bit set (never the zero state);
// step t + 1's 128 bits are the draws of elements 8t .. 8t + 7, lane k's low
// then high half at 2k, 2k + 1. Six vector operations per eight draws where
// the hash took two multiplies and six shifts and xors per four.
inline const uint16_t* Draws(uint64_t z, size_t e0, size_t n, uint16_t* buf) {
  const size_t t0 = e0 / 8, t1 = (e0 + n + 7) / 8;
  const uint64_t z2 = Mix64(z + kRoundStep);
#ifdef PYFLEET_ROW_SIMD
  __m128i x = _mm_or_si128(_mm_set_epi64x(static_cast<long long>(z2), static_cast<long long>(z)),
                           _mm_set1_epi32(1));
  auto step = [&x] {
    x = _mm_xor_si128(x, _mm_slli_epi32(x, 13));
    x = _mm_xor_si128(x, _mm_srli_epi32(x, 17));
    x = _mm_xor_si128(x, _mm_slli_epi32(x, 5));
  };
  for (size_t t = 0; t < t0; ++t) step();
  for (size_t t = t0; t < t1; ++t) {
    step();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(buf + 8 * (t - t0)), x);
  }
#else
  uint32_t x[4] = {static_cast<uint32_t>(z) | 1u, static_cast<uint32_t>(z >> 32) | 1u,
                   static_cast<uint32_t>(z2) | 1u, static_cast<uint32_t>(z2 >> 32) | 1u};
  auto step = [&x] {
    for (uint32_t& v : x) {
      v ^= v << 13;
      v ^= v >> 17;
      v ^= v << 5;
    }
  };
  for (size_t t = 0; t < t0; ++t) step();
  for (size_t t = t0; t < t1; ++t) {
    step();
    uint16_t* q = buf + 8 * (t - t0);
    for (int k = 0; k < 4; ++k) {
      q[2 * k] = static_cast<uint16_t>(x[k]);
      q[2 * k + 1] = static_cast<uint16_t>(x[k] >> 16);
    }
  }
#endif
  return buf + e0 % 8;
}

#ifdef PYFLEET_VECTOR_ROW_COPY
// q[0, n) = the rounded v[0, n) with the draws r, without the round trip
// through a buffer on the stack: elements up to an 8-byte boundary one by
// one, then four rounded in a register per asm 8-byte store (as Store16s),
// the rest one by one. The same rule on the same draws, so the same bits.
template <StorageKind S>
inline void StoreNarrowedTail(const float* v, const uint16_t* r, size_t i, size_t n,
                              uint16_t* q) {
  for (; i < n; ++i) Store16(q, i, NarrowStochastic(S, v[i], r[i]));
}
template <StorageKind S>
inline size_t StoreNarrowedHead(const float* v, const uint16_t* r, size_t n, uint16_t* q) {
  size_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(q + i) % 8 != 0; ++i) {
    Store16(q, i, NarrowStochastic(S, v[i], r[i]));
  }
  return i;
}
inline void Store4Relaxed(uint16_t* q, __m128i h) {
  asm volatile("movq %1, %0" : "=m"(*reinterpret_cast<uint64_t*>(q)) : "x"(h));
}

__attribute__((target("f16c"))) void StoreHalvesF16C(const float* v, const uint16_t* r,
                                                      size_t n, uint16_t* q) {
  size_t i = StoreNarrowedHead<StorageKind::kFP16>(v, r, n, q);
  for (; i + 4 <= n; i += 4) Store4Relaxed(q + i, NarrowHalves4F16C(v + i, r + i));
  StoreNarrowedTail<StorageKind::kFP16>(v, r, i, n, q);
}

// Eight 16-bit results in x stored at q (8-byte aligned) in two 8-byte
// stores written in asm (VEX forms), as Store4Relaxed.
__attribute__((target("avx2"))) inline void Store8Relaxed(uint16_t* q, __m128i x) {
  asm volatile("vmovq %2, %0\n\tvmovhps %2, %1"
               : "=m"(*reinterpret_cast<uint64_t*>(q)),
                 "=m"(*reinterpret_cast<uint64_t*>(q + 4))
               : "x"(x));
}

// Eight results of a group with a lane off the fast path, by the four-lane
// forms. Out of line: their constants stay out of the common loop. In VEX
// forms, as Widen8Rare: an fp16 group with a zero or a subnormal comes here
// (about one row in ten of a table initialised in +-0.01), and its legacy
// SSE code cost an fp16 push ~20% against bf16 in bench_storage.
template <StorageKind S>
__attribute__((noinline, target("avx2,f16c"))) __m128i Narrow8Rare(const float* v,
                                                                   const uint16_t* r) {
  if constexpr (S == StorageKind::kFP16) {
    return _mm_unpacklo_epi64(NarrowHalves4F16C(v, r), NarrowHalves4F16C(v + 4, r + 4));
  } else {
    return _mm_unpacklo_epi64(Narrow4<S>(v, r), Narrow4<S>(v + 4, r + 4));
  }
}

// StoreNarrowed eight lanes at a time with AVX2 (F16C for fp16): a group of
// eight normal values (fp16), or of eight finite values below the largest
// bf16's rounding range (bf16), is the rule in one add and one conversion
// or shift; any other group takes the four-lane forms. The same bits.
template <StorageKind S>
__attribute__((target("avx2,f16c"))) void StoreNarrowedAvx2(const float* v, const uint16_t* r,
                                                           size_t n, uint16_t* q) {
  size_t i = StoreNarrowedHead<S>(v, r, n, q);
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_castps_si256(_mm256_loadu_ps(v + i));
    const __m256i ri =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r + i)));
    const __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    __m128i h;
    if constexpr (S == StorageKind::kBF16) {
      const __m256i fast = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f7f0000), a);
      if (_mm256_movemask_ps(_mm256_castsi256_ps(fast)) == 0xff) {
        const __m256i b = _mm256_srai_epi32(_mm256_add_epi32(x, ri), 16);
        // packs works within 128-bit halves; the permute joins the halves.
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(b, b), 0x08);
        h = _mm256_castsi256_si128(p);
      } else {
        h = Narrow8Rare<S>(v + i, r + i);
      }
    } else {
      const __m256i normal =
          _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f7fffff)),
                              _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x387fffff)));
      if (_mm256_movemask_ps(_mm256_castsi256_ps(normal)) == 0xff) {
        const __m256i added = _mm256_add_epi32(x, _mm256_srli_epi32(ri, 3));
        h = _mm256_cvtps_ph(_mm256_castsi256_ps(added), _MM_FROUND_TO_ZERO);
      } else {
        h = Narrow8Rare<S>(v + i, r + i);
      }
    }
    Store8Relaxed(q + i, h);
  }
  if (i + 4 <= n) {
    if constexpr (S == StorageKind::kFP16) {
      Store4Relaxed(q + i, NarrowHalves4F16C(v + i, r + i));
    } else {
      Store4Relaxed(q + i, Narrow4<S>(v + i, r + i));
    }
    i += 4;
  }
  StoreNarrowedTail<S>(v, r, i, n, q);
}

template <StorageKind S>
void StoreNarrowed(const float* v, const uint16_t* r, size_t n, uint16_t* q) {
  if (RowAvx2()) return StoreNarrowedAvx2<S>(v, r, n, q);
  if constexpr (S == StorageKind::kFP16) {
    if (HasF16C()) return StoreHalvesF16C(v, r, n, q);
  }
  size_t i = StoreNarrowedHead<S>(v, r, n, q);
  for (; i + 4 <= n; i += 4) Store4Relaxed(q + i, Narrow4<S>(v + i, r + i));
  StoreNarrowedTail<S>(v, r, i, n, q);
}
#endif

// Rounds v[0, n) with the draws r[0, n) (n <= kChunk) into p.
template <StorageKind S>
void StoreDrawn(const float* v, const uint16_t* r, size_t n, void* p) {
#ifdef PYFLEET_VECTOR_ROW_COPY
  StoreNarrowed<S>(v, r, n, static_cast<uint16_t*>(p));
#else
  uint16_t h[kChunk];
  NarrowElems<S>(v, r, n, h);
  Store16s(p, h, n);
#endif
}

void StoreDrawnOf(StorageKind s, const float* v, const uint16_t* r, size_t n, void* p) {
  if (s == StorageKind::kFP16) {
    StoreDrawn<StorageKind::kFP16>(v, r, n, p);
  } else {
    StoreDrawn<StorageKind::kBF16>(v, r, n, p);
  }
}

// Rounds elements [e0, e0 + n) of the row's stream into p.
template <StorageKind S>
void StoreElems(const float* v, size_t n, void* p, uint64_t z, size_t e0) {
  uint16_t buf[kChunk + 16];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t len = std::min(kChunk, n - c);
    StoreDrawn<S>(v + c, Draws(z, e0 + c, len, buf), len, static_cast<uint16_t*>(p) + c);
  }
}

// Rounds elements [e0, e0 + n) of the stream z of kind s (fp16 or bf16).
void StoreElemsOf(StorageKind s, const float* v, size_t n, void* p, uint64_t z, size_t e0) {
  if (s == StorageKind::kFP16) {
    StoreElems<StorageKind::kFP16>(v, n, p, z, e0);
  } else {
    StoreElems<StorageKind::kBF16>(v, n, p, z, e0);
  }
}

void StoreTail(const RowLayout& l, const float* sf, void* s) {
  char* tail = static_cast<char*>(s) + l.tail_offset();
  for (size_t i = 0; i < l.state_tail; ++i) Store32(tail, i, sf[l.state_head() + i]);
}

}  // namespace

void NarrowStochasticN(StorageKind s, const float* v, const uint16_t* r, size_t n,
                       uint16_t* out) {
  s = WeightKind(s);
  PYFLEET_ASSERT(s != StorageKind::kFP32);
  if (s == StorageKind::kFP16) {
    NarrowElems<StorageKind::kFP16>(v, r, n, out);
  } else {
    NarrowElems<StorageKind::kBF16>(v, r, n, out);
  }
}

void WidenN(StorageKind s, const uint16_t* h, size_t n, float* out) {
  s = WeightKind(s);
  PYFLEET_ASSERT(s != StorageKind::kFP32);
  if (s == StorageKind::kFP16) {
    WidenElems<StorageKind::kFP16>(h, n, out);
  } else {
    WidenElems<StorageKind::kBF16>(h, n, out);
  }
}

const char* StorageName(StorageKind kind) {
  switch (kind) {
    case StorageKind::kFP32: return "fp32";
    case StorageKind::kFP16: return "fp16";
    case StorageKind::kBF16: return "bf16";
    case StorageKind::kFP16Q8: return "fp16_q8";
    case StorageKind::kBF16Q8: return "bf16_q8";
  }
  return "unknown";
}

void ValidateStorage(StorageKind kind) {
  const uint32_t k = static_cast<uint32_t>(kind);
  if (k > kMaxStorageKind) {
    ThrowInvalid("unknown storage kind ", k,
                 " (fp32 = 0, fp16 = 1, bf16 = 2, fp16_q8 = 3, bf16_q8 = 4)");
  }
}

void LoadCompactWeights(StorageKind s, const void* w, size_t n, float* out) {
  if (WeightKind(s) == StorageKind::kFP16) {
    LoadElems<StorageKind::kFP16>(w, n, out);
  } else {
    LoadElems<StorageKind::kBF16>(w, n, out);
  }
}

void LoadCompactRow(const RowLayout& l, const void* w, const void* s, float* wf, float* sf) {
  PYFLEET_ASSERT(l.compact());
  LoadCompactWeights(l.weight_kind(), w, l.dim, wf);
  if (l.q8()) return Q8LoadState(l, s, sf);
  LoadCompactWeights(l.state_kind(), s, l.state_head(), sf);
  const char* tail = static_cast<const char*>(s) + l.tail_offset();
  for (size_t i = 0; i < l.state_tail; ++i) sf[l.state_head() + i] = Load32(tail, i);
}

void StoreCompactWeights(StorageKind s, const float* wf, size_t n, void* w, uint64_t z) {
  StoreElemsOf(WeightKind(s), wf, n, w, z, 0);
}

void RoundDraws(uint64_t z, size_t e0, size_t n, uint16_t* out) {
  uint16_t buf[kChunk + 16];
  for (size_t c = 0; c < n; c += kChunk) {
    const size_t len = std::min(kChunk, n - c);
    const uint16_t* r = Draws(z, e0 + c, len, buf);
    std::memcpy(out + c, r, len * sizeof(uint16_t));
  }
}

void StoreCompactRow(const RowLayout& l, const float* wf, const float* sf, void* w, void* s,
                     uint64_t z) {
  PYFLEET_ASSERT(l.compact());
  const size_t n = l.rounded_elems();
  if (n <= kChunk) {
    // The row's draws in one pass of the generator (weights', then state's).
    uint16_t buf[kChunk + 16];
    const uint16_t* r = Draws(z, 0, n, buf);
    StoreDrawnOf(l.weight_kind(), wf, r, l.dim, w);
    if (l.q8()) return Q8StoreState(l, sf, s, r + l.dim);
    StoreDrawnOf(l.state_kind(), sf, r + l.dim, l.state_head(), s);
    return StoreTail(l, sf, s);
  }
  if (l.q8()) {
    StoreCompactWeights(l.storage, wf, l.dim, w, z);
    std::vector<uint16_t> r(l.state_head());
    RoundDraws(z, l.dim, l.state_head(), r.data());
    return Q8StoreState(l, sf, s, r.data());
  }
  StoreElemsOf(l.weight_kind(), wf, l.dim, w, z, 0);
  StoreElemsOf(l.state_kind(), sf, l.state_head(), s, z, l.dim);
  StoreTail(l, sf, s);
}

void StoreCompactRowNearest(const RowLayout& l, const float* wf, const float* sf, void* w,
                            void* s) {
  PYFLEET_ASSERT(l.compact());
  const StorageKind wk = l.weight_kind();
  for (size_t i = 0; i < l.dim; ++i) Store16(w, i, NarrowNearest(wk, wf[i]));
  if (l.q8()) return Q8StoreState(l, sf, s, nullptr);
  const StorageKind sk = l.state_kind();
  for (size_t i = 0; i < l.state_head(); ++i) Store16(s, i, NarrowNearest(sk, sf[i]));
  StoreTail(l, sf, s);
}

void RoundTripNearest(StorageKind s, float* v, size_t n) {
  s = WeightKind(s);
  if (s == StorageKind::kFP32) return;
  for (size_t i = 0; i < n; ++i) v[i] = WidenElem(s, NarrowNearest(s, v[i]));
}

}  // namespace pyfleet

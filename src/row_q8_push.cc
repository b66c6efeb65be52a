// A push to a q8 row in one pass over its blocks (row_q8.h's Q8PushRow):
// each block of Adam's m and v (Adagrad's accumulator) is decoded, updated
// and coded again in registers, where the general path decodes the whole
// state into fp32 scratch, updates it (optimizer.cc) and codes it back, three
// passes through memory and two calls per row. The same rule in the same
// fp32 operations, so the same bits (tests/table/test_storage_q8.py pins
// them against numpy and against the SSE2 path, which takes the general one).
#include <cmath>
#include <cstring>

#include "pyfleet/row_q8.h"
#include "row_q8_blocks.h"
#include "row_simd.h"

namespace pyfleet {

#ifdef PYFLEET_ROW_SIMD
namespace {

using namespace q8;

// Rows up to this dim take the fused form (its scratch is on the stack).
constexpr size_t kPushDim = 256;

inline void PutScale(uint8_t* p, uint16_t s) { std::memcpy(p, &s, 2); }

// optimizer.cc's Adam on the blocks of a row's state head `row` (m's codes,
// v's codes, m's scales, v's scales) with the draws r of the state head:
//   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g * g;
//   w -= lr * (m / (sqrt(v) + eps))
// lane by lane, each product and sum in the same order as its loop (which
// the compiler vectorises to the same operations; no FMA target).
__attribute__((target("avx2"))) void AdamBlocksAvx2(const OptimizerConfig& c, float b1p,
                                                    float b2p, size_t dim, const float* g,
                                                    const uint16_t* r, float* wf,
                                                    uint8_t* row) {
  const size_t blocks = dim / kQ8Block;
  uint8_t* mc = row;
  uint8_t* vc = row + dim;
  uint8_t* ms = row + 2 * dim;
  uint8_t* vs = ms + 2 * blocks;
  // As Adam() computes them from the beta powers, in scalar fp32.
  const float lr_s = c.learning_rate * std::sqrt(1.f - b2p) / (1.f - b1p);
  const float eps_s = c.epsilon * std::sqrt(1.f - b2p);
  const __m256 b1 = _mm256_set1_ps(c.beta1), ob1 = _mm256_set1_ps(1.f - c.beta1);
  const __m256 b2 = _mm256_set1_ps(c.beta2), ob2 = _mm256_set1_ps(1.f - c.beta2);
  const __m256 lr = _mm256_set1_ps(lr_s), eps = _mm256_set1_ps(eps_s);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t o = b * kQ8Block;
    __m256 m[2], v[2];
    Decode16Avx2(mc + o, LoadScale(ms + 2 * b), true, m);
    Decode16Avx2(vc + o, LoadScale(vs + 2 * b), false, v);
    for (int k = 0; k < 2; ++k) {
      const __m256 gk = _mm256_loadu_ps(g + o + 8 * k);
      m[k] = _mm256_add_ps(_mm256_mul_ps(b1, m[k]), _mm256_mul_ps(ob1, gk));
      v[k] = _mm256_add_ps(_mm256_mul_ps(b2, v[k]), _mm256_mul_ps(_mm256_mul_ps(ob2, gk), gk));
      const __m256 step =
          _mm256_mul_ps(lr, _mm256_div_ps(m[k], _mm256_add_ps(_mm256_sqrt_ps(v[k]), eps)));
      _mm256_storeu_ps(wf + o + 8 * k, _mm256_sub_ps(_mm256_loadu_ps(wf + o + 8 * k), step));
      v[k] = RootOf(v[k]);
    }
    PutScale(ms + 2 * b, Code16Avx2(m, r + o, true, mc + o));
    PutScale(vs + 2 * b, Code16Avx2(v, r + dim + o, false, vc + o));
  }
}

// optimizer.cc's Adagrad the same way (acc's codes, then its scales):
//   acc += g * g;  w -= lr * g / (sqrt(acc) + eps)
__attribute__((target("avx2"))) void AdagradBlocksAvx2(const OptimizerConfig& c, size_t dim,
                                                       const float* g, const uint16_t* r,
                                                       float* wf, uint8_t* row) {
  const size_t blocks = dim / kQ8Block;
  uint8_t* scales = row + dim;
  const __m256 lr = _mm256_set1_ps(c.learning_rate), eps = _mm256_set1_ps(c.epsilon);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t o = b * kQ8Block;
    __m256 acc[2];
    Decode16Avx2(row + o, LoadScale(scales + 2 * b), false, acc);
    for (int k = 0; k < 2; ++k) {
      const __m256 gk = _mm256_loadu_ps(g + o + 8 * k);
      acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(gk, gk));
      const __m256 step = _mm256_div_ps(_mm256_mul_ps(lr, gk),
                                        _mm256_add_ps(_mm256_sqrt_ps(acc[k]), eps));
      _mm256_storeu_ps(wf + o + 8 * k, _mm256_sub_ps(_mm256_loadu_ps(wf + o + 8 * k), step));
      acc[k] = RootOf(acc[k]);
    }
    PutScale(scales + 2 * b, Code16Avx2(acc, r + o, false, row + o));
  }
}

}  // namespace
#endif

bool Q8PushRow(const RowLayout& l, const OptimizerConfig& opt, void* w, void* s,
               const float* g, uint32_t count, uint64_t z) {
#ifdef PYFLEET_ROW_SIMD
  const size_t dim = l.dim, bytes = l.state_bytes();
  const bool adam = opt.kind == OptimizerKind::kAdam;
  const size_t nv = adam ? 2 : 1;
  if (!RowAvx2() || !l.q8() || dim == 0 || dim % kQ8Block != 0 || dim > kPushDim ||
      !(adam || opt.kind == OptimizerKind::kAdagrad) || l.q8_vectors() != nv ||
      (opt.decay != DecayKind::kNone && opt.decay_coeff != 0.f)) {
    return false;
  }
  alignas(32) float wf[kPushDim];
  uint16_t r[3 * kPushDim];
  alignas(16) uint8_t row[kStack];
  LoadCompactWeights(l.storage, w, dim, wf);
  LoadWords(s, bytes, row);
  // The row's draws (weights', then state's; 3 * kPushDim is a multiple of 8).
  RowDraws(z, l.rounded_elems(), r);
  if (adam) {
    float tail[2];
    Q8DerivedTail(opt, count, tail);
    AdamBlocksAvx2(opt, tail[0], tail[1], dim, g, r + dim, wf, row);
  } else {
    AdagradBlocksAvx2(opt, dim, g, r + dim, wf, row);
  }
  ClearSignedWhereRootZero(row, nv, l.q8_signed, dim);
  // The last word's padding after the scales, as Q8StoreState writes it.
  for (size_t i = l.state_head() + 2 * nv * (dim / kQ8Block); i < bytes; ++i) row[i] = 0;
  StoreCompactWeightsDrawn(l.storage, wf, r, dim, w);
  StoreWords(s, row, bytes);
  return true;
#else
  (void)l, (void)opt, (void)w, (void)s, (void)g, (void)count, (void)z;
  return false;
#endif
}

}  // namespace pyfleet

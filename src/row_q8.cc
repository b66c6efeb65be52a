#include "pyfleet/internal/row_q8.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"
#include "row_q8_blocks.h"
#include "row_simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pyfleet {

using namespace q8;  // the block kernels (row_q8_blocks.h)

namespace {

// The row's bytes on the stack for rows up to kStack bytes, else on the heap.
struct RowBuf {
  explicit RowBuf(size_t bytes) {
    if (bytes > kStack) heap.resize(bytes);
    p = bytes > kStack ? heap.data() : stack;
  }
  uint8_t stack[kStack];
  std::vector<uint8_t> heap;
  uint8_t* p;
};

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
      __m256 x[2];
      Decode16Avx2(c, LoadScale(scales), sgn, x);
      _mm256_storeu_ps(sf, x[0]);
      _mm256_storeu_ps(sf + 8, x[1]);
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
  const BlockScale s = ScaleOf(a, sgn);
  if (s.bits == 0) {
    for (size_t i = 0; i < n; ++i) codes[i] = 0;
    return 0;
  }
  const float inv = s.inv;
  const float bias = sgn ? 128.f : 0.f, lo = sgn ? 1.f : 0.f, hi = sgn ? 255.f : 255.f;
  int32_t c[kQ8Block];
  for (size_t i = 0; i < n; ++i) {
    float y = x[i] * inv + (u[i] + bias);
    y = y < lo ? lo : y;
    y = y > hi ? hi : y;
    c[i] = static_cast<int32_t>(y);
  }
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(c[i] - static_cast<int32_t>(bias));
  return s.bits;
}

#ifdef PYFLEET_ROW_SIMD
// CodeBlock16 eight lanes at a time (row_q8_blocks.h).
__attribute__((target("avx2"))) inline uint16_t CodeBlock16Avx2(const float* in,
                                                                const uint16_t* r, bool sgn,
                                                                uint8_t* codes) {
  __m256 x[2] = {_mm256_loadu_ps(in), _mm256_loadu_ps(in + 8)};
  if (!sgn) {
    x[0] = RootOf(x[0]);
    x[1] = RootOf(x[1]);
  }
  return Code16Avx2(x, r, sgn, codes);
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

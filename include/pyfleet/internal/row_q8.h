// 8-bit block-quantised optimizer state ("fp16_q8" / "bf16_q8" storage):
// the weights stay 16-bit (row_encoding.h), Adam's moments and Adagrad's
// accumulator become one byte per element plus a bf16 scale per block of
// kQ8Block elements, and Adam's beta powers are not stored at all but derived
// from the row's update count. At dim 16 with Adam a row's state is 36 bytes
// instead of 72 (fp16) or 136 (fp32).
//
// The codes, per block of a state vector, with S the block's scale:
//   signed vector (Adam's m):   x = c * (S / 127),        c in [-127, 127]
//   root vector (Adam's v, Adagrad's accumulator):
//                               x = (c * (S / 255))^2,    c in [0, 255]
// A second moment is coded by its square root: the value the update divides
// by keeps 8 bits over a range of 255, not 255^2, and its zero is exact.
// Storing a block: S = the block's largest |x| (root: largest sqrt(x)),
// rounded up to a bf16; y = x * (k / S) + (u + b) (root: sqrt(x) for x), with
// k = 127, b = 128 (signed) or k = 255, b = 0 (root), clamped to [b - 127 or
// 0, 255] and truncated: the code is floor(y) - b. u = r / 2^16 with r the
// element's 16 random bits of the row's rounding stream (stochastic,
// unbiased), or u = 1/2 for initial rows and converted files. All
// arithmetic is fp32 in this
// order (tests/table/test_storage_q8.py mirrors it in numpy). Then Adam's m
// code is set to 0 wherever v's code is 0: a decoded v of 0 with a non-zero
// m would divide by epsilon alone on the row's next update.
#pragma once

#include <cstddef>
#include <cstdint>

#include "pyfleet/optimizer.h"
#include "pyfleet/row_encoding.h"

namespace pyfleet {

// The layout of a table's rows, a function of (storage, dim, optimizer).
// Throws std::invalid_argument naming the storage and the optimizer when a
// q8 storage is asked of a rule whose state it does not code (only Adam's
// and Adagrad's; SGD has no state, so "fp16"/"bf16" is the form for it).
RowLayout TableRowLayout(StorageKind storage, size_t dim, const OptimizerConfig& opt);

// sf[0, state_head) = the decoded state of a q8 row's state column s (each
// 4-byte word read whole, relaxed: Hogwild rows). The tail is not touched.
void Q8LoadState(const RowLayout& l, const void* s, float* sf);
// Codes sf[0, state_head) into s with r[i] the random bits of state element
// i, or to nearest (u = 1/2) when r is null. Each word written whole.
void Q8StoreState(const RowLayout& l, const float* sf, void* s, const uint16_t* r);


// b^n in fp32 by repeated squaring (the bits follow from this order).
inline float PowCount(float b, uint64_t n) {
  float r = 1.f;
  for (; n != 0; n >>= 1) {
    if (n & 1) r *= b;
    b *= b;
  }
  return r;
}

// The state tail a q8 row derives instead of storing: Adam's beta powers
// after `count` updates, beta^(count + 1) (Fluid starts them at beta).
void Q8DerivedTail(const OptimizerConfig& opt, uint32_t count, float* tail);

}  // namespace pyfleet

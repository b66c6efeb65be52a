// How a sparse table stores the numbers of a row: fp32 (the default), or a
// compact 16-bit form, fp16 or bf16, for the weights and the optimizer state.
//
// Updates are always computed in fp32 (the optimizer rules of optimizer.h on
// a scratch copy of the row) and rounded back to 16 bits stochastically: a
// value between two representable neighbours rounds up with probability equal
// to its distance from the lower one, so the rounding is unbiased and small
// updates survive on average instead of being rounded away every time. Each
// element draws 16 random bits, a pure function of (table seed, key,
// update_count, element), so a run is reproducible and independent of thread
// scheduling.
//
// A compact row keeps the last OptimizerStateTail() state floats in fp32
// (Adam's beta powers: near 1, 16 bits would skew the bias correction), and
// the rest of its state in bf16 whether its weights are fp16 or bf16 (the
// state needs range more than precision):
//
//   weights column: w[dim] (fp16 or bf16)
//   state column:   s[state_dim - tail] (bf16) | tail[tail] (fp32)
//
// An fp32 row is w[dim] and s[state_dim], all fp32 (tail plays no part).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "pyfleet/hash.h"

namespace pyfleet {

// kFP16Q8 / kBF16Q8: 16-bit weights as kFP16 / kBF16, and the optimizer
// state (Adam's moments, Adagrad's accumulator) in 8-bit blocks (row_q8.h).
enum class StorageKind : uint32_t { kFP32 = 0, kFP16 = 1, kBF16 = 2, kFP16Q8 = 3, kBF16Q8 = 4 };
inline constexpr uint32_t kMaxStorageKind = 4;

const char* StorageName(StorageKind kind);
// Throws std::invalid_argument naming the value unless it is a StorageKind.
void ValidateStorage(StorageKind kind);

// Elements of one 8-bit block of a q8 state vector (one bf16 scale each).
inline constexpr size_t kQ8Block = 16;

// The byte layout of one row's two columns, declared once. A q8 row's state
// head is state_head() / dim vectors of dim 8-bit codes, the first q8_signed
// of them signed (linear), the others square-root codes, then one bf16 scale
// per block of kQ8Block elements of each vector; its tail (Adam's beta
// powers) is not stored but derived from the row's update count.
struct RowLayout {
  StorageKind storage = StorageKind::kFP32;
  size_t dim = 0;
  size_t state_dim = 0;   // floats of optimizer state, as optimizer.h lays them out
  size_t state_tail = 0;  // trailing state floats kept in fp32 by a compact row
  size_t q8_signed = 0;   // q8: leading state vectors coded signed-linear
  // fp16 rows keep their state in bf16 (its range: an Adam second moment of
  // small gradients underflows fp16); true only for files written before
  // that, whose fp16 rows hold fp16 state (FileHeader flag kFileBf16State unset).
  bool fp16_state = false;

  RowLayout() = default;
  RowLayout(StorageKind s, size_t d, size_t sd, size_t tail, size_t signed_vectors = 0)
      : storage(s), dim(d), state_dim(sd), state_tail(s == StorageKind::kFP32 ? 0 : tail),
        q8_signed(signed_vectors) {}

  bool compact() const { return storage != StorageKind::kFP32; }
  bool q8() const { return storage == StorageKind::kFP16Q8 || storage == StorageKind::kBF16Q8; }
  // How the weights are held: fp32, fp16 or bf16.
  StorageKind weight_kind() const {
    return storage == StorageKind::kFP16Q8   ? StorageKind::kFP16
           : storage == StorageKind::kBF16Q8 ? StorageKind::kBF16
                                             : storage;
  }
  // How the state head is held: bf16 for fp16 and bf16 rows (fp16 for a
  // file's rows with fp16_state), fp32 for fp32 rows; q8 rows: see row_q8.h.
  StorageKind state_kind() const {
    if (storage == StorageKind::kFP32) return storage;
    return fp16_state ? StorageKind::kFP16 : StorageKind::kBF16;
  }
  size_t elem_bytes() const { return compact() ? 2 : 4; }
  // 16-bit (compact), 8-bit (q8) or fp32 elements of the state before the tail.
  size_t state_head() const { return state_dim - state_tail; }
  size_t weight_bytes() const { return dim * elem_bytes(); }
  size_t tail_offset() const { return state_head() * elem_bytes(); }
  // q8: vectors of dim codes in the state head, and bf16 scales per vector.
  size_t q8_vectors() const {
    // 1 (Adagrad) or 2 (Adam) without a 64-bit division on every push.
    const size_t h = state_head();
    return dim == 0 ? 0 : h == dim ? 1 : h == 2 * dim ? 2 : h / dim;
  }
  size_t q8_blocks() const { return (dim + kQ8Block - 1) / kQ8Block; }
  size_t state_bytes() const {
    if (q8()) {
      if (state_head() == 0) return 0;
      return (state_head() + 2 * q8_vectors() * q8_blocks() + 3) / 4 * 4;
    }
    return tail_offset() + state_tail * sizeof(float);
  }
  // Elements a compact row rounds on every update: weights, then state head.
  size_t rounded_elems() const { return dim + state_head(); }
};

// ---- Scalar conversions (the rounding rule; tests mirror it in numpy) ----

inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}
inline float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

// No arithmetic on fp32 subnormals (a microcode assist on x86, ~100 cycles):
// a normal half is rebiased, a subnormal one's mantissa converted exactly.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = h & 0x7c00u;
  const uint32_t bits = exp == 0x7c00u ? (0x7f800000u | mag)  // Inf/NaN
                        : exp == 0     ? FloatBits(static_cast<float>(h & 0x3ffu) * 0x1p-24f)
                                       : mag + (112u << 23);
  return BitsFloat(sign | bits);
}

// fp32 -> bf16. add is added to the 16 bits that are dropped before they are
// dropped: a uniform random add in [0, 2^16) rounds stochastically. A finite
// value never becomes Inf: it saturates at the largest finite bf16.
inline uint16_t Bf16FromBits(uint32_t bits, uint32_t add) {
  if ((bits & 0x7fffffffu) >= 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | ((bits & 0x7fffffu) ? 0x40u : 0u));
  }
  uint32_t b = (bits + add) >> 16;
  if ((b & 0x7fffu) >= 0x7f80u) b = (b & 0x8000u) | 0x7f7fu;
  return static_cast<uint16_t>(b);
}
inline uint16_t Bf16Stochastic(float f, uint16_t r) { return Bf16FromBits(FloatBits(f), r); }
inline uint16_t Bf16Nearest(float f) {
  const uint32_t b = FloatBits(f);
  return Bf16FromBits(b, 0x7fffu + ((b >> 16) & 1u));
}

// fp32 -> fp16 with the 16 random bits r (stochastic) or, with nearest =
// true, round to nearest even. r / 2^16 is a uniform fraction of the
// result's unit in the last place, added before the dropped bits go: a
// normal half gets r's top 13 bits added to its 13 dropped bits; a subnormal
// one is floor(|f| * 2^24 + r / 2^16), computed here in integers and by the
// vector form in floats. Magnitudes below 2^-40 always become zero; a finite
// value saturates at 65504, never Inf.
inline uint16_t HalfRound(float f, uint16_t r, bool nearest) {
  const uint32_t bits = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t a = bits & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (a >= 0x38800000u) {  // >= 2^-14: a normal half
    const uint32_t add = nearest ? 0xfffu + ((a >> 13) & 1u) : (uint32_t{r} >> 3);
    uint32_t h = ((a + add) >> 13) - (112u << 10);
    if (h >= 0x7c00u) h = 0x7bffu;
    return sign | static_cast<uint16_t>(h);
  }
  // |f| * 2^24 = sig / 2^shift.
  const uint32_t e = a >> 23;
  const uint64_t sig = (a & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  const uint32_t shift = 126 - (e != 0 ? e : 1);  // 14 ..125
  if (shift >= 40) return sign;                    // sig / 2^shift < 2^-16
  const uint64_t mask = (uint64_t{1} << shift) - 1;
  if (nearest) {
    return sign | static_cast<uint16_t>((sig + (mask >> 1) + ((sig >> shift) & 1u)) >> shift);
  }
  const uint64_t frac16 = ((sig & mask) << 16) >> shift;  // floor(frac * 2^16)
  return sign | static_cast<uint16_t>((sig >> shift) + ((r + frac16) >> 16));
}

// The storage kind's weights kind (row_encoding's 16-bit codecs take it).
inline StorageKind WeightKind(StorageKind s) { return RowLayout(s, 0, 0, 0).weight_kind(); }

inline float WidenElem(StorageKind s, uint16_t h) {
  return s == StorageKind::kFP16 ? HalfToFloat(h) : Bf16ToFloat(h);
}
inline uint16_t NarrowStochastic(StorageKind s, float f, uint16_t r) {
  return s == StorageKind::kFP16 ? HalfRound(f, r, false) : Bf16Stochastic(f, r);
}
inline uint16_t NarrowNearest(StorageKind s, float f) {
  return s == StorageKind::kFP16 ? HalfRound(f, 0, true) : Bf16Nearest(f);
}

// ---- The rounding stream ----

inline constexpr uint64_t kRoundSalt = 0x7a3b9c1d5e6f8091ULL;
inline constexpr uint64_t kRoundStep = 0x9E3779B97F4A7C15ULL;

// The random bits of one update of one row: z = RoundStreamOf(...), with
// table_salt = Mix64(seed ^ kRoundSalt) and count = the row's update_count
// before the update. Element e (weights first, then the state head) takes
// 16 bits of a counter-seeded generator: four 32-bit xorshift lanes (<< 13,
// >> 17, << 5) seeded with the halves of z and of Mix64(z + kRoundStep),
// lowest bit set; step t + 1 gives elements 8t .. 8t + 7, lane k's low half
// to 8t + 2k and its high half to 8t + 2k + 1 (row_encoding.cc's Draws).
inline uint64_t RoundStreamOf(uint64_t table_salt, uint64_t key, uint32_t count) {
  return Mix64(Mix64(table_salt ^ key) ^ count);
}

// out[i] = NarrowStochastic(s, v[i], r[i]) for i < n; vectorised on x86-64.
void NarrowStochasticN(StorageKind s, const float* v, const uint16_t* r, size_t n,
                       uint16_t* out);
// out[i] = WidenElem(s, h[i]) for i < n; vectorised on x86-64.
void WidenN(StorageKind s, const uint16_t* h, size_t n, float* out);

// Row codecs: fp32 scratch <-> a row's columns in a compact layout. The
// loads and stores are relaxed atomics per element (Hogwild rows). Store
// rounds stochastically with the stream z; StoreNearest rounds to nearest
// even (initial rows, and conversion of a loaded file). The fp32 tail is
// copied as it is.
void LoadCompactRow(const RowLayout& l, const void* w, const void* s, float* wf, float* sf);
void StoreCompactRow(const RowLayout& l, const float* wf, const float* sf, void* w, void* s,
                     uint64_t z);
void StoreCompactRowNearest(const RowLayout& l, const float* wf, const float* sf, void* w,
                            void* s);
// Weights only: rounds wf[0, n) with elements [0, n) of the stream z into w.
void StoreCompactWeights(StorageKind s, const float* wf, size_t n, void* w, uint64_t z);
// out[0, n) = the 16-bit draws of elements [e0, e0 + n) of the stream z.
void RoundDraws(uint64_t z, size_t e0, size_t n, uint16_t* out);
// A q8 row (row_q8.h) codes its state head in 8 bits with the stream's
// draws after the weights' and leaves sf's tail to the caller on load.
// Weights only (pull paths); n = l.dim elements of the weights column.
void LoadCompactWeights(StorageKind s, const void* w, size_t n, float* out);
// Rounds v[0..n) to the storage and back (nearest even): what a row stores.
void RoundTripNearest(StorageKind s, float* v, size_t n);

}  // namespace pyfleet

#include "pyfleet/row_storage.h"

#include <atomic>

#include "pyfleet/error.h"

namespace pyfleet {

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

template <StorageKind S>
void LoadElems(const void* p, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = WidenElem(S, Load16(p, i));
}

// Rounds elements [e0, e0 + n) of the row's stream into p.
template <StorageKind S>
void StoreElems(const float* v, size_t n, void* p, uint64_t z, size_t e0) {
  for (size_t i = 0; i < n; ++i) {
    const size_t e = e0 + i;
    const uint64_t x = Mix64(z + (e / 2 + 1) * kRoundStep);
    const uint32_t r = static_cast<uint32_t>(e % 2 == 0 ? x : x >> 32);
    Store16(p, i, NarrowStochastic(S, v[i], r));
  }
}

template <StorageKind S>
void StoreRow(const RowLayout& l, const float* wf, const float* sf, void* w, void* s,
              uint64_t z) {
  StoreElems<S>(wf, l.dim, w, z, 0);
  StoreElems<S>(sf, l.state_head(), s, z, l.dim);
}

void StoreTail(const RowLayout& l, const float* sf, void* s) {
  char* tail = static_cast<char*>(s) + l.tail_offset();
  for (size_t i = 0; i < l.state_tail; ++i) Store32(tail, i, sf[l.state_head() + i]);
}

}  // namespace

const char* StorageName(StorageKind kind) {
  switch (kind) {
    case StorageKind::kFP32: return "fp32";
    case StorageKind::kFP16: return "fp16";
    case StorageKind::kBF16: return "bf16";
  }
  return "unknown";
}

void ValidateStorage(StorageKind kind) {
  const uint32_t k = static_cast<uint32_t>(kind);
  if (k > 2) ThrowInvalid("unknown storage kind ", k, " (fp32 = 0, fp16 = 1, bf16 = 2)");
}

void LoadCompactWeights(StorageKind s, const void* w, size_t n, float* out) {
  if (s == StorageKind::kFP16) {
    LoadElems<StorageKind::kFP16>(w, n, out);
  } else {
    LoadElems<StorageKind::kBF16>(w, n, out);
  }
}

void LoadCompactRow(const RowLayout& l, const void* w, const void* s, float* wf, float* sf) {
  PYFLEET_ASSERT(l.compact());
  LoadCompactWeights(l.storage, w, l.dim, wf);
  LoadCompactWeights(l.storage, s, l.state_head(), sf);
  const char* tail = static_cast<const char*>(s) + l.tail_offset();
  for (size_t i = 0; i < l.state_tail; ++i) sf[l.state_head() + i] = Load32(tail, i);
}

void StoreCompactRow(const RowLayout& l, const float* wf, const float* sf, void* w, void* s,
                     uint64_t z) {
  PYFLEET_ASSERT(l.compact());
  if (l.storage == StorageKind::kFP16) {
    StoreRow<StorageKind::kFP16>(l, wf, sf, w, s, z);
  } else {
    StoreRow<StorageKind::kBF16>(l, wf, sf, w, s, z);
  }
  StoreTail(l, sf, s);
}

void StoreCompactRowNearest(const RowLayout& l, const float* wf, const float* sf, void* w,
                            void* s) {
  PYFLEET_ASSERT(l.compact());
  for (size_t i = 0; i < l.dim; ++i) Store16(w, i, NarrowNearest(l.storage, wf[i]));
  for (size_t i = 0; i < l.state_head(); ++i) Store16(s, i, NarrowNearest(l.storage, sf[i]));
  StoreTail(l, sf, s);
}

void RoundTripNearest(StorageKind s, float* v, size_t n) {
  if (s == StorageKind::kFP32) return;
  for (size_t i = 0; i < n; ++i) v[i] = WidenElem(s, NarrowNearest(s, v[i]));
}

}  // namespace pyfleet

#include "pyfleet/batch_ops.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "pyfleet/error.h"
#include "pyfleet/hash.h"

namespace pyfleet {

namespace {

// Scratch kept by each thread between calls up to this many slots (16 MiB);
// a larger batch gets a table of its own for that call only.
constexpr size_t kMaxKeptSlots = size_t{1} << 21;

// The open-addressing set of UniqueInverse. A slot is 8 bytes: the high half
// of the key's hash (a tag) and 1 + the key's index among the distinct keys
// (0: empty); the key itself is read from uniq only when the tag matches.
// Half the size of a {key, index} slot: at 128k keys the table is 2 MiB, not
// 4, and a key's probe misses cache less often (about 30% faster there).
class KeySet {
 public:
  // Prepares an empty set for up to n distinct keys (n < 2^32 - 1).
  explicit KeySet(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;  // load <= 1/2: short linear probes
    mask_ = cap - 1;
    thread_local std::vector<uint64_t> kept;
    if (cap <= kMaxKeptSlots) {
      if (kept.size() < cap) kept.resize(cap);
      slots_ = kept.data();
    } else {
      own_.resize(cap);
      slots_ = own_.data();
    }
    std::memset(slots_, 0, cap * sizeof(uint64_t));
  }

  static uint64_t Hash(uint64_t key) { return RouteMix(key); }
  void Prefetch(uint64_t h) const { __builtin_prefetch(slots_ + (h & mask_), 1); }

  // The index of key (whose Hash is h) among the distinct keys so far, held
  // in uniq[0, next); a new key is appended there, as index next.
  uint32_t Find(uint64_t key, uint64_t h, uint64_t* uniq, uint32_t* next) {
    const uint64_t tag = h & kTagMask;
    size_t p = h & mask_;
    while (true) {
      const uint64_t s = slots_[p];
      if (s == 0) {
        const uint32_t i = (*next)++;
        slots_[p] = tag | (uint64_t{i} + 1);
        uniq[i] = key;
        return i;
      }
      if ((s & kTagMask) == tag) {
        const uint32_t i = static_cast<uint32_t>(s) - 1;
        if (uniq[i] == key) return i;
      }
      p = (p + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kTagMask = 0xffffffff00000000ULL;
  uint64_t* slots_;
  size_t mask_;
  std::vector<uint64_t> own_;
};

void CheckCount(size_t n) {
  if (n >= std::numeric_limits<uint32_t>::max()) {
    ThrowInvalid("a batch of ", n, " keys is too large (at most 2^32 - 2)");
  }
}

void CheckInverse(const int64_t* inverse, size_t n, size_t m) {
  for (size_t i = 0; i < n; ++i) {
    if (inverse[i] < 0 || static_cast<uint64_t>(inverse[i]) >= m) {
      ThrowInvalid("inverse[", i, "] = ", inverse[i], " is out of range [0, ", m, ")");
    }
  }
}

// Fixed-width row operations: with d known at compile time the compiler
// unrolls and vectorizes them; the common embedding widths get one each.
template <size_t D>
inline void AddRow(float* dst, const float* src, size_t) {
  for (size_t j = 0; j < D; ++j) dst[j] += src[j];
}
template <>
inline void AddRow<0>(float* dst, const float* src, size_t d) {
  for (size_t j = 0; j < d; ++j) dst[j] += src[j];
}
template <size_t D>
inline void CopyRow(float* dst, const float* src, size_t) {
  std::memcpy(dst, src, D * sizeof(float));
}
template <>
inline void CopyRow<0>(float* dst, const float* src, size_t d) {
  std::memcpy(dst, src, d * sizeof(float));
}

template <size_t D>
void SumRowsD(const float* values, size_t n, size_t d, const int64_t* inverse, float* out) {
  for (size_t i = 0; i < n; ++i) AddRow<D>(out + inverse[i] * d, values + i * d, d);
}

template <size_t D>
void GatherRowsD(const float* const* rows, size_t n, size_t d, const int64_t* inverse,
                 float* out) {
  constexpr size_t kAhead = 8;  // rows are scattered over MBs of replies
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(rows[inverse[i + kAhead]]);
    CopyRow<D>(out + i * d, rows[inverse[i]], d);
  }
}

// Calls f.template operator()<D>() with D = d for the common widths, else D = 0.
template <typename F>
void ByWidth(size_t d, F&& f) {
  switch (d) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 4: return f.template operator()<4>();
    case 8: return f.template operator()<8>();
    case 16: return f.template operator()<16>();
    case 32: return f.template operator()<32>();
    case 64: return f.template operator()<64>();
    default: return f.template operator()<0>();
  }
}

// UniqueInverse, calling on_new(i, h) as key i (hash h) joins the distinct keys.
template <typename OnNew>
size_t UniqueInverseT(const uint64_t* keys, size_t n, uint64_t* uniq, int64_t* inverse,
                      OnNew&& on_new) {
  CheckCount(n);
  KeySet set(n);
  uint32_t m = 0;
  // At big batches the table outgrows L2 and each key costs a cache miss:
  // the home slot of the key kAhead places on is prefetched so that misses
  // overlap (about 2.5x faster at 128k keys).
  constexpr size_t kAhead = 16;
  uint64_t ring[kAhead];
  for (size_t i = 0; i < std::min(n, kAhead); ++i) {
    ring[i] = KeySet::Hash(keys[i]);
    set.Prefetch(ring[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = ring[i % kAhead];
    if (i + kAhead < n) {
      const uint64_t ahead = KeySet::Hash(keys[i + kAhead]);
      set.Prefetch(ahead);
      ring[i % kAhead] = ahead;
    }
    const uint32_t before = m;
    const uint32_t j = set.Find(keys[i], h, uniq, &m);
    if (m != before) on_new(j, h);
    inverse[i] = j;
  }
  return m;
}

}  // namespace

size_t UniqueInverse(const uint64_t* keys, size_t n, uint64_t* uniq, int64_t* inverse) {
  return UniqueInverseT(keys, n, uniq, inverse, [](uint32_t, uint64_t) {});
}

void SumRows(const float* values, size_t n, size_t d, const int64_t* inverse, size_t m,
             float* out) {
  CheckInverse(inverse, n, m);
  std::memset(out, 0, m * d * sizeof(float));
  ByWidth(d, [&]<size_t D>() { SumRowsD<D>(values, n, d, inverse, out); });
}

size_t UniqueRoute(const uint64_t* keys, size_t n, uint32_t num_servers, uint64_t* grouped,
                   int64_t* inverse, int64_t* offsets) {
  PYFLEET_ASSERT(num_servers >= 1);
  if (num_servers == 1) {
    const size_t m = UniqueInverse(keys, n, grouped, inverse);
    offsets[0] = 0;
    offsets[1] = static_cast<int64_t>(m);
    return m;
  }
  // The owner of each distinct key comes from the hash deduplication already
  // computed (the same salted mix): no second hash pass. Positions are 32-bit
  // (CheckCount bounds n), so the final remap's random reads stay in cache
  // longer.
  thread_local std::vector<uint64_t> uniq;
  thread_local std::vector<uint32_t> position;  // owner first, then place in grouped
  if (uniq.size() < n) {
    uniq.resize(n);
    position.resize(n);
  }
  std::memset(offsets, 0, (num_servers + 1) * sizeof(int64_t));
  uint32_t* pos = position.data();
  const size_t m = UniqueInverseT(keys, n, uniq.data(), inverse, [&](uint32_t j, uint64_t h) {
    const uint32_t s = RouteHash(h, num_servers);
    pos[j] = s;
    ++offsets[s + 1];
  });
  for (uint32_t s = 0; s < num_servers; ++s) offsets[s + 1] += offsets[s];
  // offsets[s] doubles as server s's cursor while placing, then is restored.
  for (size_t j = 0; j < m; ++j) {
    const int64_t p = offsets[pos[j]]++;
    grouped[p] = uniq[j];
    pos[j] = static_cast<uint32_t>(p);
  }
  for (uint32_t s = num_servers; s > 0; --s) offsets[s] = offsets[s - 1];
  offsets[0] = 0;
  for (size_t i = 0; i < n; ++i) inverse[i] = pos[inverse[i]];
  if (n > kMaxKeptSlots) {  // do not keep a huge batch's scratch alive
    std::vector<uint64_t>().swap(uniq);
    std::vector<uint32_t>().swap(position);
  }
  return m;
}

void GatherRows(const float* const* pieces, const int64_t* starts, size_t num_pieces,
                size_t d, const int64_t* inverse, size_t n, float* out) {
  const size_t m = static_cast<size_t>(starts[num_pieces]);
  CheckInverse(inverse, n, m);
  thread_local std::vector<const float*> rows;
  rows.resize(m);
  for (size_t j = 0; j < num_pieces; ++j) {
    const float* p = pieces[j];
    for (int64_t r = starts[j]; r < starts[j + 1]; ++r, p += d) rows[r] = p;
  }
  ByWidth(d, [&]<size_t D>() { GatherRowsD<D>(rows.data(), n, d, inverse, out); });
  if (m > kMaxKeptSlots) std::vector<const float*>().swap(rows);
}

}  // namespace pyfleet

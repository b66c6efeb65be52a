#include "pyfleet/sparse_table.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/row_q8.h"
#include "pyfleet/table_io.h"
#include "row_simd.h"

namespace pyfleet {

namespace {

constexpr size_t kPrefetch = 16;  // keys in flight ahead of the one being served
constexpr size_t kPullIndexAhead = 16;  // Pull: keys between hashing and probing
constexpr size_t kPullRowAhead = 24;    // Pull: keys between probing and copying
constexpr size_t kPullRing = 64;        // Pull: ring entries (> the two above)
constexpr uint32_t kNone = 0xFFFFFFFFu;
constexpr size_t kLoadEvictSlack = 16;   // Load: rows over a shard's share before it evicts

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

}  // namespace

struct SparseTable::Shard {
  explicit Shard(SlabArena* arena) : index(arena), candidates(arena) {}
  mutable std::shared_mutex mu;
  KeyIndex index;                 // key -> row id
  KeyIndex candidates;            // key -> pull calls seen (entry policy)
  std::vector<uint64_t> dropped;  // keys erased since the last save
  std::unique_ptr<ShardSpill> spill;  // with a disk tier (spill_table.cc)
  // Counts the exclusive holds (ShardWriteLock), the only ones that move
  // rows or change index values: a row found under the shared lock, let go
  // and taken again is still where it was if this has not changed.
  uint64_t version = 0;
};

namespace {

// A shard's lock held exclusively: every exclusive hold goes through this,
// so that Shard::version counts them.
struct ShardWriteLock {
  template <typename S>
  explicit ShardWriteLock(S& s) : lock(s.mu) {
    ++s.version;
  }
  std::unique_lock<std::shared_mutex> lock;
};

constexpr uint64_t kUnseen = ~uint64_t{0};  // Batch::seen: rows not looked up

}  // namespace

// A pulled key without a row: its hash and its position in the call.
struct PullMiss {
  uint64_t h;
  uint32_t pos;
};

// Per-thread scratch for one batched call: the keys regrouped by shard.
struct SparseTable::Batch {
  std::vector<uint64_t> keys, h;
  std::vector<uint32_t> pos;      // index of keys[j] in the caller's array
  std::vector<uint32_t> rows;
  std::vector<uint32_t> dup_next; // push: next equal key after j, or kNone
  std::vector<uint8_t> is_dup;    // push: an earlier equal key carries this one
  std::vector<uint32_t> table;    // push: dedup hash table
  std::vector<PullMiss> misses;   // pull: keys without a row
  std::vector<float> w, s, g;     // one row's private copy
  size_t starts[kShards + 1];
  uint64_t seen[kShards];  // push: the shard's version its rows were looked up at, or kUnseen
  size_t noted = 0;  // Bytes() after the last Note

  size_t Bytes() const {
    return (keys.capacity() + h.capacity()) * sizeof(uint64_t) +
           (pos.capacity() + rows.capacity() + dup_next.capacity() + table.capacity()) *
               sizeof(uint32_t) +
           is_dup.capacity() + misses.capacity() * sizeof(PullMiss) +
           (w.capacity() + s.capacity() + g.capacity()) * sizeof(float);
  }
  // The working memory of a call (a thread's batches live as long as it
  // does), which a memory budget pays for (NoteCall). A call to a table
  // with a budget first gives back what an earlier, larger call left
  // (capacity over twice what this call holds).
  size_t Note() {
    bool shrunk = false;
    auto fit = [&](auto& v) {
      if (v.capacity() > 2 * v.size() + 4096) {
        v.shrink_to_fit();
        shrunk = true;
      }
    };
    fit(keys), fit(h), fit(pos), fit(rows), fit(dup_next), fit(is_dup), fit(table);
    fit(misses);
    const size_t now = Bytes();
    // A buffer that grew or shrank left a block in the heap, where malloc
    // keeps it: its pages go back to the kernel (rare: calls of one size
    // neither grow nor shrink them).
    if (now > noted || shrunk) malloc_trim(0);
    noted = now;
    return now;
  }
};

SparseTable::Batch& SparseTable::CallBatch() {
  // A thread's pulls and pushes share one: neither calls the other, and
  // the arrays both use (keys, h, pos, rows, 24 bytes a key) are then paid
  // for once, at the larger call's size, not for each.
  thread_local Batch b;
  return b;
}

void SparseTable::NoteCall(Batch& b, bool push) {
  const size_t bytes = b.Note();
  std::lock_guard g(note_mu_);
  (push ? push_batch_ : pull_batch_) = &b;
  (push ? push_bytes_ : pull_bytes_).store(bytes, std::memory_order_relaxed);
  // The last call of the other kind was this thread's: its bytes are these.
  if ((push ? pull_batch_ : push_batch_) == &b) {
    (push ? pull_bytes_ : push_bytes_).store(0, std::memory_order_relaxed);
  }
}

SparseTable::SparseTable(size_t dim, const OptimizerConfig& opt, const InitializerConfig& init,
                         uint64_t seed, const EntryConfig& entry, StorageKind storage)
    : dim_(dim),
      state_dim_((ValidateOptimizer(opt), OptimizerStateDim(opt, dim))),
      opt_(opt),
      init_(init),
      seed_(seed),
      entry_(entry),
      layout_(TableRowLayout(storage, dim, opt)),
      round_salt_(Mix64(seed ^ kRoundSalt)),
      rows_(layout_.weight_bytes(), layout_.state_bytes()) {
  if (dim == 0 || dim > 65536) ThrowInvalid("dim must be in [1, 65536], got ", dim);
  const uint32_t ik = static_cast<uint32_t>(init.kind);
  if (ik < 1 || ik > 4) ThrowInvalid("unknown initializer kind ", ik);
  switch (entry.kind) {
    case EntryKind::kAll: break;
    case EntryKind::kCountFilter:
      if (entry.count < 1) ThrowInvalid("count filter must be >= 1, got ", entry.count);
      break;
    case EntryKind::kProbability:
      if (!(entry.probability > 0 && entry.probability <= 1)) {
        ThrowInvalid("entry probability must be in (0, 1], got ", entry.probability);
      }
      break;
    default: ThrowInvalid("unknown entry kind ", static_cast<uint32_t>(entry.kind));
  }
  shards_.reserve(kShards);
  for (size_t i = 0; i < kShards; ++i) shards_.push_back(std::make_unique<Shard>(&index_arena_));
}

SparseTable::~SparseTable() { ReleaseSpill(); }

size_t SparseTable::ShardBytes() { return sizeof(Shard); }

void SparseTable::InstallShardSpills() {
  for (size_t i = 0; i < kShards; ++i) {
    Shard& sp = *shards_[i];
    ShardWriteLock lock(sp);
    sp.index.SetCompact();  // its bytes are bytes less of rows in RAM
    sp.spill = std::make_unique<ShardSpill>(spill_file_.get());
    sp.spill->shard = i;
  }
}

void SparseTable::GroupByShard(const uint64_t* keys, size_t n, Batch& b) const {
  b.keys.resize(n);
  b.h.resize(n);
  b.pos.resize(n);
  b.rows.resize(n);
  size_t counts[kShards] = {};
  for (size_t i = 0; i < n; ++i) ++counts[ShardOf(Mix64(keys[i]))];
  b.starts[0] = 0;
  for (size_t s = 0; s < kShards; ++s) b.starts[s + 1] = b.starts[s] + counts[s];
  size_t fill[kShards];
  std::memcpy(fill, b.starts, sizeof(fill));
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(keys[i]);
    const size_t j = fill[ShardOf(h)]++;
    b.keys[j] = keys[i];
    b.h[j] = h;
    b.pos[j] = static_cast<uint32_t>(i);
  }
}

void SparseTable::InitialRow(uint64_t key, float* out) const {
  pyfleet::InitialValues(init_, seed_, key, out, dim_);
  RoundTripNearest(layout_.storage, out, dim_);
}

void SparseTable::ReadRow(uint32_t row, float* w, float* state) const {
  if (layout_.compact()) {
    thread_local std::vector<float> scratch;
    scratch.resize(state_dim_);
    float* st = state ? state : scratch.data();
    LoadCompactRow(layout_, rows_.WeightBytes(row), rows_.StateBytes(row), w, st);
    if (layout_.q8()) {
      Q8DerivedTail(opt_, LoadField(&rows_.Meta(row)->update_count), st + layout_.state_head());
    }
    return;
  }
  const float* rw = rows_.Weights(row);
  for (size_t k = 0; k < dim_; ++k) w[k] = LoadRelaxed(rw + k);
  if (state == nullptr) return;
  const float* rs = rows_.State(row);
  for (size_t k = 0; k < state_dim_; ++k) state[k] = LoadRelaxed(rs + k);
}

uint32_t SparseTable::InsertLocked(Shard& s, uint64_t key, uint64_t h) {
  const uint32_t row = rows_.Allocate();
  if (!layout_.compact()) {
    pyfleet::InitialValues(init_, seed_, key, rows_.Weights(row), dim_);
    OptimizerInitState(opt_, rows_.State(row), dim_);
  } else {
    thread_local std::vector<float> w, st;
    w.resize(dim_);
    st.resize(state_dim_ + 1);
    pyfleet::InitialValues(init_, seed_, key, w.data(), dim_);
    OptimizerInitState(opt_, st.data(), dim_);
    StoreCompactRowNearest(layout_, w.data(), st.data(), rows_.WeightBytes(row),
                           rows_.StateBytes(row));
  }
  *rows_.Meta(row) = RowMeta{0, 0, kRowDirty, 0.f, 0.f};
  s.index.Insert(key, h, row);
  ResidentAdded(s.spill.get(), row, key, /*probation=*/true);
  inserted_rows_.fetch_add(1, std::memory_order_relaxed);
  return row;
}

uint32_t SparseTable::AdmitLocked(Shard& s, uint64_t key, uint64_t h, uint64_t draw_salt) {
  switch (entry_.kind) {
    case EntryKind::kAll:
      return InsertLocked(s, key, h);
    case EntryKind::kCountFilter: {
      uint32_t* seen = s.candidates.FindValue(key, h);
      const uint32_t count = (seen ? *seen : 0) + 1;
      if (count >= entry_.count) {
        if (seen) s.candidates.Erase(key, h);
        return InsertLocked(s, key, h);
      }
      if (seen) {
        *seen = count;
      } else {
        s.candidates.Insert(key, h, count);
      }
      return KeyIndex::kEmpty;
    }
    case EntryKind::kProbability: {
      const uint64_t u = Mix64(key ^ Mix64(seed_ ^ draw_salt));
      const double threshold = static_cast<double>(entry_.probability) * 18446744073709551616.0;
      if (entry_.probability >= 1.f || static_cast<double>(u) < threshold) {
        return InsertLocked(s, key, h);
      }
      return KeyIndex::kEmpty;
    }
  }
  PYFLEET_ASSERT(false);
  return KeyIndex::kEmpty;
}

void SparseTable::EraseLocked(Shard& s, uint64_t key, uint64_t h) {
  const uint32_t row = s.index.Erase(key, h);
  if (row == KeyIndex::kEmpty) return;
  FreeValueLocked(s.spill.get(), row);
  s.dropped.push_back(key);
}

void SparseTable::Pull(const uint64_t* keys, size_t n, float* out, bool create) {
  pull_calls_.fetch_add(1, std::memory_order_relaxed);
  pull_keys_.fetch_add(n, std::memory_order_relaxed);
  if (n == 0) return;
  Batch& b = CallBatch();
  b.misses.clear();
  if (budget_ != 0 && !TryLockAllShared()) {
    // A shard is held for its disk I/O: shard by shard, so that this pull
    // waits only for the shards it has keys in.
    PullFoundByShard(keys, n, out, b);
  } else {
    // Every shard is held shared for the call. Writers take one shard at a
    // time and readers take them in the same order: no cycle. With a disk
    // tier they were taken without waiting (no shard was busy).
    if (budget_ == 0) {
      for (const auto& sp : shards_) sp->mu.lock_shared();
    }
    // A copy loop of known length is unrolled: at dims the models use the
    // pipeline costs about half the instructions per key (the copy was most).
    switch (layout_.weight_kind()) {
      case StorageKind::kFP16: PullFoundDim<StorageKind::kFP16>(keys, n, out, b); break;
      case StorageKind::kBF16: PullFoundDim<StorageKind::kBF16>(keys, n, out, b); break;
      default: PullFoundDim<StorageKind::kFP32>(keys, n, out, b); break;
    }
    for (const auto& sp : shards_) sp->mu.unlock_shared();
  }
  // Either path: the budget pays for this pull's working memory (its misses
  // too, which the pipelined path gathers).
  if (budget_ != 0) NoteCall(b, false);
  if (b.misses.empty()) return;
  if (create) {
    PullMisses(keys, b, out);
    return;
  }
  // No row, and none made: the row the key would start with, or a spilled
  // row read where it lies.
  std::vector<char> rec(budget_ != 0 ? spill_slot_bytes() : 0);
  for (const PullMiss& m : b.misses) {
    float* dst = out + static_cast<size_t>(m.pos) * dim_;
    if (budget_ != 0) {
      const Shard& s = *shards_[ShardOf(m.h)];
      std::shared_lock lock(s.mu);
      const uint32_t v = s.index.Find(keys[m.pos], m.h);
      if (Spilled(v)) {
        ReadSpilled(*s.spill, v, rec.data());
        ReadRecord(rec.data(), dst, nullptr);
        continue;
      }
    }
    InitialRow(keys[m.pos], dst);
  }
}

template <StorageKind S>
void SparseTable::PullFoundDim(const uint64_t* keys, size_t n, float* out, Batch& b) const {
  switch (dim_) {
    case 8: PullFound<8, S>(keys, n, out, b); break;
    case 16: PullFound<16, S>(keys, n, out, b); break;
    case 32: PullFound<32, S>(keys, n, out, b); break;
    case 64: PullFound<64, S>(keys, n, out, b); break;
    default: PullFound<0, S>(keys, n, out, b); break;
  }
}

template <size_t D, StorageKind S>
void SparseTable::PullFound(const uint64_t* keys, size_t n, float* out, Batch& b) const {
  // Keys are served in the caller's order, so `out` is written sequentially,
  // through a software pipeline: while key k is copied, key k+B is probed
  // and its row prefetched, and key k+A+B hashed and its index slots
  // prefetched. Each key costs two misses, its slot's and then its row's;
  // with the copy down to a few vector loads, a steady stream of prefetches
  // keeps about as many misses in flight as the core allows. Measured on
  // 10M rows, dim 16: 1.2-1.3x np.take of a dense array, where staging
  // groups of 32 keys (all prefetches of a group at once) gave 1.0x, and
  // A = B = 4 0.9x. A = 16, B = 24 against A = B = 8, the two alternated on
  // the same 2M-row tables in one process: 14-17% more keys/s for every
  // storage, 2% either way on rows in L2 (a miss here is served from the
  // L3 or memory in more than the ~8 keys' time). Keys without a row go to
  // b.misses.
  const size_t dim = D != 0 ? D : dim_;
  constexpr size_t kElem = S == StorageKind::kFP32 ? sizeof(float) : sizeof(uint16_t);
  const size_t row_bytes = dim * kElem;
  KeyIndex::View index[kShards];
  for (size_t s = 0; s < kShards; ++s) index[s] = shards_[s]->index.view();
  // Hashes and row addresses wait in rings of W entries (in L1), not in
  // arrays of n (16 bytes per key streamed through cache).
  constexpr size_t A = kPullIndexAhead, B = kPullRowAhead, W = kPullRing;
  static_assert(A + B < W && (W & (W - 1)) == 0);
  uint64_t h[W];
  const char* src[W];
  const uint32_t floor = spill_floor_;  // kEmpty, or the first spilled value
  uint8_t* const used = used_;
  const uint8_t epoch = UseEpoch();
  auto hash = [&](size_t i) {
    const uint64_t x = h[i % W] = Mix64(keys[i]);
    index[ShardOf(x)].PrefetchRun(x);
  };
  auto probe = [&](size_t j) {
    const uint64_t x = h[j % W];
    const uint32_t row = index[ShardOf(x)].Find(keys[j], x);
    if (row >= floor) {  // no row, or a spilled one: a miss
      src[j % W] = nullptr;
    } else {
      src[j % W] = rows_.WeightBytesOf<D * kElem>(row);
      PrefetchSpan(src[j % W], row_bytes);
      if (used != nullptr) CountUse(used + row, epoch);
    }
  };
  for (size_t i = 0; i < std::min(n, A + B); ++i) hash(i);
  for (size_t j = 0; j < std::min(n, B); ++j) probe(j);
  for (size_t k = 0; k < n; ++k) {
    if (k + A + B < n) hash(k + A + B);
    if (k + B < n) probe(k + B);
    const char* row = src[k % W];
    if (row == nullptr) {
      b.misses.push_back({h[k % W], static_cast<uint32_t>(k)});
      continue;
    }
    float* dst = out + k * dim;
    if constexpr (S != StorageKind::kFP32) {
      if constexpr (D != 0) {
        CopyCompactRowRelaxed<D, S>(dst, row);
      } else {
        LoadCompactWeights(S, row, dim, dst);
      }
    } else if constexpr (D != 0) {
      CopyRowRelaxed<D>(dst, reinterpret_cast<const float*>(row));
    } else {
      const float* r = reinterpret_cast<const float*>(row);
      for (size_t c = 0; c < dim; ++c) dst[c] = LoadRelaxed(r + c);
    }
  }
}

bool SparseTable::TryLockAllShared() const {
  for (size_t s = 0; s < kShards; ++s) {
    if (!shards_[s]->mu.try_lock_shared()) {
      while (s > 0) shards_[--s]->mu.unlock_shared();
      return false;
    }
  }
  return true;
}

void SparseTable::PullFoundByShard(const uint64_t* keys, size_t n, float* out, Batch& b) {
  // With a disk tier a shard may be held exclusively for a while (its rows
  // read from or written to the spill file): one shard at a time here, so a
  // pull waits only for the shards it has keys in, holding no other shard.
  GroupByShard(keys, n, b);
  for (size_t s = 0; s < kShards; ++s) {
    if (b.starts[s] == b.starts[s + 1]) continue;
    std::shared_lock lock(shards_[s]->mu);
    const KeyIndex& index = shards_[s]->index;
    for (size_t j = b.starts[s]; j < b.starts[s + 1]; ++j) {
      if (j + kPrefetch < b.starts[s + 1]) index.Prefetch(b.h[j + kPrefetch]);
      const uint32_t row = index.Find(b.keys[j], b.h[j]);
      if (row >= spill_floor_) {
        b.misses.push_back({b.h[j], b.pos[j]});
        continue;
      }
      MarkUsed(row);
      float* dst = out + static_cast<size_t>(b.pos[j]) * dim_;
      if (layout_.compact()) {
        LoadCompactWeights(layout_.storage, rows_.WeightBytes(row), dim_, dst);
      } else {
        ReadRow(row, dst, nullptr);
      }
    }
  }
}

void SparseTable::PullMisses(const uint64_t* keys, Batch& b, float* out) {
  // Keys without a row: per shard, exclusively, look again (another thread
  // may have inserted them) and admit each distinct key once. The misses
  // are grouped by shard in place (a counting pass, then each put in its
  // shard's range by swaps), then each shard's few sorted by hash: Mix64 is
  // a bijection, so equal keys are equal hashes and sit together. (A sort
  // of them all by (shard, key), through the caller's array, took 8% of a
  // spilling table's extra time per cold row.)
  PullMiss* g = b.misses.data();
  size_t starts[kShards + 1] = {};
  for (const PullMiss& m : b.misses) ++starts[ShardOf(m.h) + 1];
  for (size_t s = 0; s < kShards; ++s) starts[s + 1] += starts[s];
  size_t next[kShards];
  std::memcpy(next, starts, sizeof(next));
  for (size_t s = 0; s < kShards; ++s) {
    while (next[s] < starts[s + 1]) {
      PullMiss m = g[next[s]];
      for (size_t t = ShardOf(m.h); t != s; t = ShardOf(m.h)) std::swap(m, g[next[t]++]);
      g[next[s]++] = m;
    }
  }
  if (budget_ != 0) RaisePendingSpillError();
  const uint64_t salt = draw_counter_.fetch_add(1, std::memory_order_relaxed);
  thread_local std::vector<uint64_t> reload_keys, reload_h;
  for (size_t shard = 0; shard < kShards; ++shard) {
    const size_t lo = starts[shard], hi = starts[shard + 1];
    if (lo == hi) continue;
    std::sort(g + lo, g + hi, [](const PullMiss& x, const PullMiss& y) { return x.h < y.h; });
    Shard& s = *shards_[shard];
    ShardWriteLock lock(s);
    if (s.spill) {
      reload_keys.resize(hi - lo);
      reload_h.resize(hi - lo);
      for (size_t e = lo; e < hi; ++e) reload_keys[e - lo] = keys[g[e].pos], reload_h[e - lo] = g[e].h;
      ReloadLocked(s.index, *s.spill, reload_keys.data(), reload_h.data(), hi - lo);
    }
    for (size_t m = lo; m < hi;) {
      const uint64_t key = keys[g[m].pos], h = g[m].h;
      uint32_t row = s.index.Find(key, h);
      if (row == KeyIndex::kEmpty) row = AdmitLocked(s, key, h, salt);
      for (; m < hi && g[m].h == h; ++m) {
        float* dst = out + static_cast<size_t>(g[m].pos) * dim_;
        if (row == KeyIndex::kEmpty) {
          InitialRow(key, dst);
          candidate_pulls_.fetch_add(1, std::memory_order_relaxed);
        } else if (layout_.compact()) {
          LoadCompactWeights(layout_.storage, rows_.WeightBytes(row), dim_, dst);
        } else {
          std::memcpy(dst, rows_.Weights(row), dim_ * sizeof(float));
        }
      }
    }
    if (s.spill) EvictLocked(s.index, *s.spill);
  }
}

void SparseTable::Push(const uint64_t* keys, size_t n, const float* grads, bool add_delta) {
  if (const size_t i = FirstNonFinite(grads, n * dim_); i < n * dim_) {
    rejected_pushes_.fetch_add(1, std::memory_order_relaxed);
    ThrowInvalid("push rejected: the gradient of key ", keys[i / dim_], " (position ",
                 i / dim_, ") has a non-finite value or one beyond +-1e18: ", grads[i],
                 "; no row was changed");
  }
  push_calls_.fetch_add(1, std::memory_order_relaxed);
  push_keys_.fetch_add(n, std::memory_order_relaxed);
  if (n == 0) return;
  Batch& b = CallBatch();
  GroupByShard(keys, n, b);
  b.dup_next.assign(n, kNone);
  b.is_dup.assign(n, 0);
  b.w.resize(dim_);
  b.s.resize(state_dim_ + 1);
  b.g.resize(dim_);
  if (budget_ != 0) NoteCall(b, true);
  // A push is applied whole or not at all: its spilled rows are read back
  // before any shard is updated (a read error changes no row), and its
  // evictions never throw (EvictForPush).
  std::fill(std::begin(b.seen), std::end(b.seen), kUnseen);
  if (budget_ != 0) ReloadForPush(b);
  for (size_t s = 0; s < kShards; ++s) {
    if (b.starts[s] < b.starts[s + 1]) {
      PushShard(*shards_[s], b, b.starts[s], b.starts[s + 1], grads, add_delta, b.seen[s]);
    }
  }
}

void SparseTable::RaisePendingSpillError() {
  if (!spill_error_set_.load(std::memory_order_acquire)) return;
  // Each shard over its share evicts now; the first failure is thrown with
  // the error remembered again (no row changed: the victims stay in RAM).
  spill_error_set_.store(false, std::memory_order_relaxed);
  for (const auto& s : shards_) {
    ShardWriteLock lock(*s);
    try {
      EvictLocked(s->index, *s->spill);
    } catch (const std::exception& e) {
      std::lock_guard g(spill_error_mu_);
      spill_error_ = e.what();
      spill_error_set_.store(true, std::memory_order_release);
      ThrowRuntime("the disk tier cannot take the rows beyond its memory budget (",
                   spill_error_, "); nothing was changed");
    }
  }
}

void SparseTable::ReloadForPush(Batch& b) {
  // Each shard's keys are looked up shared (prefetched: the index slots are
  // out of cache) and only those found spilled are read back: the rows a
  // pull brought back and evicted again before this push, a few a shard. A
  // shard with none keeps the rows found (b.rows, b.seen), which PushShard
  // uses if no exclusive hold came in between: one lookup a key, as without
  // a disk tier.
  thread_local std::vector<uint64_t> sk, sh;
  const uint64_t* keys = b.keys.data();
  const uint64_t* h = b.h.data();
  uint32_t* rows = b.rows.data();
  for (size_t s = 0; s < kShards; ++s) {
    const size_t lo = b.starts[s], hi = b.starts[s + 1];
    if (lo == hi) continue;
    Shard& shard = *shards_[s];
    sk.clear();
    sh.clear();
    {
      std::shared_lock lock(shard.mu);
      const KeyIndex::View index = shard.index.view();
      for (size_t j = lo; j < hi; ++j) {
        if (j + kPrefetch < hi) index.PrefetchRun(h[j + kPrefetch]);
        rows[j] = index.Find(keys[j], h[j]);
        if (Spilled(rows[j])) sk.push_back(keys[j]), sh.push_back(h[j]);
      }
      if (sk.empty()) b.seen[s] = shard.version;
    }
    if (sk.empty()) continue;
    ShardWriteLock lock(shard);
    // A read error throws with no row changed; the rows already read back
    // stay in RAM (still exact). The shard then evicts down to its share:
    // the rows read back are at the back of its queue, so others go first.
    // A key evicted between the two locks is read back by PushShard.
    ReloadLocked(shard.index, *shard.spill, sk.data(), sh.data(), sk.size());
    EvictForPush(shard.index, *shard.spill);
  }
}

void SparseTable::Prefetch(const uint64_t* keys, size_t n) {
  // A pull's read-backs without its output or its misses. The disk reads
  // run under the shard's shared lock, so the pulls and pushes of the batch
  // before, in other threads, wait for a prefetch only while it moves rows
  // into RAM and evicts. Then the shard evicts down to its share.
  if (budget_ == 0 || n == 0) return;
  prefetch_calls_.fetch_add(1, std::memory_order_relaxed);
  thread_local Batch b;  // not CallBatch's: a prefetch runs beside that thread's calls
  GroupByShard(keys, n, b);
  prefetch_bytes_.store(b.Note(), std::memory_order_relaxed);
  RaisePendingSpillError();
  for (size_t s = 0; s < kShards; ++s) {
    const size_t lo = b.starts[s], hi = b.starts[s + 1];
    if (lo == hi) continue;
    Shard& shard = *shards_[s];
    uint64_t seen;
    {
      std::shared_lock lock(shard.mu);
      if (ReadSpilledShared(shard.index, *shard.spill, b.keys.data() + lo, b.h.data() + lo,
                            hi - lo) == 0) {
        continue;
      }
      seen = shard.version;
    }
    ShardWriteLock lock(shard);
    const size_t in = InstallReadLocked(shard.index, *shard.spill, shard.version == seen + 1);
    prefetched_rows_.fetch_add(in, std::memory_order_relaxed);
    EvictLocked(shard.index, *shard.spill);
  }
}

void SparseTable::PushShard(Shard& s, Batch& b, size_t lo, size_t hi, const float* grads,
                            bool add_delta, uint64_t seen) {
  // Mark equal keys: the first occurrence carries a chain of the others.
  const size_t len = hi - lo;
  if (len > 1) {
    size_t cap = 16;
    while (cap < 2 * len) cap *= 2;
    b.table.assign(cap, kNone);
    for (size_t j = lo; j < hi; ++j) {
      size_t t = (b.h[j] >> 7) & (cap - 1);
      for (;;) {
        const uint32_t k = b.table[t];
        if (k == kNone) {
          b.table[t] = static_cast<uint32_t>(j);
          break;
        }
        if (b.keys[k] == b.keys[j]) {
          b.is_dup[j] = 1;
          b.dup_next[j] = b.dup_next[k];
          b.dup_next[k] = static_cast<uint32_t>(j);
          break;
        }
        t = (t + 1) & (cap - 1);
      }
    }
  }
  uint32_t* rows = b.rows.data();
  auto probe = [&] {
    size_t misses = 0;
    for (size_t j = lo; j < hi; ++j) {
      if (j + kPrefetch < hi) s.index.Prefetch(b.h[j + kPrefetch]);
      if (b.is_dup[j]) continue;
      rows[j] = s.index.Find(b.keys[j], b.h[j]);
      misses += rows[j] >= spill_floor_;  // no row, or a spilled one
    }
    return misses;
  };
  const size_t w_bytes = dim_ * sizeof(float);
  const size_t row_w_bytes = layout_.weight_bytes(), row_s_bytes = layout_.state_bytes();
  const bool compact = layout_.compact();
  auto apply = [&] {
    float* w = b.w.data();
    float* st = b.s.data();
    for (size_t j = lo; j < hi; ++j) {
      if (j + kPrefetch < hi && !b.is_dup[j + kPrefetch]) {
        const uint32_t r = rows[j + kPrefetch];
        if (r != KeyIndex::kEmpty) {
          PrefetchSpan(rows_.WeightBytes(r), row_w_bytes, true);
          if (row_s_bytes) PrefetchSpan(rows_.StateBytes(r), row_s_bytes, true);
          PrefetchSpan(rows_.Meta(r), sizeof(RowMeta), true);
          // With a disk tier, MarkUsed's byte too (a miss of its own a row).
          if (used_ != nullptr) __builtin_prefetch(used_ + r);
        }
        // The gradients, read where the caller has them (b.pos), are misses
        // of their own too: the key's and its first equal keys' (a hot key's
        // thousands are summed by independent loads, which overlap anyway).
        // Copying them into shard order first cost more: 0.9 ms of a 10.8 ms
        // step all in RAM, 1.0-1.2 of 23 with a disk tier (bench_capacity's
        // table, alternated steps), and 4 x dim bytes a key of the budget.
        uint32_t d = static_cast<uint32_t>(j + kPrefetch);
        for (int k = 0; k < 8 && d != kNone; ++k, d = b.dup_next[d]) {
          PrefetchSpan(grads + static_cast<size_t>(b.pos[d]) * dim_, w_bytes);
        }
      }
      if (b.is_dup[j]) continue;
      const uint32_t row = rows[j];
      if (row == KeyIndex::kEmpty) {
        size_t dropped = 1;
        for (uint32_t d = b.dup_next[j]; d != kNone; d = b.dup_next[d]) ++dropped;
        dropped_push_keys_.fetch_add(dropped, std::memory_order_relaxed);
        continue;
      }
      const float* g = grads + static_cast<size_t>(b.pos[j]) * dim_;
      if (b.dup_next[j] != kNone) {
        float* sum = b.g.data();
        std::memcpy(sum, g, w_bytes);
        for (uint32_t d = b.dup_next[j]; d != kNone; d = b.dup_next[d]) {
          const float* gd = grads + static_cast<size_t>(b.pos[d]) * dim_;
          for (size_t i = 0; i < dim_; ++i) sum[i] += gd[i];
        }
        g = sum;
      }
      MarkPushed(row);
      RowMeta* meta = rows_.Meta(row);
      float* rw = rows_.Weights(row);
      if (compact) {
        // Load into fp32, the fp32 rule, round back stochastically. The
        // stream is keyed by the update count before this update.
        // A q8 row derives Adam's beta powers from the same count.
        char* cw = rows_.WeightBytes(row);
        char* cs = rows_.StateBytes(row);
        const uint32_t count = LoadField(&meta->update_count);
        const uint64_t z = RoundStreamOf(round_salt_, b.keys[j], count);
        if (add_delta && layout_.q8()) {  // the state is not touched: its codes stay
          LoadCompactWeights(layout_.storage, cw, dim_, w);
          for (size_t i = 0; i < dim_; ++i) w[i] += g[i];
          StoreCompactWeights(layout_.storage, w, dim_, cw, z);
        } else {
          LoadCompactRow(layout_, cw, cs, w, st);
          if (add_delta) {
            for (size_t i = 0; i < dim_; ++i) w[i] += g[i];
          } else {
            if (layout_.q8()) Q8DerivedTail(opt_, count, st + layout_.state_head());
            OptimizerUpdate(opt_, w, st, g, dim_);
          }
          StoreCompactRow(layout_, w, st, cw, cs, z);
        }
      } else if (add_delta) {
        for (size_t i = 0; i < dim_; ++i) StoreRelaxed(rw + i, LoadRelaxed(rw + i) + g[i]);
      } else {
        float* rs = rows_.State(row);
        for (size_t i = 0; i < dim_; ++i) w[i] = LoadRelaxed(rw + i);
        for (size_t i = 0; i < state_dim_; ++i) st[i] = LoadRelaxed(rs + i);
        OptimizerUpdate(opt_, w, st, g, dim_);
        for (size_t i = 0; i < dim_; ++i) StoreRelaxed(rw + i, w[i]);
        for (size_t i = 0; i < state_dim_; ++i) StoreRelaxed(rs + i, st[i]);
      }
      // Hogwild like the weights (a concurrent push to the same row may
      // lose an increment): a locked add here was a full fence after every
      // row's update, keeping the next rows' loads from overlapping it.
      const uint32_t count = LoadField(&meta->update_count);
      if (count != 0xFFFFFFFFu) StoreField(&meta->update_count, count + 1);  // saturates
      StoreField<uint16_t>(&meta->unseen_passes, 0);
      StoreField<uint16_t>(&meta->flags, kRowDirty | kRowTouched);
    }
  };
  {
    std::shared_lock lock(s.mu);
    size_t misses = 0;
    if (s.version == seen) {  // b.rows as ReloadForPush found them, still right
      for (size_t j = lo; j < hi; ++j) misses += !b.is_dup[j] && rows[j] >= spill_floor_;
    } else {
      misses = probe();
    }
    if (misses == 0) {
      apply();
      return;
    }
  }
  ShardWriteLock lock(s);
  if (s.spill) ReloadLocked(s.index, *s.spill, b.keys.data() + lo, b.h.data() + lo, hi - lo);
  probe();
  if (entry_.kind == EntryKind::kAll) {
    for (size_t j = lo; j < hi; ++j) {
      if (!b.is_dup[j] && rows[j] == KeyIndex::kEmpty) rows[j] = InsertLocked(s, b.keys[j], b.h[j]);
    }
  }
  apply();
  if (s.spill) EvictForPush(s.index, *s.spill);
}

void SparseTable::AddShowClick(const uint64_t* keys, size_t n, const float* shows,
                               const float* clicks) {
  for (size_t i = 0; i < n; ++i) {
    if (!(shows[i] >= 0 && clicks[i] >= 0) || !std::isfinite(shows[i]) ||
        !std::isfinite(clicks[i])) {
      ThrowInvalid("show/click counts must be finite and >= 0; key ", keys[i], " (position ", i,
                   ") has show ", shows[i], ", click ", clicks[i], "; nothing was changed");
    }
  }
  std::vector<size_t> spilled;
  for (const auto& sp : shards_) sp->mu.lock_shared();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(keys[i]);
    const Shard& s = *shards_[ShardOf(h)];
    const uint32_t row = s.index.Find(keys[i], h);
    if (row == KeyIndex::kEmpty) continue;
    if (Spilled(row)) {
      spilled.push_back(i);
      continue;
    }
    RowMeta* m = rows_.Meta(row);
    StoreField(&m->show, LoadField(&m->show) + shows[i]);
    StoreField(&m->click, LoadField(&m->click) + clicks[i]);
  }
  for (const auto& sp : shards_) sp->mu.unlock_shared();
  // Spilled rows: their counters are changed in the spill file, each key
  // under its shard's exclusive lock (it may have come back to RAM since).
  for (size_t i : spilled) {
    const uint64_t h = Mix64(keys[i]);
    Shard& s = *shards_[ShardOf(h)];
    ShardWriteLock lock(s);
    const uint32_t row = s.index.Find(keys[i], h);
    if (row == KeyIndex::kEmpty) continue;
    RowMeta* m = rows_.Meta(row);
    RowMeta spilled_meta;
    if (Spilled(row)) {
      m = &spilled_meta;
      s.spill->file->ReadPart(row & ~spill_floor_, 0, m, sizeof(RowMeta));
    }
    m->show += shows[i];
    m->click += clicks[i];
    if (Spilled(row)) s.spill->file->WritePart(row & ~spill_floor_, 0, m, sizeof(RowMeta));
  }
}

void SparseTable::InitialValues(const uint64_t* keys, size_t n, float* out) const {
  for (size_t i = 0; i < n; ++i) InitialRow(keys[i], out + i * dim_);
}

RowExport SparseTable::Export(const uint64_t* keys, size_t n, bool with_state) const {
  RowExport e;
  std::vector<float> w(dim_), st(state_dim_);
  std::vector<char> rec(budget_ != 0 ? spill_slot_bytes() : 0);
  RowMeta spilled_meta;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = Mix64(keys[i]);
    const Shard& s = *shards_[ShardOf(h)];
    std::shared_lock lock(s.mu);
    const uint32_t row = s.index.Find(keys[i], h);
    if (row == KeyIndex::kEmpty) continue;
    e.keys.push_back(keys[i]);
    RowMeta* meta;
    if (Spilled(row)) {  // read where it lies, left on disk
      ReadSpilled(*s.spill, row, rec.data());
      ReadRecord(rec.data(), w.data(), with_state ? st.data() : nullptr);
      std::memcpy(&spilled_meta, rec.data(), sizeof(RowMeta));
      meta = &spilled_meta;
    } else {
      ReadRow(row, w.data(), with_state ? st.data() : nullptr);
      meta = rows_.Meta(row);
    }
    e.weights.insert(e.weights.end(), w.begin(), w.end());
    if (with_state) e.state.insert(e.state.end(), st.begin(), st.end());
    e.update_count.push_back(LoadField(&meta->update_count));
    e.show.push_back(LoadField(&meta->show));
    e.click.push_back(LoadField(&meta->click));
    e.unseen_passes.push_back(LoadField(&meta->unseen_passes));
  }
  return e;
}

std::vector<uint64_t> SparseTable::Keys() const {
  std::vector<uint64_t> keys;
  for (const auto& sp : shards_) {
    std::shared_lock lock(sp->mu);
    keys.reserve(keys.size() + sp->index.size());
    sp->index.ForEach([&](uint64_t k, uint32_t) { keys.push_back(k); });
  }
  return keys;
}

size_t SparseTable::Size() const {
  size_t n = 0;
  for (const auto& sp : shards_) {
    std::shared_lock lock(sp->mu);
    n += sp->index.size();
  }
  return n;
}

size_t SparseTable::MemoryBytes() const {
  // With a budget also the last pull's, push's and prefetch's working
  // memory, which the budget pays for (0 without: not tracked).
  size_t bytes = sizeof(*this) + rows_.MemoryBytes() + index_arena_.MemoryBytes() +
                 (spill_file_ ? spill_file_->MemoryBytes() : 0) +
                 pull_bytes_.load(std::memory_order_relaxed) +
                 push_bytes_.load(std::memory_order_relaxed) +
                 prefetch_bytes_.load(std::memory_order_relaxed);
  for (const auto& sp : shards_) {
    std::shared_lock lock(sp->mu);
    const size_t queued = sp->spill ? sp->spill->ring.size() + sp->spill->probation.size() : 0;
    bytes += sizeof(Shard) + queued * sizeof(uint64_t) + sp->index.MemoryBytes() +
             sp->candidates.MemoryBytes() + sp->dropped.capacity() * sizeof(uint64_t);
  }
  return bytes;
}

SparseTableStats SparseTable::Stats() const {
  SparseTableStats st;
  for (const auto& sp : shards_) {
    std::shared_lock lock(sp->mu);
    st.rows += sp->index.size();
    st.candidates += sp->candidates.size();
  }
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  st.pull_calls = get(pull_calls_);
  st.pull_keys = get(pull_keys_);
  st.push_calls = get(push_calls_);
  st.push_keys = get(push_keys_);
  st.inserted_rows = get(inserted_rows_);
  st.candidate_pulls = get(candidate_pulls_);
  st.dropped_push_keys = get(dropped_push_keys_);
  st.rejected_pushes = get(rejected_pushes_);
  st.shrunk_rows = get(shrunk_rows_);
  st.memory_bytes = MemoryBytes();
  if (spill_file_) {
    st.spilled_rows = spill_file_->used();
    st.spill_file_bytes = spill_file_->file_bytes();
    st.spill_reads = spill_file_->reads();
    st.spill_writes = spill_file_->writes();
    st.spill_clean_reads = spill_file_->clean_reads();
    st.spill_clean_moves = spill_file_->clean_moves();
    st.spill_slot_bytes = spill_file_->slot_bytes();
    st.spill_extent_bytes = spill_file_->slot_bytes() * spill_file_->extent_slots();
    st.relocated_rows = get(relocated_rows_);
    st.prefetch_calls = get(prefetch_calls_);
    st.prefetched_rows = get(prefetched_rows_);
    st.spill_ghost_hits = get(ghost_hits_);
  }
  return st;
}

size_t SparseTable::Shrink(int max_unseen, uint32_t min_update_count, float min_score,
                           float decay) {
  size_t dropped = 0;
  std::vector<uint64_t> victims;
  for (const auto& sp : shards_) {
    Shard& s = *sp;
    ShardWriteLock lock(s);
    victims.clear();
    auto pass = [&](uint64_t key, RowMeta* m) {
      if (m->flags & kRowTouched) {
        m->unseen_passes = 0;
      } else if (m->unseen_passes != 0xFFFF) {
        ++m->unseen_passes;
      }
      m->flags &= static_cast<uint16_t>(~kRowTouched);
      m->show *= decay;
      m->click *= decay;
      // Paddle's CTR accessor score: non-clicks weigh 0.1 of a click.
      const float score = 0.1f * (m->show - m->click) + m->click;
      if ((max_unseen >= 0 && m->unseen_passes > max_unseen) ||
          m->update_count < min_update_count || score < min_score) {
        victims.push_back(key);
      }
    };
    s.index.ForEach([&](uint64_t key, uint32_t row) {
      if (!Spilled(row)) pass(key, rows_.Meta(row));
    });
    if (s.spill) {
      ForEachSpilledLocked(s.index, *s.spill, [&](uint64_t key, RowMeta* m, const char*) {
        pass(key, m);
        return true;
      });
    }
    for (uint64_t key : victims) EraseLocked(s, key, Mix64(key));
    dropped += victims.size();
    s.candidates.Clear();
  }
  shrunk_rows_.fetch_add(dropped, std::memory_order_relaxed);
  return dropped;
}

size_t SparseTable::Save(const std::string& path, bool delta) {
  if (delta && delta_invalid_.load()) {
    ThrowInvalid("cannot write a delta to ", path,
                 ": a previous save of this table failed, so rows changed before it would be "
                 "missing; take a full save first");
  }
  const size_t wb = layout_.weight_bytes(), sb = layout_.state_bytes();
  const size_t rec = sizeof(uint64_t) + sizeof(RowMeta) + wb + sb;
  size_t rows = 0;
  std::vector<uint64_t> dropped;
  try {
    FileWriter out(path);
    FileHeader hdr{};
    std::memcpy(hdr.magic, kFileMagic, sizeof(kFileMagic));
    hdr.format_version = kFormatVersion;
    hdr.table_kind = static_cast<uint32_t>(TableKind::kSparse);
    hdr.dim = static_cast<uint32_t>(dim_);
    hdr.optimizer_kind = static_cast<uint32_t>(opt_.kind);
    hdr.state_dim = static_cast<uint32_t>(state_dim_);
    hdr.flags = (delta ? kFileDelta : 0) | kFileBf16State;
    hdr.seed = seed_;
    hdr.meta_bytes = sizeof(RowMeta);
    hdr.storage = static_cast<uint32_t>(layout_.storage);
    out.Write(&hdr, sizeof(hdr));
    std::string buf;
    for (const auto& sp : shards_) {
      Shard& s = *sp;
      buf.clear();
      // One record: key, meta (its dirty flag cleared), then the payload the
      // caller copies to the returned address (weights, then state).
      auto append = [&](uint64_t key, RowMeta* m) {
        m->flags &= static_cast<uint16_t>(~kRowDirty);
        const size_t at = buf.size();
        buf.resize(at + rec);
        char* p = buf.data() + at;
        std::memcpy(p, &key, sizeof(key));
        std::memcpy(p + 8, m, sizeof(RowMeta));
        return p + 8 + sizeof(RowMeta);
      };
      {
        // Exclusive: no push is half-way through a row while it is copied.
        ShardWriteLock lock(s);
        s.index.ForEach([&](uint64_t key, uint32_t row) {
          if (Spilled(row)) return;
          RowMeta* m = rows_.Meta(row);
          if (delta && !(m->flags & kRowDirty)) return;
          char* payload = append(key, m);
          std::memcpy(payload, rows_.WeightBytes(row), wb);
          std::memcpy(payload + wb, rows_.StateBytes(row), sb);
        });
        if (s.spill) {
          // Spilled rows go to the file in pieces, still under the lock, so
          // that a save needs no RAM for a shard's spilled rows.
          ForEachSpilledLocked(s.index, *s.spill, [&](uint64_t key, RowMeta* m, const char* r) {
            const bool dirty = m->flags & kRowDirty;
            if (delta && !dirty) return false;
            std::memcpy(append(key, m), r + sizeof(RowMeta), wb + sb);
            if (buf.size() >= (size_t{8} << 20)) {
              out.Write(buf.data(), buf.size());
              rows += buf.size() / rec;
              buf.clear();
            }
            return dirty;
          });
        }
        dropped.insert(dropped.end(), s.dropped.begin(), s.dropped.end());
        s.dropped.clear();
        s.dropped.shrink_to_fit();
      }
      out.Write(buf.data(), buf.size());
      rows += buf.size() / rec;
    }
    if (delta) out.Write(dropped.data(), dropped.size() * sizeof(uint64_t));
    out.Finish(rows, delta ? dropped.size() : 0);
  } catch (...) {
    delta_invalid_.store(true);
    throw;
  }
  delta_invalid_.store(false);
  return rows;
}

size_t SparseTable::Load(const std::string& path, uint32_t num_servers, uint32_t server_index) {
  FileReader in(path);
  const FileHeader& h = in.header();
  if (h.table_kind != static_cast<uint32_t>(TableKind::kSparse)) {
    ThrowInvalid(path, " holds a dense table, not a sparse one");
  }
  if (h.dim != dim_) ThrowInvalid(path, " holds rows of dim ", h.dim, ", this table has dim ", dim_);
  if (h.optimizer_kind != static_cast<uint32_t>(opt_.kind) || h.state_dim != state_dim_) {
    ThrowInvalid(path, " holds ", OptimizerName(static_cast<OptimizerKind>(h.optimizer_kind)),
                 " state (", h.state_dim, " floats a row); this table uses ",
                 OptimizerName(opt_.kind), " (", state_dim_, " floats a row)");
  }
  if (h.meta_bytes != sizeof(RowMeta)) {
    ThrowRuntime(path, " has row metadata of ", h.meta_bytes, " bytes, expected ",
                 sizeof(RowMeta));
  }
  if (h.storage > kMaxStorageKind) {
    ThrowRuntime(path, " holds rows of unknown storage kind ", h.storage);
  }
  if (budget_ != 0) RaisePendingSpillError();
  // The file's rows as they are laid out; converted when they differ from ours.
  RowLayout fl = TableRowLayout(static_cast<StorageKind>(h.storage), dim_, opt_);
  fl.fp16_state = fl.storage == StorageKind::kFP16 && !(h.flags & kFileBf16State);
  const bool convert = fl.storage != layout_.storage || fl.fp16_state;
  const size_t fwb = fl.weight_bytes(), fsb = fl.state_bytes();
  std::vector<float> cw(dim_), cs(state_dim_ + 1);
  const size_t rec = sizeof(uint64_t) + sizeof(RowMeta) + fwb + fsb;
  const uint64_t num_rows = in.trailer().num_rows, num_dropped = in.trailer().num_dropped;
  in.ExpectBody(num_rows * rec + num_dropped * sizeof(uint64_t));
  constexpr size_t kBatchRows = 4096;
  std::vector<char> buf(kBatchRows * rec);
  size_t loaded = 0;
  for (uint64_t done = 0; done < num_rows;) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(kBatchRows, num_rows - done));
    in.Read(buf.data(), take * rec);
    done += take;
    for (size_t r = 0; r < take; ++r) {
      const char* p = buf.data() + r * rec;
      uint64_t key;
      std::memcpy(&key, p, sizeof(key));
      if (num_servers > 0 && RouteKey(key, num_servers) != server_index) continue;
      const uint64_t hk = Mix64(key);
      Shard& s = *shards_[ShardOf(hk)];
      ShardWriteLock lock(s);
      uint32_t row = s.index.Find(key, hk);
      if (row == KeyIndex::kEmpty) {
        row = rows_.Allocate();
        s.index.Insert(key, hk, row);
        s.candidates.Erase(key, hk);
        // CLOCK's queue, as before probation existed: a load evicts every
        // few rows, and all of them are of one call.
        ResidentAdded(s.spill.get(), row, key, /*probation=*/false);
      } else if (Spilled(row)) {  // replaced: the new row is made in RAM
        FreeValueLocked(s.spill.get(), row);
        row = rows_.Allocate();
        *s.index.FindValue(key, hk) = row;
        ResidentAdded(s.spill.get(), row, key, /*probation=*/false);
      }
      RowMeta* m = rows_.Meta(row);
      std::memcpy(m, p + 8, sizeof(RowMeta));
      m->flags = 0;
      const char* fw = p + 8 + sizeof(RowMeta);
      const char* fs = fw + fwb;
      if (!convert) {
        std::memcpy(rows_.WeightBytes(row), fw, fwb);
        std::memcpy(rows_.StateBytes(row), fs, fsb);
      } else {
        if (fl.compact()) {
          LoadCompactRow(fl, fw, fs, cw.data(), cs.data());
          if (fl.q8()) Q8DerivedTail(opt_, m->update_count, cs.data() + fl.state_head());
        } else {
          std::memcpy(cw.data(), fw, fwb);
          std::memcpy(cs.data(), fs, fsb);
        }
        if (layout_.compact()) {
          StoreCompactRowNearest(layout_, cw.data(), cs.data(), rows_.WeightBytes(row),
                                 rows_.StateBytes(row));
        } else {
          std::memcpy(rows_.WeightBytes(row), cw.data(), dim_ * sizeof(float));
          std::memcpy(rows_.StateBytes(row), cs.data(), state_dim_ * sizeof(float));
        }
      }
      if (s.spill) EvictLocked(s.index, *s.spill, kLoadEvictSlack);
      ++loaded;
    }
  }
  std::vector<uint64_t> dropped(num_dropped);
  in.Read(dropped.data(), dropped.size() * sizeof(uint64_t));
  for (uint64_t key : dropped) {
    if (num_servers > 0 && RouteKey(key, num_servers) != server_index) continue;
    const uint64_t hk = Mix64(key);
    Shard& s = *shards_[ShardOf(hk)];
    ShardWriteLock lock(s);
    const uint32_t row = s.index.Erase(key, hk);
    if (row != KeyIndex::kEmpty) FreeValueLocked(s.spill.get(), row);
  }
  for (const auto& sp : shards_) {
    if (!sp->spill) break;
    ShardWriteLock lock(*sp);
    EvictLocked(sp->index, *sp->spill);
  }
  return loaded;
}

}  // namespace pyfleet

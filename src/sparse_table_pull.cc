// SparseTable's pull path: the rows of a batch of keys copied out (all
// shards held shared, or shard by shard with a disk tier), the keys without
// a row admitted or answered with initial values, and Prefetch's read-backs.
#include "pyfleet/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/internal/row_q8.h"
#include "row_copy.h"
#include "sparse_table_shard.h"

namespace pyfleet {

namespace {

constexpr size_t kPullIndexAhead = 16;  // Pull: keys between hashing and probing
constexpr size_t kPullRowAhead = 24;    // Pull: keys between probing and copying
constexpr size_t kPullRing = 64;        // Pull: ring entries (> the two above)

// g[0, n) regrouped by shard in place, shard s's at [starts[s], starts[s + 1]):
// a counting pass, then each put in its shard's range by swaps.
void GroupMissesByShard(PullMiss* g, size_t n, size_t* starts) {
  constexpr size_t kShards = SparseTable::kShards;
  std::fill_n(starts, kShards + 1, 0);
  const auto shard = [](const PullMiss& m) { return SparseTable::ShardOf(m.h); };
  for (size_t i = 0; i < n; ++i) ++starts[shard(g[i]) + 1];
  for (size_t s = 0; s < kShards; ++s) starts[s + 1] += starts[s];
  size_t next[kShards];
  std::memcpy(next, starts, sizeof(next));
  for (size_t s = 0; s < kShards; ++s) {
    while (next[s] < starts[s + 1]) {
      PullMiss m = g[next[s]];
      for (size_t t = shard(m); t != s; t = shard(m)) std::swap(m, g[next[t]++]);
      g[next[s]++] = m;
    }
  }
}

}  // namespace

void SparseTable::Pull(const uint64_t* keys, size_t n, float* out, bool create) {
  pull_calls_.fetch_add(1, std::memory_order_relaxed);
  pull_keys_.fetch_add(n, std::memory_order_relaxed);
  if (n == 0) return;
  Batch& b = CallBatch();
  b.misses.clear();
  b.deferred.clear();
  // Every shard is held shared for the call. Writers take one shard at a
  // time and readers take them in the same order: no cycle. With a disk
  // tier each is taken only if that needs no wait: a shard held for its disk
  // I/O (a prefetch's read-back, an eviction) is left, and its keys are
  // deferred to PullDeferred, which waits for that shard alone.
  uint64_t held = ~uint64_t{0};
  if (budget_ != 0) {
    held = TryLockShardsShared();
  } else {
    for (const auto& sp : shards_) sp->mu.lock_shared();
  }
  // A copy loop of known length is unrolled: at dims the models use the
  // pipeline costs about half the instructions per key (the copy was most).
  switch (layout_.weight_kind()) {
    case StorageKind::kFP16: PullFoundDim<StorageKind::kFP16>(keys, n, out, b, held); break;
    case StorageKind::kBF16: PullFoundDim<StorageKind::kBF16>(keys, n, out, b, held); break;
    default: PullFoundDim<StorageKind::kFP32>(keys, n, out, b, held); break;
  }
  for (size_t s = 0; s < kShards; ++s) {
    if (held >> s & 1) shards_[s]->mu.unlock_shared();
  }
  if (!b.deferred.empty()) PullDeferred(keys, out, b);
  // The budget pays for this pull's working memory (its misses and
  // deferred keys too, which the pipelined path gathers).
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
void SparseTable::PullFoundDim(const uint64_t* keys, size_t n, float* out, Batch& b,
                               uint64_t held) const {
  switch (dim_) {
    case 8: PullFound<8, S>(keys, n, out, b, held); break;
    case 16: PullFound<16, S>(keys, n, out, b, held); break;
    case 32: PullFound<32, S>(keys, n, out, b, held); break;
    case 64: PullFound<64, S>(keys, n, out, b, held); break;
    default: PullFound<0, S>(keys, n, out, b, held); break;
  }
}

template <size_t D, StorageKind S>
void SparseTable::PullFound(const uint64_t* keys, size_t n, float* out, Batch& b,
                            uint64_t held) const {
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
  // b.misses, keys of shards not held (bit s of held clear) to b.deferred.
  const size_t dim = D != 0 ? D : dim_;
  constexpr size_t kElem = S == StorageKind::kFP32 ? sizeof(float) : sizeof(uint16_t);
  const size_t row_bytes = dim * kElem;
  KeyIndex::View index[kShards];
  for (size_t s = 0; s < kShards; ++s) {
    if (held >> s & 1) index[s] = shards_[s]->index.view();
  }
  const bool all = held == ~uint64_t{0};
  const char* const kDeferred = reinterpret_cast<const char*>(&held);  // a src[] marker
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
    if (all || (held >> ShardOf(x) & 1)) index[ShardOf(x)].PrefetchRun(x);
  };
  auto probe = [&](size_t j) {
    const uint64_t x = h[j % W];
    if (!all && !(held >> ShardOf(x) & 1)) {
      src[j % W] = kDeferred;
      return;
    }
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
    if (row == nullptr || row == kDeferred) {
      (row == nullptr ? b.misses : b.deferred).push_back({h[k % W], static_cast<uint32_t>(k)});
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

uint64_t SparseTable::TryLockShardsShared() const {
  static_assert(kShards == 64, "a shard's bit in a uint64_t");
  uint64_t held = 0;
  for (size_t s = 0; s < kShards; ++s) {
    if (shards_[s]->mu.try_lock_shared()) held |= uint64_t{1} << s;
  }
  return held;
}

void SparseTable::PullDeferred(const uint64_t* keys, float* out, Batch& b) {
  // The keys of shards that were busy (held exclusively for their disk I/O)
  // when the pull began: shard by shard, each under its shared lock alone,
  // so that the pull waits for those shards only, holding no other.
  const size_t n = b.deferred.size();
  size_t starts[kShards + 1];
  GroupMissesByShard(b.deferred.data(), n, starts);
  for (size_t s = 0; s < kShards; ++s) {
    if (starts[s] == starts[s + 1]) continue;
    std::shared_lock lock(shards_[s]->mu);
    const KeyIndex& index = shards_[s]->index;
    for (size_t j = starts[s]; j < starts[s + 1]; ++j) {
      const PullMiss& d = b.deferred[j];
      if (j + kPrefetch < starts[s + 1]) index.Prefetch(b.deferred[j + kPrefetch].h);
      const uint32_t row = index.Find(keys[d.pos], d.h);
      if (row >= spill_floor_) {
        b.misses.push_back(d);
        continue;
      }
      MarkUsed(row);
      float* dst = out + static_cast<size_t>(d.pos) * dim_;
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
  // are grouped by shard in place, then each shard's few sorted by hash:
  // Mix64 is a bijection, so equal keys are equal hashes and sit together.
  // (A sort of them all by (shard, key), through the caller's array, took
  // 8% of a spilling table's extra time per cold row.)
  PullMiss* g = b.misses.data();
  size_t starts[kShards + 1];
  GroupMissesByShard(g, b.misses.size(), starts);
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
    if (s.spill) EvictLocked(s.index, *s.spill, kCallReserve);  // see Prefetch
  }
}

void SparseTable::Prefetch(const uint64_t* keys, size_t n) {
  // A pull's read-backs without its output or its misses. The disk reads
  // run under the shard's shared lock, so the pulls and pushes of the batch
  // before, in other threads, wait for a prefetch only while it moves rows
  // into RAM and evicts. Then the shard evicts down to its cap once it is
  // over its share (the cap and the reserve the budget keeps a shard for a
  // call's rows, 64 rows): a step of 16k keys brings about 27 rows a shard,
  // and evicting them at every call cost the prefetching thread a third more
  // CPU (a victim pass and a 6 KB append a shard a call). So does a pull.
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
    EvictLocked(shard.index, *shard.spill, kCallReserve);
  }
}

}  // namespace pyfleet

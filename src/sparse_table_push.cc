// SparseTable's push path: a batch's gradients applied where the rows live
// (equal keys summed first, spilled rows read back first), and the show and
// click counters.
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

constexpr uint32_t kNone = 0xFFFFFFFFu;

}  // namespace

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
  b.table.clear();  // MarkEqualKeys: its size becomes this push's largest shard's table
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

void SparseTable::PushShard(Shard& s, Batch& b, size_t lo, size_t hi, const float* grads,
                            bool add_delta, uint64_t seen) {
  MarkEqualKeys(b, lo, hi);
  {
    std::shared_lock lock(s.mu);
    size_t misses = 0;
    if (s.version == seen) {  // b.rows as ReloadForPush found them, still right
      for (size_t j = lo; j < hi; ++j) misses += !b.is_dup[j] && b.rows[j] >= spill_floor_;
    } else {
      misses = FindPushRows(s, b, lo, hi);
    }
    if (misses == 0) {
      ApplyPush(b, lo, hi, grads, add_delta);
      return;
    }
  }
  ShardWriteLock lock(s);
  if (s.spill) ReloadLocked(s.index, *s.spill, b.keys.data() + lo, b.h.data() + lo, hi - lo);
  FindPushRows(s, b, lo, hi);
  if (entry_.kind == EntryKind::kAll) {
    for (size_t j = lo; j < hi; ++j) {
      if (!b.is_dup[j] && b.rows[j] == KeyIndex::kEmpty) {
        b.rows[j] = InsertLocked(s, b.keys[j], b.h[j]);
      }
    }
  }
  ApplyPush(b, lo, hi, grads, add_delta);
  if (s.spill) EvictForPush(s.index, *s.spill);
}

void SparseTable::MarkEqualKeys(Batch& b, size_t lo, size_t hi) {
  // The first occurrence carries a chain of the others.
  const size_t len = hi - lo;
  if (len <= 1) return;
  size_t cap = 16;
  while (cap < 2 * len) cap *= 2;
  // The array keeps the size of the largest shard's (a hot key's thousands
  // of copies make one shard's table many times the others'), so that the
  // next call's Batch::Note sees what this push needed, not the last
  // shard's: sized by the last one, it gave the array back and trimmed the
  // heap every call, and the next push took it again.
  if (b.table.size() < cap) b.table.resize(cap);
  std::fill_n(b.table.begin(), cap, kNone);
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

size_t SparseTable::FindPushRows(const Shard& s, Batch& b, size_t lo, size_t hi) const {
  uint32_t* rows = b.rows.data();
  size_t misses = 0;
  for (size_t j = lo; j < hi; ++j) {
    if (j + kPrefetch < hi) s.index.Prefetch(b.h[j + kPrefetch]);
    if (b.is_dup[j]) continue;
    rows[j] = s.index.Find(b.keys[j], b.h[j]);
    misses += rows[j] >= spill_floor_;  // no row, or a spilled one
  }
  return misses;
}

void SparseTable::ApplyPush(Batch& b, size_t lo, size_t hi, const float* grads, bool add_delta) {
  const uint32_t* rows = b.rows.data();
  for (size_t j = lo; j < hi; ++j) {
    if (j + kPrefetch < hi && !b.is_dup[j + kPrefetch]) PrefetchPushRow(b, j + kPrefetch, grads);
    if (b.is_dup[j]) continue;
    const uint32_t row = rows[j];
    if (row == KeyIndex::kEmpty) {
      size_t dropped = 1;
      for (uint32_t d = b.dup_next[j]; d != kNone; d = b.dup_next[d]) ++dropped;
      dropped_push_keys_.fetch_add(dropped, std::memory_order_relaxed);
      continue;
    }
    const float* g = grads + static_cast<size_t>(b.pos[j]) * dim_;
    if (b.dup_next[j] != kNone) g = SumEqualKeyGrads(b, j, grads);
    MarkPushed(row);
    UpdatePushedRow(b, row, b.keys[j], g, add_delta);
  }
}

void SparseTable::PrefetchPushRow(const Batch& b, size_t j, const float* grads) const {
  const uint32_t r = b.rows[j];
  if (r != KeyIndex::kEmpty) {
    PrefetchSpan(rows_.WeightBytes(r), layout_.weight_bytes(), true);
    if (layout_.state_bytes()) PrefetchSpan(rows_.StateBytes(r), layout_.state_bytes(), true);
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
  uint32_t d = static_cast<uint32_t>(j);
  for (int k = 0; k < 8 && d != kNone; ++k, d = b.dup_next[d]) {
    PrefetchSpan(grads + static_cast<size_t>(b.pos[d]) * dim_, dim_ * sizeof(float));
  }
}

const float* SparseTable::SumEqualKeyGrads(Batch& b, size_t j, const float* grads) const {
  float* sum = b.g.data();
  std::memcpy(sum, grads + static_cast<size_t>(b.pos[j]) * dim_, dim_ * sizeof(float));
  for (uint32_t d = b.dup_next[j]; d != kNone; d = b.dup_next[d]) {
    const float* gd = grads + static_cast<size_t>(b.pos[d]) * dim_;
    for (size_t i = 0; i < dim_; ++i) sum[i] += gd[i];
  }
  return sum;
}

void SparseTable::UpdatePushedRow(Batch& b, uint32_t row, uint64_t key, const float* g,
                                  bool add_delta) {
  float* w = b.w.data();
  float* st = b.s.data();
  RowMeta* meta = rows_.Meta(row);
  float* rw = rows_.Weights(row);
  if (layout_.compact()) {
    // Load into fp32, the fp32 rule, round back stochastically. The
    // stream is keyed by the update count before this update.
    // A q8 row derives Adam's beta powers from the same count.
    char* cw = rows_.WeightBytes(row);
    char* cs = rows_.StateBytes(row);
    const uint32_t count = LoadField(&meta->update_count);
    const uint64_t z = RoundStreamOf(round_salt_, key, count);
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

}  // namespace pyfleet

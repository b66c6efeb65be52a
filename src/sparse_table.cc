// SparseTable itself: its shards, a call's scratch, inserting and erasing
// rows, the counters, shrink. The paths live beside it: sparse_table_pull.cc,
// sparse_table_push.cc, sparse_table_file.cc; the disk tier in spill_table.cc.
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

void SparseTable::InitialValues(const uint64_t* keys, size_t n, float* out) const {
  for (size_t i = 0; i < n; ++i) InitialRow(keys[i], out + i * dim_);
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

}  // namespace pyfleet

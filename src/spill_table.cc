// SparseTable's disk tier: a memory budget, eviction to the spill file and
// bringing rows back (declared in sparse_table.h, the store in internal/spill_file.h).
//
// The budget covers the table's memory as measured now: the index arrays
// (with the next growth phased in), the spill file's free list, the
// queues, and rows in RAM at RowBytesInRam() each; what is left is split
// evenly between the shards, less two reserves (a call's rows over a cap, the
// steps of the row limit). Calls that add rows (a pull or push of new or
// spilled keys, a load) evict after their work, under the shard's exclusive
// lock, so a shard may hold one call's rows beyond its share for that moment.
// Row memory follows the budget down: the row store hands out the lowest
// free ids, and as the index grows and the row limit (the rows the budget
// buys) drops, each shard moves its rows above the limit below it
// (RelocateLocked); the memory above the highest id in use goes back.
// Choosing and writing victims: spill_evict.cc.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

#include "pyfleet/error.h"
#include "pyfleet/internal/row_q8.h"
#include "pyfleet/sparse_table.h"
#include "spill_shared.h"

namespace pyfleet {

namespace {

constexpr size_t kUsedBytes = kSpilledBit;  // one byte per possible row id, mapped lazily
constexpr size_t kMinShardRows = 1;
constexpr size_t kCallSlackRows = 64;      // a shard's rows over its cap within a call, reserved

}  // namespace


size_t SparseTable::spill_slot_bytes() const {
  return sizeof(RowMeta) + layout_.weight_bytes() + layout_.state_bytes();
}

size_t SparseTable::MinMemoryBudget() const {
  // Room for 16 rows a shard: less would only make every call a disk trip.
  return kShards * 16 * (spill_slot_bytes() + 1);
}

void SparseTable::EnableSpill(size_t memory_budget, const std::string& spill_dir) {
  if (budget_ != 0) ThrowInvalid("memory_budget: this table already has a disk tier");
  if (Size() != 0) ThrowInvalid("memory_budget: a disk tier is given to an empty table only");
  const size_t min = MinMemoryBudget();
  if (memory_budget < min) {
    ThrowInvalid("memory_budget must be at least ", min, " bytes for this table (rows of ",
                 spill_slot_bytes(), " bytes in ", kShards, " shards), got ", memory_budget);
  }
  RemoveStaleSpillFiles(spill_dir);
  // A slot on disk: the row's record, then its trailer (its key for the
  // cleaner, and when it left, for the ghost hits). Two extents a shard (the
  // open one and the one being cleaned) come to at most a quarter of the
  // budget: extents of budget / 512, up to 256 KiB.
  auto file = std::make_unique<SpillFile>(spill_dir, spill_slot_bytes() + kTrailerBytes,
                                          memory_budget / (8 * kShards));
  void* used = mmap(nullptr, kUsedBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (used == MAP_FAILED) throw std::bad_alloc();
  used_ = static_cast<uint8_t*>(used);
  madvise(used_, kUsedBytes, MADV_NOHUGEPAGE);  // one byte a row: 4 KiB pages, not 2 MiB
  index_arena_.ReleaseFreedArrays();
  rows_.EnableKeys();
  spill_file_ = std::move(file);
  InstallShardSpills();
  budget_ = memory_budget;
  spill_floor_ = kSpilledBit;
}

void SparseTable::ReleaseSpill() {
  if (used_ != nullptr) munmap(used_, kUsedBytes);
  used_ = nullptr;
}

size_t SparseTable::RowBytesInRam() const {
  // Its bytes, its second-chance byte, its key in one of the queues and
  // beside it in the row store (RowStore::EnableKeys), its bit in the row
  // store's map (rounded up to a byte).
  return spill_slot_bytes() + 1 + 2 * sizeof(uint64_t) + 1;
}

void SparseTable::UpdateShardOwnLocked(const KeyIndex& index, ShardSpill& sp) {
  // An index grows at index.grow_at() entries (1.25x at a load of 4/5,
  // KeyIndex::SetCompact); the slots it grows by are paid for in advance,
  // phased in as it fills from the size it grew at to the next, so that the
  // rows make room before the new array is touched (the old one goes back
  // to the kernel right after, see SlabArena::Free). The moment both arrays
  // are live is RowBudget's reserve. Also the shard's list of spill file
  // extents and its queue's stale keys.
  const size_t slots = index.capacity(), next = index.next_capacity();
  const double hi = static_cast<double>(index.grow_at());
  const double lo = hi * static_cast<double>(slots) / static_cast<double>(next);
  const double phase = std::clamp((static_cast<double>(index.size()) - lo) / (hi - lo), 0.0, 1.0);
  const size_t queued = sp.ring.size() + sp.probation.size();
  const size_t stale = queued > sp.resident ? queued - sp.resident : 0;
  const size_t own = index.MemoryBytes() + sp.log.MemoryBytes() +
                     static_cast<size_t>(phase * static_cast<double>((next - slots) * sizeof(IndexSlot))) +
                     (stale + sp.above.capacity()) * sizeof(uint64_t);
  spill_own_.fetch_add(own - sp.own, std::memory_order_relaxed);  // modular: own may shrink
  sp.own = own;
}

size_t SparseTable::RowBudget() const {
  // What is not rows comes off the budget first, as measured now: the
  // table and its shards, the arena's slabs (every index array of 64 KiB or
  // more, on whole huge pages, and the next huge page growing arrays will
  // touch in the slabs of each of the two sizes the shards' arrays have
  // while they grow from one to the next; the index's next growth is
  // phased in by its slots, not by the huge pages they open), one shard's
  // old array while it grows (shards are even, and one may be a step of
  // 1.25x ahead), each shard's own bytes (see
  // UpdateShardOwnLocked), the spill file's free list, and the working
  // memory of the last pull, push and prefetch (about 29 bytes a key of a
  // push and 16 a pulled key without a row in RAM, in one buffer a thread's
  // pulls and pushes share, a pull's keys 24 more bytes each when a busy
  // shard makes it group them; 24 a key of a prefetch; kept by the calling
  // thread for its next call; threads calling at once each hold their own,
  // which is not counted).
  // The huge pages are reserved from when the arrays are within a growth
  // of the arena's smallest (the shards then move into it, often all in
  // one call, opening a few slabs at once).
  const size_t arena = index_arena_.MemoryBytes();
  const size_t own = spill_own_.load(std::memory_order_relaxed);
  const bool slabs = arena != 0 || own >= kShards * SlabArena::kMinBytes * 4 / 5;
  const size_t other = sizeof(*this) + kShards * (ShardBytes() + sizeof(ShardSpill)) + arena +
                       (slabs ? 2 * kHugePageBytes + arena / kShards * 5 / 4 : 0) + own +
                       spill_file_->MemoryBytes() +
                       pull_bytes_.load(std::memory_order_relaxed) +
                       push_bytes_.load(std::memory_order_relaxed) +
                       prefetch_bytes_.load(std::memory_order_relaxed);
  return budget_ > other ? (budget_ - other) / RowBytesInRam() : 0;
}

size_t SparseTable::ShardRowCap(size_t total) const {
  // The rows are split evenly (keys are spread evenly over the shards),
  // after two reserves: kCallSlackRows a shard (a call adds its rows before
  // it evicts) and 1/32 (the row store's limit moves in steps and its
  // memory is given back in steps, see UpdateRowLimit).
  const size_t share = (total - total / 32) / kShards;
  return share > kMinShardRows + kCallSlackRows ? share - kCallSlackRows : kMinShardRows;
}

size_t SparseTable::CallReserveRows(size_t total) const {
  const size_t share = (total - total / 32) / kShards;
  return share - std::min(share, ShardRowCap(total));
}

void SparseTable::UpdateRowLimit(size_t total) {
  // With q = total / 32, the limit stays in [total - q, total - q/2]: the
  // caps and their call reserve sum to total - q (ShardRowCap), and the row
  // store keeps up to limit / 64 <= q/2 rows of touched memory above the
  // highest id in use (RowStore::MaybeRelease), so row memory stays within
  // total. Moved (to total - 3q/4) only when it leaves that band, so that
  // the shards move their rows (a pass over their queues) once per 1/128 of
  // the rows, not at every call.
  const size_t q = total / 32;
  const size_t floor = kShards * (kMinShardRows + kCallSlackRows);
  const size_t limit = rows_.limit();
  if (limit != RowStore::kNone && limit + q >= total && limit + q / 2 <= total) return;
  const size_t want = std::max(total - q + q / 4, floor);
  rows_.SetLimit(static_cast<uint32_t>(std::min<size_t>(want, RowStore::kNone - 1)));
}

void SparseTable::RelocateLocked(KeyIndex& index, ShardSpill& sp) {
  const uint64_t epoch = rows_.limit_epoch();
  const bool moved = sp.epoch_seen != epoch;  // every row may be above it now
  if (!moved && sp.above.empty()) return;
  sp.epoch_seen = epoch;
  thread_local std::vector<uint64_t> again;  // this call's keys of sp.above
  again.clear();
  again.swap(sp.above);
  if (!rows_.InUseAboveLimit()) return;
  const uint32_t limit = rows_.limit();
  const size_t wb = layout_.weight_bytes(), sb = layout_.state_bytes();
  const auto relocate = [&](const uint64_t key) {
    uint32_t* v = index.FindValue(key, Mix64(key));
    if (v == nullptr || Spilled(*v) || *v < limit) return;
    const uint32_t row = rows_.AllocateBelowLimit();
    if (row == RowStore::kNone) {  // other shards are over their caps for now: next time
      sp.above.push_back(key);
      return;
    }
    const uint32_t from = *v;
    std::memcpy(rows_.Meta(row), rows_.Meta(from), sizeof(RowMeta));
    std::memcpy(rows_.WeightBytes(row), rows_.WeightBytes(from), wb);
    std::memcpy(rows_.StateBytes(row), rows_.StateBytes(from), sb);
    StoreUsed(used_ + row, LoadUsed(used_ + from));
    StoreUsed(used_ + from, 0);
    rows_.SetKey(row, key);
    *v = row;
    rows_.Free(from);  // the last row above the limit freed: their memory goes back
    relocated_rows_.fetch_add(1, std::memory_order_relaxed);
  };
  if (moved) {
    // The rows at or above the limit tell their keys (the row store's key
    // column): a pass over those rows, of every shard (a shard's rows are
    // spread over the ids), not a lookup of every key this shard holds in
    // RAM, which took a quarter of a table's CPU while new keys kept its
    // index growing and the limit moving (docs/disk_tier.md). A key read is
    // checked against this shard's index: the row may be another shard's,
    // or freed and made again since its key was written.
    thread_local std::vector<uint64_t> found;
    found.clear();
    rows_.KeysInUseFrom(limit, found, [&](uint64_t key, uint32_t row) {
      const uint64_t h = Mix64(key);
      return ShardOf(h) == sp.shard && index.Find(key, h) == row;
    });
    // Highest first: while there is less room below the limit than rows
    // above it (the shards evict down to the new caps one by one), the
    // room goes to the rows that hold the top up, so the memory above the
    // highest row still in use goes back as soon as it can.
    for (auto it = found.rbegin(); it != found.rend(); ++it) relocate(*it);
  } else {
    for (const uint64_t key : again) relocate(key);
  }
}

void SparseTable::MarkUsed(uint32_t row) const {
  if (used_ != nullptr) CountUse(used_ + row, UseEpoch());
}

void SparseTable::MarkPushed(uint32_t row) const {
  if (used_ != nullptr) CountPushUse(used_ + row, UseEpoch());
}

void SparseTable::QueueOnProbation(ShardSpill& sp, uint64_t key) const {
  const uint64_t call = CallCount();
  const size_t at = call % ShardSpill::kProbationCalls;
  uint64_t& slot_call = sp.probation_call[at];
  // A slot names the last call that used it; a call that began before it
  // (another thread's, waiting for the lock) keeps the later one.
  if (slot_call == ShardSpill::kNoCall || slot_call < call) {
    slot_call = call;
    sp.probation_start[at] = sp.probation_pushed;
  }
  sp.probation.push_back(key);
  ++sp.probation_pushed;
}

void SparseTable::ResidentAdded(ShardSpill* sp, uint32_t row, uint64_t key, bool probation) {
  if (sp == nullptr) return;
  if (row >= kSpilledBit) ThrowRuntime("a table with a disk tier holds at most 2^31 rows in RAM");
  rows_.SetKey(row, key);
  ++sp->resident;
  if (probation) {
    QueueOnProbation(*sp, key);
  } else {
    sp->ring.push_back(key);
  }
  if (row >= rows_.limit()) sp->above.push_back(key);  // to move below it at the next EvictLocked
  // No use counted, and this call's epoch: the step that brought the row
  // in (its pull, the push of the same keys after it) does not count.
  StoreUsed(used_ + row, static_cast<uint8_t>(UseEpoch() << kEpochShift | kNew));
}

void SparseTable::FreeValueLocked(ShardSpill* sp, uint32_t v) {
  if (Spilled(v)) {
    sp->log.Free(v & ~kSpilledBit);
    return;
  }
  rows_.Free(v);
  if (sp != nullptr) --sp->resident;
}

void SparseTable::ReadSpilled(const ShardSpill& sp, uint32_t v, char* rec) const {
  sp.file->ReadPart(v & ~kSpilledBit, 0, rec, spill_slot_bytes());
}

void SparseTable::ReadRecord(const char* rec, float* w, float* state) const {
  const char* rw = rec + sizeof(RowMeta);
  const char* rs = rw + layout_.weight_bytes();
  if (layout_.compact()) {  // as ReadRow does for a row in RAM
    thread_local std::vector<float> scratch;
    scratch.resize(state_dim_ + 1);
    float* st = state ? state : scratch.data();
    LoadCompactRow(layout_, rw, rs, w, st);
    if (layout_.q8()) {
      RowMeta meta;
      std::memcpy(&meta, rec, sizeof(meta));
      Q8DerivedTail(opt_, meta.update_count, st + layout_.state_head());
    }
    return;
  }
  std::memcpy(w, rw, dim_ * sizeof(float));
  if (state != nullptr) std::memcpy(state, rs, state_dim_ * sizeof(float));
}

namespace {

// A prefetch's rows read under a shard's shared lock, waiting for its
// exclusive lock: their keys, hashes, slots and records (slot order).
struct PrefetchScratch {
  std::vector<uint64_t> keys, h;
  std::vector<uint32_t> slots;
  std::vector<char> buf;
};
thread_local PrefetchScratch prefetch_scratch;

}  // namespace

size_t SparseTable::ReadSpilledShared(const KeyIndex& index, const ShardSpill& sp,
                                      const uint64_t* keys, const uint64_t* h, size_t n) const {
  PrefetchScratch& p = prefetch_scratch;
  struct Found {
    uint32_t slot;
    uint32_t i;  // in keys
  };
  thread_local std::vector<Found> found;
  found.clear();
  constexpr size_t kAhead = 16;  // index slots prefetched, as a push's shared lookup does
  const KeyIndex::View view = index.view();
  const uint8_t epoch = UseEpoch();
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) view.PrefetchRun(h[i + kAhead]);
    const uint32_t v = view.Find(keys[i], h[i]);
    if (Spilled(v)) {
      found.push_back({v & ~kSpilledBit, static_cast<uint32_t>(i)});
    } else if (v != KeyIndex::kEmpty) {
      // A use to come, counted now: a row in RAM at zero would otherwise
      // be the first victim of the evictions before its pull (this one's
      // among them), and read back right after.
      CountUse(used_ + v, epoch);
    }
  }
  // In the file's order, each slot once, as ReloadLocked reads them.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.slot < b.slot; });
  found.erase(std::unique(found.begin(), found.end(),
                          [](const Found& a, const Found& b) { return a.slot == b.slot; }),
              found.end());
  const size_t m = found.size();
  p.keys.resize(m);
  p.h.resize(m);
  p.slots.resize(m);
  for (size_t j = 0; j < m; ++j) {
    p.slots[j] = found[j].slot;
    p.keys[j] = keys[found[j].i];
    p.h[j] = h[found[j].i];
  }
  p.buf.resize(m * sp.file->slot_bytes());
  if (m != 0) sp.file->Read(p.slots.data(), p.buf.data(), m);
  return m;
}

size_t SparseTable::InstallReadLocked(KeyIndex& index, ShardSpill& sp, bool unchanged) {
  PrefetchScratch& p = prefetch_scratch;
  const size_t m = p.keys.size();
  if (!unchanged) {
    // Another exclusive hold came in between: a row may have been read back,
    // moved by the cleaner, or written in place (add_show_click, shrink), so
    // the records read may be stale. The rows still spilled are read again.
    const size_t before = sp.resident;
    ReloadLocked(index, sp, p.keys.data(), p.h.data(), m);
    return sp.resident - before;
  }
  thread_local std::vector<uint32_t*> values;
  values.resize(m);
  for (size_t i = 0; i < m; ++i) {
    values[i] = index.FindValue(p.keys[i], p.h[i]);
    PYFLEET_ASSERT(values[i] != nullptr && *values[i] == (kSpilledBit | p.slots[i]));
  }
  InstallRecordsLocked(sp, p.slots.data(), p.buf.data(), m, values.data(), p.keys.data());
  return m;
}

void SparseTable::InstallRecordsLocked(ShardSpill& sp, const uint32_t* slots, const char* buf,
                                       size_t m, uint32_t* const* values, const uint64_t* keys) {
  const size_t rec = sp.file->slot_bytes(), wb = layout_.weight_bytes(), sb = layout_.state_bytes();
  const size_t left_at = spill_slot_bytes() + kLeftInTrailer;
  size_t i = 0, ghosts = 0;
  try {
    for (; i < m; ++i) {
      const uint32_t row = rows_.Allocate();
      const char* r = buf + i * rec;
      std::memcpy(rows_.Meta(row), r, sizeof(RowMeta));
      std::memcpy(rows_.WeightBytes(row), r + sizeof(RowMeta), wb);
      std::memcpy(rows_.StateBytes(row), r + sizeof(RowMeta) + wb, sb);
      // Back within about a pass of the shard's rows after it left: it was
      // evicted too early, and skips probation.
      uint64_t left;
      std::memcpy(&left, r + left_at, sizeof(left));
      const bool ghost = sp.evictions - left < sp.resident;
      ResidentAdded(&sp, row, keys[i], /*probation=*/!ghost);
      ghosts += ghost;
      *values[i] = row;
    }
  } catch (...) {
    ghost_hits_.fetch_add(ghosts, std::memory_order_relaxed);
    sp.log.Free(slots, i);  // the rows that did come back
    throw;
  }
  ghost_hits_.fetch_add(ghosts, std::memory_order_relaxed);
  sp.log.Free(slots, m);
}

void SparseTable::ReloadLocked(KeyIndex& index, ShardSpill& sp, const uint64_t* keys,
                               const uint64_t* h, size_t n, size_t stride) {
  struct Found {
    uint32_t* value;  // the key's index value
    uint32_t slot;
    uint64_t key;
  };
  thread_local std::vector<Found> found;
  thread_local std::vector<uint32_t> slots;
  thread_local std::vector<uint32_t*> values;
  thread_local std::vector<uint64_t> found_keys;
  thread_local std::vector<char> buf;
  found.clear();
  // The keys' index slots were last seen a whole call ago (out of cache):
  // prefetched ahead, as a pull's pipeline does.
  constexpr size_t kAhead = 16;
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) index.Prefetch(h[(i + kAhead) * stride]);
    uint32_t* v = index.FindValue(keys[i * stride], h[i * stride]);
    if (v != nullptr && Spilled(*v)) found.push_back({v, *v & ~kSpilledBit, keys[i * stride]});
  }
  if (found.empty()) return;
  // In the file's order, each slot once (a key given twice): the read then
  // needs no sort of its own, and a run of adjacent slots is one buffer.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.slot < b.slot; });
  found.erase(std::unique(found.begin(), found.end(),
                          [](const Found& a, const Found& b) { return a.slot == b.slot; }),
              found.end());
  const size_t m = found.size();
  slots.resize(m);
  values.resize(m);
  found_keys.resize(m);
  for (size_t i = 0; i < m; ++i) {
    slots[i] = found[i].slot;
    values[i] = found[i].value;
    found_keys[i] = found[i].key;
  }
  buf.resize(m * sp.file->slot_bytes());
  sp.file->Read(slots.data(), buf.data(), m);
  InstallRecordsLocked(sp, slots.data(), buf.data(), m, values.data(), found_keys.data());
}

void SparseTable::ForEachSpilledLocked(
    const KeyIndex& index, ShardSpill& sp,
    const std::function<bool(uint64_t, RowMeta*, const char*)>& f) {
  constexpr size_t kBatch = 4096;
  // In the file's order: a save or shrink of a shard then sweeps its
  // extents front to back (runs of adjacent slots, one call each, read ahead
  // by the kernel) instead of reading its rows at random, which on a table
  // larger than the page cache is a device seek per row.
  std::vector<std::pair<uint32_t, uint64_t>> order;  // (slot, key)
  index.ForEach([&](uint64_t key, uint32_t v) {
    if (Spilled(v)) order.emplace_back(v & ~kSpilledBit, key);
  });
  std::sort(order.begin(), order.end());
  const size_t rec = sp.file->slot_bytes();
  std::vector<uint32_t> slots;
  std::vector<char> buf;
  std::vector<uint32_t> changed_slots;
  std::vector<char> changed;
  for (size_t lo = 0; lo < order.size(); lo += kBatch) {
    const size_t m = std::min(kBatch, order.size() - lo);
    slots.resize(m);
    for (size_t i = 0; i < m; ++i) slots[i] = order[lo + i].first;
    buf.resize(m * rec);
    sp.file->Read(slots.data(), buf.data(), m);
    changed_slots.clear();
    changed.clear();
    for (size_t i = 0; i < m; ++i) {
      char* p = buf.data() + i * rec;
      RowMeta meta;
      std::memcpy(&meta, p, sizeof(meta));
      if (f(order[lo + i].second, &meta, p)) {
        std::memcpy(p, &meta, sizeof(meta));
        changed_slots.push_back(slots[i]);
        changed.insert(changed.end(), p, p + rec);
      }
    }
    sp.file->Write(changed_slots.data(), changed.data(), changed_slots.size());
  }
}

}  // namespace pyfleet

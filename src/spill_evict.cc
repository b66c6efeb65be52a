// SparseTable's disk tier, eviction: which rows leave RAM when a shard is
// over its share of the memory budget (spill_table.cc), and how they are
// written to the shard's extents of the spill file.
//
// The victims are chosen by 2Q over CLOCK with a use count. Each shard
// keeps the keys of its rows in RAM in two FIFO queues. A row comes to RAM
// (new or read back) at zero uses, and every later pull and push of it adds
// one, up to kMaxUse; the step that brought it in (its pull and the push
// after it, by the calls' epochs kept in used_) does not count. It joins
// probation, unless it is read back within a shard's rows of evictions
// after it left (a ghost hit: its spill record carries the shard's count of
// evictions when it left, so the history of rows on disk costs no RAM); a
// ghost hit joins CLOCK's queue. Victims come first from probation's front:
// rows not used again within two steps of coming in; one used again is
// promoted to CLOCK's queue. For each such victim CLOCK's hand moves one
// key: a row whose count is not zero is spared, its count decreased and its
// key queued again; one at zero goes too. So the Zipf tail, seen once,
// leaves after two steps instead of a whole pass of CLOCK's queue, and the
// room goes to rows used again: bench_capacity's steady phase reads back
// ~12% fewer rows a step (docs/dev/disk_tier_log.md, with the simulation that chose
// this). When probation's old rows are not enough, CLOCK's queue gives the
// rest, then the rows of the step before on probation, this step's rows
// last: the push after a pull uses them.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"
#include "pyfleet/hash.h"
#include "pyfleet/sparse_table.h"
#include "spill_shared.h"

namespace pyfleet {

namespace {

constexpr uint8_t kChosen = 0xFF;          // used_ value of a victim being evicted
// Probation's rows not used again are victims once they came in more than
// this many calls ago (two steps of a pull and a push); the step that is
// spared longest is the last kStepCalls calls.
constexpr uint64_t kYoungCalls = 4, kStepCalls = 2;
// CLOCK's hand, moving with probation's victims (beyond the rows wanted),
// spares a row not used since it came for this many calls (8 steps of a
// pull and a push): a ghost hit, read back and queued for CLOCK at zero,
// waits for its next use. Taking such rows at once read back rows used every
// 4th step beside a stream of keys used once at nearly every use
// (test_spill_policy.py; half of them in benchmarks/disk_tier/eviction_sim.py,
// ghosth2 against ghosth2n8).
constexpr unsigned kHandSpareCalls = 16;
constexpr size_t kEvictAhead = 8;  // EvictLocked: index slots of queued keys further on prefetched
static_assert(kYoungCalls <= ShardSpill::kProbationCalls);

// Every cache line of a row (meta, weights, state) asked for ahead.
void PrefetchRow(const RowStore& rows, uint32_t row) {
  const auto lines = [](const void* p, size_t bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t at = first; at < end; at += 64) __builtin_prefetch(reinterpret_cast<const char*>(at));
  };
  lines(rows.Meta(row), sizeof(RowMeta));
  lines(rows.WeightBytes(row), rows.weight_bytes());
  lines(rows.StateBytes(row), rows.state_bytes());
}

}  // namespace

uint64_t SparseTable::ProbationFrom(const ShardSpill& sp, uint64_t call, uint64_t calls) {
  uint64_t from = sp.probation_pushed;
  for (size_t j = 0; j < ShardSpill::kProbationCalls; ++j) {
    const uint64_t c = sp.probation_call[j];
    // A call later than `call` (another thread's) is young too.
    if (c != ShardSpill::kNoCall && c + calls > call) from = std::min(from, sp.probation_start[j]);
  }
  return from;
}

void SparseTable::DropStaleKeysLocked(const KeyIndex& index, ShardSpill& sp) {
  // Keys erased (shrink, load) stay in the queues until they reach the
  // front; a shard that has not evicted for a while drops them here, in
  // order, and CLOCK's duplicates (a key erased and added again meanwhile)
  // if its queue is still large after that.
  const auto stale = [&](uint64_t key) {
    const uint32_t v = index.Find(key, Mix64(key));
    return v == KeyIndex::kEmpty || Spilled(v);
  };
  std::erase_if(sp.ring, stale);
  if (sp.ring.size() > 2 * sp.resident + 1024) {
    std::sort(sp.ring.begin(), sp.ring.end());
    sp.ring.erase(std::unique(sp.ring.begin(), sp.ring.end()), sp.ring.end());
  }
  // Probation's positions move down by the keys dropped before them, so
  // that the calls' starts still tell the young keys.
  uint64_t dropped_before[ShardSpill::kProbationCalls] = {};
  const uint64_t front = sp.probation_pushed - sp.probation.size();
  size_t kept = 0;
  for (size_t i = 0; i < sp.probation.size(); ++i) {
    if (!stale(sp.probation[i])) {
      sp.probation[kept++] = sp.probation[i];
      continue;
    }
    for (size_t j = 0; j < ShardSpill::kProbationCalls; ++j) {
      dropped_before[j] += sp.probation_start[j] > front + i;
    }
  }
  const size_t dropped = sp.probation.size() - kept;
  sp.probation.resize(kept);
  sp.probation_pushed -= dropped;
  for (size_t j = 0; j < ShardSpill::kProbationCalls; ++j) {
    sp.probation_start[j] -= dropped_before[j];
  }
}

// An eviction's victims as they are chosen, and the buffers they leave
// RAM through (a thread's, reused: EvictLocked runs on every spilling call).
struct SparseTable::Victims {
  size_t wanted = 0;               // rows over the shard's cap
  uint8_t epoch = 0;               // UseEpoch() of the call evicting
  std::vector<uint32_t*> values;   // their index values
  std::vector<uint64_t> keys;
  std::vector<uint64_t> promoted;  // from probation, for CLOCK's queue
  std::vector<uint32_t> slots;
  std::vector<char> buf;
  bool more() const { return values.size() < wanted; }
};

void SparseTable::EvictLocked(KeyIndex& index, ShardSpill& sp, size_t slack, bool spare) {
  if (sp.ring.size() + sp.probation.size() > 2 * sp.resident + 1024) DropStaleKeysLocked(index, sp);
  UpdateShardOwnLocked(index, sp);
  const size_t total = RowBudget();
  UpdateRowLimit(total);
  const size_t cap = ShardRowCap(total);
  if (sp.resident <= cap + (slack == kCallReserve ? CallReserveRows(total) : slack)) {
    RelocateLocked(index, sp);
    return;
  }
  thread_local Victims v;
  v.wanted = sp.resident - cap;
  v.epoch = UseEpoch();
  v.values.clear();
  v.keys.clear();
  v.promoted.clear();
  ChooseVictimsLocked(index, sp, v, spare);
  WriteVictimsLocked(sp, v);
  CleanLocked(index, sp);
  RelocateLocked(index, sp);
}

void SparseTable::ChooseVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v, bool spare) {
  // A load (slack) spares no row of its own: it evicts every few rows it
  // adds, all of one call, and each eviction would pass over them all.
  const uint64_t call = CallCount();
  const size_t out = ProbationVictimsLocked(index, sp, v, ProbationFrom(sp, call, kYoungCalls),
                                            spare);
  // The hand moves with probation's victims (rows at zero it meets go too,
  // beyond k): so CLOCK's queue turns over while probation alone gives the
  // victims, and a hot set that moved leaves it in time. Only over keys
  // queued before this eviction: a short queue passed twice lost rows with
  // one use left, this step's (its push read them back).
  ClockVictimsLocked(index, sp, v, std::min(out, sp.ring.size()), spare ? kHandSpareCalls : 0,
                     /*wanted=*/false);
  // Not enough: a pass of CLOCK's queue (counts run down, rows at zero go),
  // then probation's rows of the step before this one, then the passes that
  // find k (every count reaches zero within kMaxUse more), then this step's
  // rows: on probation, promoted, anywhere.
  const unsigned step = spare ? kStepCalls : 0;
  ClockVictimsLocked(index, sp, v, sp.ring.size(), step, true);
  ProbationVictimsLocked(index, sp, v, ProbationFrom(sp, call, kStepCalls), spare);
  ClockVictimsLocked(index, sp, v, kMaxUse * sp.ring.size(), step, true);
  ProbationVictimsLocked(index, sp, v, ~uint64_t{0}, false);
  sp.ring.insert(sp.ring.end(), v.promoted.begin(), v.promoted.end());
  ClockVictimsLocked(index, sp, v, (kMaxUse + 1) * sp.ring.size(), 0, true);
}

uint32_t* SparseTable::UnchosenRowLocked(KeyIndex& index, uint64_t key) const {
  uint32_t* v = index.FindValue(key, Mix64(key));
  if (v == nullptr || Spilled(*v) || LoadUsed(used_ + *v) == kChosen) return nullptr;
  return v;
}

void SparseTable::ChooseVictim(Victims& v, uint32_t* value, uint64_t key) const {
  StoreUsed(used_ + *value, kChosen);
  v.values.push_back(value);
  v.keys.push_back(key);
}

// Probation from its front while victims are wanted: a row used since it
// came in is promoted (to CLOCK's queue at the end of this eviction, so
// that no pass below takes it: this step's pull may be its use); one not
// used is a victim if its position is before `young`, which every key
// after it came in later than. If `spare`, one whose epoch says it came
// in this step is queued again instead: it came in 32 calls ago or more,
// the epochs repeated, and this step's use of it was not counted.
// Returns the victims it took.
size_t SparseTable::ProbationVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v,
                                           uint64_t young, bool spare) {
  size_t taken = 0;
  while (v.more() && !sp.probation.empty()) {
    if (sp.probation.size() > kEvictAhead) index.Prefetch(Mix64(sp.probation[kEvictAhead]));
    const uint64_t key = sp.probation.front();
    uint32_t* value = UnchosenRowLocked(index, key);
    if (value == nullptr) {
      sp.probation.pop_front();
      continue;
    }
    const uint8_t u = LoadUsed(used_ + *value);
    if ((u & kCountMask) != 0) {
      v.promoted.push_back(key);
      sp.probation.pop_front();
      continue;
    }
    if (sp.probation_pushed - sp.probation.size() >= young) break;
    sp.probation.pop_front();
    if (spare && CameInThisStep(u, v.epoch)) {
      QueueOnProbation(sp, key);
    } else {
      ChooseVictim(v, value, key);
      ++taken;
    }
  }
  return taken;
}

// CLOCK's hand, `moves` keys from the front of its queue: a row whose
// count is not zero has it decreased and is queued again; one at zero is
// a victim (while victims are wanted, if `wanted`) unless it came to RAM
// within the last `spare` calls and was not used since (2: this step's
// rows, its epoch this call's or the one before; 0: none spared).
void SparseTable::ClockVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v, size_t moves,
                                     unsigned spare, bool wanted) {
  for (size_t m = 0; m < moves && !sp.ring.empty() && (!wanted || v.more()); ++m) {
    if (sp.ring.size() > kEvictAhead) index.Prefetch(Mix64(sp.ring[kEvictAhead]));
    const uint64_t key = sp.ring.front();
    sp.ring.pop_front();
    uint32_t* value = UnchosenRowLocked(index, key);
    if (value == nullptr) continue;
    const uint8_t u = LoadUsed(used_ + *value);
    if ((u & kCountMask) != 0) {
      StoreUsed(used_ + *value, u - 1);  // the count less one, its epoch kept
      sp.ring.push_back(key);
    } else if (CameWithin(u, v.epoch, spare)) {
      sp.ring.push_back(key);
    } else {
      ChooseVictim(v, value, key);
    }
  }
}

void SparseTable::WriteVictimsLocked(ShardSpill& sp, Victims& v) {
  const size_t k = v.values.size();
  const size_t rec = sp.file->slot_bytes(), wb = layout_.weight_bytes(), sb = layout_.state_bytes();
  v.buf.resize(k * rec);
  v.slots.resize(k);
  // The victims were last used a while ago: their rows' lines (in three
  // columns, four at dim 16 fp32) are asked for kRowAhead victims ahead of
  // the copy instead of missing one by one in it (bench_capacity's steady
  // step 1.4 ms shorter, of ~20; docs/dev/disk_tier_log.md).
  constexpr size_t kRowAhead = 8;
  for (size_t j = 0; j < k; ++j) {
    if (j + kRowAhead < k) PrefetchRow(rows_, *v.values[j + kRowAhead]);
    const uint32_t row = *v.values[j];
    char* p = v.buf.data() + j * rec;
    std::memcpy(p, rows_.Meta(row), sizeof(RowMeta));
    std::memcpy(p + sizeof(RowMeta), rows_.WeightBytes(row), wb);
    std::memcpy(p + sizeof(RowMeta) + wb, rows_.StateBytes(row), sb);
    const uint64_t left = sp.evictions + j;
    std::memcpy(p + sizeof(RowMeta) + wb + sb, &v.keys[j], sizeof(uint64_t));
    std::memcpy(p + sizeof(RowMeta) + wb + sb + kLeftInTrailer, &left, sizeof(left));
  }
  try {
    // Appended to the shard's open extent: one write of consecutive slots.
    sp.log.Append(v.buf.data(), k, v.slots.data());
  } catch (...) {
    // The rows stay in RAM, over budget; the caller sees the I/O error.
    for (size_t j = 0; j < k; ++j) {
      StoreUsed(used_ + *v.values[j], 0);
      sp.ring.push_back(v.keys[j]);
    }
    throw;
  }
  sp.evictions += k;
  for (size_t j = 0; j < k; ++j) {
    const uint32_t row = *v.values[j];
    *v.values[j] = kSpilledBit | v.slots[j];
    StoreUsed(used_ + row, 0);
    rows_.Free(row);
  }
  sp.resident -= k;
}

void SparseTable::EvictForPush(KeyIndex& index, ShardSpill& sp) noexcept {
  // A push has changed its rows when it evicts: throwing now would leave
  // the push's other shards unchanged, and a retry would apply it twice here.
  try {
    EvictLocked(index, sp);
  } catch (const std::exception& e) {
    std::lock_guard g(spill_error_mu_);
    spill_error_ = e.what();
    spill_error_set_.store(true, std::memory_order_release);
  }
}

void SparseTable::CleanLocked(KeyIndex& index, ShardSpill& sp) {
  // Greedy: while the shard's garbage passes the ratio, its full extent
  // with the fewest live slots is read in one call, its live records (those
  // whose key's index value still names their slot) are appended to the
  // open extent, and the extent, empty, goes back to the file.
  thread_local std::vector<char> ext, moved;
  thread_local std::vector<uint32_t*> values;
  thread_local std::vector<uint32_t> old_slots, new_slots;
  const size_t rec = sp.file->slot_bytes(), key_at = spill_slot_bytes();
  const uint32_t per = sp.file->extent_slots();
  while (sp.log.NeedsCleaning()) {
    const uint32_t e = sp.log.EmptiestExtent();
    if (e == ShardLog::kNone) return;
    const uint32_t first = e * per;
    ext.resize(per * rec);
    sp.file->ReadRun(first, ext.data(), per);
    moved.clear();
    values.clear();
    old_slots.clear();
    // The index slots of records kAhead further on are prefetched: each
    // lookup is a cache miss of its own, and an extent is ~1000 of them.
    constexpr uint32_t kAhead = 8;
    const auto key_of = [&](uint32_t i) {
      uint64_t key;
      std::memcpy(&key, ext.data() + i * rec + key_at, sizeof(key));
      return key;
    };
    for (uint32_t i = 0; i < per; ++i) {
      if (i + kAhead < per) index.Prefetch(Mix64(key_of(i + kAhead)));
      const char* p = ext.data() + i * rec;
      const uint64_t key = key_of(i);
      uint32_t* v = index.FindValue(key, Mix64(key));
      if (v == nullptr || *v != (kSpilledBit | (first + i))) continue;  // garbage
      values.push_back(v);
      old_slots.push_back(first + i);
      moved.insert(moved.end(), p, p + rec);
    }
    // Its live count said it had garbage and live slots: the index agrees.
    PYFLEET_ASSERT(!values.empty() && values.size() == sp.file->ExtentLive(e));
    new_slots.resize(values.size());
    sp.log.Append(moved.data(), values.size(), new_slots.data());
    sp.file->CountCleaning(per, values.size());
    for (size_t j = 0; j < values.size(); ++j) {
      *values[j] = kSpilledBit | new_slots[j];
      sp.log.Free(old_slots[j]);  // the last one gives the extent back
    }
  }
}

}  // namespace pyfleet

// SparseTable: uint64 key -> embedding row + optimizer state, updated where it lives.
//
// Keys are spread over kShards shards by the high bits of Mix64(key); each
// shard has its own reader-writer lock, key index and row store. There is no
// global lock. Pull and push take a shard's lock shared while they find rows
// and read or update them; only inserting a new key, shrink, save and load
// take it exclusively. Row updates under the shared lock are Hogwild: two
// pushes to one row may interleave and one update may be lost, but every
// float is read and written whole (relaxed std::atomic_ref), so a row is never
// torn to garbage and a key is never lost or duplicated.
//
// Every batched call groups its keys by shard once and probes each shard's
// index with software prefetching, so a batch costs about one memory latency
// per key spread over many keys in flight.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "pyfleet/entry.h"
#include "pyfleet/initializer.h"
#include "pyfleet/internal/key_index.h"
#include "pyfleet/optimizer.h"
#include "pyfleet/row_encoding.h"
#include "pyfleet/internal/row_store.h"
#include "pyfleet/internal/slab_arena.h"
#include "pyfleet/internal/shard_spill.h"

namespace pyfleet {

struct FileHeader;  // table_io.h

struct SparseTableStats {
  uint64_t rows = 0;
  uint64_t pull_calls = 0, pull_keys = 0;
  uint64_t push_calls = 0, push_keys = 0;
  uint64_t inserted_rows = 0;
  uint64_t candidate_pulls = 0;     // pulled keys answered with an initial value, no row
  uint64_t dropped_push_keys = 0;   // pushed keys that had no row under an entry policy
  uint64_t rejected_pushes = 0;     // pushes refused for a NaN/Inf gradient
  uint64_t shrunk_rows = 0;
  uint64_t candidates = 0;          // keys counted by the admission filter, not yet rows
  uint64_t memory_bytes = 0;
  uint64_t spilled_rows = 0;        // rows in the spill files, not in RAM
  uint64_t spill_file_bytes = 0;    // size of the spill files (slots used and free)
  uint64_t spill_reads = 0, spill_writes = 0;  // rows read from / written to them
  // The cleaner's part of them: slots read (whole extents), records moved.
  uint64_t spill_clean_reads = 0, spill_clean_moves = 0;
  uint64_t spill_slot_bytes = 0, spill_extent_bytes = 0;  // a row's slot on disk, an extent
  uint64_t relocated_rows = 0;      // rows moved below the row limit as the budget's rows shrank
  uint64_t prefetch_calls = 0, prefetched_rows = 0;  // Prefetch calls, rows they read back
  // Rows read back within a shard's rows in RAM of evictions after they
  // left, which skip probation (spill_table.cc): evicted too early.
  uint64_t spill_ghost_hits = 0;
};

// One row's contents, as export() copies them.
struct RowExport {
  std::vector<uint64_t> keys;
  std::vector<float> weights, state;
  std::vector<uint32_t> update_count;
  std::vector<float> show, click;
  std::vector<uint16_t> unseen_passes;
};

class SparseTable {
 public:
  static constexpr int kShardBits = 6;
  static constexpr size_t kShards = size_t{1} << kShardBits;
  // The shard of a key by its hash, Mix64(key): the top kShardBits bits.
  static size_t ShardOf(uint64_t h) { return h >> (64 - kShardBits); }

  // storage: how rows hold their weights and state (row_encoding.h); every
  // call still takes and returns fp32.
  SparseTable(size_t dim, const OptimizerConfig& opt, const InitializerConfig& init,
              uint64_t seed, const EntryConfig& entry,
              StorageKind storage = StorageKind::kFP32);
  ~SparseTable();

  // out[i*dim ..] = row of keys[i]; creates (or, under an entry policy,
  // counts) keys without a row. With create = false a key without a row is
  // answered with its initial row and the table is left as it was (lookups
  // for evaluation or serving). Thread-safe.
  void Pull(const uint64_t* keys, size_t n, float* out, bool create = true);

  // Brings the spilled rows among keys back to RAM, as a pull would, and
  // evicts others down to the budget; creates no row (absent keys are
  // ignored), writes no output and changes no value, count or admission
  // counter. A no-op without a disk tier. Meant to run in another thread
  // on the next batch's keys while this batch is pulled and pushed (the
  // rows it reads back wait as a pull's would, see spill_table.cc).
  // Thread-safe.
  void Prefetch(const uint64_t* keys, size_t n);

  // Applies the optimizer with grads[i*dim ..] to keys[i]'s row. Equal keys
  // are summed and applied once. A NaN/Inf anywhere rejects the whole call
  // (std::invalid_argument) before any row changes. With add_delta the
  // optimizer is bypassed: w += grads (geo mode's deltas). Thread-safe.
  void Push(const uint64_t* keys, size_t n, const float* grads, bool add_delta = false);

  // Adds shows[i] and clicks[i] to keys[i]'s show/click counters (Paddle's
  // CTR accessor; shrink's score decays and compares them). Keys without a
  // row are ignored. Negative or non-finite counts: std::invalid_argument,
  // nothing changed. Thread-safe; concurrent adds to one row are Hogwild.
  void AddShowClick(const uint64_t* keys, size_t n, const float* shows, const float* clicks);

  // The initial rows of keys, without touching the table (as the table's
  // storage holds them: a compact table rounds them to nearest even).
  void InitialValues(const uint64_t* keys, size_t n, float* out) const;

  // Copies rows that exist among keys (each shard under its lock).
  RowExport Export(const uint64_t* keys, size_t n, bool with_state) const;

  std::vector<uint64_t> Keys() const;
  size_t Size() const;
  size_t MemoryBytes() const;
  SparseTableStats Stats() const;

  // Writes rows (delta: those pushed since the last save, and keys dropped
  // since then) to path atomically; each shard is copied under its exclusive
  // lock, so each row is saved from one instant. Returns rows written.
  size_t Save(const std::string& path, bool delta);

  // Reads a file written by Save, of any storage kind: rows of another kind
  // are converted (to nearest even). num_servers > 0 keeps only keys with
  // RouteKey(key, num_servers) == server_index. Returns rows loaded.
  size_t Load(const std::string& path, uint32_t num_servers, uint32_t server_index);

  // Ends a pass and drops stale rows (see pyfleet/table.py). max_unseen < 0
  // disables that test. Returns rows dropped.
  size_t Shrink(int max_unseen, uint32_t min_update_count, float min_score, float decay);

  // Gives the table a disk tier (spill_table.cc): beyond memory_budget bytes
  // (rows, index and spill bookkeeping) rows leave RAM for files in
  // spill_dir; a pull or push brings them back. Only on an empty table.
  // std::invalid_argument naming the problem: a budget below
  // MinMemoryBudget(), a spill_dir where no file can be created.
  void EnableSpill(size_t memory_budget, const std::string& spill_dir);
  size_t MinMemoryBudget() const;
  size_t memory_budget() const { return budget_; }

  size_t dim() const { return dim_; }
  size_t state_dim() const { return state_dim_; }
  const OptimizerConfig& optimizer() const { return opt_; }
  StorageKind storage() const { return layout_.storage; }

 private:
  struct Shard;
  struct Batch;

  // Regroups keys by shard into b (b.pos: each one's place in keys).
  void GroupByShard(const uint64_t* keys, size_t n, Batch& b) const;
  // Pull's lookups and copies for rows that exist (D = dim, or 0 for any);
  // the caller holds shard s shared where bit s of held is set (the keys of
  // the others go to b.deferred).
  template <StorageKind S>
  void PullFoundDim(const uint64_t* keys, size_t n, float* out, Batch& b, uint64_t held) const;
  template <size_t D, StorageKind S>
  void PullFound(const uint64_t* keys, size_t n, float* out, Batch& b, uint64_t held) const;
  void PullMisses(const uint64_t* keys, Batch& b, float* out);
  // Pull's lookups and copies of b.deferred with a disk tier: shard by shard
  // under each one's shared lock (misses and spilled rows to b.misses).
  void PullDeferred(const uint64_t* keys, float* out, Batch& b);
  // The shared locks of the shards not held exclusively now (bit s: shard s).
  uint64_t TryLockShardsShared() const;
  // seen: the shard's version b.rows[lo, hi) were looked up at (kUnseen if
  // not). Key j's gradient is the caller's, grads + b.pos[j] * dim.
  void PushShard(Shard& s, Batch& b, size_t lo, size_t hi, const float* grads,
                 bool add_delta, uint64_t seen);
  // PushShard's steps (sparse_table_push.cc): equal keys chained to their
  // first (b.is_dup, b.dup_next); the rows of keys[lo, hi) looked up into
  // b.rows (returns how many are missing or spilled); the gradients applied
  // row by row, each row's lines prefetched kPrefetch keys ahead and equal
  // keys' gradients summed first (into b.g; returns the sum).
  void MarkEqualKeys(Batch& b, size_t lo, size_t hi);
  size_t FindPushRows(const Shard& s, Batch& b, size_t lo, size_t hi) const;
  void ApplyPush(Batch& b, size_t lo, size_t hi, const float* grads, bool add_delta);
  void PrefetchPushRow(const Batch& b, size_t j, const float* grads) const;
  const float* SumEqualKeyGrads(Batch& b, size_t j, const float* grads) const;
  void UpdatePushedRow(Batch& b, uint32_t row, uint64_t key, const float* g, bool add_delta);
  // Under the exclusive lock: the row of key, creating it if the entry policy
  // admits it now; kEmpty when it stays a candidate.
  uint32_t AdmitLocked(Shard& s, uint64_t key, uint64_t h, uint64_t draw_salt);
  uint32_t InsertLocked(Shard& s, uint64_t key, uint64_t h);
  void EraseLocked(Shard& s, uint64_t key, uint64_t h);
  // The disk tier (spill_table.cc). An index value >= spill_floor_ other
  // than kEmpty is kSpilledBit | slot of a row in the shard's spill file;
  // without a disk tier spill_floor_ is kEmpty and no value is spilled.
  // The *Locked helpers run under the shard's exclusive lock.
  bool Spilled(uint32_t v) const { return v >= spill_floor_ && v != KeyIndex::kEmpty; }
  // Prefetch's read-back of a shard in two holds (spill_table.cc). Under
  // the shared lock: the spilled rows among keys[0, n) are read into this
  // thread's scratch (a live slot changes only under the exclusive lock);
  // returns how many. Under the exclusive lock: they come to RAM from the
  // scratch if no other exclusive hold came in between (unchanged), else
  // are read again where they are now; returns the rows brought to RAM.
  size_t ReadSpilledShared(const KeyIndex& index, const ShardSpill& sp, const uint64_t* keys,
                           const uint64_t* h, size_t n) const;
  size_t InstallReadLocked(KeyIndex& index, ShardSpill& sp, bool unchanged);
  // The m records in buf, read from slots, come to RAM as rows: the i-th
  // is keys[i]'s, whose index value *values[i] then names it. The slots are
  // freed (after an error, those of the rows that came back).
  void InstallRecordsLocked(ShardSpill& sp, const uint32_t* slots, const char* buf, size_t m,
                            uint32_t* const* values, const uint64_t* keys);
  // Brings the spilled rows among keys[i * stride] back to RAM.
  void ReloadLocked(KeyIndex& index, ShardSpill& sp, const uint64_t* keys, const uint64_t* h,
                    size_t n, size_t stride = 1);
  // Evicts rows (2Q: probation, then CLOCK) down to the shard's cap once it
  // holds more than the cap plus slack rows (kCallReserve: the rows the
  // budget keeps a shard beyond its cap for a call's rows, ShardRowCap).
  // spare: this step's rows go last (a load's rows are all one call's: it
  // spares none).
  static constexpr size_t kCallReserve = ~size_t{0};
  void EvictLocked(KeyIndex& index, ShardSpill& sp, size_t slack = 0, bool spare = true);
  // EvictLocked's steps (spill_table.cc): the victims chosen (probation
  // from its front, then CLOCK's hand, in the order its comment gives),
  // then written to the shard's open extent and their rows freed.
  struct Victims;
  void ChooseVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v, bool spare);
  // Probation's victims of positions before young (returns how many) and
  // CLOCK's hand over `moves` keys (sparing rows that came within `spare`
  // calls; only while victims are wanted, if `wanted`).
  size_t ProbationVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v, uint64_t young,
                                bool spare);
  void ClockVictimsLocked(KeyIndex& index, ShardSpill& sp, Victims& v, size_t moves,
                          unsigned spare, bool wanted);
  // The row behind key, or null if it was evicted or erased since the key
  // was queued (the key is dropped) or is already a victim (a second entry
  // of a key erased and added again).
  uint32_t* UnchosenRowLocked(KeyIndex& index, uint64_t key) const;
  void ChooseVictim(Victims& v, uint32_t* value, uint64_t key) const;
  void WriteVictimsLocked(ShardSpill& sp, Victims& v);
  // Save's and Load's steps (sparse_table_file.cc): the file's header against this
  // table; the row key will be loaded into (made, or made again in RAM if
  // spilled); a record [RowMeta | weights | state] of layout fl stored in it
  // (converted to this table's layout if `convert`, through cw and cs).
  void CheckLoadHeader(const std::string& path, const FileHeader& h) const;
  FileHeader SaveHeader(bool delta) const;  // Save's header of this table
  uint32_t LoadedRowLocked(Shard& s, uint64_t key, uint64_t hk);
  void StoreLoadedRow(const RowLayout& fl, bool convert, const char* rec, uint32_t row, float* cw,
                      float* cs);
  // A push's eviction: never throws; a failed write leaves the rows in RAM
  // and is remembered for RaisePendingSpillError.
  void EvictForPush(KeyIndex& index, ShardSpill& sp) noexcept;
  // Before a call that adds rows to RAM changes anything: the evictions a
  // push held back are retried, their error thrown if the write still fails.
  void RaisePendingSpillError();
  // A push's spilled rows, every shard's, back in RAM before any is updated
  // (b grouped by shard); the rows of shards with none in b.rows, b.seen.
  void ReloadForPush(Batch& b);
  // Moves live records out of the shard's emptiest extents (shard_log.h).
  void CleanLocked(KeyIndex& index, ShardSpill& sp);
  // A shard's rows in RAM out of RowBudget()'s total; the row store's limit.
  size_t ShardRowCap(size_t total) const;
  size_t CallReserveRows(size_t total) const;  // a shard's rows between its cap and its share
  void UpdateRowLimit(size_t total);
  // Adds the shard's bytes besides rows (its array outside the arena, its
  // next doubling phased in, stale queue keys) to spill_own_.
  void UpdateShardOwnLocked(const KeyIndex& index, ShardSpill& sp);
  // Rows in RAM the budget buys table-wide (before the reserves), and the
  // bytes one costs.
  size_t RowBudget() const;
  size_t RowBytesInRam() const;
  static size_t ShardBytes();  // sizeof(Shard), which only the sparse_table*.cc files see
  // Moves the shard's rows at or above the row store's limit below it.
  void RelocateLocked(KeyIndex& index, ShardSpill& sp);
  // A spilled row's slot: [RowMeta | weights | state] (the shard held shared).
  void ReadSpilled(const ShardSpill& sp, uint32_t v, char* rec) const;
  void ReadRecord(const char* rec, float* w, float* state) const;  // state may be null
  // A pull or push used a row in RAM (the shard held shared or exclusive).
  void MarkUsed(uint32_t row) const;
  void MarkPushed(uint32_t row) const;  // CountPushUse
  // A row now in RAM (new, read back or loaded) joins the back of one of
  // its shard's queues (probation, or CLOCK's) with no use counted.
  void ResidentAdded(ShardSpill* sp, uint32_t row, uint64_t key, bool probation);
  // Queues key at the back of sp's probation, as one of this call's.
  void QueueOnProbation(ShardSpill& sp, uint64_t key) const;
  // The position on sp's probation queue from which its keys came in within
  // the last `calls` calls (at most ShardSpill::kProbationCalls).
  static uint64_t ProbationFrom(const ShardSpill& sp, uint64_t call, uint64_t calls);
  // Drops the keys erased or spilled since they were queued from sp's queues.
  void DropStaleKeysLocked(const KeyIndex& index, ShardSpill& sp);
  // Frees key's row or spilled slot after its index entry was erased.
  void FreeValueLocked(ShardSpill* sp, uint32_t v);
  // f(key, meta, record) for each spilled row of the shard; the records for
  // which f returns true are written back.
  void ForEachSpilledLocked(const KeyIndex& index, ShardSpill& sp,
                            const std::function<bool(uint64_t, RowMeta*, const char*)>& f);
  size_t spill_slot_bytes() const;
  void ReleaseSpill();
  void InstallShardSpills();  // each shard's ShardSpill over spill_file_

  // out[0, dim) = key's initial row, as this table's storage would hold it.
  void InitialRow(uint64_t key, float* out) const;
  // An existing row's weights and state as fp32 (state may be null).
  void ReadRow(uint32_t row, float* w, float* state) const;

  const size_t dim_;
  const size_t state_dim_;
  const OptimizerConfig opt_;
  const InitializerConfig init_;
  const uint64_t seed_;
  const EntryConfig entry_;
  const RowLayout layout_;
  const uint64_t round_salt_;  // Mix64(seed ^ kRoundSalt): the rounding streams' base
  SlabArena index_arena_;  // the shards' bigger index arrays (outlives shards_)
  std::vector<std::unique_ptr<Shard>> shards_;
  RowStore rows_;  // every shard's rows (row ids are table-wide)
  std::atomic<bool> delta_invalid_{false};
  size_t budget_ = 0;                       // 0: no disk tier
  uint32_t spill_floor_ = KeyIndex::kEmpty;
  // A byte by row id (with a disk tier): the row's use count in bits 0-1
  // (up to kMaxUse), kNew in bit 2 until a use counts, and in bits 3-7 the
  // call epoch (UseEpoch) it came to RAM at. 0xFF (count 3 and kNew, which
  // no row has) marks a victim.
  uint8_t* used_ = nullptr;
  static constexpr uint8_t kMaxUse = 3;
  static constexpr uint8_t kCountMask = 3, kNew = 4, kEpochMask = 31;
  static constexpr int kEpochShift = 3;
  // Pulls and pushes so far; UseEpoch mod 32.
  uint64_t CallCount() const {
    return pull_calls_.load(std::memory_order_relaxed) + push_calls_.load(std::memory_order_relaxed);
  }
  uint8_t UseEpoch() const { return static_cast<uint8_t>(CallCount() & kEpochMask); }
  // Whether a row not used since it came to RAM came in this step: its
  // epoch is this call's or the one before (the pull whose push this is).
  // Epochs repeat after 32 calls, so a row not used for that long may look
  // new once more, for two calls: its first use then does not count.
  static bool CameInThisStep(uint8_t u, uint8_t epoch) { return CameWithin(u, epoch, 2); }
  // Whether a row not used since it came to RAM came within the last
  // `calls` calls (at most 32, and as above, modulo 32).
  static bool CameWithin(uint8_t u, uint8_t epoch, unsigned calls) {
    return (u & kNew) != 0 && ((epoch - (u >> kEpochShift)) & kEpochMask) < calls;
  }
  // A use of the row whose byte is *u in a call of the given epoch, the
  // step that brought the row to RAM not counted: relaxed (concurrent uses
  // may lose one), and written only when the count rises, so the bytes of
  // hot rows, saturated, are read and not written.
  static void CountUse(uint8_t* u, uint8_t epoch) {
    std::atomic_ref<uint8_t> a(*u);
    const uint8_t v = a.load(std::memory_order_relaxed);
    if ((v & kCountMask) >= kMaxUse || CameInThisStep(v, epoch)) return;
    a.store(static_cast<uint8_t>((v & ~kNew) + 1), std::memory_order_relaxed);
  }
  // A push's use: as CountUse, but none for a row not used since it came.
  // A push follows the pull of its keys, which brought such a row in, and
  // is its step's use: through the service the next batch's pull comes in
  // between (the worker pulls ahead), so the push is three calls after its
  // pull, not "this step" by the epoch, and counting it promoted every new
  // row off probation (2Q's eviction then did a CLOCK pass for each).
  static void CountPushUse(uint8_t* u, uint8_t epoch) {
    if ((std::atomic_ref<uint8_t>(*u).load(std::memory_order_relaxed) & kNew) != 0) return;
    CountUse(u, epoch);
  }
  std::atomic<size_t> spill_own_{0};  // the shards' ShardSpill::own, summed
  // The working memory of the last pull, push and prefetch (Batch::Note
  // in sparse_table_shard.h), which a memory budget pays for. A thread's pull
  // and push share one Batch (CallBatch): a call's NoteCall zeroes the
  // other kind's bytes if they were the same Batch's, so it is paid once.
  std::atomic<size_t> pull_bytes_{0}, push_bytes_{0}, prefetch_bytes_{0};
  std::mutex note_mu_;  // NoteCall's update of the two below and the bytes
  const void* pull_batch_ = nullptr;  // the Batch pull_bytes_ is of
  const void* push_batch_ = nullptr;
  static Batch& CallBatch();  // this thread's, for its pulls and pushes
  void NoteCall(Batch& b, bool push);
  std::atomic<uint64_t> relocated_rows_{0};  // RelocateLocked's moves (stats)
  std::atomic<uint64_t> prefetch_calls_{0}, prefetched_rows_{0};  // (stats)
  std::atomic<uint64_t> ghost_hits_{0};  // InstallRecordsLocked's rows that skip probation (stats)
  std::unique_ptr<SpillFile> spill_file_;  // every shard's spilled rows
  std::atomic<bool> spill_error_set_{false};  // a push's eviction failed (spill_error_)
  std::mutex spill_error_mu_;
  std::string spill_error_;

  mutable std::atomic<uint64_t> pull_calls_{0}, pull_keys_{0}, push_calls_{0}, push_keys_{0},
      inserted_rows_{0}, candidate_pulls_{0}, dropped_push_keys_{0}, rejected_pushes_{0},
      shrunk_rows_{0}, draw_counter_{0};
};

}  // namespace pyfleet

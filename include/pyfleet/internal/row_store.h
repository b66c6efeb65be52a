// Stable chunked storage for the rows of a table, shared by its shards.
//
// A row is addressed by a uint32 row id; rows never move when the store grows
// (chunks are appended, never reallocated, and the chunk table itself is a
// fixed mapping), so a reader holding a row id under its shard's shared lock
// may use it while other shards add rows. One store per table, not per shard.
// The first chunk holds kFirstChunkRows rows (small tables stay small), every
// later one kChunkRows. A chunk is three separately mapped column blocks, so
// that a pull touches only the weights:
//
//   chunk: weights[rows][weight_bytes]    state[rows][state_bytes]    meta[rows]
//
// What a row's weight and state bytes hold (fp32, or a compact 16-bit form)
// is the RowLayout of row_encoding.h; the store only keeps the columns.
//
// Pages are touched only as rows are allocated. A pull or push reads random
// rows, and on small pages nearly every one is also a TLB miss (measured:
// pulls from a 10M-row table 1.5-2x slower), so each block of a later chunk
// starts 2 MiB-aligned and every 2 MiB page of it is collapsed into a huge
// page as soon as the rows it holds are all allocated: at most one page per
// column stays small, and no huge page holds memory for rows that do not
// exist. Chunks of 2^17 rows make even the 16-byte meta column fill pages.
//
// Row ids are handed out lowest first (a bit map of ids in use). A table
// with a memory budget sets a row limit (the rows its budget buys); as its
// index grows the limit drops, the shards move their rows above it below it
// (RelocateLocked in spill_table.cc), and the memory of ids above the
// highest one in use goes back to the kernel: the row memory a table holds
// follows its budget down instead of staying at its high water.
//
//   RowMeta (16 bytes):
//   +--------------+---------------+-------+------+-------+
//   | update_count | unseen_passes | flags | show | click |
//   |   uint32     |    uint16     | u16   | f32  |  f32  |
//   +--------------+---------------+-------+------+-------+
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace pyfleet {

struct RowMeta {
  uint32_t update_count;   // pushes applied to this row (saturating)
  uint16_t unseen_passes;  // shrink() calls since the last push (saturating)
  uint16_t flags;          // kDirty | kTouched
  float show;              // decayed show score (Paddle's CTR accessor)
  float click;             // decayed click score
};
static_assert(sizeof(RowMeta) == 16, "RowMeta is part of the file format");

inline constexpr uint16_t kRowDirty = 1;    // pushed since the last save
inline constexpr uint16_t kRowTouched = 2;  // pushed since the last shrink

class RowStore {
 public:
  static constexpr uint32_t kFirstChunkRows = 4096;
  static constexpr uint32_t kChunkShift = 17;
  static constexpr uint32_t kChunkRows = 1u << kChunkShift;

  // Bytes of one row in each column (each a multiple of 4).
  RowStore(size_t weight_bytes, size_t state_bytes);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // A fresh row id (reusing a freed one first). Thread-safe (an internal
  // mutex); the caller publishes the row through its shard's index.
  uint32_t Allocate();
  void Free(uint32_t row);

  static constexpr uint32_t kNone = 0xFFFFFFFFu;
  // Allocate hands out the lowest free id, so rows gather at low ids. A
  // limit (kNone: none) is the row count a memory budget buys: lowering it
  // bumps limit_epoch(), telling the shards to move their rows above it
  // below it.
  void SetLimit(uint32_t limit);
  uint32_t limit() const { return limit_; }
  uint64_t limit_epoch() const { return limit_epoch_; }
  // Rows at or above the limit in use (to move below it).
  bool InUseAboveLimit() const;
  // The lowest free row id if it is below the limit, else kNone.
  uint32_t AllocateBelowLimit();

  // The row's weight bytes; as float*: for fp32 rows.
  float* Weights(uint32_t row) const { return reinterpret_cast<float*>(WeightBytes(row)); }
  char* WeightBytes(uint32_t row) const {
    const Where w = Locate(row);
    return chunks_[w.chunk].weights + w.offset * weight_bytes_;
  }
  // WeightBytes(row) for a row size known at compile time (B == weight_bytes(); 0: any).
  template <size_t B>
  char* WeightBytesOf(uint32_t row) const {
    if constexpr (B == 0) {
      return WeightBytes(row);
    } else {
      const Where w = Locate(row);
      return chunks_[w.chunk].weights + w.offset * B;
    }
  }
  float* State(uint32_t row) const { return reinterpret_cast<float*>(StateBytes(row)); }
  char* StateBytes(uint32_t row) const {
    const Where w = Locate(row);
    return chunks_[w.chunk].state + w.offset * state_bytes_;
  }
  RowMeta* Meta(uint32_t row) const {
    const Where w = Locate(row);
    return chunks_[w.chunk].meta + w.offset;
  }

  size_t weight_bytes() const { return weight_bytes_; }
  size_t state_bytes() const { return state_bytes_; }
  size_t MemoryBytes() const;

  // Each row's key beside it (8 bytes a row), for a table with a memory
  // budget: when the limit moves down, the rows above it tell their keys, so
  // that a shard finds its rows to move by a pass over those rows instead of
  // a lookup of every key it holds (a quarter of a growing table's CPU).
  // Before the first row only. The key is written by the row's owner (under
  // its shard's lock) and read by any shard under this store's mutex:
  // relaxed atomics, and a reader checks a key against its own index.
  void EnableKeys();
  void SetKey(uint32_t row, uint64_t key) const {
    const Where w = Locate(row);
    __atomic_store_n(chunks_[w.chunk].keys + w.offset, key, __ATOMIC_RELAXED);
  }
  // Appends to out the keys of the rows in use from `from` on for which
  // keep(key, row) holds; no row is made or freed meanwhile (the mutex).
  template <class Keep>
  void KeysInUseFrom(uint32_t from, std::vector<uint64_t>& out, Keep&& keep) const {
    std::lock_guard lock(mu_);
    for (uint32_t row = from; row < top_; ++row) {
      if ((live_[row / 64] >> (row % 64) & 1) == 0) continue;
      const Where w = Locate(row);
      const uint64_t key = __atomic_load_n(chunks_[w.chunk].keys + w.offset, __ATOMIC_RELAXED);
      if (keep(key, row)) out.push_back(key);
    }
  }

 private:
  struct Where {
    size_t chunk, offset, capacity;
  };
  static Where Locate(uint32_t row) {
    if (row < kFirstChunkRows) return {0, row, kFirstChunkRows};
    const uint32_t r = row - kFirstChunkRows;
    return {1 + (r >> kChunkShift), r & (kChunkRows - 1), kChunkRows};
  }
  struct Chunk {
    char* weights;
    char* state;
    RowMeta* meta;
    uint64_t* keys;  // with EnableKeys, else null
    size_t rows;
  };
  void FreeChunk(const Chunk& c);
  // With a limit: the memory of rows from top_ to touched_ back to the
  // kernel (whole chunks unmapped, the tail pages of the one holding top_
  // dropped), once it is 1/64 of the limit or more. Under mu_.
  void MaybeRelease();
  uint32_t LowestFreeLocked();  // the lowest free id, or top_ (under mu_)
  void GrowLocked();            // top_ + 1, mapping its chunk if new (under mu_)
  void SetLive(uint32_t row, bool live);
  // Collapses the 2 MiB pages of chunk k's columns that row `offset` (just
  // allocated, the chunk's highest so far) completes.
  void CollapseFilledPages(size_t k, size_t offset);
  static constexpr size_t kMaxChunks = 2 + ((size_t{1} << 32) >> kChunkShift);

  size_t weight_bytes_;
  size_t state_bytes_;
  bool keys_ = false;      // a key column (EnableKeys)
  mutable std::mutex mu_;  // guards the fields below, not the rows
  Chunk* chunks_;          // kMaxChunks entries, mapped once (pages touched as used)
  size_t num_chunks_ = 0;
  uint32_t top_ = 0;          // 1 + the highest row id in use
  uint32_t touched_ = 0;      // row ids whose memory is (or was) touched
  uint32_t hint_ = 0;         // <= the lowest free id
  size_t live_rows_ = 0;
  std::vector<uint64_t> live_;  // a bit per row id: in use
  // Written under mu_; read without it by the shards (a stale value only
  // delays a move).
  std::atomic<uint32_t> limit_{kNone};
  std::atomic<uint64_t> limit_epoch_{0};
};

inline constexpr size_t kHugePageBytes = size_t{2} << 20;  // a transparent huge page

// Page-granular allocation straight from the kernel, so memory freed by a
// rehash or a shrink goes back to the system instead of staying in the heap.
// With huge = true a block of 2 MiB or more starts on a 2 MiB boundary, is
// rounded up to whole 2 MiB pages and advised as transparent huge pages.
void* PageAlloc(size_t bytes, bool huge = false);  // zero-filled
// The bytes PageAlloc(bytes, huge) maps (and PageFree unmaps).
size_t MappedBytes(size_t bytes, bool huge);
// Small pages, but 2 MiB-aligned when bytes >= 2 MiB, so that a full block can
// later be collapsed into huge pages.
void* PageAllocAligned(size_t bytes);
// Asks the kernel to back [p, p + bytes) with huge pages now (MADV_COLLAPSE);
// best effort, a no-op where that is not available.
void CollapseToHugePages(void* p, size_t bytes);
void PageFree(void* p, size_t bytes, bool huge = false);  // huge as allocated

}  // namespace pyfleet

// Stable chunked storage for the rows of one shard.
//
// A row is addressed by a uint32 row id; rows never move when the store grows
// (chunks are appended, never reallocated), so a reader holding a row id under
// its shard's shared lock may use it while other rows are added elsewhere.
// Each chunk holds kChunkRows rows, split into three column blocks so that a
// pull touches only the weights:
//
//   chunk: | weights[kChunkRows][dim] | state[kChunkRows][state_dim] | meta[kChunkRows] |
//
//   RowMeta (16 bytes):
//   +--------------+---------------+-------+------+-------+
//   | update_count | unseen_passes | flags | show | click |
//   |   uint32     |    uint16     | u16   | f32  |  f32  |
//   +--------------+---------------+-------+------+-------+
#pragma once

#include <cstddef>
#include <cstdint>
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
  static constexpr uint32_t kChunkRows = 4096;

  RowStore(size_t dim, size_t state_dim);
  ~RowStore();
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // A fresh row id (reusing a freed one first). Not thread-safe: callers hold
  // the shard's exclusive lock.
  uint32_t Allocate();
  void Free(uint32_t row);

  float* Weights(uint32_t row) const {
    return chunks_[row / kChunkRows] + (row % kChunkRows) * dim_;
  }
  float* State(uint32_t row) const {
    return chunks_[row / kChunkRows] + kChunkRows * dim_ + (row % kChunkRows) * state_dim_;
  }
  RowMeta* Meta(uint32_t row) const {
    return reinterpret_cast<RowMeta*>(chunks_[row / kChunkRows] +
                                      kChunkRows * (dim_ + state_dim_)) +
           row % kChunkRows;
  }

  size_t dim() const { return dim_; }
  size_t state_dim() const { return state_dim_; }
  size_t MemoryBytes() const;

 private:
  size_t ChunkBytes() const;

  size_t dim_;
  size_t state_dim_;
  std::vector<float*> chunks_;
  uint32_t next_row_ = 0;
  std::vector<uint32_t> free_rows_;
};

// Page-granular allocation straight from the kernel, so memory freed by a
// rehash or a shrink goes back to the system instead of staying in the heap.
void* PageAlloc(size_t bytes);  // zero-filled
void PageFree(void* p, size_t bytes);

}  // namespace pyfleet

// ShardLog: a shard's extents of its table's SpillFile (spill_file.h says
// how the file is laid out and cleaned).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pyfleet/internal/spill_file.h"

namespace pyfleet {

// A shard's extents of the spill file: where its next evicted rows go and
// how many live slots each extent holds (its shard's lock guards it).
class ShardLog {
 public:
  static constexpr double kGarbageRatio = 1.0;  // garbage slots per live slot, at most
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  explicit ShardLog(SpillFile* f) : file_(f) {}
  ShardLog(const ShardLog&) = delete;
  ShardLog& operator=(const ShardLog&) = delete;

  // Appends n records (data, slot_bytes apart) to the open extent (and the
  // next ones): one write per extent touched; slots[i] is where record i
  // went, live from then on. A failed write throws with no slot taken.
  void Append(const char* data, size_t n, uint32_t* slots);
  // A live slot's row left it (read back or erased).
  void Free(uint32_t slot);
  // The same for n slots (the file's count of live slots, shared by the
  // shards, changed once).
  void Free(const uint32_t* slots, size_t n);
  // Garbage in the full extents beyond the ratio and at least an extent of
  // it: worth cleaning.
  bool NeedsCleaning() const;
  // The full extent with the fewest live slots (kNone if none), to clean.
  uint32_t EmptiestExtent() const;
  size_t live() const { return live_; }
  size_t extents() const { return extents_.size(); }
  size_t MemoryBytes() const { return sizeof(*this) + extents_.capacity() * sizeof(uint32_t); }

 private:
  void Release(uint32_t extent);  // an extent with no live slot back to the file

  SpillFile* file_;
  std::vector<uint32_t> extents_;  // the shard's extents (the open one too)
  uint32_t open_ = kNone;            // the extent being appended to
  uint32_t fill_ = 0;                // its slots written
  size_t live_ = 0;
};

}  // namespace pyfleet

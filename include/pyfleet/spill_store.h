// SpillFile: a file of fixed-size slots that holds a table shard's rows
// evicted from RAM (the disk tier of a SparseTable with a memory budget).
//
// A slot holds one row's bytes as the row store lays them out, opaque here:
//
//   slot k at offset k * slot_bytes:  [ RowMeta | weight bytes | state bytes ]
//
// Freed slots go on a free list and are reused before the file grows, so the
// file is as large as the most rows ever spilled at once. Batches are read
// and written with preadv/pwritev: the slots are sorted, runs of adjacent
// slots become one call, and before a read of several runs the kernel is
// asked to fetch all of them at once (POSIX_FADV_WILLNEED), so a pull's cold
// rows are in flight together instead of one after the other.
//
// The file is unlinked as soon as it is created: it has no name while the
// table lives, a crashed process leaves nothing behind in spill_dir (the
// kernel frees the space), and no spill file can be mistaken for a checkpoint.
// Between creating and unlinking (microseconds) it is named
// ".pyfleet-spill-<pid>-XXXXXX"; RemoveStaleSpillFiles deletes such names of
// processes that no longer exist.
//
// One file per table, shared by its shards: Allocate and Free take a small
// mutex (no I/O under it); reads and writes of distinct slots run
// concurrently (pread/pwrite have no cursor). A slot belongs to one shard,
// whose lock guards its contents.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace pyfleet {

class SpillFile {
 public:
  static constexpr uint32_t kMaxSlots = 0x7FFFFFFEu;  // slot ids fit 31 bits

  // Creates an unlinked file in dir; std::invalid_argument naming dir if it
  // cannot be created there.
  SpillFile(const std::string& dir, size_t slot_bytes);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  uint32_t Allocate();
  void Free(uint32_t slot);

  // Slot slots[i] <- data + i * slot_bytes (write) or -> (read), i < n.
  // I/O errors (a full disk) throw std::runtime_error; a failed write leaves
  // the caller's rows where they were.
  void Write(const uint32_t* slots, const char* data, size_t n);
  void Read(const uint32_t* slots, char* data, size_t n) const;
  // bytes at offset within one slot.
  void ReadPart(uint32_t slot, size_t offset, void* out, size_t bytes) const;
  void WritePart(uint32_t slot, size_t offset, const void* in, size_t bytes);

  size_t slot_bytes() const { return slot_bytes_; }
  size_t used() const;
  size_t file_bytes() const;
  size_t MemoryBytes() const;
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }

 private:
  // One preadv/pwritev per run of adjacent slots.
  void Transfer(const uint32_t* slots, char* data, size_t n, bool write) const;

  int fd_ = -1;
  std::string dir_;
  size_t slot_bytes_;
  mutable std::mutex mu_;  // guards next_ and free_
  uint32_t next_ = 0;
  std::vector<uint32_t> free_;
  mutable std::atomic<uint64_t> reads_{0}, writes_{0};  // slots transferred (stats)
};

// Deletes dir/.pyfleet-spill-<pid>-* files whose process is gone (left by a
// crash in the instant between creating and unlinking a SpillFile).
void RemoveStaleSpillFiles(const std::string& dir);

}  // namespace pyfleet

namespace pyfleet {

// A shard's part of a table's disk tier (its lock guards it).
struct ShardSpill {
  explicit ShardSpill(SpillFile* f) : file(f) {}
  SpillFile* file;      // the table's, shared by its shards
  size_t resident = 0;  // rows of the shard in RAM
  // Second chance: the keys of the shard's rows in RAM in a FIFO queue (and
  // keys erased or spilled since they were queued, dropped at the front).
  std::deque<uint64_t> ring;
};

}  // namespace pyfleet

// SpillFile: a file of fixed-size slots that holds a table's rows evicted
// from RAM (the disk tier of a SparseTable with a memory budget).
//
// A slot holds one row's bytes as the row store lays them out, opaque here,
// followed by a trailer of the row's key (so that a cleaner can find a
// record's index entry) and its shard's count of evictions when it left RAM
// (so that a row read back soon after is known to have left too early,
// spill_table.cc); both cost disk, not RAM:
//
//   slot k at offset k * slot_bytes:  [ RowMeta | weight bytes | state bytes | key | left ]
//
// The file is cut into extents of extent_slots() consecutive slots. An
// extent belongs to one shard at a time (ShardLog): a shard appends its
// evicted rows to its open extent, so a batch of victims is one pwrite of a
// contiguous buffer instead of one write per scattered free slot. A slot
// freed by a reload or an erase is garbage in its extent; an extent with no
// live slot goes back to the file, and a shard whose garbage passes
// kGarbageRatio x its live rows moves the live records of its emptiest
// extents to its open one (the cleaner, in spill_table.cc). So the file holds
// at most (1 + kGarbageRatio) x the live rows' slots plus about two extents
// a shard, and the most extents in use at once is its size.
//
// Reads: the callers sort the slots, a run of adjacent slots is one call
// into one buffer, first with preadv2(RWF_NOWAIT) (served from the page
// cache, no blocking); only the runs that would block are then announced
// together (POSIX_FADV_WILLNEED, so the device sees them at once) and read.
//
// The file grows kGrowBytes at a time, written with zeros ahead of the
// extents handed out (one write of one zero page repeated, not under mu_):
// the page cache then holds it in large folios where the filesystem has
// them (ext4 in recent kernels; 6.18 here), not in the 4-16 KiB ones a shard's appends
// of a few dozen rows would make, and the kernel's part of a read of one
// slot shrinks (a smaller tree to find the page in, fewer folios): random
// 216-byte preadv2 of a 400 MB file, 530 ns against 900. Larger steps make
// larger folios and cheaper reads (2 MiB: 490 ns), but ext4 walks a folio's
// every block on each write into it, and an append of 26 KB into a 2 MiB
// folio went through 512 (ext4_block_write_begin, 14% of bench_capacity's
// spilling step). The zeros cost one more write of the file's bytes while
// it grows, none once its size is steady. Best effort: a failed write of
// zeros (a full disk) stops them; the extents' own writes report the error.
// Only the first kGrowShare of the machine's memory is grown so: a file the
// page cache cannot hold is read from the device, where the folios do not
// matter, and its zeros reach the device too, written twice (the 100M-row
// headline trained ~10% slower with zeros all the way; docs/dev/disk_tier_log.md).
//
// The file is unlinked as soon as it is created: it has no name while the
// table lives, a crashed process leaves nothing behind in spill_dir (the
// kernel frees the space), and no spill file can be mistaken for a checkpoint.
// Between creating and unlinking (microseconds) it is named
// ".pyfleet-spill-<pid>-XXXXXX"; RemoveStaleSpillFiles deletes such names of
// processes that no longer exist.
//
// One file (one fd) per table, shared by its shards: allocating and freeing
// extents take a small mutex (no I/O under it); reads and writes of distinct
// slots run concurrently (pread/pwrite have no cursor). A slot belongs to one
// shard, whose lock guards its contents and its ShardLog.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pyfleet {

class SpillFile {
 public:
  static constexpr uint32_t kMaxSlots = 0x7FFFFFFEu;  // slot ids fit 31 bits
  static constexpr size_t kMaxExtentBytes = 256 << 10;  // about; a whole number of slots
  static constexpr size_t kGrowBytes = 256 << 10;        // zeros written ahead, at a time
  static constexpr size_t kGrowShare = 8;                 // up to 1/8 of physical memory

  // Creates an unlinked file in dir; std::invalid_argument naming dir if it
  // cannot be created there. Extents of about extent_bytes (at least a slot,
  // at most kMaxExtentBytes).
  SpillFile(const std::string& dir, size_t slot_bytes, size_t extent_bytes);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  uint32_t extent_slots() const { return extent_slots_; }
  // An extent id; its first slot is id * extent_slots(). A new one past the
  // zeros written ahead waits for the next kGrowBytes of them.
  uint32_t AllocateExtent();
  void FreeExtent(uint32_t extent);
  // Live slots of an extent: read and written by its owner (under its lock).
  uint32_t& ExtentLive(uint32_t extent) const {
    return chunks_[extent / kChunk][extent % kChunk];
  }

  // Slot slots[i] <- data + i * slot_bytes (write) or -> (read), i < n,
  // the slots in increasing order (each once): a run of adjacent slots is
  // one call of one buffer. I/O errors (a full disk) throw
  // std::runtime_error; a failed write leaves the caller's rows where they
  // were.
  void Write(const uint32_t* slots, const char* data, size_t n);
  void Read(const uint32_t* slots, char* data, size_t n) const;
  // n consecutive slots from first: one call.
  void WriteRun(uint32_t first, const char* data, size_t n);
  void ReadRun(uint32_t first, char* data, size_t n) const;
  // bytes at offset within one slot.
  void ReadPart(uint32_t slot, size_t offset, void* out, size_t bytes) const;
  void WritePart(uint32_t slot, size_t offset, const void* in, size_t bytes);

  size_t slot_bytes() const { return slot_bytes_; }
  // Live slots (rows on disk), kept by the shards' logs.
  size_t used() const { return live_.load(std::memory_order_relaxed); }
  void AddLive(ptrdiff_t d) { live_.fetch_add(static_cast<size_t>(d), std::memory_order_relaxed); }
  size_t file_bytes() const;
  size_t extents_in_use() const;
  size_t MemoryBytes() const;
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint64_t writes() const { return writes_.load(std::memory_order_relaxed); }
  // The cleaner's share of them: slots it read (whole extents, garbage too)
  // and live records it moved (stats, apart from the rows read back).
  void CountCleaning(size_t read, size_t moved) {
    clean_reads_.fetch_add(read, std::memory_order_relaxed);
    clean_moves_.fetch_add(moved, std::memory_order_relaxed);
  }
  uint64_t clean_reads() const { return clean_reads_.load(std::memory_order_relaxed); }
  uint64_t clean_moves() const { return clean_moves_.load(std::memory_order_relaxed); }

 private:
  // One preadv/pwritev per run of adjacent slots.
  void Transfer(const uint32_t* slots, char* data, size_t n, bool write) const;
  // Zeros written up to at least end bytes (whole kGrowBytes), best effort.
  void GrowTo(size_t end);

  int fd_ = -1;
  std::string dir_;
  size_t slot_bytes_;
  uint32_t extent_slots_;
  static constexpr size_t kChunk = 4096;  // extents' live counts by chunks that never move
  mutable std::mutex mu_;  // guards next_, free_ and making chunks
  uint32_t next_ = 0;      // extents ever made
  std::vector<uint32_t> free_;
  std::vector<std::unique_ptr<uint32_t[]>> chunks_;  // sized once: never reallocated
  std::atomic<size_t> live_{0};
  std::mutex grow_mu_;               // one writer of zeros at a time
  std::atomic<size_t> grown_{0};     // bytes written with zeros ahead
  std::atomic<bool> grow_{true};     // false after a write of zeros failed, or past grow_limit_
  size_t grow_limit_ = 0;            // bytes: physical memory / kGrowShare
  mutable std::atomic<uint64_t> reads_{0}, writes_{0};  // slots transferred (stats)
  std::atomic<uint64_t> clean_reads_{0}, clean_moves_{0};
};

// Deletes dir/.pyfleet-spill-<pid>-* files whose process is gone (left by a
// crash in the instant between creating and unlinking a SpillFile).
void RemoveStaleSpillFiles(const std::string& dir);

}  // namespace pyfleet

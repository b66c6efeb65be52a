// Huge-page slabs for the index arrays of one table's shards.
//
// Each of a table's 64 shards has its own index array, grown by doubling. On
// small pages, a table of a few million rows spreads its index over tens of
// thousands of 4 KiB pages, so nearly every lookup is also a TLB miss; giving
// each array its own huge pages instead would round every array up to 2 MiB
// (and put the used part of all 64 at the same cache sets). The arena packs
// arrays of equal size side by side into slabs mapped on transparent huge
// pages: a slab holds at least 8 arrays of one size and is a whole number of
// 2 MiB pages; pages are touched only as arrays are handed out, and a slab is
// unmapped once all its arrays are freed.
//
// Thread-safe (an internal mutex): shards grow under their own locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace pyfleet {

class SlabArena {
 public:
  // Arrays smaller than this stay on small pages: tiny tables stay tiny.
  static constexpr size_t kMinBytes = size_t{64} << 10;

  SlabArena() = default;
  ~SlabArena();
  SlabArena(const SlabArena&) = delete;
  SlabArena& operator=(const SlabArena&) = delete;

  // An array of `bytes` (>= kMinBytes; contents unspecified).
  void* Allocate(size_t bytes);
  // Returns an array from Allocate(bytes).
  void Free(void* p, size_t bytes);
  // Bytes the slabs hold in touched huge pages (less what was given back).
  size_t MemoryBytes() const;
  // From now on a freed array's pages go back to the kernel at once (the
  // pages wholly inside it; excluded from huge pages until it is handed out
  // again), not when its whole slab is free: a table with a memory budget
  // must not hold an index's old arrays while its shards grow one by one.
  void ReleaseFreedArrays() { release_freed_ = true; }

 private:
  struct Slab {
    char* base;
    size_t bytes;        // mapped
    size_t slice;        // array size
    size_t handed = 0;   // slices handed out at least once (they are touched)
    size_t live = 0;     // slices in use
    std::vector<uint32_t> free;  // freed slice numbers
    size_t released = 0;         // bytes of freed slices given back
  };
  // The page-aligned inside of slice k of s: [*begin, *begin + *bytes).
  static void Inside(const Slab& s, size_t k, char** begin, size_t* bytes);
  bool release_freed_ = false;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;
};

}  // namespace pyfleet

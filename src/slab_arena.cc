#include "pyfleet/internal/slab_arena.h"

#include <sys/mman.h>

#include <cstdint>

#include "pyfleet/error.h"
#include "pyfleet/internal/row_store.h"

namespace pyfleet {

namespace {
constexpr size_t kHuge = kHugePageBytes;
constexpr size_t kMinSlices = 8;
constexpr uintptr_t kPage = 4096;
inline size_t RoundUpHuge(size_t b) { return (b + kHuge - 1) / kHuge * kHuge; }
}  // namespace

void SlabArena::Inside(const Slab& s, size_t k, char** begin, size_t* bytes) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(s.base + k * s.slice);
  const uintptr_t a = (lo + kPage - 1) & ~(kPage - 1), b = (lo + s.slice) & ~(kPage - 1);
  *begin = reinterpret_cast<char*>(a);
  *bytes = b > a ? b - a : 0;
}

SlabArena::~SlabArena() {
  for (const Slab& s : slabs_) PageFree(s.base, s.bytes, true);
}

void* SlabArena::Allocate(size_t bytes) {
  PYFLEET_ASSERT(bytes >= kMinBytes);
  std::lock_guard lock(mu_);
  for (Slab& s : slabs_) {
    if (s.slice != bytes) continue;
    size_t k;
    if (!s.free.empty()) {
      k = s.free.back();
      s.free.pop_back();
      if (release_freed_) {
        char* p;
        size_t n;
        Inside(s, k, &p, &n);
        if (n > 0) madvise(p, n, MADV_HUGEPAGE);
        s.released -= n;
      }
    } else if ((s.handed + 1) * bytes <= s.bytes) {
      k = s.handed++;
    } else {
      continue;
    }
    ++s.live;
    return s.base + k * bytes;
  }
  Slab s;
  s.slice = bytes;
  s.bytes = RoundUpHuge(kMinSlices * bytes);
  s.base = static_cast<char*>(PageAlloc(s.bytes, /*huge=*/true));
  s.handed = s.live = 1;
  slabs_.push_back(std::move(s));
  return slabs_.back().base;
}

void SlabArena::Free(void* p, size_t bytes) {
  std::lock_guard lock(mu_);
  char* c = static_cast<char*>(p);
  for (size_t i = 0; i < slabs_.size(); ++i) {
    Slab& s = slabs_[i];
    if (c < s.base || c >= s.base + s.bytes) continue;
    PYFLEET_ASSERT(s.slice == bytes && (c - s.base) % bytes == 0);
    if (--s.live == 0) {  // every array of the slab is free: give the memory back
      PageFree(s.base, s.bytes, true);
      slabs_[i] = std::move(slabs_.back());
      slabs_.pop_back();
      return;
    }
    const size_t k = static_cast<size_t>(c - s.base) / bytes;
    s.free.push_back(static_cast<uint32_t>(k));
    if (release_freed_) {
      char* p;
      size_t n;
      Inside(s, k, &p, &n);
      if (n > 0) {
        // Not huge first: else khugepaged (which fills a 2 MiB range with
        // as few as one page present) could bring the range back.
        madvise(p, n, MADV_NOHUGEPAGE);
        madvise(p, n, MADV_DONTNEED);
        s.released += n;
      }
    }
    return;
  }
  PYFLEET_ASSERT(false);
}

size_t SlabArena::MemoryBytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const Slab& s : slabs_) total += RoundUpHuge(s.handed * s.slice) - s.released;
  return total;
}

}  // namespace pyfleet

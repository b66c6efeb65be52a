#include "pyfleet/row_store.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t{2} << 20;
inline size_t RoundUp(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// size bytes (a multiple of kHuge) starting on a kHuge boundary: over-map by
// one huge page, then unmap the slack on both sides.
void* MapHugeAligned(size_t size) {
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHuge - 1) & ~(kHuge - 1);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + size + kHuge;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  return reinterpret_cast<void*>(aligned);
}
}  // namespace

void* PageAlloc(size_t bytes, bool huge) {
  size_t size = RoundUp(bytes);
  if (huge && size >= kHuge) size = (size + kHuge - 1) / kHuge * kHuge;
  if (!huge || size < kHuge) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  void* p = MapHugeAligned(size);
  madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void* PageAllocAligned(size_t bytes) {
  const size_t size = RoundUp(bytes);
  if (size < kHuge) return PageAlloc(bytes);
  return MapHugeAligned(size);
}

void CollapseToHugePages(void* p, size_t bytes) {
#ifdef __linux__
  // Linux 6.1's MADV_COLLAPSE; older glibc headers lack the name, older
  // kernels answer EINVAL, and either way the block stays as it is.
  constexpr int kMadvCollapse = 25;
  if (bytes >= kHuge && reinterpret_cast<uintptr_t>(p) % kHuge == 0) {
    // Best effort: without free huge pages the kernel says no and the block
    // stays on small pages, which is slower but correct.
    madvise(p, bytes / kHuge * kHuge, kMadvCollapse);
  }
#else
  (void)p;
  (void)bytes;
#endif
}

void PageFree(void* p, size_t bytes, bool huge) {
  size_t size = RoundUp(bytes);
  if (huge && size >= kHuge) size = (size + kHuge - 1) / kHuge * kHuge;
  if (p != nullptr && bytes > 0) munmap(p, size);
}

RowStore::RowStore(size_t dim, size_t state_dim) : dim_(dim), state_dim_(state_dim) {}

RowStore::~RowStore() {
  for (const Chunk& c : chunks_) FreeChunk(c);
}

void RowStore::FreeChunk(const Chunk& c) {
  PageFree(c.weights, c.rows * dim_ * sizeof(float));
  PageFree(c.state, c.rows * state_dim_ * sizeof(float));
  PageFree(c.meta, c.rows * sizeof(RowMeta));
}

uint32_t RowStore::Allocate() {
  if (!free_rows_.empty()) {
    const uint32_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (next_row_ == 0xFFFFFFFEu) ThrowRuntime("a table shard is full (2^32 - 2 rows)");
  if (Locate(next_row_).chunk == chunks_.size()) {
    // A pull reads a random row's weights: on small pages nearly every one
    // is also a TLB miss (measured: pulls from a 10M-row table 1.5-2x slower).
    // Weight blocks therefore start 2 MiB-aligned on small pages, and each is
    // collapsed into huge pages once it is full; huge pages from the start
    // would make 2 MiB per shard resident before its rows exist.
    if (!chunks_.empty()) {
      const Chunk& full = chunks_.back();
      CollapseToHugePages(full.weights, full.rows * dim_ * sizeof(float));
    }
    Chunk c;
    c.rows = chunks_.empty() ? kFirstChunkRows : kChunkRows;
    c.weights = static_cast<float*>(PageAllocAligned(c.rows * dim_ * sizeof(float)));
    c.state = state_dim_ ? static_cast<float*>(PageAlloc(c.rows * state_dim_ * sizeof(float)))
                         : nullptr;
    c.meta = static_cast<RowMeta*>(PageAlloc(c.rows * sizeof(RowMeta)));
    chunks_.push_back(c);
  }
  return next_row_++;
}

void RowStore::Free(uint32_t row) { free_rows_.push_back(row); }

size_t RowStore::MemoryBytes() const {
  size_t bytes = free_rows_.capacity() * sizeof(uint32_t) + chunks_.capacity() * sizeof(Chunk);
  for (const Chunk& c : chunks_) {
    bytes += RoundUp(c.rows * dim_ * sizeof(float)) + RoundUp(c.rows * sizeof(RowMeta)) +
             (state_dim_ ? RoundUp(c.rows * state_dim_ * sizeof(float)) : 0);
  }
  return bytes;
}

}  // namespace pyfleet

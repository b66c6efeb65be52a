#include "pyfleet/row_store.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHuge = kHugePageBytes;
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

size_t MappedBytes(size_t bytes, bool huge) {
  const size_t size = RoundUp(bytes);
  return huge && size >= kHuge ? (size + kHuge - 1) / kHuge * kHuge : size;
}

void* PageAlloc(size_t bytes, bool huge) {
  const size_t size = MappedBytes(bytes, huge);
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
  if (p != nullptr && bytes > 0) munmap(p, MappedBytes(bytes, huge));
}

RowStore::RowStore(size_t weight_bytes, size_t state_bytes)
    : weight_bytes_(weight_bytes),
      state_bytes_(state_bytes),
      chunks_(static_cast<Chunk*>(PageAlloc(kMaxChunks * sizeof(Chunk)))) {}

RowStore::~RowStore() {
  for (size_t k = 0; k < num_chunks_; ++k) FreeChunk(chunks_[k]);
  PageFree(chunks_, kMaxChunks * sizeof(Chunk));
}

void RowStore::FreeChunk(const Chunk& c) {
  PageFree(c.weights, c.rows * weight_bytes_);
  PageFree(c.state, c.rows * state_bytes_);
  PageFree(c.meta, c.rows * sizeof(RowMeta));
}

uint32_t RowStore::Allocate() {
  std::lock_guard lock(mu_);
  if (!free_rows_.empty()) {
    const uint32_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (next_row_ == 0xFFFFFFFEu) ThrowRuntime("a table is full (2^32 - 2 rows on one server)");
  const Where at = Locate(next_row_);
  if (at.chunk == num_chunks_) {
    Chunk c;
    c.rows = at.capacity;
    c.weights = static_cast<char*>(PageAllocAligned(c.rows * weight_bytes_));
    c.state = state_bytes_ ? static_cast<char*>(PageAllocAligned(c.rows * state_bytes_))
                           : nullptr;
    c.meta = static_cast<RowMeta*>(PageAllocAligned(c.rows * sizeof(RowMeta)));
    // Readers find this entry only through rows published after it, under
    // their shard's lock (the chunk is written before this mutex is released).
    chunks_[num_chunks_] = c;
    ++num_chunks_;
  }
  CollapseFilledPages(at.chunk, at.offset);
  return next_row_++;
}

void RowStore::CollapseFilledPages(size_t k, size_t offset) {
  const Chunk& c = chunks_[k];
  auto column = [&](void* base, size_t row_bytes) {
    const size_t begin = offset * row_bytes, end = begin + row_bytes;
    if (base == nullptr || end / kHuge == begin / kHuge) return;
    // Row `offset` reaches or crosses a 2 MiB boundary: the page before that
    // boundary now holds allocated rows only. (CollapseToHugePages ignores a
    // block that did not start 2 MiB-aligned, as a small first chunk does.)
    CollapseToHugePages(static_cast<char*>(base) + (end / kHuge - 1) * kHuge, kHuge);
  };
  column(c.weights, weight_bytes_);
  column(c.state, state_bytes_);
  column(c.meta, sizeof(RowMeta));
}

void RowStore::Free(uint32_t row) {
  std::lock_guard lock(mu_);
  free_rows_.push_back(row);
}

size_t RowStore::MemoryBytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = free_rows_.capacity() * sizeof(uint32_t) +
                 RoundUp((num_chunks_ + 1) * sizeof(Chunk));
  for (size_t k = 0; k < num_chunks_; ++k) {
    // Pages are touched as rows are allocated: the last chunk counts its
    // allocated rows only.
    const Chunk& c = chunks_[k];
    const size_t rows = k + 1 < num_chunks_ ? c.rows : Locate(next_row_ - 1).offset + 1;
    bytes += RoundUp(rows * weight_bytes_) + RoundUp(rows * sizeof(RowMeta)) +
             (state_bytes_ ? RoundUp(rows * state_bytes_) : 0);
  }
  return bytes;
}

}  // namespace pyfleet

#include "pyfleet/row_store.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {
constexpr size_t kPage = 4096;
inline size_t RoundUp(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
}  // namespace

void* PageAlloc(size_t bytes, bool huge) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = RoundUp(bytes);
  if (!huge || size < kHuge) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  // Over-allocate by one huge page, then trim to a 2 MiB-aligned start.
  void* raw = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHuge - 1) & ~(kHuge - 1);
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + size + kHuge;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  madvise(reinterpret_cast<void*>(aligned), size / kHuge * kHuge, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void PageFree(void* p, size_t bytes) {
  if (p != nullptr && bytes > 0) munmap(p, RoundUp(bytes));
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
    // Small pages: a huge page would make up to 2 MiB per column block and
    // shard resident before its rows exist (measured: 750 bytes a row for a
    // 512k-row table), for no pull speed that could be told from noise.
    Chunk c;
    c.rows = chunks_.empty() ? kFirstChunkRows : kChunkRows;
    c.weights = static_cast<float*>(PageAlloc(c.rows * dim_ * sizeof(float)));
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

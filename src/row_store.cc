#include "pyfleet/row_store.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {
constexpr size_t kPage = 4096;
inline size_t RoundUp(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
}  // namespace

void* PageAlloc(size_t bytes) {
  void* p = mmap(nullptr, RoundUp(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void PageFree(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, RoundUp(bytes));
}

RowStore::RowStore(size_t dim, size_t state_dim) : dim_(dim), state_dim_(state_dim) {}

RowStore::~RowStore() {
  for (float* c : chunks_) PageFree(c, ChunkBytes());
}

size_t RowStore::ChunkBytes() const {
  return kChunkRows * ((dim_ + state_dim_) * sizeof(float) + sizeof(RowMeta));
}

uint32_t RowStore::Allocate() {
  if (!free_rows_.empty()) {
    const uint32_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if (next_row_ % kChunkRows == 0 && next_row_ / kChunkRows == chunks_.size()) {
    if (chunks_.size() >= (size_t{0xFFFFFFFEu} / kChunkRows)) {
      ThrowRuntime("a table shard is full (2^32 rows)");
    }
    chunks_.push_back(static_cast<float*>(PageAlloc(ChunkBytes())));
  }
  return next_row_++;
}

void RowStore::Free(uint32_t row) { free_rows_.push_back(row); }

size_t RowStore::MemoryBytes() const {
  return chunks_.size() * RoundUp(ChunkBytes()) + free_rows_.capacity() * sizeof(uint32_t) +
         chunks_.capacity() * sizeof(float*);
}

}  // namespace pyfleet

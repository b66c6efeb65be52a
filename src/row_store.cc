#include "pyfleet/internal/row_store.h"

#include <sys/mman.h>

#include <algorithm>
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
  if (c.keys != nullptr) PageFree(c.keys, c.rows * sizeof(uint64_t));
}

void RowStore::EnableKeys() {
  std::lock_guard lock(mu_);
  PYFLEET_ASSERT(live_rows_ == 0);
  // Rows made and freed before (an emptied table) leave chunks without the
  // column: they go, and the next row maps its chunk with it.
  for (size_t k = 0; k < num_chunks_; ++k) FreeChunk(chunks_[k]);
  num_chunks_ = 0;
  top_ = touched_ = hint_ = 0;
  keys_ = true;
}

uint32_t RowStore::Allocate() {
  std::lock_guard lock(mu_);
  const uint32_t row = LowestFreeLocked();
  if (row == top_) GrowLocked();
  SetLive(row, true);
  return row;
}

uint32_t RowStore::AllocateBelowLimit() {
  std::lock_guard lock(mu_);
  const uint32_t row = LowestFreeLocked();
  if (row >= limit_) return kNone;
  if (row == top_) GrowLocked();
  SetLive(row, true);
  return row;
}

uint32_t RowStore::LowestFreeLocked() {
  if (live_rows_ == top_) return top_;  // no hole: the next new id
  // hint_ <= the lowest free id; words before it are all live.
  for (size_t w = hint_ / 64; w * 64 < top_; ++w) {
    uint64_t holes = ~live_[w];
    if (w == hint_ / 64) holes &= ~uint64_t{0} << (hint_ % 64);
    if (holes == 0) continue;
    const uint32_t row = static_cast<uint32_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(holes)));
    hint_ = std::min(row, top_);
    return hint_;
  }
  hint_ = top_;
  return top_;
}

void RowStore::GrowLocked() {
  if (top_ == 0xFFFFFFFEu) ThrowRuntime("a table is full (2^32 - 2 rows on one server)");
  const Where at = Locate(top_);
  if (at.chunk == num_chunks_) {
    Chunk c;
    c.rows = at.capacity;
    c.weights = static_cast<char*>(PageAllocAligned(c.rows * weight_bytes_));
    c.state = state_bytes_ ? static_cast<char*>(PageAllocAligned(c.rows * state_bytes_))
                           : nullptr;
    c.meta = static_cast<RowMeta*>(PageAllocAligned(c.rows * sizeof(RowMeta)));
    c.keys = keys_ ? static_cast<uint64_t*>(PageAllocAligned(c.rows * sizeof(uint64_t))) : nullptr;
    // Readers find this entry only through rows published after it, under
    // their shard's lock (the chunk is written before this mutex is released).
    chunks_[num_chunks_] = c;
    ++num_chunks_;
  }
  if (top_ / 64 >= live_.size()) live_.resize(live_.size() + RowStore::kChunkRows / 64, 0);
  if (top_ >= touched_) {
    CollapseFilledPages(at.chunk, at.offset);
    touched_ = top_ + 1;
  }
  ++top_;
}

void RowStore::SetLive(uint32_t row, bool live) {
  uint64_t& w = live_[row / 64];
  const uint64_t bit = uint64_t{1} << (row % 64);
  if (live) {
    w |= bit;
    ++live_rows_;
  } else {
    w &= ~bit;
    --live_rows_;
  }
}

bool RowStore::InUseAboveLimit() const {
  std::lock_guard lock(mu_);
  return top_ > limit_;  // top_ - 1 is in use (Free lowers top_ past free ids)
}

void RowStore::SetLimit(uint32_t limit) {
  std::lock_guard lock(mu_);
  if (limit == limit_) return;
  if (limit < limit_) limit_epoch_.fetch_add(1);
  limit_ = limit;
  MaybeRelease();
}

void RowStore::MaybeRelease() {
  // Only with a limit (a table with a memory budget), and in steps of
  // 1/64 of it, so that rows freed and made again near the top do not
  // cost a system call each.
  const uint32_t limit = limit_;
  if (limit == kNone || touched_ <= top_ || touched_ - top_ < std::max<uint32_t>(limit / 64, 64)) {
    return;
  }
  // No row at or above top_ is in use: no shard reads them.
  const Where at = Locate(top_);
  const size_t keep = at.chunk + (at.offset > 0 ? 1 : 0);
  for (size_t k = keep; k < num_chunks_; ++k) FreeChunk(chunks_[k]);
  num_chunks_ = keep;
  if (at.offset > 0) {
    const Chunk& c = chunks_[at.chunk];
    auto drop = [&](void* base, size_t row_bytes) {
      const size_t from = RoundUp(at.offset * row_bytes), size = RoundUp(c.rows * row_bytes);
      if (base != nullptr && from < size) {
        madvise(static_cast<char*>(base) + from, size - from, MADV_DONTNEED);
      }
    };
    drop(c.weights, weight_bytes_);
    drop(c.state, state_bytes_);
    drop(c.meta, sizeof(RowMeta));
    drop(c.keys, sizeof(uint64_t));
  }
  touched_ = top_;
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
  column(c.keys, sizeof(uint64_t));
}

void RowStore::Free(uint32_t row) {
  std::lock_guard lock(mu_);
  SetLive(row, false);
  hint_ = std::min(hint_, row);
  if (row + 1 != top_) return;
  while (top_ > 0 && (live_[(top_ - 1) / 64] >> ((top_ - 1) % 64) & 1) == 0) {
    if ((top_ - 1) % 64 == 63 && live_[(top_ - 1) / 64] == 0) {
      top_ -= 64;  // a whole free word
    } else {
      --top_;
    }
  }
  hint_ = std::min(hint_, top_);
  MaybeRelease();
}

size_t RowStore::MemoryBytes() const {
  std::lock_guard lock(mu_);
  size_t bytes = live_.capacity() * sizeof(uint64_t) + RoundUp((num_chunks_ + 1) * sizeof(Chunk));
  for (size_t k = 0; k < num_chunks_; ++k) {
    // Pages are touched as rows are allocated: the last chunk counts its
    // allocated rows only.
    const Chunk& c = chunks_[k];
    const size_t rows = k + 1 < num_chunks_ ? c.rows : Locate(touched_ - 1).offset + 1;
    bytes += RoundUp(rows * weight_bytes_) + RoundUp(rows * sizeof(RowMeta)) +
             (state_bytes_ ? RoundUp(rows * state_bytes_) : 0) +
             (keys_ ? RoundUp(rows * sizeof(uint64_t)) : 0);
  }
  return bytes;
}

}  // namespace pyfleet

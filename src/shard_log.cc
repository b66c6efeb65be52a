#include "pyfleet/internal/shard_log.h"

#include <algorithm>
#include <cstring>

#include "pyfleet/error.h"

namespace pyfleet {

void ShardLog::Append(const char* data, size_t n, uint32_t* slots) {
  const uint32_t per = file_->extent_slots();
  const size_t sb = file_->slot_bytes();
  // Written extent by extent, then made live: a failure leaves no slot taken
  // (what was written before it is garbage past fill_, overwritten later).
  const uint32_t open0 = open_, fill0 = fill_;
  const size_t owned0 = extents_.size();
  try {
    for (size_t done = 0; done < n;) {
      if (open_ == kNone || fill_ == per) {
        open_ = file_->AllocateExtent();
        extents_.push_back(open_);
        fill_ = 0;
      }
      const size_t got = std::min<size_t>(n - done, per - fill_);
      const uint32_t first = open_ * per + fill_;
      file_->WriteRun(first, data + done * sb, got);
      for (size_t i = 0; i < got; ++i) slots[done + i] = first + static_cast<uint32_t>(i);
      fill_ += static_cast<uint32_t>(got);
      done += got;
    }
  } catch (...) {
    // Extents opened by this batch go back; the open one is as it was.
    for (size_t i = owned0; i < extents_.size(); ++i) file_->FreeExtent(extents_[i]);
    extents_.resize(owned0);
    open_ = open0;
    fill_ = fill0;
    throw;
  }
  for (size_t i = 0; i < n; ++i) ++file_->ExtentLive(slots[i] / per);
  live_ += n;
  file_->AddLive(static_cast<ptrdiff_t>(n));
  // Extents closed with no live slot (all read back while open) go back.
  if (open0 != kNone && open0 != open_ && file_->ExtentLive(open0) == 0) Release(open0);
}

void ShardLog::Free(uint32_t slot) { Free(&slot, 1); }

void ShardLog::Free(const uint32_t* slots, size_t n) {
  const uint32_t per = file_->extent_slots();
  PYFLEET_ASSERT(live_ >= n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t e = slots[i] / per;
    uint32_t& live = file_->ExtentLive(e);
    PYFLEET_ASSERT(live > 0);
    if (--live == 0 && e != open_) Release(e);
  }
  live_ -= n;
  file_->AddLive(-static_cast<ptrdiff_t>(n));
}

void ShardLog::Release(uint32_t extent) {
  const auto it = std::find(extents_.begin(), extents_.end(), extent);
  PYFLEET_ASSERT(it != extents_.end());
  *it = extents_.back();
  extents_.pop_back();
  file_->FreeExtent(extent);
}

bool ShardLog::NeedsCleaning() const {
  const uint32_t per = file_->extent_slots();
  const size_t closed = extents_.size() - (open_ != kNone ? 1 : 0);
  const size_t open_live = open_ != kNone ? file_->ExtentLive(open_) : 0;
  const size_t garbage = closed * per - (live_ - open_live);
  return garbage >= per && static_cast<double>(garbage) > kGarbageRatio * static_cast<double>(live_);
}

uint32_t ShardLog::EmptiestExtent() const {
  uint32_t best = kNone, best_live = 0xFFFFFFFFu;
  for (uint32_t e : extents_) {
    if (e == open_) continue;
    const uint32_t l = file_->ExtentLive(e);
    if (l < best_live) best = e, best_live = l;
  }
  return best;
}

}  // namespace pyfleet

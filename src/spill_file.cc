#include "pyfleet/internal/spill_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {

constexpr char kPrefix[] = ".pyfleet-spill-";

// Drops done bytes from the front of iov[0..cnt).
void Skip(iovec*& iov, int& cnt, size_t done) {
  while (cnt > 0 && done >= iov->iov_len) {
    done -= iov->iov_len;
    ++iov;
    --cnt;
  }
  if (cnt > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + done;
    iov->iov_len -= done;
  }
}

// Runs the whole request: preadv/pwritev may transfer less than asked.
void FullTransfer(int fd, iovec* iov, int cnt, off_t off, bool write, const std::string& dir) {
  while (cnt > 0) {
    const ssize_t r = write ? pwritev(fd, iov, cnt, off) : preadv(fd, iov, cnt, off);
    if (r < 0) {
      if (errno == EINTR) continue;
      ThrowRuntime("spill file in ", dir, ": ", write ? "write" : "read", " failed: ",
                   std::strerror(errno));
    }
    if (r == 0) ThrowRuntime("spill file in ", dir, ": read past its end");
    off += r;
    Skip(iov, cnt, static_cast<size_t>(r));
  }
}

// RWF_NOWAIT reads, until the kernel says it has none for this file.
std::atomic<bool> g_nowait{true};

// Reads what the page cache holds of the run without blocking; the rest is
// left in iov/cnt/off.
void TryReadCached(int fd, iovec*& iov, int& cnt, off_t& off) {
#ifdef RWF_NOWAIT
  while (cnt > 0 && g_nowait.load(std::memory_order_relaxed)) {
    const ssize_t r = preadv2(fd, iov, cnt, off, RWF_NOWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS) {
        g_nowait.store(false, std::memory_order_relaxed);
      }
      return;  // EAGAIN (would block), or an error the blocking read reports
    }
    if (r == 0) return;
    off += r;
    Skip(iov, cnt, static_cast<size_t>(r));
  }
#else
  (void)fd, (void)iov, (void)cnt, (void)off;
#endif
}

}  // namespace

SpillFile::SpillFile(const std::string& dir, size_t slot_bytes, size_t extent_bytes)
    : dir_(dir),
      slot_bytes_(slot_bytes),
      extent_slots_(static_cast<uint32_t>(
          std::max<size_t>(1, std::min(extent_bytes, kMaxExtentBytes) / slot_bytes))) {
  PYFLEET_ASSERT(slot_bytes > 0);
  const size_t max_extents = (size_t{kMaxSlots} + 1) / extent_slots_;
  chunks_.resize((max_extents + kChunk - 1) / kChunk);
  std::string name = dir + "/" + kPrefix + std::to_string(getpid()) + "-XXXXXX";
  fd_ = mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) {
    ThrowInvalid("spill_dir ", dir, ": cannot create a spill file there: ",
                 std::strerror(errno));
  }
  unlink(name.c_str());
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  grow_limit_ = pages > 0 && page > 0 ? static_cast<size_t>(pages) * page / kGrowShare : 0;
  // Reads need not update the access time (a cost per read call); a
  // filesystem that refuses the flag keeps it.
  const int fl = fcntl(fd_, F_GETFL);
  if (fl >= 0) fcntl(fd_, F_SETFL, fl | O_NOATIME);
}

SpillFile::~SpillFile() {
  if (fd_ >= 0) close(fd_);
}

uint32_t SpillFile::AllocateExtent() {
  uint32_t e;
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {  // below the zeros: its first use waited for them
      e = free_.back();
      free_.pop_back();
      ExtentLive(e) = 0;
      return e;
    }
    if ((size_t{next_} + 1) * extent_slots_ > kMaxSlots) {
      ThrowRuntime("spill file in ", dir_, ": more than 2^31 rows spilled");
    }
    e = next_++;
    auto& chunk = chunks_[e / kChunk];
    if (!chunk) chunk = std::make_unique<uint32_t[]>(kChunk);  // zeroed
    ExtentLive(e) = 0;
  }
  // Outside mu_: shards reusing freed extents do not wait for the write.
  // No extent past grown_ holds data yet (each new one's owner is here), so
  // the zeros overwrite nothing.
  GrowTo((size_t{e} + 1) * extent_slots_ * slot_bytes_);
  return e;
}

void SpillFile::GrowTo(size_t end) {
  if (grown_.load(std::memory_order_acquire) >= end || !grow_.load(std::memory_order_relaxed)) {
    return;
  }
  std::lock_guard lock(grow_mu_);
  if (end > grow_limit_) {
    // For good: no zeros may go past data written where they stopped.
    grow_.store(false, std::memory_order_relaxed);
    return;
  }
  static const char zeros[4096] = {};
  constexpr size_t kPages = kGrowBytes / sizeof(zeros);
  static_assert(kPages <= IOV_MAX);
  iovec v[kPages];
  for (iovec& x : v) x = {const_cast<char*>(zeros), sizeof(zeros)};
  size_t at = grown_.load(std::memory_order_relaxed);
  while (at < end && grow_.load(std::memory_order_relaxed)) {
    // One call a step: the kernel sizes the page cache's folios by the write.
    iovec* left = v;
    int cnt = static_cast<int>(kPages);
    off_t off = static_cast<off_t>(at);
    while (cnt > 0) {
      const ssize_t r = pwritev(fd_, left, cnt, off);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        grow_.store(false, std::memory_order_relaxed);
        break;
      }
      off += r;
      Skip(left, cnt, static_cast<size_t>(r));
    }
    if (cnt > 0) break;
    at += kGrowBytes;
    grown_.store(at, std::memory_order_release);
  }
}

void SpillFile::FreeExtent(uint32_t extent) {
  std::lock_guard lock(mu_);
  PYFLEET_ASSERT(extent < next_);
  free_.push_back(extent);
}

size_t SpillFile::file_bytes() const {
  std::lock_guard lock(mu_);
  return size_t{next_} * extent_slots_ * slot_bytes_;
}

size_t SpillFile::extents_in_use() const {
  std::lock_guard lock(mu_);
  return next_ - free_.size();
}

size_t SpillFile::MemoryBytes() const {
  std::lock_guard lock(mu_);
  const size_t made = (size_t{next_} + kChunk - 1) / kChunk;
  return sizeof(*this) + free_.capacity() * sizeof(uint32_t) +
         chunks_.capacity() * sizeof(chunks_[0]) + made * kChunk * sizeof(uint32_t);
}

void SpillFile::Transfer(const uint32_t* slots, char* data, size_t n, bool write) const {
  if (n == 0) return;
  struct Run {
    size_t iov;  // first iovec
    int cnt;
    off_t off;
  };
  // Record i is at data + i * slot_bytes and the slots ascend: a run of
  // adjacent slots is one buffer (one iovec, one copy in the kernel).
  thread_local std::vector<iovec> iov;
  thread_local std::vector<Run> runs;
  iov.clear();
  runs.clear();
  for (size_t i = 0; i < n;) {
    PYFLEET_ASSERT(i == 0 || slots[i] > slots[i - 1]);
    size_t j = i + 1;
    while (j < n && slots[j] == slots[j - 1] + 1) ++j;
    const off_t at = static_cast<off_t>(slots[i]) * static_cast<off_t>(slot_bytes_);
    runs.push_back({iov.size(), 1, at});
    iov.push_back({data + i * slot_bytes_, (j - i) * slot_bytes_});
    i = j;
  }
  if (write) {
    for (const Run& r : runs) FullTransfer(fd_, iov.data() + r.iov, r.cnt, r.off, true, dir_);
    writes_.fetch_add(n, std::memory_order_relaxed);
    return;
  }
  // What the page cache holds is copied without blocking; the runs left are
  // all asked for before any is waited on, so the device sees them together.
  size_t left = 0;
  for (Run& r : runs) {
    iovec* v = iov.data() + r.iov;
    TryReadCached(fd_, v, r.cnt, r.off);
    r.iov = static_cast<size_t>(v - iov.data());
    if (r.cnt > 0) runs[left++] = r;
  }
  runs.resize(left);
  if (runs.size() > 1) {
    for (const Run& r : runs) {
      size_t bytes = 0;
      for (int k = 0; k < r.cnt; ++k) bytes += iov[r.iov + k].iov_len;
      posix_fadvise(fd_, r.off, static_cast<off_t>(bytes), POSIX_FADV_WILLNEED);
    }
  }
  for (const Run& r : runs) FullTransfer(fd_, iov.data() + r.iov, r.cnt, r.off, false, dir_);
  reads_.fetch_add(n, std::memory_order_relaxed);
}

void SpillFile::Write(const uint32_t* slots, const char* data, size_t n) {
  Transfer(slots, const_cast<char*>(data), n, true);
}

void SpillFile::Read(const uint32_t* slots, char* data, size_t n) const {
  Transfer(slots, data, n, false);
}

void SpillFile::WriteRun(uint32_t first, const char* data, size_t n) {
  iovec v{const_cast<char*>(data), n * slot_bytes_};
  FullTransfer(fd_, &v, 1, static_cast<off_t>(first) * slot_bytes_, true, dir_);
  writes_.fetch_add(n, std::memory_order_relaxed);
}

void SpillFile::ReadRun(uint32_t first, char* data, size_t n) const {
  iovec v{data, n * slot_bytes_};
  FullTransfer(fd_, &v, 1, static_cast<off_t>(first) * slot_bytes_, false, dir_);
  reads_.fetch_add(n, std::memory_order_relaxed);
}

void SpillFile::ReadPart(uint32_t slot, size_t offset, void* out, size_t bytes) const {
  PYFLEET_ASSERT(offset + bytes <= slot_bytes_);
  iovec v{out, bytes};
  FullTransfer(fd_, &v, 1, static_cast<off_t>(slot) * slot_bytes_ + offset, false, dir_);
  reads_.fetch_add(1, std::memory_order_relaxed);
}

void SpillFile::WritePart(uint32_t slot, size_t offset, const void* in, size_t bytes) {
  PYFLEET_ASSERT(offset + bytes <= slot_bytes_);
  iovec v{const_cast<void*>(in), bytes};
  FullTransfer(fd_, &v, 1, static_cast<off_t>(slot) * slot_bytes_ + offset, true, dir_);
  writes_.fetch_add(1, std::memory_order_relaxed);
}

void RemoveStaleSpillFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  const size_t plen = sizeof(kPrefix) - 1;
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, kPrefix, plen) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + plen, &end, 10);
    if (end == e->d_name + plen || *end != '-' || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive
    unlink((dir + "/" + e->d_name).c_str());
  }
  closedir(d);
}

}  // namespace pyfleet

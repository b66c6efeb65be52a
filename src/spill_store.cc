#include "pyfleet/spill_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {

constexpr char kPrefix[] = ".pyfleet-spill-";

#ifdef IOV_MAX
constexpr size_t kMaxIov = IOV_MAX;
#else
constexpr size_t kMaxIov = 1024;
#endif

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
    size_t done = static_cast<size_t>(r);
    off += r;
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
}

}  // namespace

SpillFile::SpillFile(const std::string& dir, size_t slot_bytes)
    : dir_(dir), slot_bytes_(slot_bytes) {
  PYFLEET_ASSERT(slot_bytes > 0);
  std::string name = dir + "/" + kPrefix + std::to_string(getpid()) + "-XXXXXX";
  fd_ = mkostemp(name.data(), O_CLOEXEC);
  if (fd_ < 0) {
    ThrowInvalid("spill_dir ", dir, ": cannot create a spill file there: ",
                 std::strerror(errno));
  }
  unlink(name.c_str());
}

SpillFile::~SpillFile() {
  if (fd_ >= 0) close(fd_);
}

uint32_t SpillFile::Allocate() {
  std::lock_guard lock(mu_);
  if (!free_.empty()) {
    const uint32_t s = free_.back();
    free_.pop_back();
    return s;
  }
  if (next_ >= kMaxSlots) ThrowRuntime("spill file in ", dir_, ": more than 2^31 rows spilled");
  return next_++;
}

void SpillFile::Free(uint32_t slot) {
  std::lock_guard lock(mu_);
  PYFLEET_ASSERT(slot < next_);
  free_.push_back(slot);
}

size_t SpillFile::used() const {
  std::lock_guard lock(mu_);
  return next_ - free_.size();
}

size_t SpillFile::file_bytes() const {
  std::lock_guard lock(mu_);
  return size_t{next_} * slot_bytes_;
}

size_t SpillFile::MemoryBytes() const {
  std::lock_guard lock(mu_);
  return sizeof(*this) + free_.capacity() * sizeof(uint32_t);
}

void SpillFile::Transfer(const uint32_t* slots, char* data, size_t n, bool write) const {
  if (n == 0) return;
  thread_local std::vector<uint32_t> order;
  thread_local std::vector<iovec> iov;
  order.resize(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return slots[a] < slots[b]; });
  if (!write && n > 1) {
    // Every run asked for before any is waited on: the device sees the
    // batch's reads together (a no-op for runs already in the page cache).
    for (size_t i = 0; i < n;) {
      size_t j = i + 1;
      while (j < n && slots[order[j]] == slots[order[j - 1]] + 1) ++j;
      if (j - i < n) {
        posix_fadvise(fd_, static_cast<off_t>(slots[order[i]]) * slot_bytes_,
                      static_cast<off_t>((j - i) * slot_bytes_), POSIX_FADV_WILLNEED);
      }
      i = j;
    }
  }
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && j - i < kMaxIov && slots[order[j]] == slots[order[j - 1]] + 1) ++j;
    iov.resize(j - i);
    for (size_t k = i; k < j; ++k) {
      iov[k - i] = {data + static_cast<size_t>(order[k]) * slot_bytes_, slot_bytes_};
    }
    FullTransfer(fd_, iov.data(), static_cast<int>(j - i),
                 static_cast<off_t>(slots[order[i]]) * slot_bytes_, write, dir_);
    i = j;
  }
  (write ? writes_ : reads_).fetch_add(n, std::memory_order_relaxed);
}

void SpillFile::Write(const uint32_t* slots, const char* data, size_t n) {
  Transfer(slots, const_cast<char*>(data), n, true);
}

void SpillFile::Read(const uint32_t* slots, char* data, size_t n) const {
  Transfer(slots, data, n, false);
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

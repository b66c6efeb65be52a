#include "pyfleet/table_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "pyfleet/error.h"

namespace pyfleet {

namespace {
std::atomic<uint64_t> tmp_counter{0};
constexpr size_t kBufBytes = 4 << 20;

std::string Errno() { return std::strerror(errno); }

void FsyncDir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

FileWriter::FileWriter(const std::string& path)
    : path_(path),
      tmp_path_(path + ".tmp." + std::to_string(::getpid()) + "." +
                std::to_string(tmp_counter.fetch_add(1))) {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ThrowRuntime("cannot create ", tmp_path_, ": ", Errno());
  buf_.reserve(kBufBytes);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void FileWriter::Write(const void* data, size_t n) {
  sum_.Update(data, n);
  const char* p = static_cast<const char*>(data);
  if (buf_.size() + n > kBufBytes) Flush();
  if (n >= kBufBytes) {
    for (size_t off = 0; off < n;) {
      const ssize_t w = ::write(fd_, p + off, n - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        ThrowRuntime("cannot write ", tmp_path_, ": ", Errno());
      }
      off += static_cast<size_t>(w);
    }
    return;
  }
  buf_.append(p, n);
}

void FileWriter::Flush() {
  for (size_t off = 0; off < buf_.size();) {
    const ssize_t w = ::write(fd_, buf_.data() + off, buf_.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      ThrowRuntime("cannot write ", tmp_path_, ": ", Errno());
    }
    off += static_cast<size_t>(w);
  }
  buf_.clear();
}

void FileWriter::Finish(uint64_t num_rows, uint64_t num_dropped) {
  FileTrailer t{};
  t.num_rows = num_rows;
  t.num_dropped = num_dropped;
  sum_.Update(&t, 16);  // the counts are covered too
  t.checksum = sum_.Digest();
  std::memcpy(t.magic, kFileEndMagic, sizeof(kFileEndMagic));
  buf_.append(reinterpret_cast<const char*>(&t), sizeof(t));
  Flush();
  if (::fsync(fd_) != 0) ThrowRuntime("cannot fsync ", tmp_path_, ": ", Errno());
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_path_.c_str());
    ThrowRuntime("cannot close ", tmp_path_, ": ", Errno());
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const std::string err = Errno();
    ::unlink(tmp_path_.c_str());
    ThrowRuntime("cannot rename ", tmp_path_, " to ", path_, ": ", err);
  }
  FsyncDir(path_);
}

FileReader::FileReader(const std::string& path) : path_(path) {
  f_ = std::fopen(path.c_str(), "rb");
  if (f_ == nullptr) ThrowRuntime("cannot open ", path, ": ", Errno());
  struct stat st;
  if (::fstat(::fileno(f_), &st) != 0) ThrowRuntime("cannot stat ", path, ": ", Errno());
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < sizeof(FileHeader) + sizeof(FileTrailer)) {
    ThrowRuntime(path, " is not a pyfleet table file: ", size, " bytes is too short (truncated?)");
  }
  if (std::fread(&header_, sizeof(header_), 1, f_) != 1) ThrowRuntime("cannot read ", path);
  if (std::memcmp(header_.magic, kFileMagic, sizeof(kFileMagic)) != 0) {
    ThrowRuntime(path, " is not a pyfleet table file (bad magic)");
  }
  if (header_.format_version != kFormatVersion) {
    ThrowRuntime(path, " has format version ", header_.format_version,
                 "; this pyfleet reads version ", kFormatVersion);
  }
  if (std::fseek(f_, static_cast<long>(size - sizeof(FileTrailer)), SEEK_SET) != 0 ||
      std::fread(&trailer_, sizeof(trailer_), 1, f_) != 1) {
    ThrowRuntime("cannot read the trailer of ", path);
  }
  if (std::memcmp(trailer_.magic, kFileEndMagic, sizeof(kFileEndMagic)) != 0) {
    ThrowRuntime(path, " is truncated or damaged (no end marker)");
  }
  body_bytes_ = size - sizeof(FileHeader) - sizeof(FileTrailer);
  // Verify the checksum over everything before anything is loaded.
  Checksum sum;
  std::vector<char> buf(kBufBytes);
  std::fseek(f_, 0, SEEK_SET);
  uint64_t left = size - sizeof(FileTrailer);
  while (left > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    if (std::fread(buf.data(), 1, take, f_) != take) ThrowRuntime("cannot read ", path);
    sum.Update(buf.data(), take);
    left -= take;
  }
  sum.Update(&trailer_, 16);
  if (sum.Digest() != trailer_.checksum) {
    ThrowRuntime(path, " is damaged: its checksum does not match its contents");
  }
  std::fseek(f_, sizeof(FileHeader), SEEK_SET);
}

FileReader::~FileReader() {
  if (f_ != nullptr) std::fclose(f_);
}

void FileReader::ExpectBody(uint64_t expected) const {
  if (body_bytes_ != expected) {
    ThrowRuntime(path_, " is damaged: its body has ", body_bytes_, " bytes, its header and "
                 "trailer describe ", expected);
  }
}

void FileReader::Read(void* out, size_t n) {
  if (read_ + n > body_bytes_) ThrowRuntime(path_, " ends early (truncated?)");
  if (n > 0 && std::fread(out, 1, n, f_) != n) ThrowRuntime("cannot read ", path_);
  read_ += n;
}

}  // namespace pyfleet

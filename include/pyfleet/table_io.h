// The table file format, and the writer/reader that keep files whole.
//
//   +--------------------+  FileHeader, 64 bytes
//   | body               |  sparse: records {key u64, RowMeta, weight bytes, state bytes}
//   |                    |    (the RowLayout of the header's storage: row_encoding.h)
//   |                    |  dense:  weights[size], state[state_dim]
//   | dropped keys u64[] |  sparse delta files: keys removed since the previous save
//   +--------------------+  FileTrailer, 32 bytes: counts, checksum of all before it
//
// All integers and floats little-endian. A writer writes to "<path>.tmp.<pid>.<n>",
// fsyncs, renames over <path> and fsyncs the directory, so a crash never leaves
// a half-written file under the real name. A reader checks the size implied
// by the header and trailer and the checksum before anything is loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "pyfleet/hash.h"

namespace pyfleet {

inline constexpr char kFileMagic[8] = {'P', 'Y', 'F', 'L', 'T', 'B', 'L', '\0'};
inline constexpr char kFileEndMagic[8] = {'P', 'Y', 'F', 'L', 'E', 'N', 'D', '\0'};
inline constexpr uint32_t kFormatVersion = 1;

enum class TableKind : uint32_t { kSparse = 1, kDense = 2 };
inline constexpr uint32_t kFileDelta = 1;  // FileHeader::flags
// An fp16 file's state is bf16 (set by every save since; without it an fp16
// file's state is fp16, as files written before).
inline constexpr uint32_t kFileBf16State = 2;

struct FileHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t table_kind;
  uint32_t dim;             // sparse: floats per row; dense: 0
  uint32_t optimizer_kind;  // OptimizerKind
  uint32_t state_dim;       // floats of optimizer state per row (dense: per table)
  uint32_t flags;           // kFileDelta | kFileBf16State
  uint64_t seed;
  uint64_t dense_size;      // dense: number of weights
  uint32_t meta_bytes;      // sizeof(RowMeta) for sparse files
  uint32_t storage;         // sparse: StorageKind of the rows (0, fp32, in older files)
  uint8_t reserved[8];
};
static_assert(sizeof(FileHeader) == 64, "FileHeader is 64 bytes on disk");

struct FileTrailer {
  uint64_t num_rows;
  uint64_t num_dropped;
  uint64_t checksum;
  char magic[8];
};
static_assert(sizeof(FileTrailer) == 32, "FileTrailer is 32 bytes on disk");

// Buffered, checksummed, atomic file writer. Destroying an unfinished writer
// removes its temporary file.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();
  void Write(const void* data, size_t n);
  // Writes the trailer, fsyncs, renames onto the final path.
  void Finish(uint64_t num_rows, uint64_t num_dropped);

 private:
  void Flush();
  std::string path_, tmp_path_;
  int fd_ = -1;
  Checksum sum_;
  std::string buf_;
};

// Reads a whole table file after verifying its size and checksum.
class FileReader {
 public:
  // Throws std::runtime_error naming `path` if the file is missing, truncated,
  // of another format version or damaged.
  explicit FileReader(const std::string& path);
  ~FileReader();
  const FileHeader& header() const { return header_; }
  const FileTrailer& trailer() const { return trailer_; }
  // Reads the next n bytes of the body (after the header); throws if that
  // would run past the body.
  void Read(void* out, size_t n);
  // Bytes between the header and the trailer.
  uint64_t body_bytes() const { return body_bytes_; }
  // Throws std::runtime_error naming the file unless the body is `expected` bytes.
  void ExpectBody(uint64_t expected) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  FileHeader header_;
  FileTrailer trailer_;
  uint64_t body_bytes_ = 0;
  uint64_t read_ = 0;
};

}  // namespace pyfleet

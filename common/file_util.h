// Small POSIX file helpers shared by the file formats (tokens files, safetensors, model
// export) and usable by checkpoints:
//   AtomicFileWriter  writes a file so that readers see the old file or the complete new
//                     one, never a torn one: a temp file in the same directory, then
//                     fsync, rename over the target, fsync of the directory. A writer
//                     dropped before Commit() removes its temp file.
//   MappedFile        read-only mmap of a whole file (empty files map to no bytes).
//   ReadFileToString  a file read whole into memory (configs, YAML, tokenizer.json,
//                     JSON indexes and manifests), capped at MaxFileBytes().
// Errors name the operation and the path (ErrnoError).
//
// Ownership: each object owns its descriptor / mapping; move-only.
// Thread-safety: none; one thread per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace l2l {

class AtomicFileWriter {
 public:
  // Creates "<path>.tmp.<pid>.<counter>" next to `path` (mode 0644 before umask).
  static Result<AtomicFileWriter> Create(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // not committed: closes and unlinks the temp file

  // Appends n bytes (handles short writes and EINTR).
  Status Append(const void* data, size_t n);
  // fsync, close, rename over the target, fsync the directory. Once only.
  Status Commit();
  const std::string& path() const { return path_; }
  uint64_t bytes_written() const { return written_; }

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd) : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  void Abandon();
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

// Convenience: the whole file from one buffer.
Status WriteFileAtomic(const std::string& path, const void* data, size_t n);

class MappedFile {
 public:
  static Result<MappedFile> Open(const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The largest file ReadFileToString reads, and the most memory one GGUF file's metadata
// arrays may take (common/formats/gguf.cc): $L2L_MAX_FILE_BYTES, default 1 GiB (see
// common/env.h). A value below 1 is INVALID_ARGUMENT naming the variable.
Result<uint64_t> MaxFileBytes();
// The message of a refusal by that cap: "<what>: <size> bytes, more than the <max>-byte
// limit on <kind> (L2L_MAX_FILE_BYTES; set it higher to ...)".
std::string FileCapMessage(const std::string& what, uint64_t size, uint64_t max, const std::string& kind);

// The whole file, refused before reading when it is larger than `max_bytes` (stat size;
// a file that grows while read, a pipe or a /dev file, is refused once it passes the cap):
// INVALID_ARGUMENT naming the file, its size and the cap.
Result<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes);
// The same, with max_bytes = MaxFileBytes().
Result<std::string> ReadFileToString(const std::string& path);

// fsync(2) of a directory, so renames and creations inside it survive a crash.
Status FsyncDir(const std::string& dir);

}  // namespace l2l

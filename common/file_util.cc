// POSIX implementations of AtomicFileWriter, MappedFile, ReadFileToString.
// See common/file_util.h.
//
// Thread-safety: the temp-name counter is atomic; objects are single-threaded.
#include "common/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <utility>

#include "common/env.h"
#include "common/logging.h"

namespace l2l {
namespace {

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync", dir, err);
  return Status::Ok();
}

Result<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path) {
  if (path.empty()) return InvalidArgument("AtomicFileWriter: empty path");
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open", tmp, errno);
  return AtomicFileWriter(path, tmp, fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), fd_(std::exchange(o.fd_, -1)), written_(o.written_) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& o) noexcept {
  if (this != &o) {
    Abandon();
    path_ = std::move(o.path_);
    tmp_ = std::move(o.tmp_);
    fd_ = std::exchange(o.fd_, -1);
    written_ = o.written_;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  if (::unlink(tmp_.c_str()) != 0) L2L_LOG_WARN("cannot remove temp file {}: errno {}", tmp_, errno);
}

Status AtomicFileWriter::Append(const void* data, size_t n) {
  if (fd_ < 0) return FailedPrecondition("AtomicFileWriter: append to " + path_ + " after Commit()");
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", tmp_, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return FailedPrecondition("AtomicFileWriter: " + path_ + " committed twice");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    Abandon();
    return ErrnoError("fsync", tmp_, err);
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return ErrnoError("close", tmp_, err);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    return ErrnoError("rename to " + path_, tmp_, err);
  }
  return FsyncDir(DirName(path_));
}

Status WriteFileAtomic(const std::string& path, const void* data, size_t n) {
  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  L2L_RETURN_IF_ERROR(w.Append(data, n));
  return w.Commit();
}

Result<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("fstat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoError("mmap", path, err);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return MappedFile(path, data, size);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && ::munmap(const_cast<uint8_t*>(data_), size_) != 0) {
    L2L_LOG_WARN("munmap {}: errno {}", path_, errno);
  }
}

Result<uint64_t> MaxFileBytes() {
  L2L_ASSIGN_OR_RETURN(const int64_t v, EnvInt(EnvVar::kMaxFileBytes));
  if (v < 1) return EnvError(EnvInfo(EnvVar::kMaxFileBytes), std::to_string(v), "a byte count of at least 1");
  return static_cast<uint64_t>(v);
}

std::string FileCapMessage(const std::string& what, uint64_t size, uint64_t max, const std::string& kind) {
  return what + ": " + std::to_string(size) + " bytes, more than the " + std::to_string(max) + "-byte limit on " +
         kind + " (L2L_MAX_FILE_BYTES; set it higher to read a larger file)";
}

Result<std::string> ReadFileToString(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(const uint64_t max, MaxFileBytes());
  return ReadFileToString(path, max);
}

Result<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  constexpr const char* kKind = "files read whole";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("fstat", path, err);
  }
  std::string out;
  if (S_ISREG(st.st_mode)) {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size > max_bytes) {
      ::close(fd);
      return InvalidArgument(FileCapMessage(path, size, max_bytes, kKind));
    }
    out.reserve(static_cast<size_t>(size));
  }
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError("read", path, err);
    }
    if (r == 0) break;
    if (static_cast<uint64_t>(r) > max_bytes - out.size()) {  // grew past the cap, or not a regular file
      ::close(fd);
      return InvalidArgument(FileCapMessage(path, out.size() + static_cast<uint64_t>(r), max_bytes, kKind) +
                             "; counted while reading: the file grows or is not a regular file");
    }
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace l2l

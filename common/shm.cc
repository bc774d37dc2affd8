// POSIX shared memory and futex helpers. See shm.h.
#include "common/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string_view>

namespace l2l {

Result<ShmSegment> ShmSegment::Create(const std::string& name, size_t bytes) {
  if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos) {
    return InvalidArgument("shm segment name '" + name + "' must be '/name' with no other '/'");
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoError("shm_open(O_CREAT|O_EXCL)", name, errno);
  // fchmod: the umask may have removed bits we need; never add group/other bits.
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoError("ftruncate", name, err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ErrnoError("mmap", name, err);
  }
  ShmSegment s;
  s.data_ = p;
  s.size_ = bytes;
  s.name_ = name;
  s.owner_ = true;
  return s;
}

Result<ShmSegment> ShmSegment::Open(const std::string& name, bool writable) {
  int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) return ErrnoError("shm_open", name, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoError("fstat", name, err);
  }
  size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes == 0) {
    close(fd);
    return InvalidArgument("shm segment " + name + " is empty");
  }
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoError("mmap", name, err);
  ShmSegment s;
  s.data_ = p;
  s.size_ = bytes;
  s.name_ = name;
  s.owner_ = false;
  return s;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = o.data_;
    size_ = o.size_;
    name_ = std::move(o.name_);
    owner_ = o.owner_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.owner_ = false;
    o.name_.clear();
  }
  return *this;
}

void ShmSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (owner_ && !name_.empty() && shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    std::fprintf(stderr, "l2l: shm_unlink(%s): %s\n", name_.c_str(), std::strerror(errno));
  }
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
}

ShmSegment::~ShmSegment() { Reset(); }

Status ShmSegment::Unlink() {
  if (!owner_) return FailedPrecondition("shm segment " + name_ + ": only its creator unlinks it");
  owner_ = false;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) return ErrnoError("shm_unlink", name_, errno);
  return Status::Ok();
}

namespace {

// "w", or 'g' / 'u' then digits, optionally 'r' and digits: what follows "l2l-<job>-".
bool IsJobSegmentSuffix(std::string_view s) {
  if (s == "w") return true;
  if (s.size() < 2 || (s[0] != 'g' && s[0] != 'u')) return false;
  size_t i = 1;
  auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (!digits()) return false;
  if (i == s.size()) return true;
  if (s[i] != 'r') return false;
  ++i;
  return digits() && i == s.size();
}

}  // namespace

Result<int> RemoveJobSegments(const std::string& job_id) {
  if (job_id.empty()) return InvalidArgument("RemoveJobSegments: empty job id");
  const std::string prefix = "l2l-" + job_id + "-";
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return ErrnoError("opendir", "/dev/shm", errno);
  int removed = 0;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.compare(0, prefix.size(), prefix) != 0 || !IsJobSegmentSuffix(std::string_view(n).substr(prefix.size()))) {
      continue;
    }
    if (shm_unlink(("/" + n).c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

bool FutexWait(const std::atomic<uint32_t>* word, uint32_t expected,
               std::chrono::nanoseconds timeout) {
  struct timespec ts {};
  struct timespec* tsp = nullptr;
  if (timeout.count() >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
    tsp = &ts;
  }
  long r = syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT, expected, tsp,
                   nullptr, 0);
  return !(r != 0 && errno == ETIMEDOUT);
}

void FutexWake(const std::atomic<uint32_t>* word, int count) {
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, count, nullptr, nullptr, 0);
}

bool ProcessGone(int32_t pid) {
  if (pid <= 0) return false;
  return kill(pid, 0) != 0 && errno == ESRCH;  // EPERM: alive, owned by another user
}

std::string BootId() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace l2l

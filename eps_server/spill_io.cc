// Spill I/O: FaultPlan, SpillFile, IoEngine (liburing) and AlignedBufferPool. Contracts,
// ownership and thread-safety are in spill_io.h.
//
// IoEngine internals. Every transfer becomes a Transfer holding its blocks (requests of
// at most block_bytes). Blocks wait in a FIFO (`pending_`) until fewer than queue_depth
// requests are in flight; one mutex (`mu_`) guards the FIFO, the SQ side of the ring,
// the transfers and the stats. The reaper thread waits on the CQ without the mutex,
// then takes it to account for a batch of completions (resubmitting short blocks at the
// front of the FIFO, refilling the ring), and runs the finished transfers' callbacks
// after dropping it, so a callback may Submit again. Taking `mu_` on both sides is also
// what orders the submitter's writes to a Block before the reaper's reads of it (the
// kernel's ring is invisible to ThreadSanitizer). Errors that Submit finds itself
// (alignment, range) are delivered through a NOP request, so every callback runs on the
// reaper thread.
#include "eps_server/spill_io.h"

#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "common/logging.h"

namespace l2l::eps {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMinAlign = 4096;
constexpr const char* kInjected = " [injected fault]";

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int InjectedErrno(FaultPlan::Kind k) {
  switch (k) {
    case FaultPlan::Kind::kEnospc: return ENOSPC;
    case FaultPlan::Kind::kEio: return EIO;
    case FaultPlan::Kind::kEinval: return EINVAL;
    default: return 0;
  }
}

FaultPlan::Kind NextFault(FaultPlan* faults, IoOp op) {
  return faults == nullptr ? FaultPlan::Kind::kNone : faults->Next(op);
}

uint64_t FreeBytes(const std::string& path) {
  std::string dir = path;
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

}  // namespace

const char* IoOpName(IoOp op) {
  switch (op) {
    case IoOp::kOpen: return "open";
    case IoOp::kFallocate: return "fallocate";
    case IoOp::kRead: return "read";
    case IoOp::kWrite: return "write";
    case IoOp::kFsync: return "fsync";
  }
  return "?";
}

// ---- FaultPlan -------------------------------------------------------------------

FaultPlan::FaultPlan(const FaultPlan& o) {
  std::lock_guard<std::mutex> lock(o.mu_);
  rules_ = o.rules_;
  std::copy(std::begin(o.counts_), std::end(o.counts_), counts_);
}

FaultPlan& FaultPlan::operator=(const FaultPlan& o) {
  if (this == &o) return *this;
  // One lock at a time (a copy of o's counts first), so no lock order between plans.
  decltype(counts_) counts;
  {
    std::lock_guard<std::mutex> lock(o.mu_);
    std::copy(std::begin(o.counts_), std::end(o.counts_), counts);
  }
  std::lock_guard<std::mutex> lock(mu_);
  rules_ = o.rules_;
  std::copy(std::begin(counts), std::end(counts), counts_);
  return *this;
}

Result<FaultPlan> FaultPlan::Parse(const std::string& text) {
  static const char* kSyntax =
      "; syntax: op:nth:kind or op:nth+:kind, rules separated by ',', with op "
      "open|fallocate|read|write|fsync, nth >= 1, kind ENOSPC|EIO|short (read, write) or "
      "EINVAL (open)";
  FaultPlan plan;
  size_t start = 0;
  int index = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string rule = text.substr(start, end - start);
    start = end + 1;
    ++index;
    const auto first = rule.find_first_not_of(" \t");
    rule = first == std::string::npos ? "" : rule.substr(first, rule.find_last_not_of(" \t") - first + 1);
    const std::string where = "fault plan \"" + text + "\" rule " + std::to_string(index) + " '" + rule + "': ";
    if (rule.empty()) {
      if (text.find_first_not_of(" \t") == std::string::npos) break;  // "" = no faults
      return InvalidArgument(where + "empty rule" + kSyntax);
    }
    const size_t c1 = rule.find(':');
    const size_t c2 = c1 == std::string::npos ? c1 : rule.find(':', c1 + 1);
    if (c2 == std::string::npos || rule.find(':', c2 + 1) != std::string::npos) {
      return InvalidArgument(where + "expected 3 fields separated by ':'" + kSyntax);
    }
    const std::string op = Lower(rule.substr(0, c1));
    std::string nth = rule.substr(c1 + 1, c2 - c1 - 1);
    const std::string kind = Lower(rule.substr(c2 + 1));
    Rule r{};
    if (op == "open") r.op = IoOp::kOpen;
    else if (op == "fallocate") r.op = IoOp::kFallocate;
    else if (op == "read") r.op = IoOp::kRead;
    else if (op == "write") r.op = IoOp::kWrite;
    else if (op == "fsync") r.op = IoOp::kFsync;
    else return InvalidArgument(where + "unknown op '" + rule.substr(0, c1) + "'" + kSyntax);
    r.and_after = !nth.empty() && nth.back() == '+';
    if (r.and_after) nth.pop_back();
    r.nth = 0;
    const bool digits = !nth.empty() && nth.size() <= 15 &&
                        std::all_of(nth.begin(), nth.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) r.nth = std::stoll(nth);
    if (r.nth < 1) return InvalidArgument(where + "nth '" + rule.substr(c1 + 1, c2 - c1 - 1) + "' is not an integer >= 1" + kSyntax);
    if (kind == "enospc") r.kind = Kind::kEnospc;
    else if (kind == "eio") r.kind = Kind::kEio;
    else if (kind == "short") r.kind = Kind::kShort;
    else if (kind == "einval") r.kind = Kind::kEinval;
    else return InvalidArgument(where + "unknown kind '" + rule.substr(c2 + 1) + "'" + kSyntax);
    if (r.kind == Kind::kShort && r.op != IoOp::kRead && r.op != IoOp::kWrite) {
      return InvalidArgument(where + "kind short applies to read and write only" + kSyntax);
    }
    if (r.kind == Kind::kEinval && r.op != IoOp::kOpen) {
      return InvalidArgument(where + "kind EINVAL applies to open only" + kSyntax);
    }
    plan.rules_.push_back(r);
  }
  return plan;
}

FaultPlan::Kind FaultPlan::Next(IoOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t n = ++counts_[static_cast<int>(op)];
  for (const Rule& r : rules_) {
    if (r.op == op && (n == r.nth || (r.and_after && n > r.nth))) return r.kind;
  }
  return Kind::kNone;
}

// ---- SpillFile -------------------------------------------------------------------

SpillFile::SpillFile(SpillFile&& o) noexcept
    : fd_(o.fd_), path_(std::move(o.path_)), size_(o.size_), direct_(o.direct_), align_(o.align_) {
  o.fd_ = -1;
}

SpillFile& SpillFile::operator=(SpillFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    size_ = o.size_;
    direct_ = o.direct_;
    align_ = o.align_;
    o.fd_ = -1;
  }
  return *this;
}

SpillFile::~SpillFile() {
  if (fd_ >= 0 && ::close(fd_) != 0) L2L_LOG_WARN("close({}): {}", path_, std::strerror(errno));
}

namespace {

// Owns a descriptor during Open; unlinks the file it created when Open fails.
struct OpenGuard {
  int fd = -1;
  bool created = false;
  std::string path;
  ~OpenGuard() {
    if (fd >= 0) ::close(fd);
    if (created) ::unlink(path.c_str());
  }
};

// Direct-I/O alignment of an open file: statx STATX_DIOALIGN (Linux 6.1+), never below
// 4096 (buffers and offsets at 4096 also suit 512-byte devices and the page cache).
// *supported = false when the kernel reports the file cannot do direct I/O at all.
size_t DirectAlign(int fd, bool* supported) {
  *supported = true;
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) != 0 || !(stx.stx_mask & STATX_DIOALIGN)) {
    return kMinAlign;  // kernel or filesystem does not say: 4096 is safe on every device we know
  }
  if (stx.stx_dio_offset_align == 0 || stx.stx_dio_mem_align == 0) {
    *supported = false;
    return kMinAlign;
  }
  return std::max<size_t>({kMinAlign, stx.stx_dio_offset_align, stx.stx_dio_mem_align});
}

Status Preallocate(int fd, const std::string& path, uint64_t bytes, FaultPlan* faults) {
  const FaultPlan::Kind fault = NextFault(faults, IoOp::kFallocate);
  int err = InjectedErrno(fault);
  if (err == 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) err = errno;
  if (err == EOPNOTSUPP) {
    // No preallocation on this filesystem: size it sparse; ENOSPC then surfaces on writes.
    L2L_LOG_WARN("fallocate({}): not supported by the filesystem; the spill file is sparse", path);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) return Status::Ok();
    err = errno;
  }
  if (err == 0) return Status::Ok();
  std::string msg = "fallocate(" + path + ", " + std::to_string(bytes) + " bytes): " + std::strerror(err);
  if (err == ENOSPC || err == EDQUOT) {
    msg += ": the spill file needs " + std::to_string(bytes) + " bytes, the filesystem has " +
           std::to_string(FreeBytes(path)) + " bytes free (statvfs); free space or point spill.dir at a larger filesystem";
  }
  if (fault != FaultPlan::Kind::kNone) msg += kInjected;
  return StatusFromErrno(err, msg);
}

}  // namespace

Result<SpillFile> SpillFile::Open(const std::string& path, uint64_t bytes, const SpillFileOptions& opts,
                                  FaultPlan* faults) {
  if (bytes == 0) return InvalidArgument("spill file " + path + ": size 0 requested");
  OpenGuard g;
  g.path = path;
  bool direct = opts.direct;
  const FaultPlan::Kind open_fault = NextFault(faults, IoOp::kOpen);
  const int base = O_RDWR | O_CLOEXEC;
  struct stat before {};
  const bool existed_before = ::stat(path.c_str(), &before) == 0;
  auto try_open = [&](bool with_direct) -> int {
    const int dflag = with_direct ? O_DIRECT : 0;
    if (open_fault == FaultPlan::Kind::kEinval && with_direct) {
      errno = EINVAL;  // injected: the filesystem refuses O_DIRECT
      return -1;
    }
    if (int err = InjectedErrno(open_fault); err != 0 && open_fault != FaultPlan::Kind::kEinval) {
      errno = err;
      return -1;
    }
    if (opts.must_exist) return ::open(path.c_str(), base | dflag);
    int fd = ::open(path.c_str(), base | dflag | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
      g.created = true;
      return fd;
    }
    if (errno != EEXIST) return -1;
    return ::open(path.c_str(), base | dflag);
  };
  g.fd = try_open(direct);
  if (g.fd < 0 && errno == EINVAL && direct) {
    L2L_LOG_WARN("open({}): O_DIRECT refused (EINVAL), falling back to buffered I/O{}", path,
                 open_fault == FaultPlan::Kind::kEinval ? kInjected : "");
    direct = false;
    g.fd = try_open(false);
    // A kernel may create the file before refusing O_DIRECT: then the retry finds it.
    if (g.fd >= 0 && !existed_before) g.created = true;
  }
  if (g.fd < 0) {
    const int err = errno;
    const std::string injected = open_fault != FaultPlan::Kind::kNone ? kInjected : "";
    if (err == ENOENT && opts.must_exist) {
      return NotFound("spill file " + path + " does not exist (it must: must_exist)" + injected);
    }
    if (err == ENOENT) return NotFound("open(" + path + "): " + std::strerror(err) + ": does the directory exist?" + injected);
    return StatusFromErrno(err, "open(" + path + "): " + std::strerror(err) + injected);
  }

  bool dio_ok = true;
  size_t align = DirectAlign(g.fd, &dio_ok);
  if (direct && !dio_ok) {
    L2L_LOG_WARN("statx({}): the filesystem cannot do direct I/O on this file; using buffered I/O", path);
    int fd = ::open(path.c_str(), base);
    if (fd < 0) return StatusFromErrno(errno, "open(" + path + "): " + std::strerror(errno));
    ::close(g.fd);
    g.fd = fd;
    direct = false;
  }
  const uint64_t want = RoundUp(bytes, align);

  struct stat st {};
  if (::fstat(g.fd, &st) != 0) return StatusFromErrno(errno, "fstat(" + path + "): " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("spill file " + path + " is not a regular file");
  const uint64_t have = static_cast<uint64_t>(st.st_size);
  if (!g.created && have != want) {
    if (!opts.resize_existing) {
      return DataLoss("spill file " + path + " has " + std::to_string(have) + " bytes, expected " +
                      std::to_string(want) + " (" + std::to_string(bytes) + " rounded up to " +
                      std::to_string(align) + "): written for another layout? remove it or allow resizing");
    }
    L2L_LOG_WARN("spill file {}: resizing from {} to {} bytes", path, have, want);
    if (::ftruncate(g.fd, static_cast<off_t>(want)) != 0) {
      return StatusFromErrno(errno, "ftruncate(" + path + ", " + std::to_string(want) + "): " + std::strerror(errno));
    }
  }
  L2L_RETURN_IF_ERROR(Preallocate(g.fd, path, want, faults));

  SpillFile f;
  f.fd_ = g.fd;
  f.path_ = path;
  f.size_ = want;
  f.direct_ = direct;
  f.align_ = align;
  g.fd = -1;
  g.created = false;
  return f;
}

// ---- IoEngine --------------------------------------------------------------------

namespace {

struct Transfer;

// One request: a block of a transfer, or a NOP carrying an error found by Submit.
struct Block {
  Transfer* t = nullptr;
  uint64_t file_off = 0;  // where this block starts in the file
  size_t len = 0;         // bytes of the block (0: fsync or NOP)
  size_t done = 0;        // bytes known transferred, from the block's start
  size_t issued = 0;      // where the request in flight starts, from the block's start
  FaultPlan::Kind fault = FaultPlan::Kind::kNone;
  int short_stage = 0;    // injected short: 0 = cut next result, 1 = next result is 0
};

struct Transfer {
  const SpillFile* file = nullptr;
  IoOp op = IoOp::kRead;
  char* buf = nullptr;
  size_t len = 0;
  uint64_t offset = 0;
  bool nop = false;  // completes with `status` without I/O
  std::function<void(Status)> done;
  std::vector<Block> blocks;  // sized once: Block addresses stay valid
  size_t blocks_left = 0;
  Status status;              // the error of the lowest-offset failing block
  uint64_t err_off = UINT64_MAX;
  Clock::time_point start;
};

// user_data of the request that stops the reaper.
char kStopTag;

}  // namespace

struct IoEngine::Impl {
  IoEngineOptions opts;
  FaultPlan* faults = nullptr;
  io_uring ring{};
  std::thread reaper;

  mutable std::mutex mu;
  std::condition_variable drained;  // signalled when `outstanding` drops to 0
  std::deque<Block*> pending GUARDED_BY(mu);  // FIFO of blocks waiting for a slot
  int inflight GUARDED_BY(mu) = 0;  // requests in the ring
  int64_t outstanding GUARDED_BY(mu) = 0;  // transfers whose callback has not returned
  IoStats stats GUARDED_BY(mu);

  // Fills the ring from `pending` up to queue_depth and submits.
  void Pump() REQUIRES(mu);
  // Accounts one completion; a finished transfer is moved to `ready`.
  void Complete(Block* b, int res, std::vector<std::unique_ptr<Transfer>>* ready) REQUIRES(mu);
  void FinishBlock(Block* b, Status st, std::vector<std::unique_ptr<Transfer>>* ready) REQUIRES(mu);
  void ReaperLoop();
};

void IoEngine::Impl::Pump() {
  int prepared = 0;
  while (inflight < opts.queue_depth && !pending.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) break;  // SQ full of entries not yet consumed: retry on the next Pump
    Block* b = pending.front();
    pending.pop_front();
    Transfer* t = b->t;
    if (t->nop) {
      io_uring_prep_nop(sqe);
    } else if (t->op == IoOp::kFsync) {
      io_uring_prep_fsync(sqe, t->file->fd(), 0);
    } else {
      const size_t at = b->issued;
      char* p = t->buf + (b->file_off - t->offset) + at;
      const unsigned n = static_cast<unsigned>(b->len - at);
      if (t->op == IoOp::kRead) {
        io_uring_prep_read(sqe, t->file->fd(), p, n, b->file_off + at);
      } else {
        io_uring_prep_write(sqe, t->file->fd(), p, n, b->file_off + at);
      }
    }
    io_uring_sqe_set_data(sqe, b);
    ++inflight;
    ++prepared;
  }
  if (prepared == 0 && io_uring_sq_ready(&ring) == 0) return;
  for (int attempt = 0;; ++attempt) {
    const int r = io_uring_submit(&ring);
    if (r >= 0) return;
    if ((r == -EINTR || r == -EAGAIN || r == -EBUSY) && attempt < 1000) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    // The entries stay in the SQ; the next Submit or completion submits them again.
    L2L_LOG_ERROR("spill I/O: io_uring_submit: {}", std::strerror(-r));
    return;
  }
}

void IoEngine::Impl::FinishBlock(Block* b, Status st, std::vector<std::unique_ptr<Transfer>>* ready) {
  Transfer* t = b->t;
  if (!st.ok() && (t->status.ok() || b->file_off < t->err_off)) {
    t->status = std::move(st);
    t->err_off = b->file_off;
  }
  if (--t->blocks_left > 0) return;
  if (t->status.ok() && !t->nop) {
    const double dt = std::chrono::duration<double>(Clock::now() - t->start).count();
    if (t->op == IoOp::kRead) {
      stats.bytes_read += t->len;
      ++stats.reads;
      stats.read_busy_s += dt;
    } else if (t->op == IoOp::kWrite) {
      stats.bytes_written += t->len;
      ++stats.writes;
      stats.write_busy_s += dt;
    }
  }
  ready->emplace_back(t);
}

void IoEngine::Impl::Complete(Block* b, int res, std::vector<std::unique_ptr<Transfer>>* ready) {
  --inflight;
  Transfer* t = b->t;
  if (t->nop) return FinishBlock(b, Status::Ok(), ready);
  const std::string& path = t->file->path();
  const char* op = IoOpName(t->op);
  bool injected = false;
  if (b->fault != FaultPlan::Kind::kNone) {
    injected = true;
    if (b->fault == FaultPlan::Kind::kShort) {
      if (b->short_stage == 0 && res > 0) {
        const size_t want = b->len - b->issued;
        const size_t cut = want / 2 / t->file->align() * t->file->align();
        res = static_cast<int>(std::min<size_t>(static_cast<size_t>(res), cut));
        b->short_stage = 1;
      } else if (res > 0) {
        res = 0;
      }
    } else if (res >= 0) {
      res = -InjectedErrno(b->fault);
      b->fault = FaultPlan::Kind::kNone;
    }
  }
  const std::string tag = injected ? kInjected : "";
  if (t->op == IoOp::kFsync) {
    if (res < 0) return FinishBlock(b, StatusFromErrno(-res, "spill fsync of " + path + " failed: " + std::strerror(-res) + tag), ready);
    return FinishBlock(b, Status::Ok(), ready);
  }
  if (res < 0) {
    const int err = -res;
    std::string msg = "spill " + std::string(op) + " of " + path + " at offset " +
                      std::to_string(b->file_off + b->issued) + " (" + std::to_string(b->len - b->issued) +
                      " bytes) failed: " + std::strerror(err);
    if (err == EINVAL) msg += " (misaligned direct I/O?)";
    if (err == ENOSPC || err == EDQUOT) msg += ": the disk is full";
    return FinishBlock(b, StatusFromErrno(err, msg + tag), ready);
  }
  const size_t end = b->issued + static_cast<size_t>(res);
  if (end > b->done) {
    b->done = std::min(end, b->len);
  } else {
    // No progress: EOF of a truncated file (read) or a device that takes no more (write).
    std::string msg;
    if (t->op == IoOp::kRead) {
      msg = "short read of " + path + " at offset " + std::to_string(b->file_off) + ": got " +
            std::to_string(b->done) + " of " + std::to_string(b->len) + " bytes (file truncated?)";
    } else {
      msg = "short write of " + path + " at offset " + std::to_string(b->file_off) + ": wrote " +
            std::to_string(b->done) + " of " + std::to_string(b->len) + " bytes and the device accepted no more";
    }
    return FinishBlock(b, DataLoss(msg + tag), ready);
  }
  if (b->done >= b->len) return FinishBlock(b, Status::Ok(), ready);
  // Short: resume the remainder first. O_DIRECT needs an aligned restart, so the request
  // backs up to the alignment (re-transferring a few bytes is harmless).
  const size_t a = t->file->direct() ? t->file->align() : 1;
  b->issued = b->done / a * a;
  pending.push_front(b);
}

void IoEngine::Impl::ReaperLoop() {
  pthread_setname_np(pthread_self(), "l2l-spill-io");
  std::vector<std::unique_ptr<Transfer>> ready;
  std::vector<io_uring_cqe*> cqes(static_cast<size_t>(opts.queue_depth) * 2 + 1);
  for (;;) {
    io_uring_cqe* first = nullptr;
    const int r = io_uring_wait_cqe(&ring, &first);
    if (r == -EINTR) continue;
    if (r < 0) {
      L2L_LOG_ERROR("spill I/O: io_uring_wait_cqe: {}", std::strerror(-r));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    const unsigned n = io_uring_peek_batch_cqe(&ring, cqes.data(), static_cast<unsigned>(cqes.size()));
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (unsigned i = 0; i < n; ++i) {
        void* ud = io_uring_cqe_get_data(cqes[i]);
        const int res = cqes[i]->res;
        if (ud == &kStopTag) {
          stop = true;
          continue;
        }
        Complete(static_cast<Block*>(ud), res, &ready);
      }
      io_uring_cq_advance(&ring, n);
      Pump();
    }
    for (auto& t : ready) {
      std::function<void(Status)> done = std::move(t->done);
      Status st = std::move(t->status);
      t.reset();
      if (done) done(std::move(st));
    }
    if (!ready.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      outstanding -= static_cast<int64_t>(ready.size());
      if (outstanding == 0) drained.notify_all();
    }
    ready.clear();
    if (stop) return;
  }
}

IoEngine::IoEngine(const IoEngineOptions& opts) : opts_(opts), impl_(std::make_unique<Impl>()) {}

Result<std::unique_ptr<IoEngine>> IoEngine::Create(const IoEngineOptions& opts, FaultPlan* faults) {
  if (opts.queue_depth < 1 || opts.queue_depth > 4096) {
    return InvalidArgument("spill queue_depth " + std::to_string(opts.queue_depth) + " must be in [1, 4096]");
  }
  if (opts.block_bytes == 0 || opts.block_bytes % kMinAlign != 0 || opts.block_bytes > (size_t{1} << 30)) {
    return InvalidArgument("spill block_bytes " + std::to_string(opts.block_bytes) +
                           " must be a multiple of 4096 in [4096, 1 GiB]");
  }
  std::unique_ptr<IoEngine> e(new IoEngine(opts));
  Impl& im = *e->impl_;
  im.opts = opts;
  im.faults = faults;
  const int r = io_uring_queue_init(static_cast<unsigned>(opts.queue_depth), &im.ring, 0);
  if (r < 0) {
    const std::string msg = "io_uring_queue_init(entries=" + std::to_string(opts.queue_depth) + "): " +
                            std::strerror(-r) +
                            " (io_uring disabled by seccomp or kernel.io_uring_disabled? the SSD tier needs it)";
    e->impl_.reset();  // no ring to tear down
    switch (-r) {
      case ENOMEM: return ResourceExhausted(msg);
      case EPERM:
      case EACCES: return PermissionDenied(msg);
      case ENOSYS: return Unimplemented(msg);
      default: return Status(StatusCode::kIoError, msg);
    }
  }
  im.reaper = std::thread([&im] { im.ReaperLoop(); });
  return e;
}

IoEngine::~IoEngine() {
  if (!impl_) return;
  Impl& im = *impl_;
  UniqueLock lock(im.mu);
  im.drained.wait(lock.native(), [&]() REQUIRES(im.mu) { return im.outstanding == 0; });
  // The ring is idle: one NOP tells the reaper to leave.
  io_uring_sqe* sqe = io_uring_get_sqe(&im.ring);
  L2L_CHECK(sqe != nullptr) << "spill I/O: no SQ entry for the stop request of an idle ring";
  io_uring_prep_nop(sqe);
  io_uring_sqe_set_data(sqe, &kStopTag);
  int r;
  while ((r = io_uring_submit(&im.ring)) == -EINTR || r == -EAGAIN || r == -EBUSY) {
  }
  L2L_CHECK(r >= 0) << "spill I/O: io_uring_submit of the stop request: " << std::strerror(-r);
  lock.unlock();
  im.reaper.join();
  io_uring_queue_exit(&im.ring);
}

void IoEngine::Submit(const SpillFile& file, IoOp op, void* buf, size_t len, uint64_t offset,
                      std::function<void(Status)> done) {
  Impl& im = *impl_;
  auto t = std::make_unique<Transfer>();
  t->file = &file;
  t->op = op;
  t->buf = static_cast<char*>(buf);
  t->len = len;
  t->offset = offset;
  t->done = std::move(done);
  t->start = Clock::now();

  Status bad;
  const std::string what = std::string("spill ") + IoOpName(op) + " of " + file.path();
  const size_t a = file.align();
  if (op != IoOp::kRead && op != IoOp::kWrite && op != IoOp::kFsync) {
    bad = InvalidArgument(what + ": not a transfer operation");
  } else if (file.fd() < 0) {
    bad = FailedPrecondition(what + ": the spill file is not open");
  } else if (op != IoOp::kFsync &&
             (reinterpret_cast<uintptr_t>(buf) % a != 0 || len % a != 0 || offset % a != 0)) {
    bad = InvalidArgument(what + " at offset " + std::to_string(offset) + " (" + std::to_string(len) +
                          " bytes, buffer " + std::to_string(reinterpret_cast<uintptr_t>(buf)) +
                          "): offset, length and buffer must be multiples of " + std::to_string(a));
  } else if (op != IoOp::kFsync && (offset > file.size() || len > file.size() - offset)) {
    bad = OutOfRange(what + " at offset " + std::to_string(offset) + " (" + std::to_string(len) +
                     " bytes) runs past the end of the file (" + std::to_string(file.size()) + " bytes)");
  }
  // Only transfers that reach the disk count as occurrences for the fault plan.
  const FaultPlan::Kind fault =
      bad.ok() && (op == IoOp::kFsync || len > 0) ? NextFault(im.faults, op) : FaultPlan::Kind::kNone;

  if (!bad.ok() || (op != IoOp::kFsync && len == 0)) {
    t->nop = true;
    t->status = bad;
    t->blocks.resize(1);
  } else if (op == IoOp::kFsync) {
    t->blocks.resize(1);
  } else {
    const size_t bs = RoundUp(opts_.block_bytes, a);
    t->blocks.resize((len + bs - 1) / bs);
    for (size_t i = 0; i < t->blocks.size(); ++i) {
      t->blocks[i].file_off = offset + i * bs;
      t->blocks[i].len = std::min(bs, len - i * bs);
    }
  }
  for (Block& b : t->blocks) b.t = t.get();
  t->blocks[0].fault = t->nop ? FaultPlan::Kind::kNone : fault;
  t->blocks_left = t->blocks.size();

  std::lock_guard<std::mutex> lock(im.mu);
  ++im.outstanding;
  Transfer* raw = t.release();  // owned by the engine until its callback ran
  for (Block& b : raw->blocks) im.pending.push_back(&b);
  im.Pump();
}

namespace {
// Waits for one transfer's callback (blocking forms of Submit).
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done GUARDED_BY(mu) = false;
  Status status GUARDED_BY(mu);
  std::function<void(Status)> Callback() {
    return [this](Status st) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(st);
      done = true;
      cv.notify_all();
    };
  }
  Status Wait() {
    UniqueLock lock(mu);
    cv.wait(lock.native(), [&]() REQUIRES(mu) { return done; });
    return status;
  }
};
}  // namespace

Status IoEngine::Read(const SpillFile& file, void* buf, size_t len, uint64_t offset) {
  Waiter w;
  Submit(file, IoOp::kRead, buf, len, offset, w.Callback());
  return w.Wait();
}

Status IoEngine::Write(const SpillFile& file, const void* buf, size_t len, uint64_t offset) {
  Waiter w;
  Submit(file, IoOp::kWrite, const_cast<void*>(buf), len, offset, w.Callback());
  return w.Wait();
}

Status IoEngine::Fsync(const SpillFile& file) {
  Waiter w;
  Submit(file, IoOp::kFsync, nullptr, 0, 0, w.Callback());
  return w.Wait();
}

IoStats IoEngine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

// ---- AlignedBufferPool -----------------------------------------------------------

struct AlignedBufferPool::Sync {
  std::mutex mu;
  std::condition_variable freed;
  std::vector<void*> free GUARDED_BY(mu);  // buffers not taken
  std::vector<bool> taken GUARDED_BY(mu);  // per buffer index
};

AlignedBufferPool::AlignedBufferPool(size_t buffer_bytes, size_t count)
    : buffer_bytes_(buffer_bytes), count_(count), sync_(std::make_unique<Sync>()) {}

Result<std::unique_ptr<AlignedBufferPool>> AlignedBufferPool::Create(size_t buffer_bytes, size_t count) {
  if (buffer_bytes == 0 || buffer_bytes % kMinAlign != 0) {
    return InvalidArgument("staging buffer size " + std::to_string(buffer_bytes) + " must be a positive multiple of 4096");
  }
  if (count == 0) return InvalidArgument("staging pool of 0 buffers");
  if (count > SIZE_MAX / buffer_bytes) {
    return InvalidArgument("staging pool of " + std::to_string(count) + " x " + std::to_string(buffer_bytes) + " bytes overflows");
  }
  const size_t total = buffer_bytes * count;
  std::unique_ptr<AlignedBufferPool> p(new AlignedBufferPool(buffer_bytes, count));
  void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return StatusFromErrno(errno, "mmap of the spill staging pool (" + std::to_string(count) + " x " +
                                std::to_string(buffer_bytes) + " bytes): " + std::strerror(errno));
  }
  p->base_ = base;
  if (::mlock(base, total) == 0) {
    p->pinned_ = true;
  } else {
    L2L_LOG_INFO("spill staging pool: mlock of {} bytes failed ({}); buffers are not pinned (RLIMIT_MEMLOCK)",
                 total, std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(p->sync_->mu);
  p->sync_->free.reserve(count);
  for (size_t i = count; i-- > 0;) p->sync_->free.push_back(static_cast<char*>(base) + i * buffer_bytes);
  p->sync_->taken.assign(count, false);
  return p;
}

AlignedBufferPool::~AlignedBufferPool() {
  if (base_ == nullptr) return;
  size_t free_count = 0;
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    free_count = sync_->free.size();
  }
  if (free_count != count_) {
    L2L_LOG_WARN("spill staging pool destroyed with {} of {} buffers still taken", count_ - free_count, count_);
  }
  if (::munmap(base_, buffer_bytes_ * count_) != 0) L2L_LOG_WARN("munmap of the spill staging pool: {}", std::strerror(errno));
}

Result<std::vector<void*>> AlignedBufferPool::Acquire(size_t n, std::chrono::milliseconds timeout) {
  if (n > count_) {
    return InvalidArgument("asked the spill staging pool for " + std::to_string(n) + " buffers of " +
                           std::to_string(buffer_bytes_) + " bytes; it has " + std::to_string(count_) +
                           " in all (raise spill.pool_bytes)");
  }
  UniqueLock lock(sync_->mu);
  if (!sync_->freed.wait_for(lock.native(), timeout, [&]() REQUIRES(sync_->mu) { return sync_->free.size() >= n; })) {
    return Status(StatusCode::kDeadlineExceeded,
                  "waited " + std::to_string(timeout.count()) + " ms for " + std::to_string(n) +
                      " spill staging buffers; " + std::to_string(sync_->free.size()) + " of " + std::to_string(count_) +
                      " free");
  }
  std::vector<void*> out(sync_->free.end() - static_cast<std::ptrdiff_t>(n), sync_->free.end());
  sync_->free.resize(sync_->free.size() - n);
  for (void* b : out) sync_->taken[(static_cast<char*>(b) - static_cast<char*>(base_)) / buffer_bytes_] = true;
  return out;
}

std::vector<void*> AlignedBufferPool::TryAcquire(size_t n) {
  std::lock_guard<std::mutex> lock(sync_->mu);
  if (n == 0 || sync_->free.size() < n) return {};
  std::vector<void*> out(sync_->free.end() - static_cast<std::ptrdiff_t>(n), sync_->free.end());
  sync_->free.resize(sync_->free.size() - n);
  for (void* b : out) sync_->taken[(static_cast<char*>(b) - static_cast<char*>(base_)) / buffer_bytes_] = true;
  return out;
}

void AlignedBufferPool::Release(const std::vector<void*>& bufs) {
  if (bufs.empty()) return;
  {
    std::lock_guard<std::mutex> lock(sync_->mu);
    for (void* b : bufs) {
      const auto off = static_cast<char*>(b) - static_cast<char*>(base_);
      L2L_CHECK(off >= 0 && static_cast<size_t>(off) < buffer_bytes_ * count_ && off % buffer_bytes_ == 0)
          << "Release of " << b << ", not a buffer of this spill staging pool";
      const size_t i = static_cast<size_t>(off) / buffer_bytes_;
      L2L_CHECK(sync_->taken[i]) << "spill staging buffer " << i << " released twice";
      sync_->taken[i] = false;
      sync_->free.push_back(b);
    }
  }
  sync_->freed.notify_all();
}

size_t AlignedBufferPool::free_count() const {
  std::lock_guard<std::mutex> lock(sync_->mu);
  return sync_->free.size();
}

}  // namespace l2l::eps

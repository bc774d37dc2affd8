// Spill I/O: the SSD tier's files, its io_uring engine, its bounded pool of aligned
// staging buffers, and fault injection (so every I/O failure path can be tested).
//
//   SpillFile          one preallocated file in spill.dir, opened O_DIRECT (falls back to
//                      buffered I/O with a warning where the filesystem refuses O_DIRECT,
//                      e.g. tmpfs); its size is padded to the device's logical block.
//   IoEngine           one io_uring (liburing) with a reaper thread. A transfer of a
//                      staging buffer is split into block_bytes requests; at most
//                      queue_depth requests are in flight (the rest wait in a FIFO); the
//                      callback runs once, on the reaper thread, when every block is done.
//                      Short transfers are resumed for the remainder; a transfer that
//                      makes no progress (0 bytes: EOF of a truncated file, or a full
//                      disk) fails with an error naming the path, the operation, the
//                      offset and the byte counts. Errors never assert.
//   AlignedBufferPool  a fixed number of equal, 4096-aligned buffers mapped once (and
//                      mlock'ed when the limit allows: pinned for a future GPU path).
//                      Acquisition of N buffers is all-or-nothing, so two takers can
//                      never each hold half of what they need (no deadlock), and the pool
//                      never grows: exhaustion means waiting, not failing.
//   FaultPlan          injected failures for tests and drills: "op:nth:kind[,...]" with
//                      op open|fallocate|read|write|fsync, nth the 1-based count of that
//                      op ("nth+" = that one and every later one), kind ENOSPC|EIO|short
//                      (short: read and write only) or EINVAL (open only: the kernel
//                      refusing O_DIRECT, which exercises the buffered fallback).
//                      Occurrences count calls: one SpillFile::Open is one open (and one
//                      fallocate), one Submit is one read/write/fsync however many
//                      block requests it is split into. An injected read/write/fsync
//                      fault replaces the result of the transfer's first block (the I/O
//                      itself is done); "short" cuts that block to half and then makes
//                      its resubmission return 0 bytes, so it fails as no progress.
//                      Injected errors end with "[injected fault]".
//                      The daemon reads it from $L2L_SPILL_FAULTS (a testing aid).
//
// Ownership: IoEngine owns its ring and reaper thread; callers own files and buffers and
// must keep them alive until the transfer's callback ran. Thread-safety: IoEngine::Submit,
// the pool and FaultPlan::Next are thread-safe; a SpillFile is immutable after Open.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace l2l::eps {

enum class IoOp { kOpen = 0, kFallocate, kRead, kWrite, kFsync };
const char* IoOpName(IoOp op);

class FaultPlan {
 public:
  enum class Kind { kNone = 0, kEnospc, kEio, kShort, kEinval };
  struct Rule {
    IoOp op;
    int64_t nth;       // 1-based occurrence of `op` that fails
    bool and_after;    // "op:nth+:kind": that occurrence and every later one
    Kind kind;
  };
  FaultPlan() = default;
  // Copies the rules and the counts so far (the mutex is not copied).
  FaultPlan(const FaultPlan& o);
  FaultPlan& operator=(const FaultPlan& o);
  // "" = no faults. Syntax: rules separated by ','; rule "op:nth:kind" or
  // "op:nth+:kind". INVALID_ARGUMENT names the bad rule.
  static Result<FaultPlan> Parse(const std::string& text);
  // Counts one occurrence of `op` and returns the fault to inject for it (kNone: none).
  Kind Next(IoOp op);
  bool empty() const { return rules_.empty(); }

 private:
  mutable std::mutex mu_;
  std::vector<Rule> rules_;              // immutable after Parse
  int64_t counts_[5] GUARDED_BY(mu_) = {0, 0, 0, 0, 0};  // indexed by IoOp
};

struct SpillFileOptions {
  bool direct = true;          // O_DIRECT; falls back to buffered with a warning when open
                               // says EINVAL or statx says the file cannot do direct I/O
  bool must_exist = false;     // NOT_FOUND when missing instead of creating it
  // An existing file of another size: false -> DATA_LOSS naming path and both sizes;
  // true -> resized (ftruncate + fallocate).
  bool resize_existing = false;
};

class SpillFile {
 public:
  SpillFile() = default;
  SpillFile(SpillFile&& o) noexcept;
  SpillFile& operator=(SpillFile&& o) noexcept;
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Opens or creates `path` (mode 0600) and preallocates `bytes` (rounded up to align())
  // with fallocate. Errors name the path and the operation: RESOURCE_EXHAUSTED for ENOSPC
  // (with the bytes needed and the filesystem's free bytes), DATA_LOSS for an existing
  // file of the wrong size, PERMISSION_DENIED, NOT_FOUND (directory or must_exist).
  static Result<SpillFile> Open(const std::string& path, uint64_t bytes, const SpillFileOptions& opts,
                                FaultPlan* faults = nullptr);

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  bool direct() const { return direct_; }
  // Offsets, lengths and buffer addresses of transfers must be multiples of this
  // (the device's logical block / direct-I/O alignment; 4096 when unknown).
  size_t align() const { return align_; }

 private:
  int fd_ = -1;
  std::string path_;
  uint64_t size_ = 0;
  bool direct_ = false;
  size_t align_ = 4096;
};

struct IoEngineOptions {
  int queue_depth = 32;            // io_uring requests in flight
  size_t block_bytes = 1 << 20;    // bytes per request (multiple of 4096)
};

struct IoStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t reads = 0;               // transfers (not blocks)
  uint64_t writes = 0;
  double read_busy_s = 0;           // summed transfer latencies (submit -> done)
  double write_busy_s = 0;
};

class IoEngine {
 public:
  // INVALID_ARGUMENT for bad options; the io_uring_queue_init error (with its errno text)
  // when the kernel refuses a ring (e.g. seccomp in some containers).
  static Result<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& opts, FaultPlan* faults = nullptr);
  ~IoEngine();  // waits for every submitted transfer's callback

  // Asynchronous transfer of `len` bytes between `buf` and `file` at `offset` (all
  // aligned to file.align()). `done` runs exactly once on the reaper thread, with OK or
  // an error naming file path, op, offset and what happened (when several blocks fail,
  // the one at the lowest offset). `done` must not block on
  // another transfer of this engine, nor destroy the engine. Errors Submit finds itself
  // (misalignment: INVALID_ARGUMENT; past the file's end: OUT_OF_RANGE) also arrive
  // through `done`. len 0 completes OK at once; op kFsync ignores buf, len and offset.
  void Submit(const SpillFile& file, IoOp op, void* buf, size_t len, uint64_t offset,
              std::function<void(Status)> done);
  // Blocking forms of Submit (not from a callback: it would wait on its own thread).
  Status Read(const SpillFile& file, void* buf, size_t len, uint64_t offset);
  Status Write(const SpillFile& file, const void* buf, size_t len, uint64_t offset);
  Status Fsync(const SpillFile& file);

  IoStats stats() const;
  const IoEngineOptions& options() const { return opts_; }

 private:
  struct Impl;
  explicit IoEngine(const IoEngineOptions& opts);
  IoEngineOptions opts_;
  std::unique_ptr<Impl> impl_;
};

class AlignedBufferPool {
 public:
  // `count` buffers of `buffer_bytes` (multiple of 4096), 4096-aligned, zero-filled.
  static Result<std::unique_ptr<AlignedBufferPool>> Create(size_t buffer_bytes, size_t count);
  ~AlignedBufferPool();

  // Takes n buffers at once, waiting up to `timeout` for them. INVALID_ARGUMENT when
  // n > capacity() (it could never succeed); DEADLINE_EXCEEDED on timeout.
  Result<std::vector<void*>> Acquire(size_t n, std::chrono::milliseconds timeout);
  // Takes n buffers only if they are free now; empty otherwise.
  std::vector<void*> TryAcquire(size_t n);
  void Release(const std::vector<void*>& bufs);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t capacity() const { return count_; }
  size_t free_count() const;
  bool pinned() const { return pinned_; }  // mlock succeeded

 private:
  AlignedBufferPool(size_t buffer_bytes, size_t count);
  const size_t buffer_bytes_;
  const size_t count_;
  void* base_ = nullptr;
  bool pinned_ = false;
  struct Sync;  // the free list and its mutex (spill_io.cc)
  std::unique_ptr<Sync> sync_;
};

}  // namespace l2l::eps

// The CUDA runtime of the emulator (cuda_emu): errors, devices, streams, events,
// device and pinned host memory, copies, and the queueing half of kernel launches (the
// execution half is fiber.cc). Semantics are listed in include/cuda_runtime.h.
//
// Ownership: streams and their worker threads, events, and every allocation live in the
// process-wide registries below until destroyed/freed. A destroyed stream's object is
// kept (its thread joined) so that a later use of the stale handle is recognised
// instead of touching freed memory; streams are few.
// Thread-safety: all entry points are thread-safe; registries are guarded by mutexes,
// stream queues by each stream's own mutex. Errors: per-thread last error, per-device
// sticky error.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cuda_runtime.h"

namespace l2l_cuda_emu::detail {
bool RunGrid(const GridWork& work, std::string* error);  // fiber.cc
}  // namespace l2l_cuda_emu::detail

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxDevices = 64;
constexpr size_t kDeviceAlign = 256;

// ---- Environment --------------------------------------------------------------------------
uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') {
    std::fprintf(stderr, "l2l cuda emulator: ignoring %s=%s (not a number)\n", name, v);
    return fallback;
  }
  return x;
}
// Read at each call, so a test may set it before the devices it uses (allocations and
// streams of a device beyond a lowered count stay valid).
int DeviceCount() {
  return static_cast<int>(std::min<uint64_t>(EnvU64("L2L_CUDA_EMU_DEVICES", 1), kMaxDevices));
}
uint64_t MemoryLimit() { return EnvU64("L2L_CUDA_EMU_MEMORY_BYTES", uint64_t{80} << 30); }
bool NoHostRegister() { return EnvU64("L2L_CUDA_EMU_NO_HOST_REGISTER", 0) != 0; }
// Read at each copy call (on the calling thread, never on a stream worker).
unsigned CopyDelayUs() { return static_cast<unsigned>(EnvU64("L2L_CUDA_EMU_COPY_DELAY_US", 50)); }
size_t PageSize() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
size_t RoundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// ---- Errors -------------------------------------------------------------------------------
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;  // current device; a stream worker's is its stream's

std::mutex g_sticky_mu;
cudaError_t g_sticky[kMaxDevices] = {};

cudaError_t Sticky(int device) {
  std::lock_guard<std::mutex> lock(g_sticky_mu);
  return g_sticky[device];
}
// The sticky error of the current device, else `e`.
cudaError_t StickyOr(cudaError_t e) {
  const cudaError_t s = Sticky(t_device);
  return s != cudaSuccess ? s : e;
}

// Records `e` as the thread's last error and returns it; prints `fmt` when given.
cudaError_t Fail(cudaError_t e, const char* fmt = nullptr, ...)
    __attribute__((format(printf, 2, 3)));
cudaError_t Fail(cudaError_t e, const char* fmt, ...) {
  if (fmt != nullptr) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "l2l cuda emulator: %s (%s)\n", buf, cudaGetErrorName(e));
  }
  t_last_error = e;
  return e;
}

const char* KindName(int kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "invalid cudaMemcpyKind";
}

}  // namespace

// ---- Streams --------------------------------------------------------------------------------
struct CUstream_st {
  struct Op {
    std::function<void()> fn;
    bool always = false;  // runs even after a sticky error (event markers, waits)
  };

  int device = 0;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Op> queue;
  uint64_t enqueued = 0, completed = 0;
  bool stop = false;
  std::thread worker;

  void Loop() {
    t_device = device;
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and drained
      Op op = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      // A failed kernel leaves the context unusable, as on a GPU: later work is skipped.
      if (op.always || Sticky(device) == cudaSuccess) op.fn();
      op.fn = nullptr;  // release captures before reporting completion
      lock.lock();
      ++completed;
      cv.notify_all();
    }
  }
  uint64_t Push(std::function<void()> fn, bool always) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(Op{std::move(fn), always});
    cv.notify_all();
    return ++enqueued;
  }
  void WaitFor(uint64_t seq) {
    if (std::this_thread::get_id() == worker.get_id()) return;  // from its own work
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= seq; });
  }
  void WaitIdle() {
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu);
      seq = enqueued;
    }
    WaitFor(seq);
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    return completed == enqueued;
  }
};

struct CUevent_st {
  // One cudaEventRecord: complete once the stream has reached it.
  struct Record {
    std::atomic<bool> done{false};
    Clock::time_point time;
    void Wait() const {
      while (!done.load(std::memory_order_acquire)) done.wait(false, std::memory_order_acquire);
    }
  };
  unsigned flags = 0;
  std::mutex mu;
  std::shared_ptr<Record> last;  // null: never recorded (= complete)
};

namespace {

std::mutex g_streams_mu;
std::unordered_set<CUstream_st*> g_streams;  // live streams
// Destroyed streams, kept (see the header comment); never freed, so never destroyed
// before LeakSanitizer looks.
auto* const g_destroyed_streams = new std::vector<CUstream_st*>;
std::mutex g_events_mu;
std::unordered_set<CUevent_st*> g_events;

bool IsLegacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

// Null for the legacy stream; sets *ok=false for an unknown or destroyed stream.
CUstream_st* LookupStream(cudaStream_t s, bool* ok) {
  *ok = true;
  if (IsLegacy(s)) return nullptr;
  std::lock_guard<std::mutex> lock(g_streams_mu);
  if (g_streams.count(s) == 0) *ok = false;
  return s;
}

std::vector<CUstream_st*> StreamSnapshot() {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  return {g_streams.begin(), g_streams.end()};
}

// What the legacy default stream does before its work: wait for every blocking stream.
void SyncBlockingStreams() {
  for (CUstream_st* s : StreamSnapshot()) {
    if (!(s->flags & cudaStreamNonBlocking)) s->WaitIdle();
  }
}
void SyncAllStreams() {
  for (CUstream_st* s : StreamSnapshot()) s->WaitIdle();
}

// Runs `fn` on the legacy stream (now, on this thread) or queues it on `st`. Returns the
// sequence number to wait for (0 for inline work).
uint64_t Submit(CUstream_st* st, std::function<void()> fn, bool always = false) {
  if (st == nullptr) {
    SyncBlockingStreams();
    if (always || Sticky(t_device) == cudaSuccess) fn();
    return 0;
  }
  return st->Push(std::move(fn), always);
}

CUevent_st* LookupEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_events_mu);
  return g_events.count(e) ? e : nullptr;
}

// ---- Memory registries --------------------------------------------------------------------
struct DeviceAlloc {
  char* begin;
  size_t size;     // as requested
  size_t rounded;  // to 256 bytes; the guard page starts right after
  int device;
  void* map;
  size_t map_bytes;
};
struct PinnedRange {
  char* begin;
  size_t size;
  int device;
  bool read_only;
  bool allocated;  // cudaMallocHost/cudaHostAlloc (else cudaHostRegister)
  size_t map_bytes;
};

std::mutex g_mem_mu;
std::map<uintptr_t, DeviceAlloc> g_device_allocs;  // by begin
std::map<uintptr_t, PinnedRange> g_pinned;         // by begin
uint64_t g_used[kMaxDevices] = {};

// Where a copy endpoint lies.
struct Range {
  bool device = false;
  bool pinned = false;
  bool read_only = false;  // overlaps a cudaHostRegisterReadOnly range
};

// Classifies [p, p + bytes), bytes > 0. False with *why set when the range is not one
// any copy may use (null, straddles or overruns a device allocation).
bool Classify(const void* ptr, size_t bytes, Range* out, std::string* why) {
  char buf[512];
  if (ptr == nullptr) {
    *why = "is a null pointer";
    return false;
  }
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  auto it = g_device_allocs.upper_bound(p);
  if (it != g_device_allocs.begin()) {
    const DeviceAlloc& a = std::prev(it)->second;
    const auto b = reinterpret_cast<uintptr_t>(a.begin);
    if (p < b + a.rounded) {
      if (p + bytes > b + a.size) {
        std::snprintf(buf, sizeof buf,
                      "[%p, +%zu) runs %zu bytes past the end of the %zu-byte device allocation "
                      "at %p",
                      ptr, bytes, static_cast<size_t>(p + bytes - (b + a.size)), a.size, a.begin);
        *why = buf;
        return false;
      }
      out->device = true;
      return true;
    }
  }
  if (it != g_device_allocs.end() && reinterpret_cast<uintptr_t>(it->second.begin) < p + bytes) {
    std::snprintf(buf, sizeof buf, "[%p, +%zu) overlaps the device allocation at %p", ptr, bytes,
                  it->second.begin);
    *why = buf;
    return false;
  }
  // Host memory: pinned when wholly inside one pinned range.
  auto pit = g_pinned.upper_bound(p);
  if (pit != g_pinned.begin()) {
    const PinnedRange& r = std::prev(pit)->second;
    const auto b = reinterpret_cast<uintptr_t>(r.begin);
    if (p < b + r.size) {
      out->pinned = p + bytes <= b + r.size;
      out->read_only = r.read_only;
    }
  }
  for (; pit != g_pinned.end() && pit->first < p + bytes; ++pit) {
    if (pit->second.read_only) out->read_only = true;
  }
  return true;
}

// ---- Copies -------------------------------------------------------------------------------
// Copies run as stream work: read the source, poison the destination, wait, write. A
// reader on another stream that did not wait for the copy sees 0xFF bytes; a writer
// that overwrote the source while the copy ran (it did not wait for the copy either) is
// caught by comparing the source with what the copy read, and fails the stream.
void PoisonedCopy(void* dst, const void* src, size_t bytes, unsigned delay_us) {
  std::vector<char> read(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
  std::memset(dst, 0xFF, bytes);
  if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  std::memcpy(dst, read.data(), bytes);
  if (std::memcmp(src, read.data(), bytes) != 0) {
    char what[256];
    std::snprintf(what, sizeof what,
                  "cudaMemcpyAsync(dst=%p, src=%p, %zu bytes): the source changed while the copy "
                  "ran (something wrote it without waiting for the copy)",
                  dst, src, bytes);
    l2l_cuda_emu::ReportAsyncError(cudaErrorLaunchFailure, what);
  }
}

cudaError_t Copy(const char* api, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                 cudaStream_t s) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle, "%s on unknown or destroyed stream %p", api,
                static_cast<void*>(s));
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return Fail(cudaErrorInvalidMemcpyDirection, "%s(dst=%p, src=%p, %zu bytes): kind %d", api, dst,
                src, bytes, static_cast<int>(kind));
  }
  if (bytes == 0) return cudaSuccess;
  Range d, sr;
  std::string why;
  if (!Classify(dst, bytes, &d, &why)) {
    return Fail(cudaErrorInvalidValue, "%s(dst=%p, src=%p, %zu bytes, %s): dst %s", api, dst, src,
                bytes, KindName(kind), why.c_str());
  }
  if (!Classify(src, bytes, &sr, &why)) {
    return Fail(cudaErrorInvalidValue, "%s(dst=%p, src=%p, %zu bytes, %s): src %s", api, dst, src,
                bytes, KindName(kind), why.c_str());
  }
  cudaMemcpyKind actual = sr.device ? (d.device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                    : (d.device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  if (kind != cudaMemcpyDefault && kind != actual) {
    return Fail(cudaErrorInvalidValue,
                "%s(dst=%p, src=%p, %zu bytes, %s): dst is %s memory and src is %s memory (that "
                "is %s)",
                api, dst, src, bytes, KindName(kind), d.device ? "device" : "host",
                sr.device ? "device" : "host", KindName(actual));
  }
  if (!d.device && d.read_only) {
    return Fail(cudaErrorInvalidValue,
                "%s(dst=%p, src=%p, %zu bytes, %s): dst lies in a range registered with "
                "cudaHostRegisterReadOnly",
                api, dst, src, bytes, KindName(kind));
  }
  if (st == nullptr) {  // legacy stream: in order with all blocking streams, now
    Submit(nullptr, [=] { std::memcpy(dst, src, bytes); });
    return StickyOr(cudaSuccess);
  }
  std::shared_ptr<std::vector<char>> staging;
  const void* from = src;
  if (!sr.device && !sr.pinned) {  // pageable source: CUDA stages it before returning
    staging = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                  static_cast<const char*>(src) + bytes);
    from = staging->data();
  }
  const unsigned delay_us = CopyDelayUs();
  const uint64_t seq = st->Push(
      [dst, from, bytes, staging, delay_us] { PoisonedCopy(dst, from, bytes, delay_us); }, false);
  if (!d.device && !d.pinned) {  // pageable destination: synchronous
    st->WaitFor(seq);
    return StickyOr(cudaSuccess);
  }
  return cudaSuccess;
}

cudaError_t Memset(const char* api, void* dst, int value, size_t bytes, cudaStream_t s) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle, "%s on unknown or destroyed stream %p", api,
                static_cast<void*>(s));
  if (bytes == 0) return cudaSuccess;
  Range d;
  std::string why;
  if (!Classify(dst, bytes, &d, &why)) {
    return Fail(cudaErrorInvalidValue, "%s(%p, %d, %zu bytes): %s", api, dst, value, bytes,
                why.c_str());
  }
  if (!d.device) {
    return Fail(cudaErrorInvalidValue, "%s(%p, %d, %zu bytes): not device memory", api, dst, value,
                bytes);
  }
  Submit(st, [=] { std::memset(dst, value, bytes); });
  return st == nullptr ? StickyOr(cudaSuccess) : cudaSuccess;
}

bool ValidDevice(int d) { return d >= 0 && d < DeviceCount(); }

}  // namespace

// ---- Contract (l2l_cuda_emu.h) --------------------------------------------------------------
namespace l2l_cuda_emu {

cudaError_t Enqueue(cudaStream_t s, std::function<void()> work) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle, "work queued on unknown or destroyed stream %p",
                static_cast<void*>(s));
  Submit(st, std::move(work));
  return cudaSuccess;
}

// Read at each launch, on the launching thread (never on a stream worker).
bool SkipCompute() { return EnvU64("L2L_CUDA_EMU_SKIP_COMPUTE", 0) != 0; }

bool IsDeviceRange(const void* p, size_t bytes) {
  Range r;
  std::string why;
  return p != nullptr && Classify(p, bytes == 0 ? 1 : bytes, &r, &why) && r.device;
}

void ReportAsyncError(cudaError_t e, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(g_sticky_mu);
    if (g_sticky[t_device] == cudaSuccess) g_sticky[t_device] = e;
  }
  std::fprintf(stderr, "l2l cuda emulator: asynchronous error on cuda:%d: %s: %s\n", t_device,
               cudaGetErrorName(e), what.c_str());
}

void ClearStickyErrorForTesting() {
  SyncAllStreams();
  std::lock_guard<std::mutex> lock(g_sticky_mu);
  g_sticky[t_device] = cudaSuccess;
  t_last_error = cudaSuccess;
}

namespace detail {

bool CheckKernelPointer(cudaStream_t s, const char* kernel, int index, const void* p) {
  if (p == nullptr) return true;
  Range r;
  std::string why;
  if (Classify(p, 1, &r, &why) && (r.device || r.pinned)) return true;
  char what[256];
  std::snprintf(what, sizeof what,
                "kernel %s: argument %d (%p) is neither device memory nor page-locked host "
                "memory%s%s: a GPU would fault on it",
                kernel, index, p, why.empty() ? "" : "; it ", why.c_str());
  const std::string msg = what;
  (void)l2l_cuda_emu::Enqueue(s, [msg] { ReportAsyncError(cudaErrorIllegalAddress, msg); });
  return false;
}

bool CheckLaunchConfig(const char* name, dim3 grid, dim3 block, size_t smem_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  const char* why = nullptr;
  if (threads == 0 || threads > 1024)
    why = "block must have 1..1024 threads";
  else if (block.x > 1024 || block.y > 1024 || block.z > 64)
    why = "block dims exceed (1024, 1024, 64)";
  else if (grid.x == 0 || grid.x > 0x7fffffffu)
    why = "grid.x must be in 1..2^31-1";
  else if (grid.y == 0 || grid.y > 65535 || grid.z == 0 || grid.z > 65535)
    why = "grid.y and grid.z must be in 1..65535";
  else if (smem_bytes > 0)
    why = "dynamic shared memory is not supported by the emulator (use __shared__ arrays)";
  if (why == nullptr) return true;
  Fail(cudaErrorInvalidConfiguration,
       "launch of kernel %s with grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of dynamic shared "
       "memory: %s",
       name, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem_bytes, why);
  return false;
}

void EnqueueGrid(cudaStream_t s, GridWork work) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok) {
    Fail(cudaErrorInvalidResourceHandle, "launch of kernel %s on unknown or destroyed stream %p",
         work.name, static_cast<void*>(s));
    return;
  }
  Submit(st, [w = std::move(work), skip = SkipCompute()] {
    if (skip) return;
    std::string error;
    if (!RunGrid(w, &error)) ReportAsyncError(cudaErrorLaunchFailure, error);
  });
}

}  // namespace detail
}  // namespace l2l_cuda_emu

// ---- Errors -------------------------------------------------------------------------------
cudaError_t cudaGetLastError() {
  const cudaError_t s = Sticky(t_device);
  if (s != cudaSuccess) return s;
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() { return StickyOr(t_last_error); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define L2L_EMU_NAME(x) \
  case x:               \
    return #x;
    L2L_EMU_NAME(cudaSuccess)
    L2L_EMU_NAME(cudaErrorInvalidValue)
    L2L_EMU_NAME(cudaErrorMemoryAllocation)
    L2L_EMU_NAME(cudaErrorInitializationError)
    L2L_EMU_NAME(cudaErrorInvalidConfiguration)
    L2L_EMU_NAME(cudaErrorInvalidPitchValue)
    L2L_EMU_NAME(cudaErrorInvalidSymbol)
    L2L_EMU_NAME(cudaErrorInvalidDevicePointer)
    L2L_EMU_NAME(cudaErrorInvalidMemcpyDirection)
    L2L_EMU_NAME(cudaErrorNoDevice)
    L2L_EMU_NAME(cudaErrorInvalidDevice)
    L2L_EMU_NAME(cudaErrorInvalidResourceHandle)
    L2L_EMU_NAME(cudaErrorNotReady)
    L2L_EMU_NAME(cudaErrorIllegalAddress)
    L2L_EMU_NAME(cudaErrorHostMemoryAlreadyRegistered)
    L2L_EMU_NAME(cudaErrorHostMemoryNotRegistered)
    L2L_EMU_NAME(cudaErrorLaunchFailure)
    L2L_EMU_NAME(cudaErrorNotSupported)
    L2L_EMU_NAME(cudaErrorUnknown)
#undef L2L_EMU_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidSymbol:
      return "invalid device symbol";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
      return "pointer does not correspond to a registered memory region";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unrecognized error code";
}

// ---- Devices ------------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Fail(cudaErrorInvalidValue, "cudaGetDeviceCount(nullptr)");
  *count = DeviceCount();
  return DeviceCount() == 0 ? Fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!ValidDevice(device)) {
    return Fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d device(s)", device, DeviceCount());
  }
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Fail(cudaErrorInvalidValue, "cudaGetDevice(nullptr)");
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return Fail(cudaErrorInvalidValue, "cudaGetDeviceProperties(nullptr)");
  if (!ValidDevice(device))
    return Fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "l2l CUDA emulator (CPU)");
  prop->totalGlobalMem = MemoryLimit();
  prop->sharedMemPerBlock = 48 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 << 10;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  prop->memoryBusWidth = 5120;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  prop->pciBusID = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return Fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute(nullptr)");
  if (!ValidDevice(device))
    return Fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute(device %d)", device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimX:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimY:
      *value = 1024;
      break;
    case cudaDevAttrMaxBlockDimZ:
      *value = 64;
      break;
    case cudaDevAttrMaxGridDimX:
      *value = 0x7fffffff;
      break;
    case cudaDevAttrMaxGridDimY:
      *value = 65535;
      break;
    case cudaDevAttrMaxGridDimZ:
      *value = 65535;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 << 10;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      break;
    case cudaDevAttrL2CacheSize:
      *value = 50 << 20;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrHostRegisterSupported:
    case cudaDevAttrHostRegisterReadOnlySupported:
      *value = NoHostRegister() ? 0 : 1;
      break;
    default:
      return Fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated",
                  static_cast<int>(attr));
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  SyncAllStreams();
  return StickyOr(cudaSuccess);
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return Fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion(nullptr)");
  *version = 12080;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return Fail(cudaErrorInvalidValue, "cudaDriverGetVersion(nullptr)");
  *version = 12080;
  return cudaSuccess;
}

// ---- Device memory ------------------------------------------------------------------------
cudaError_t cudaMalloc(void** dev_ptr, size_t bytes) {
  if (dev_ptr == nullptr) return Fail(cudaErrorInvalidValue, "cudaMalloc(nullptr, %zu)", bytes);
  *dev_ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const int dev = t_device;
  const size_t rounded = RoundUp(bytes, kDeviceAlign);
  const uint64_t limit = MemoryLimit();
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    if (rounded > limit || g_used[dev] > limit - rounded) {
      return Fail(cudaErrorMemoryAllocation,
                  "cudaMalloc of %zu bytes on cuda:%d: %llu of %llu bytes already allocated", bytes,
                  dev, static_cast<unsigned long long>(g_used[dev]),
                  static_cast<unsigned long long>(limit));
    }
    g_used[dev] += rounded;  // reserved; undone below if mmap fails
  }
  const size_t page = PageSize();
  const size_t data = RoundUp(rounded, page);
  const size_t map_bytes = data + 2 * page;  // guard, data, guard
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    g_used[dev] -= rounded;
    return Fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: mmap failed: %s", bytes,
                std::strerror(errno));
  }
  char* base = static_cast<char*>(m);
  mprotect(base, page, PROT_NONE);
  mprotect(base + page + data, page, PROT_NONE);
  char* begin = base + page + (data - rounded);  // end-aligned against the guard page
  std::memset(begin, 0xFF, rounded);             // never-written memory reads as NaN
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    g_device_allocs[reinterpret_cast<uintptr_t>(begin)] =
        DeviceAlloc{begin, bytes, rounded, dev, m, map_bytes};
  }
  *dev_ptr = begin;
  return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
  if (dev_ptr == nullptr) return cudaSuccess;
  SyncAllStreams();  // as CUDA: cudaFree synchronises the device
  DeviceAlloc a;
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = g_device_allocs.find(reinterpret_cast<uintptr_t>(dev_ptr));
    if (it == g_device_allocs.end()) {
      return Fail(cudaErrorInvalidValue,
                  "cudaFree(%p): not the start of a live cudaMalloc allocation", dev_ptr);
    }
    a = it->second;
    g_device_allocs.erase(it);
    g_used[a.device] -= a.rounded;
  }
  munmap(a.map, a.map_bytes);  // later use faults (until the address is reused)
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return Fail(cudaErrorInvalidValue, "cudaMemGetInfo(nullptr)");
  }
  const uint64_t limit = MemoryLimit();
  std::lock_guard<std::mutex> lock(g_mem_mu);
  const uint64_t used = g_used[t_device];
  *total_bytes = limit;
  *free_bytes = used >= limit ? 0 : limit - used;
  return cudaSuccess;
}

// ---- Pinned host memory -------------------------------------------------------------------
namespace {

// True when [p, p + bytes) overlaps a pinned range (caller holds g_mem_mu).
const PinnedRange* OverlappingPinned(uintptr_t p, size_t bytes) {
  auto it = g_pinned.upper_bound(p);
  if (it != g_pinned.begin()) {
    const PinnedRange& r = std::prev(it)->second;
    if (p < reinterpret_cast<uintptr_t>(r.begin) + r.size) return &r;
  }
  if (it != g_pinned.end() && it->first < p + bytes) return &it->second;
  return nullptr;
}

// Whether every page of [p, p + bytes) is mapped, and whether all are writable, from
// /proc/self/maps. CUDA refuses to register read-only pages without
// cudaHostRegisterReadOnly (on hosts whose device does not use the host page tables,
// like the H100 machines), and unmapped memory outright.
struct RangeProt {
  bool mapped = false;
  bool writable = false;
};
RangeProt ProtOf(uintptr_t p, size_t bytes) {
  RangeProt r;
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return RangeProt{true, true};  // cannot tell: assume the caller is right
  uintptr_t covered = p;
  const uintptr_t end = p + bytes;
  bool writable = true;
  char line[512];
  while (covered < end && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
    if (hi <= covered || lo > covered) continue;  // maps are sorted: gaps show as lo > covered
    if (perms[1] != 'w') writable = false;
    covered = hi;
  }
  std::fclose(f);
  r.mapped = covered >= end;
  r.writable = r.mapped && writable;
  return r;
}

cudaError_t AllocPinned(const char* api, void** ptr, size_t bytes) {
  if (ptr == nullptr) return Fail(cudaErrorInvalidValue, "%s(nullptr, %zu)", api, bytes);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t map_bytes = RoundUp(bytes, PageSize());
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    return Fail(cudaErrorMemoryAllocation, "%s of %zu bytes: mmap failed: %s", api, bytes,
                std::strerror(errno));
  }
  std::memset(m, 0xFF, bytes);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  g_pinned[reinterpret_cast<uintptr_t>(m)] =
      PinnedRange{static_cast<char*>(m), bytes, t_device, false, true, map_bytes};
  *ptr = m;
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  return AllocPinned("cudaMallocHost", ptr, bytes);
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  if (flags & ~0x7u) return Fail(cudaErrorInvalidValue, "cudaHostAlloc: unknown flags 0x%x", flags);
  return AllocPinned("cudaHostAlloc", ptr, bytes);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  SyncAllStreams();  // copies from/to it may be in flight
  PinnedRange r;
  {
    std::lock_guard<std::mutex> lock(g_mem_mu);
    auto it = g_pinned.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_pinned.end() || !it->second.allocated) {
      return Fail(cudaErrorInvalidValue,
                  "cudaFreeHost(%p): not a cudaMallocHost/cudaHostAlloc pointer", ptr);
    }
    r = it->second;
    g_pinned.erase(it);
  }
  munmap(r.begin, r.map_bytes);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
  if (NoHostRegister()) {
    return Fail(cudaErrorNotSupported,
                "cudaHostRegister(%p, %zu): disabled by L2L_CUDA_EMU_NO_HOST_REGISTER", ptr, bytes);
  }
  if (ptr == nullptr || bytes == 0 || (flags & ~0xFu)) {
    return Fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu, 0x%x): bad argument", ptr, bytes,
                flags);
  }
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const RangeProt prot = ProtOf(p, bytes);
  if (!prot.mapped) {
    return Fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): the range is not all mapped",
                ptr, bytes);
  }
  if (!prot.writable && !(flags & cudaHostRegisterReadOnly)) {
    return Fail(cudaErrorInvalidValue,
                "cudaHostRegister(%p, %zu, 0x%x): read-only pages need cudaHostRegisterReadOnly",
                ptr, bytes, flags);
  }
  std::lock_guard<std::mutex> lock(g_mem_mu);
  if (const PinnedRange* r = OverlappingPinned(p, bytes)) {
    return Fail(cudaErrorHostMemoryAlreadyRegistered,
                "cudaHostRegister(%p, %zu): overlaps the pinned range [%p, +%zu)", ptr, bytes,
                static_cast<void*>(r->begin), r->size);
  }
  auto it = g_device_allocs.upper_bound(p + bytes - 1);
  if (it != g_device_allocs.begin()) {
    const DeviceAlloc& a = std::prev(it)->second;
    if (reinterpret_cast<uintptr_t>(a.begin) + a.rounded > p) {
      return Fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): overlaps device allocation %p",
                  ptr, bytes, static_cast<void*>(a.begin));
    }
  }
  g_pinned[p] = PinnedRange{
      static_cast<char*>(ptr), bytes, t_device, (flags & cudaHostRegisterReadOnly) != 0, false, 0};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> lock(g_mem_mu);
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_pinned.end() || it->second.allocated) {
    return Fail(cudaErrorHostMemoryNotRegistered,
                "cudaHostUnregister(%p): not the start of a cudaHostRegister range", ptr);
  }
  g_pinned.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return Fail(cudaErrorInvalidValue, "cudaPointerGetAttributes(nullptr)");
  *attr = cudaPointerAttributes{cudaMemoryTypeUnregistered, -2, nullptr, const_cast<void*>(ptr)};
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_mem_mu);
  auto it = g_device_allocs.upper_bound(p);
  if (it != g_device_allocs.begin()) {
    const DeviceAlloc& a = std::prev(it)->second;
    if (p < reinterpret_cast<uintptr_t>(a.begin) + a.size) {
      *attr =
          cudaPointerAttributes{cudaMemoryTypeDevice, a.device, const_cast<void*>(ptr), nullptr};
      return cudaSuccess;
    }
  }
  auto pit = g_pinned.upper_bound(p);
  if (pit != g_pinned.begin()) {
    const PinnedRange& r = std::prev(pit)->second;
    if (p < reinterpret_cast<uintptr_t>(r.begin) + r.size) {
      *attr = cudaPointerAttributes{cudaMemoryTypeHost, r.device, const_cast<void*>(ptr),
                                    const_cast<void*>(ptr)};
    }
  }
  return cudaSuccess;
}

// ---- Copies -------------------------------------------------------------------------------
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return Copy("cudaMemcpy", dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  return Copy("cudaMemcpyAsync", dst, src, bytes, kind, s);
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t bytes) {
  return Memset("cudaMemset", dev_ptr, value, bytes, nullptr);
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t bytes, cudaStream_t s) {
  return Memset("cudaMemsetAsync", dev_ptr, value, bytes, s);
}

// ---- Streams ------------------------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  if (s == nullptr || (flags & ~0x1u)) {
    return Fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags(%p, 0x%x)", static_cast<void*>(s),
                flags);
  }
  auto* st = new CUstream_st;
  st->device = t_device;
  st->flags = flags;
  st->worker = std::thread([st] { st->Loop(); });
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    g_streams.insert(st);
  }
  *s = st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (IsLegacy(s))
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the default stream");
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    if (g_streams.erase(s) == 0) {
      return Fail(cudaErrorInvalidResourceHandle,
                  "cudaStreamDestroy(%p): unknown or destroyed stream", static_cast<void*>(s));
    }
    g_destroyed_streams->push_back(s);
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stop = true;  // the worker drains the queue first
    s->cv.notify_all();
  }
  s->worker.join();
  return cudaSuccess;  // the object stays allocated: stale handles are recognised
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaStreamSynchronize(%p): unknown or destroyed stream", static_cast<void*>(s));
  if (st == nullptr) {
    SyncBlockingStreams();
  } else {
    st->WaitIdle();
  }
  return StickyOr(cudaSuccess);
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery(%p): unknown or destroyed stream",
                static_cast<void*>(s));
  const cudaError_t sticky = Sticky(t_device);
  if (sticky != cudaSuccess) return sticky;
  if (st == nullptr) {
    for (CUstream_st* o : StreamSnapshot()) {
      if (!(o->flags & cudaStreamNonBlocking) && !o->Idle()) return cudaErrorNotReady;
    }
    return cudaSuccess;
  }
  return st->Idle() ? cudaSuccess : cudaErrorNotReady;  // NotReady is not an error
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaStreamWaitEvent on unknown or destroyed stream %p", static_cast<void*>(s));
  CUevent_st* ev = LookupEvent(e);
  if (ev == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaStreamWaitEvent(%p): unknown or destroyed event", static_cast<void*>(e));
  }
  if (flags != 0) return Fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags 0x%x", flags);
  std::shared_ptr<CUevent_st::Record> rec;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    rec = ev->last;  // the record current at the call; later records do not matter
  }
  if (rec == nullptr) return cudaSuccess;  // never recorded: complete
  Submit(
      st, [rec] { rec->Wait(); }, /*always=*/true);
  return cudaSuccess;
}

// ---- Events -------------------------------------------------------------------------------
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (e == nullptr || (flags & ~0x7u)) {
    return Fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags(%p, 0x%x)", static_cast<void*>(e),
                flags);
  }
  auto* ev = new CUevent_st;
  ev->flags = flags;
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    g_events.insert(ev);
  }
  *e = ev;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  {
    std::lock_guard<std::mutex> lock(g_events_mu);
    if (e == nullptr || g_events.erase(e) == 0) {
      return Fail(cudaErrorInvalidResourceHandle,
                  "cudaEventDestroy(%p): unknown or destroyed event", static_cast<void*>(e));
    }
  }
  delete e;  // pending records are shared with their stream work and outlive it
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  CUevent_st* ev = LookupEvent(e);
  if (ev == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord(%p): unknown or destroyed event",
                static_cast<void*>(e));
  }
  bool ok = true;
  CUstream_st* st = LookupStream(s, &ok);
  if (!ok)
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventRecord on unknown or destroyed stream %p",
                static_cast<void*>(s));
  auto rec = std::make_shared<CUevent_st::Record>();
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    ev->last = rec;
  }
  Submit(
      st,
      [rec] {
        rec->time = Clock::now();
        rec->done.store(true, std::memory_order_release);
        rec->done.notify_all();
      },
      /*always=*/true);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  CUevent_st* ev = LookupEvent(e);
  if (ev == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaEventSynchronize(%p): unknown or destroyed event", static_cast<void*>(e));
  }
  std::shared_ptr<CUevent_st::Record> rec;
  {
    std::lock_guard<std::mutex> lock(ev->mu);
    rec = ev->last;
  }
  if (rec) rec->Wait();
  return StickyOr(cudaSuccess);
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  CUevent_st* ev = LookupEvent(e);
  if (ev == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventQuery(%p): unknown or destroyed event",
                static_cast<void*>(e));
  }
  std::lock_guard<std::mutex> lock(ev->mu);
  if (ev->last && !ev->last->done.load(std::memory_order_acquire)) return cudaErrorNotReady;
  return StickyOr(cudaSuccess);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  CUevent_st* a = LookupEvent(start);
  CUevent_st* b = LookupEvent(end);
  if (ms == nullptr) return Fail(cudaErrorInvalidValue, "cudaEventElapsedTime(nullptr)");
  if (a == nullptr || b == nullptr) {
    return Fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: unknown or destroyed event");
  }
  if ((a->flags | b->flags) & cudaEventDisableTiming) {
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  }
  std::shared_ptr<CUevent_st::Record> ra, rb;
  {
    std::lock_guard<std::mutex> lock(a->mu);
    ra = a->last;
  }
  {
    std::lock_guard<std::mutex> lock(b->mu);
    rb = b->last;
  }
  if (!ra || !rb) {
    return Fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was never recorded");
  }
  if (!ra->done.load(std::memory_order_acquire) || !rb->done.load(std::memory_order_acquire)) {
    return Fail(cudaErrorNotReady);
  }
  *ms = std::chrono::duration<float, std::milli>(rb->time - ra->time).count();
  return cudaSuccess;
}

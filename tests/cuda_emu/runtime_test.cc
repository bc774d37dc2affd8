// Tests of the CUDA emulator's runtime and kernel execution (runtime.cc, fiber.cc):
// kernels written here with the device macros, checked against host computations;
// stream/event ordering shown both ways (with the wait: right data; without: the 0xFF
// poison); copy staging and synchronicity; API misuse errors; guard pages (in a forked
// child); memory limits; sticky errors; and the speed of the fiber scheduler.
// Thread-safety: test-only; tests that set environment variables restore them.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cuda_runtime.h"

#define LAUNCH(kernel, grid, block, smem, stream) \
  ::l2l_cuda_emu::Launch(kernel, #kernel, grid, block, smem, stream)
#define REQUIRE_CUDA(expr) REQUIRE((expr) == cudaSuccess)

namespace {

constexpr unsigned kFull = 0xffffffffu;

// The "without the wait" halves of the ordering tests are deliberate data races (that
// is what they show); ThreadSanitizer rightly reports them, so they do not run under it.
#ifdef __SANITIZE_THREAD__
constexpr bool kDeliberateRaces = false;
#else
constexpr bool kDeliberateRaces = true;
#endif

// ---- Kernels --------------------------------------------------------------------------------

template <class T>
__device__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// partial[block] = sum of x over the block's grid-stride slice (blockDim.x multiple of 32).
__global__ void BlockSumKernel(float* partial, const float* x, int64_t n) {
  __shared__ float smem[32];
  float acc = 0.0f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    acc += x[i];
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  acc = WarpSum(acc);
  if (lane == 0) smem[warp] = acc;
  __syncthreads();
  acc = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : 0.0f;
  acc = WarpSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[4 * tid + k]: the four shuffle flavours of value 100 * lane + 7 (one warp per block).
__global__ void ShuffleFlavoursKernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  const int v = 100 * lane + 7;
  out[4 * lane + 0] = __shfl_sync(kFull, v, 5);
  out[4 * lane + 1] = __shfl_up_sync(kFull, v, 3);
  out[4 * lane + 2] = __shfl_down_sync(kFull, v, 2, 16);
  out[4 * lane + 3] = __shfl_xor_sync(kFull, v, 9);
}

// out[y * width + x] = encoding of (blockIdx, threadIdx) at global (x, y) of plane z.
__global__ void IndexKernel(uint32_t* out, unsigned width, unsigned height) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
  const unsigned z = blockIdx.z * blockDim.z + threadIdx.z;
  out[(z * height + y) * width + x] = (blockIdx.x << 24) | (blockIdx.y << 20) | (blockIdx.z << 16) |
                                      (threadIdx.x << 8) | (threadIdx.y << 4) | threadIdx.z;
}

// Every block repeatedly publishes a block-specific value in __shared__ memory and every
// thread checks it after the barrier; mismatches (another block's value) are counted.
// Also checks the neighbour's slot of a per-thread array after a barrier.
__global__ void SharedPerBlockKernel(int* mismatches, int reps) {
  __shared__ int token;
  __shared__ int slots[128];
  int bad = 0;
  for (int r = 0; r < reps; ++r) {
    const int want = static_cast<int>(blockIdx.x) * 1000 + r;
    if (threadIdx.x == 0) token = want;
    slots[threadIdx.x] = want + static_cast<int>(threadIdx.x);
    __syncthreads();
    std::this_thread::yield();  // give a concurrently running stream every chance to interfere
    if (token != want) ++bad;
    const unsigned nb = (threadIdx.x + 1) % blockDim.x;
    if (slots[nb] != want + static_cast<int>(nb)) ++bad;
    __syncthreads();
  }
  if (bad) mismatches[blockIdx.x * blockDim.x + threadIdx.x] = bad;
}

// Lanes 0..15 wait at __syncthreads while lanes 16..31 wait at a full-warp shuffle.
__global__ void DeadlockKernel(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    v = __shfl_xor_sync(kFull, v, 1);
  }
  out[threadIdx.x] = v;
}

// Lane 5 returns before a full-mask shuffle of its warp.
__global__ void EarlyExitShuffleKernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void FillKernel(float* out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = value;
  }
}

// Thread (0,0) sleeps `ms` first, so every write of the grid happens after the sleep.
__global__ void SlowFillKernel(float* out, float value, int64_t n, int ms) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = value;
  }
}

__global__ void CopyKernel(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    dst[i] = src[i];
  }
}

__global__ void SleepKernel(int ms) {
  if (threadIdx.x == 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

__global__ void AxpyKernel(float* y, const float* x, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    y[i] += a * x[i];
  }
}

// One warp per row: y = (x - mean) * rstd (LayerNorm without affine), 10 shuffles per row.
__global__ void RowNormKernel(float* y, const float* x, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (row >= rows) return;
  const float* xr = x + row * cols;
  float s = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) s += xr[c];
  const float m = WarpSum(s) / static_cast<float>(cols);
  float v = 0.0f;
  for (int64_t c = lane; c < cols; c += 32) v += (xr[c] - m) * (xr[c] - m);
  const float r = 1.0f / sqrtf(WarpSum(v) / static_cast<float>(cols) + 1e-5f);
  for (int64_t c = lane; c < cols; c += 32) y[row * cols + c] = (xr[c] - m) * r;
}

// ---- Helpers --------------------------------------------------------------------------------

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { REQUIRE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s); }
};

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n;
  explicit DevBuf(size_t count) : n(count) { REQUIRE_CUDA(cudaMalloc(&p, n * sizeof(T))); }
  ~DevBuf() { (void)cudaFree(p); }
  std::vector<T> Read() {
    std::vector<T> h(n);
    REQUIRE_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

bool IsPoison(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits == 0xFFFFFFFFu;
}

// Clears the sticky error a test provoked on purpose, so later tests start clean.
struct StickyGuard {
  ~StickyGuard() { l2l_cuda_emu::ClearStickyErrorForTesting(); }
};

}  // namespace

// ---- Kernel execution ---------------------------------------------------------------------------

TEST_CASE("block reduction with shuffles and __syncthreads matches a double host sum",
          "[cuda_emu]") {
  const int64_t n = 100003;
  std::vector<float> h(n);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  double want = 0.0;
  for (auto& v : h) {
    v = dist(rng);
    want += v;
  }
  DevBuf<float> x(n);
  const unsigned blocks = 37;
  DevBuf<float> partial(blocks);
  REQUIRE_CUDA(cudaMemcpy(x.p, h.data(), n * 4, cudaMemcpyHostToDevice));
  Stream s;
  LAUNCH(BlockSumKernel, blocks, 256, 0, s.s)(partial.p, x.p, n);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  double got = 0.0;
  for (float p : partial.Read()) got += p;
  CHECK(std::abs(got - want) < 1e-3);
}

TEST_CASE("shuffle flavours read the CUDA-defined source lanes", "[cuda_emu]") {
  DevBuf<int> out(4 * 32);
  LAUNCH(ShuffleFlavoursKernel, 1, 32, 0, nullptr)(out.p);
  REQUIRE_CUDA(cudaDeviceSynchronize());
  const auto h = out.Read();
  auto val = [](int lane) { return 100 * lane + 7; };
  for (int lane = 0; lane < 32; ++lane) {
    INFO("lane " << lane);
    CHECK(h[4 * lane + 0] == val(5));
    CHECK(h[4 * lane + 1] == val(lane >= 3 ? lane - 3 : lane));
    const int seg_end = (lane & ~15) + 16;
    CHECK(h[4 * lane + 2] == val(lane + 2 < seg_end ? lane + 2 : lane));
    CHECK(h[4 * lane + 3] == val(lane ^ 9));
  }
}

TEST_CASE("2D and 3D blocks and grids index correctly", "[cuda_emu]") {
  const dim3 block(8, 4, 2), grid(3, 2, 2);
  const unsigned W = block.x * grid.x, H = block.y * grid.y, D = block.z * grid.z;
  DevBuf<uint32_t> out(size_t{W} * H * D);
  Stream s;
  LAUNCH(IndexKernel, grid, block, 0, s.s)(out.p, W, H);
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  const auto h = out.Read();
  for (unsigned z = 0; z < D; ++z) {
    for (unsigned y = 0; y < H; ++y) {
      for (unsigned x = 0; x < W; ++x) {
        const uint32_t want = ((x / block.x) << 24) | ((y / block.y) << 20) |
                              ((z / block.z) << 16) | ((x % block.x) << 8) | ((y % block.y) << 4) |
                              (z % block.z);
        INFO("x " << x << " y " << y << " z " << z);
        REQUIRE(h[(size_t{z} * H + y) * W + x] == want);
      }
    }
  }
}

TEST_CASE("__shared__ memory is per block, also with two streams running at once", "[cuda_emu]") {
  const unsigned blocks = 8, threads = 128;
  DevBuf<int> bad_a(blocks * threads), bad_b(blocks * threads);
  REQUIRE_CUDA(cudaMemset(bad_a.p, 0, blocks * threads * sizeof(int)));
  REQUIRE_CUDA(cudaMemset(bad_b.p, 0, blocks * threads * sizeof(int)));
  Stream a, b;
  LAUNCH(SharedPerBlockKernel, blocks, threads, 0, a.s)(bad_a.p, 20);
  LAUNCH(SharedPerBlockKernel, blocks, threads, 0, b.s)(bad_b.p, 20);
  REQUIRE_CUDA(cudaDeviceSynchronize());
  for (int v : bad_a.Read()) REQUIRE(v == 0);
  for (int v : bad_b.Read()) REQUIRE(v == 0);
}

TEST_CASE("deadlocked and divergent kernels fail the launch - the process survives", "[cuda_emu]") {
  StickyGuard guard;
  DevBuf<float> out(32);
  Stream s;
  SECTION("half a warp at __syncthreads, the other half at a shuffle") {
    LAUNCH(DeadlockKernel, 2, 32, 0, s.s)(out.p);
    // The launch itself is fine (the failure may already be sticky: the stream is fast).
    CHECK(cudaGetLastError() != cudaErrorInvalidConfiguration);
    CHECK(cudaStreamSynchronize(s.s) == cudaErrorLaunchFailure);
  }
  SECTION("a full-mask shuffle after a lane of the warp returned") {
    LAUNCH(EarlyExitShuffleKernel, 1, 32, 0, s.s)(out.p);
    CHECK(cudaStreamSynchronize(s.s) == cudaErrorLaunchFailure);
  }
  l2l_cuda_emu::ClearStickyErrorForTesting();
  // The emulator still works afterwards.
  LAUNCH(FillKernel, 1, 32, 0, s.s)(out.p, 3.0f, int64_t{32});
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  for (float v : out.Read()) CHECK(v == 3.0f);
}

TEST_CASE("invalid launch configurations set cudaErrorInvalidConfiguration and run nothing",
          "[cuda_emu]") {
  DevBuf<float> out(4);
  Stream s;
  struct Cfg {
    dim3 grid, block;
    size_t smem;
  };
  const Cfg bad[] = {
      {dim3(1), dim3(0), 0},        {dim3(1), dim3(1025), 0}, {dim3(1), dim3(32, 33), 0},
      {dim3(1), dim3(1, 1, 65), 0}, {dim3(0), dim3(32), 0},   {dim3(1, 65536), dim3(32), 0},
      {dim3(1, 1, 0), dim3(32), 0}, {dim3(1), dim3(32), 16},
  };
  for (const Cfg& c : bad) {
    LAUNCH(FillKernel, c.grid, c.block, c.smem, s.s)(out.p, 1.0f, int64_t{4});
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  }
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  for (float v : out.Read()) CHECK(IsPoison(v));  // never written
}

TEST_CASE("L2L_CUDA_EMU_SKIP_COMPUTE=1 queues launches without running them - copies still run",
          "[cuda_emu]") {
  DevBuf<float> out(64);
  Stream s;
  const std::vector<float> ones(64, 1.0f);
  setenv("L2L_CUDA_EMU_SKIP_COMPUTE", "1", 1);
  LAUNCH(FillKernel, 2, 32, 0, s.s)(out.p, 3.0f, int64_t{64});
  const cudaError_t launched = cudaGetLastError();
  LAUNCH(FillKernel, 1, 2000, 0, s.s)(out.p, 3.0f, int64_t{64});  // still checked
  const cudaError_t bad = cudaGetLastError();
  unsetenv("L2L_CUDA_EMU_SKIP_COMPUTE");
  CHECK(launched == cudaSuccess);
  CHECK(bad == cudaErrorInvalidConfiguration);
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  for (float v : out.Read()) CHECK(IsPoison(v));  // the kernel did not run
  REQUIRE_CUDA(cudaMemcpy(out.p, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(out.Read() == ones);
  // Read at the launch: unset again, the same launch runs.
  LAUNCH(FillKernel, 2, 32, 0, s.s)(out.p, 3.0f, int64_t{64});
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  for (float v : out.Read()) CHECK(v == 3.0f);
}

// ---- Streams and events ---------------------------------------------------------------------

TEST_CASE(
    "an event orders a consumer stream after a slow producer - without it the "
    "consumer reads poison",
    "[cuda_emu]") {
  const int64_t n = 4096;
  Stream producer, consumer;
  cudaEvent_t done;
  REQUIRE_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  for (const bool wait : {true, false}) {
    if (!wait && !kDeliberateRaces) {
      WARN("ThreadSanitizer build: the deliberately racing half of this test is not run");
      continue;
    }
    DevBuf<float> data(n), copy(n);  // fresh: 0xFF until written
    LAUNCH(SlowFillKernel, 4, 256, 0, producer.s)(data.p, 5.0f, n, 60);
    REQUIRE_CUDA(cudaEventRecord(done, producer.s));
    if (wait) REQUIRE_CUDA(cudaStreamWaitEvent(consumer.s, done, 0));
    LAUNCH(CopyKernel, 4, 256, 0, consumer.s)(copy.p, data.p, n);
    REQUIRE_CUDA(cudaStreamSynchronize(consumer.s));
    if (!wait) CHECK(cudaEventQuery(done) == cudaErrorNotReady);
    REQUIRE_CUDA(cudaEventSynchronize(done));
    CHECK(cudaEventQuery(done) == cudaSuccess);
    const auto h = copy.Read();
    int64_t fives = 0, poison = 0;
    for (float v : h) {
      fives += v == 5.0f;
      poison += IsPoison(v);
    }
    INFO("wait " << wait);
    CHECK(fives == (wait ? n : 0));
    CHECK(poison == (wait ? 0 : n));
  }
  REQUIRE_CUDA(cudaEventDestroy(done));
}

TEST_CASE("stream wait captures the record current at the call", "[cuda_emu]") {
  Stream a, b;
  cudaEvent_t e;
  REQUIRE_CUDA(cudaEventCreate(&e));
  CHECK(cudaEventQuery(e) == cudaSuccess);  // never recorded: complete
  LAUNCH(SleepKernel, 1, 1, 0, a.s)(80);
  REQUIRE_CUDA(cudaEventRecord(e, a.s));
  REQUIRE_CUDA(cudaStreamWaitEvent(b.s, e, 0));
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE_CUDA(cudaStreamSynchronize(b.s));
  const double waited =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited > 40.0);
  REQUIRE_CUDA(cudaEventRecord(e, a.s));  // a later record, already complete when checked
  REQUIRE_CUDA(cudaEventSynchronize(e));
  cudaEvent_t start, untimed;
  REQUIRE_CUDA(cudaEventCreate(&start));
  REQUIRE_CUDA(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming));
  REQUIRE_CUDA(cudaEventRecord(start, a.s));
  LAUNCH(SleepKernel, 1, 1, 0, a.s)(20);
  REQUIRE_CUDA(cudaEventRecord(e, a.s));
  REQUIRE_CUDA(cudaEventRecord(untimed, a.s));
  REQUIRE_CUDA(cudaEventSynchronize(e));
  float ms = 0;
  REQUIRE_CUDA(cudaEventElapsedTime(&ms, start, e));
  CHECK(ms >= 19.0f);
  CHECK(cudaEventElapsedTime(&ms, start, untimed) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  for (cudaEvent_t x : {e, start, untimed}) REQUIRE_CUDA(cudaEventDestroy(x));
  CHECK(cudaEventRecord(e, a.s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("a destroyed stream is an invalid handle", "[cuda_emu]") {
  cudaStream_t s;
  REQUIRE_CUDA(cudaStreamCreate(&s));
  DevBuf<float> d(16);
  LAUNCH(SlowFillKernel, 1, 16, 0, s)(d.p, 2.0f, int64_t{16}, 20);
  REQUIRE_CUDA(cudaStreamDestroy(s));  // waits for the queue to drain
  for (float v : d.Read()) CHECK(v == 2.0f);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaMemsetAsync(d.p, 0, 64, s) == cudaErrorInvalidResourceHandle);
  LAUNCH(FillKernel, 1, 16, 0, s)(d.p, 1.0f, int64_t{16});
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

// ---- Copies ---------------------------------------------------------------------------------

TEST_CASE(
    "pageable H2D sources are staged at the call - pinned ones are read when the "
    "copy runs",
    "[cuda_emu]") {
  const size_t n = 1024;
  DevBuf<float> d(n);
  Stream s;
  SECTION("pageable") {
    std::vector<float> src(n, 1.0f);
    LAUNCH(SleepKernel, 1, 1, 0, s.s)(40);  // the copy runs well after the call returns
    REQUIRE_CUDA(cudaMemcpyAsync(d.p, src.data(), n * 4, cudaMemcpyHostToDevice, s.s));
    std::fill(src.begin(), src.end(), 2.0f);
    REQUIRE_CUDA(cudaStreamSynchronize(s.s));
    for (float v : d.Read()) REQUIRE(v == 1.0f);
  }
  SECTION("pinned") {
    float* src = nullptr;
    REQUIRE_CUDA(cudaMallocHost(&src, n * 4));
    std::fill(src, src + n, 1.0f);
    LAUNCH(SleepKernel, 1, 1, 0, s.s)(40);
    REQUIRE_CUDA(cudaMemcpyAsync(d.p, src, n * 4, cudaMemcpyHostToDevice, s.s));
    std::fill(src, src + n, 2.0f);  // a bug on a GPU: the copy has not run yet
    REQUIRE_CUDA(cudaStreamSynchronize(s.s));
    for (float v : d.Read()) REQUIRE(v == 2.0f);
    REQUIRE_CUDA(cudaFreeHost(src));
  }
}

TEST_CASE("D2H into pageable memory is synchronous - into pinned memory it is not", "[cuda_emu]") {
  const int64_t n = 512;
  DevBuf<float> d(n);
  Stream s;
  std::vector<float> pageable(n, 0.0f);
  LAUNCH(SlowFillKernel, 1, 256, 0, s.s)(d.p, 7.0f, n, 40);
  REQUIRE_CUDA(cudaMemcpyAsync(pageable.data(), d.p, n * 4, cudaMemcpyDeviceToHost, s.s));
  for (float v : pageable) REQUIRE(v == 7.0f);  // no synchronisation needed

  float* pinned = nullptr;
  REQUIRE_CUDA(cudaMallocHost(&pinned, n * 4));
  std::fill(pinned, pinned + n, 0.0f);
  LAUNCH(SlowFillKernel, 1, 256, 0, s.s)(d.p, 8.0f, n, 40);
  REQUIRE_CUDA(cudaMemcpyAsync(pinned, d.p, n * 4, cudaMemcpyDeviceToHost, s.s));
  CHECK(cudaStreamQuery(s.s) == cudaErrorNotReady);
  CHECK(pinned[0] == 0.0f);  // the kernel still sleeps: nothing copied yet
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  for (int64_t i = 0; i < n; ++i) REQUIRE(pinned[i] == 8.0f);
  CHECK(cudaStreamQuery(s.s) == cudaSuccess);
  REQUIRE_CUDA(cudaFreeHost(pinned));
}

TEST_CASE(
    "an asynchronous copy poisons its destination until it completes - the legacy "
    "stream does not wait for non-blocking streams",
    "[cuda_emu]") {
  const int64_t n = 256;
  DevBuf<float> src(n), dst(n);
  Stream a;
  LAUNCH(FillKernel, 1, 256, 0, a.s)(src.p, 2.0f, n);
  LAUNCH(FillKernel, 1, 256, 0, a.s)(dst.p, 1.0f, n);
  REQUIRE_CUDA(cudaStreamSynchronize(a.s));
  setenv("L2L_CUDA_EMU_COPY_DELAY_US", "150000", 1);
  REQUIRE_CUDA(cudaMemcpyAsync(dst.p, src.p, n * 4, cudaMemcpyDeviceToDevice, a.s));
  unsetenv("L2L_CUDA_EMU_COPY_DELAY_US");
  if (kDeliberateRaces) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    std::vector<float> early(n);  // a read that forgot to wait for stream a
    REQUIRE_CUDA(cudaMemcpy(early.data(), dst.p, n * 4, cudaMemcpyDeviceToHost));
    for (float v : early) REQUIRE(IsPoison(v));
  } else {
    WARN("ThreadSanitizer build: the deliberately racing read of this test is not run");
  }
  REQUIRE_CUDA(cudaStreamSynchronize(a.s));
  for (float v : dst.Read()) REQUIRE(v == 2.0f);
}

TEST_CASE("overwriting a copy's source before the copy completed fails the stream",
          "[cuda_emu]") {
  const int64_t n = 256;
  DevBuf<float> src(n), dst(n);
  Stream a, b;
  LAUNCH(FillKernel, 1, 256, 0, a.s)(src.p, 2.0f, n);
  REQUIRE_CUDA(cudaStreamSynchronize(a.s));
  // Waiting for the copy before writing its source: fine.
  REQUIRE_CUDA(cudaMemcpyAsync(dst.p, src.p, n * 4, cudaMemcpyDeviceToDevice, a.s));
  cudaEvent_t copied;
  REQUIRE_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  REQUIRE_CUDA(cudaEventRecord(copied, a.s));
  REQUIRE_CUDA(cudaStreamWaitEvent(b.s, copied, 0));
  LAUNCH(FillKernel, 1, 256, 0, b.s)(src.p, 3.0f, n);
  REQUIRE_CUDA(cudaStreamSynchronize(b.s));
  REQUIRE_CUDA(cudaStreamSynchronize(a.s));
  for (float v : dst.Read()) REQUIRE(v == 2.0f);
  if (kDeliberateRaces) {
    // Without the wait, stream b overwrites the source while the (slow) copy runs.
    StickyGuard guard;
    // The copy takes 1 s and the write comes 40 ms into it: a margin of 0.96 s for the
    // scheduler (0.15 s failed under a loaded 2-core machine's ASan run).
    setenv("L2L_CUDA_EMU_COPY_DELAY_US", "1000000", 1);
    REQUIRE_CUDA(cudaMemcpyAsync(dst.p, src.p, n * 4, cudaMemcpyDeviceToDevice, a.s));
    unsetenv("L2L_CUDA_EMU_COPY_DELAY_US");
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    LAUNCH(FillKernel, 1, 256, 0, b.s)(src.p, 4.0f, n);
    CHECK(cudaStreamSynchronize(a.s) == cudaErrorLaunchFailure);
  } else {
    WARN("ThreadSanitizer build: the deliberately racing write of this test is not run");
  }
  REQUIRE_CUDA(cudaEventDestroy(copied));
}

TEST_CASE("copy kinds are checked against the pointers", "[cuda_emu]") {
  DevBuf<float> d(64), d2(64);
  std::vector<float> h(64, 1.0f), h2(64);
  const size_t b = 64 * 4;
  CHECK(cudaMemcpy(h2.data(), h.data(), b, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaMemcpy(d.p, h.data(), b, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(h.data(), d.p, b, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d.p, h.data(), b, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d.p, h.data(), b + 4, cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);  // overrun
  CHECK(cudaMemcpy(d.p + 1, h.data(), b, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemset(h.data(), 0, b) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d.p, nullptr, b, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // The right kinds, and cudaMemcpyDefault inferring them.
  REQUIRE_CUDA(cudaMemcpy(d.p, h.data(), b, cudaMemcpyDefault));
  REQUIRE_CUDA(cudaMemcpy(d2.p, d.p, b, cudaMemcpyDeviceToDevice));
  REQUIRE_CUDA(cudaMemcpy(h2.data(), d2.p, b, cudaMemcpyDefault));
  CHECK(h2 == h);
  CHECK(l2l_cuda_emu::IsDeviceRange(d.p, b));
  CHECK_FALSE(l2l_cuda_emu::IsDeviceRange(d.p, b + 1));
  CHECK_FALSE(l2l_cuda_emu::IsDeviceRange(h.data(), 4));
}

TEST_CASE("host registration: overlap, unregister and read-only errors", "[cuda_emu]") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<char> mem(4 * page);
  char* p = mem.data();
  REQUIRE_CUDA(cudaHostRegister(p, 2 * page, cudaHostRegisterDefault));
  CHECK(cudaHostRegister(p + page, 2 * page, 0) == cudaErrorHostMemoryAlreadyRegistered);
  CHECK(cudaHostUnregister(p + 16) == cudaErrorHostMemoryNotRegistered);
  cudaPointerAttributes attr{};
  REQUIRE_CUDA(cudaPointerGetAttributes(&attr, p + 8));
  CHECK(attr.type == cudaMemoryTypeHost);
  REQUIRE_CUDA(cudaHostUnregister(p));
  CHECK(cudaHostUnregister(p) == cudaErrorHostMemoryNotRegistered);
  REQUIRE_CUDA(cudaPointerGetAttributes(&attr, p + 8));
  CHECK(attr.type == cudaMemoryTypeUnregistered);

  // A read-only registration may be a copy source but never a destination.
  DevBuf<char> d(page);
  REQUIRE_CUDA(cudaHostRegister(p, page, cudaHostRegisterReadOnly));
  REQUIRE_CUDA(cudaMemcpy(d.p, p, page, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(p, d.p, page, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  REQUIRE_CUDA(cudaHostUnregister(p));
  REQUIRE_CUDA(cudaPointerGetAttributes(&attr, d.p));
  CHECK(attr.type == cudaMemoryTypeDevice);
  (void)cudaGetLastError();
}

TEST_CASE("host registration of a read-only mapping needs cudaHostRegisterReadOnly", "[cuda_emu]") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, 2 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(m != MAP_FAILED);
  CHECK(cudaHostRegister(m, 2 * page, cudaHostRegisterDefault) == cudaErrorInvalidValue);
  REQUIRE_CUDA(cudaHostRegister(m, 2 * page, cudaHostRegisterReadOnly));
  REQUIRE_CUDA(cudaHostUnregister(m));
  // A range running past the mapping is refused, whatever the flags.
  REQUIRE(munmap(static_cast<char*>(m) + page, page) == 0);
  CHECK(cudaHostRegister(m, 2 * page, cudaHostRegisterReadOnly) == cudaErrorInvalidValue);
  REQUIRE(munmap(m, page) == 0);
  (void)cudaGetLastError();
}

TEST_CASE("L2L_CUDA_EMU_NO_HOST_REGISTER turns host registration off", "[cuda_emu]") {
  std::vector<char> mem(8192);
  int v = -1;
  REQUIRE_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterSupported, 0));
  CHECK(v == 1);
  setenv("L2L_CUDA_EMU_NO_HOST_REGISTER", "1", 1);
  REQUIRE_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterSupported, 0));
  CHECK(v == 0);
  REQUIRE_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterReadOnlySupported, 0));
  CHECK(v == 0);
  CHECK(cudaHostRegister(mem.data(), mem.size(), 0) == cudaErrorNotSupported);
  unsetenv("L2L_CUDA_EMU_NO_HOST_REGISTER");
  (void)cudaGetLastError();
  REQUIRE_CUDA(cudaHostRegister(mem.data(), mem.size(), 0));
  REQUIRE_CUDA(cudaHostUnregister(mem.data()));
}

// ---- Device memory --------------------------------------------------------------------------

namespace {
// Runs `body` in a forked child; returns the signal that killed it (0: exited normally).
template <class F>
int ChildSignal(F body) {
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not Catch2's handler: die of the signal
    signal(SIGBUS, SIG_DFL);
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) ? WTERMSIG(status) : 0;
}
}  // namespace

TEST_CASE("device allocations are 256-aligned, poisoned and guarded", "[cuda_emu]") {
  char* p = nullptr;
  REQUIRE_CUDA(cudaMalloc(&p, 100));
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  std::vector<unsigned char> h(100);
  REQUIRE_CUDA(cudaMemcpy(h.data(), p, 100, cudaMemcpyDeviceToHost));
  for (unsigned char c : h) REQUIRE(c == 0xFF);
  CHECK(ChildSignal([p] { static_cast<volatile char*>(p)[255] = 1; }) == 0);  // rounding slack
  CHECK(ChildSignal([p] { static_cast<volatile char*>(p)[256] = 1; }) == SIGSEGV);
  REQUIRE_CUDA(cudaFree(p));
  CHECK(ChildSignal([p] { static_cast<volatile char*>(p)[0] = 1; }) == SIGSEGV);  // freed
  CHECK(cudaFree(p) == cudaErrorInvalidValue);
  (void)cudaGetLastError();
}

TEST_CASE(
    "cudaMemGetInfo accounts allocations and the limit gives "
    "cudaErrorMemoryAllocation",
    "[cuda_emu]") {
  size_t free0 = 0, total = 0, free1 = 0;
  REQUIRE_CUDA(cudaMemGetInfo(&free0, &total));
  CHECK(total == (size_t{80} << 30));
  void* p = nullptr;
  REQUIRE_CUDA(cudaMalloc(&p, 1000));
  REQUIRE_CUDA(cudaMemGetInfo(&free1, &total));
  CHECK(free0 - free1 == 1024);
  void* q = nullptr;
  CHECK(cudaMalloc(&q, free1 + 1) == cudaErrorMemoryAllocation);
  CHECK(q == nullptr);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  setenv("L2L_CUDA_EMU_MEMORY_BYTES", "1048576", 1);
  CHECK(cudaMalloc(&q, 1 << 20) == cudaErrorMemoryAllocation);  // 1 KiB already used
  REQUIRE_CUDA(cudaMalloc(&q, 512 << 10));
  REQUIRE_CUDA(cudaFree(q));
  unsetenv("L2L_CUDA_EMU_MEMORY_BYTES");
  REQUIRE_CUDA(cudaFree(p));
  REQUIRE_CUDA(cudaMemGetInfo(&free1, &total));
  CHECK(free1 == free0);
  (void)cudaGetLastError();
}

// ---- Errors ---------------------------------------------------------------------------------

TEST_CASE("an asynchronous error is sticky and stops later work", "[cuda_emu]") {
  StickyGuard guard;
  Stream s;
  DevBuf<float> d(32);
  REQUIRE_CUDA(l2l_cuda_emu::Enqueue(
      s.s, [] { l2l_cuda_emu::ReportAsyncError(cudaErrorIllegalAddress, "test fault"); }));
  LAUNCH(FillKernel, 1, 32, 0, s.s)(d.p, 1.0f, int64_t{32});  // skipped: context is dead
  CHECK(cudaStreamSynchronize(s.s) == cudaErrorIllegalAddress);
  CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // not cleared
  cudaEvent_t e;
  REQUIRE_CUDA(cudaEventCreate(&e));
  REQUIRE_CUDA(cudaEventRecord(e, s.s));
  CHECK(cudaEventSynchronize(e) == cudaErrorIllegalAddress);
  REQUIRE_CUDA(cudaEventDestroy(e));
  l2l_cuda_emu::ClearStickyErrorForTesting();
  for (float v : d.Read()) CHECK(IsPoison(v));
}

TEST_CASE("a kernel given pageable host memory faults - device and page-locked memory work",
          "[cuda_emu]") {
  const int64_t n = 64;
  Stream s;
  DevBuf<float> d(n);
  LAUNCH(FillKernel, 1, 64, 0, s.s)(d.p, 1.0f, n);
  REQUIRE_CUDA(cudaGetLastError());
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  float* pinned = nullptr;
  REQUIRE_CUDA(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)));
  LAUNCH(FillKernel, 1, 64, 0, s.s)(pinned, 2.0f, n);
  REQUIRE_CUDA(cudaStreamSynchronize(s.s));
  CHECK(pinned[n - 1] == 2.0f);
  REQUIRE_CUDA(cudaFreeHost(pinned));
  {
    StickyGuard guard;
    std::vector<float> pageable(n, 0.0f);
    LAUNCH(FillKernel, 1, 64, 0, s.s)(pageable.data(), 3.0f, n);
    CHECK(cudaStreamSynchronize(s.s) == cudaErrorIllegalAddress);
    CHECK(pageable[0] == 0.0f);  // the kernel did not run
  }
}

TEST_CASE("devices: count, selection and properties", "[cuda_emu]") {
  int n = 0, cur = -1;
  REQUIRE_CUDA(cudaGetDeviceCount(&n));
  CHECK(n >= 1);
  CHECK(cudaSetDevice(n) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  REQUIRE_CUDA(cudaSetDevice(0));
  REQUIRE_CUDA(cudaGetDevice(&cur));
  CHECK(cur == 0);
  cudaDeviceProp prop{};
  REQUIRE_CUDA(cudaGetDeviceProperties(&prop, 0));
  CHECK(std::string(prop.name) == "l2l CUDA emulator (CPU)");
  CHECK(prop.major == 9);
  CHECK(prop.multiProcessorCount == 132);
  CHECK(prop.sharedMemPerBlock == 48 * 1024);
}

// ---- Speed ----------------------------------------------------------------------------------

TEST_CASE("fiber scheduler speed: elementwise and warp-per-row kernels", "[cuda_emu]") {
  Stream s;
  {
    const int64_t n = 1 << 20;
    DevBuf<float> x(n), y(n);
    LAUNCH(FillKernel, 2112, 256, 0, s.s)(x.p, 1.5f, n);
    LAUNCH(FillKernel, 2112, 256, 0, s.s)(y.p, 1.0f, n);
    REQUIRE_CUDA(cudaStreamSynchronize(s.s));
    const auto t0 = std::chrono::steady_clock::now();
    LAUNCH(AxpyKernel, 2112, 256, 0, s.s)(y.p, x.p, 2.0f, n);
    REQUIRE_CUDA(cudaStreamSynchronize(s.s));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN("elementwise axpy, 1M floats, 2112 x 256 threads: " << ms << " ms");
    const auto h = y.Read();
    for (int64_t i = 0; i < n; i += 4097) REQUIRE(h[i] == 4.0f);
    CHECK(ms < 1000.0);  // target ~50 ms; far above means the fast context switch broke
  }
  {
    const int64_t rows = 4096, cols = 768;
    std::vector<float> hx(rows * cols);
    std::mt19937 rng(3);
    std::normal_distribution<float> dist(0.5f, 2.0f);
    for (auto& v : hx) v = dist(rng);
    DevBuf<float> x(rows * cols), y(rows * cols);
    REQUIRE_CUDA(cudaMemcpy(x.p, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    const auto t0 = std::chrono::steady_clock::now();
    LAUNCH(RowNormKernel, static_cast<unsigned>(rows / 8), 256, 0, s.s)(y.p, x.p, rows, cols);
    REQUIRE_CUDA(cudaStreamSynchronize(s.s));
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN("warp-per-row norm, 4096 x 768, 10 shuffles per row: " << ms << " ms");
    const auto hy = y.Read();
    for (int64_t r = 0; r < rows; r += 101) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < cols; ++c) m += hx[r * cols + c];
      m /= cols;
      for (int64_t c = 0; c < cols; ++c) v += (hx[r * cols + c] - m) * (hx[r * cols + c] - m);
      const double rstd = 1.0 / std::sqrt(v / cols + 1e-5);
      for (int64_t c = 0; c < cols; c += 37) {
        REQUIRE(std::abs(hy[r * cols + c] - (hx[r * cols + c] - m) * rstd) < 1e-3);
      }
    }
    CHECK(ms < 3000.0);  // target ~300 ms
  }
}

// Tests of the emulator's NCCL (cuda_emu/nccl.cc): all-gather, reduce-scatter and
// all-reduce on 2..4 emulated devices against host computations (fp32 and bf16 sums,
// in place and out of place, a flat buffer whose length does not divide by the rank count,
// padded as the worker's device group pads a layer), communicators from a unique id on
// several threads, ordering behind an event of another stream, and the errors NCCL
// returns for bad arguments and misuse.
// Thread-safety: test-only; each test sets L2L_CUDA_EMU_DEVICES for its own lifetime.
#include <nccl.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

#define REQUIRE_CUDA(expr) REQUIRE((expr) == cudaSuccess)
#define REQUIRE_NCCL(expr) REQUIRE((expr) == ncclSuccess)

namespace {

class Devices {
 public:
  explicit Devices(int n) {
    REQUIRE(setenv("L2L_CUDA_EMU_DEVICES", std::to_string(n).c_str(), 1) == 0);
    int count = 0;
    REQUIRE_CUDA(cudaGetDeviceCount(&count));
    REQUIRE(count == n);
  }
  ~Devices() {
    (void)cudaSetDevice(0);
    unsetenv("L2L_CUDA_EMU_DEVICES");
  }
};

// One rank: its communicator, a stream and a device buffer on its device.
struct Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* buf = nullptr;   // `bytes`
  void* buf2 = nullptr;  // `bytes`
};

std::vector<Rank> MakeRanks(int n, size_t bytes) {
  std::vector<ncclComm_t> comms(n);
  REQUIRE_NCCL(ncclCommInitAll(comms.data(), n, nullptr));
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r].device = r;
    ranks[r].comm = comms[r];
    REQUIRE_CUDA(cudaSetDevice(r));
    REQUIRE_CUDA(cudaStreamCreateWithFlags(&ranks[r].stream, cudaStreamNonBlocking));
    REQUIRE_CUDA(cudaMalloc(&ranks[r].buf, bytes));
    REQUIRE_CUDA(cudaMalloc(&ranks[r].buf2, bytes));
  }
  return ranks;
}

void FreeRanks(std::vector<Rank>& ranks) {
  for (Rank& r : ranks) {
    REQUIRE_CUDA(cudaSetDevice(r.device));
    REQUIRE_CUDA(cudaStreamSynchronize(r.stream));
    REQUIRE_CUDA(cudaStreamDestroy(r.stream));
    REQUIRE_CUDA(cudaFree(r.buf));
    REQUIRE_CUDA(cudaFree(r.buf2));
    REQUIRE_NCCL(ncclCommDestroy(r.comm));
  }
}

template <class T>
void Put(const Rank& r, void* dst, const std::vector<T>& h) {
  REQUIRE_CUDA(cudaSetDevice(r.device));
  REQUIRE_CUDA(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <class T>
std::vector<T> Get(const Rank& r, const void* src, size_t n) {
  REQUIRE_CUDA(cudaSetDevice(r.device));
  REQUIRE_CUDA(cudaStreamSynchronize(r.stream));
  std::vector<T> h(n);
  REQUIRE_CUDA(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

float Value(int rank, size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i)) * 0.25f; }

}  // namespace

TEST_CASE("nccl emulator: all-gather of fp32 and bf16, in place and out of place", "[nccl]") {
  for (int n : {2, 3, 4}) {
    Devices devices(n);
    const size_t count = 5;
    auto ranks = MakeRanks(n, count * n * sizeof(float));
    // Out of place, fp32.
    for (int r = 0; r < n; ++r) {
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = Value(r, i);
      Put(ranks[r], ranks[r].buf, mine);
    }
    REQUIRE_NCCL(ncclGroupStart());
    for (int r = 0; r < n; ++r)
      REQUIRE_NCCL(ncclAllGather(ranks[r].buf, ranks[r].buf2, count, ncclFloat32, ranks[r].comm, ranks[r].stream));
    REQUIRE_NCCL(ncclGroupEnd());
    for (int r = 0; r < n; ++r) {
      auto got = Get<float>(ranks[r], ranks[r].buf2, count * n);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i) REQUIRE(got[j * count + i] == Value(j, i));
    }
    // In place (send = recv + rank * count), bf16.
    for (int r = 0; r < n; ++r) {
      std::vector<__nv_bfloat16> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = __float2bfloat16_rn(Value(r, i));
      Put(ranks[r], static_cast<__nv_bfloat16*>(ranks[r].buf) + r * count, mine);
    }
    for (int r = 0; r < n; ++r) {
      auto* base = static_cast<__nv_bfloat16*>(ranks[r].buf);
      REQUIRE_NCCL(ncclAllGather(base + r * count, base, count, ncclBfloat16, ranks[r].comm, ranks[r].stream));
    }
    for (int r = 0; r < n; ++r) {
      auto got = Get<__nv_bfloat16>(ranks[r], ranks[r].buf, count * n);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i)
          REQUIRE(__bfloat162float(got[j * count + i]) == __bfloat162float(__float2bfloat16_rn(Value(j, i))));
    }
    FreeRanks(ranks);
  }
}

TEST_CASE("nccl emulator: reduce-scatter and all-reduce sum a layer whose length does not divide by n",
          "[nccl]") {
  for (int n : {2, 3, 4}) {
    Devices devices(n);
    const size_t numel = 13;                    // not a multiple of 2, 3 or 4
    const size_t shard = (numel + n - 1) / n;   // padded shard, as the device group pads
    auto ranks = MakeRanks(n, shard * n * sizeof(float));
    std::vector<std::vector<float>> inputs(n, std::vector<float>(shard * n, 0.0f));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < numel; ++i) inputs[r][i] = Value(r, i) - 3.5f * static_cast<float>(i);
      Put(ranks[r], ranks[r].buf, inputs[r]);
      Put(ranks[r], ranks[r].buf2, inputs[r]);
    }
    // Reduce-scatter in place: rank r's sum lands at buf + r * shard.
    for (int r = 0; r < n; ++r) {
      float* base = static_cast<float*>(ranks[r].buf);
      REQUIRE_NCCL(ncclReduceScatter(base, base + r * shard, shard, ncclFloat32, ncclSum, ranks[r].comm,
                                     ranks[r].stream));
    }
    // All-reduce in place, fp32 sum.
    for (int r = 0; r < n; ++r)
      REQUIRE_NCCL(ncclAllReduce(ranks[r].buf2, ranks[r].buf2, shard * n, ncclFloat32, ncclSum, ranks[r].comm,
                                 ranks[r].stream));
    for (int r = 0; r < n; ++r) {
      auto rs = Get<float>(ranks[r], ranks[r].buf, shard * n);
      auto ar = Get<float>(ranks[r], ranks[r].buf2, shard * n);
      for (size_t i = 0; i < shard * n; ++i) {
        float want = 0;  // integers and quarters: exact in any order
        for (int j = 0; j < n; ++j) want += inputs[j][i];
        REQUIRE(ar[i] == want);
        if (i / shard == static_cast<size_t>(r)) REQUIRE(rs[i] == want);
        else REQUIRE(rs[i] == inputs[r][i]);  // the rest of the send buffer is untouched
      }
    }
    FreeRanks(ranks);
  }
}

TEST_CASE("nccl emulator: bf16 sums round once, max and avg reduce", "[nccl]") {
  Devices devices(2);
  auto ranks = MakeRanks(2, 64);
  const std::vector<float> a = {1.0f, 256.0f, -3.0f, 0.5f}, b = {1.0f / 256, 1.0f, 7.0f, 0.25f};
  const std::vector<std::vector<float>> in = {a, b};
  for (int r = 0; r < 2; ++r) {
    std::vector<__nv_bfloat16> h;
    for (float x : in[r]) h.push_back(__float2bfloat16_rn(x));
    Put(ranks[r], ranks[r].buf, h);
    Put(ranks[r], ranks[r].buf2, in[r]);
  }
  for (int r = 0; r < 2; ++r) {
    REQUIRE_NCCL(ncclAllReduce(ranks[r].buf, ranks[r].buf, 4, ncclBfloat16, ncclSum, ranks[r].comm, ranks[r].stream));
    REQUIRE_NCCL(ncclAllReduce(ranks[r].buf2, static_cast<float*>(ranks[r].buf2) + 4, 4, ncclFloat32, ncclMax,
                               ranks[r].comm, ranks[r].stream));
    REQUIRE_NCCL(ncclAllReduce(ranks[r].buf2, static_cast<float*>(ranks[r].buf2) + 8, 4, ncclFloat32, ncclAvg,
                               ranks[r].comm, ranks[r].stream));
  }
  for (int r = 0; r < 2; ++r) {
    auto s = Get<__nv_bfloat16>(ranks[r], ranks[r].buf, 4);
    auto f = Get<float>(ranks[r], ranks[r].buf2, 12);
    for (int i = 0; i < 4; ++i) {
      REQUIRE(__bfloat162float(s[i]) == __bfloat162float(__float2bfloat16_rn(a[i] + b[i])));
      REQUIRE(f[4 + i] == std::max(a[i], b[i]));
      REQUIRE(f[8 + i] == (a[i] + b[i]) / 2);
    }
  }
  // 256 + 1 is not a bf16: the sum rounds to nearest even (256), as one rounding does.
  REQUIRE(__bfloat162float(Get<__nv_bfloat16>(ranks[0], ranks[0].buf, 4)[1]) == 256.0f);
  FreeRanks(ranks);
}

TEST_CASE("nccl emulator: communicators from a unique id, one thread per rank", "[nccl]") {
  const int n = 4;
  Devices devices(n);
  ncclUniqueId id;
  REQUIRE_NCCL(ncclGetUniqueId(&id));
  std::vector<ncclResult_t> init(n, ncclInternalError), coll(n, ncclInternalError);
  std::vector<std::vector<float>> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      if (cudaSetDevice(r) != cudaSuccess) return;
      ncclComm_t comm = nullptr;
      init[r] = ncclCommInitRank(&comm, n, id, r);
      if (init[r] != ncclSuccess) return;
      int count = 0, rank = -1, dev = -1;
      if (ncclCommCount(comm, &count) != ncclSuccess || count != n) return;
      if (ncclCommUserRank(comm, &rank) != ncclSuccess || rank != r) return;
      if (ncclCommCuDevice(comm, &dev) != ncclSuccess || dev != r) return;
      float* d = nullptr;
      if (cudaMalloc(&d, 3 * sizeof(float)) != cudaSuccess) return;
      const float h[3] = {1.0f * r, 2.0f * r, 3.0f};
      if (cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice) != cudaSuccess) return;
      coll[r] = ncclAllReduce(d, d, 3, ncclFloat32, ncclSum, comm, cudaStreamPerThread);
      out[r].resize(3);
      (void)cudaMemcpy(out[r].data(), d, sizeof h, cudaMemcpyDeviceToHost);
      (void)cudaFree(d);
      (void)ncclCommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    REQUIRE(init[r] == ncclSuccess);
    REQUIRE(coll[r] == ncclSuccess);
    REQUIRE(out[r] == std::vector<float>{6.0f, 12.0f, 12.0f});
  }
}

TEST_CASE("nccl emulator: a collective waits for an event of another stream", "[nccl]") {
  Devices devices(2);
  const size_t count = 4096;
  auto ranks = MakeRanks(2, count * 2 * sizeof(float));
  std::vector<std::vector<float>> host(2, std::vector<float>(count));
  std::vector<cudaStream_t> copy(2);
  std::vector<cudaEvent_t> ev(2);
  float* pinned[2];
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < count; ++i) host[r][i] = Value(r, i);
    REQUIRE_CUDA(cudaSetDevice(r));
    REQUIRE_CUDA(cudaMallocHost(&pinned[r], count * sizeof(float)));
    std::memcpy(pinned[r], host[r].data(), count * sizeof(float));
    REQUIRE_CUDA(cudaStreamCreateWithFlags(&copy[r], cudaStreamNonBlocking));
    REQUIRE_CUDA(cudaEventCreate(&ev[r]));
    // The copy stream fills the send buffer (after the emulator's copy delay); the
    // collective's stream waits for it by event only.
    REQUIRE_CUDA(cudaMemcpyAsync(ranks[r].buf, pinned[r], count * sizeof(float), cudaMemcpyHostToDevice, copy[r]));
    REQUIRE_CUDA(cudaEventRecord(ev[r], copy[r]));
    REQUIRE_CUDA(cudaStreamWaitEvent(ranks[r].stream, ev[r], 0));
    REQUIRE_NCCL(ncclAllGather(ranks[r].buf, ranks[r].buf2, count, ncclFloat32, ranks[r].comm, ranks[r].stream));
  }
  for (int r = 0; r < 2; ++r) {
    auto got = Get<float>(ranks[r], ranks[r].buf2, 2 * count);
    for (int j = 0; j < 2; ++j)
      for (size_t i = 0; i < count; ++i) REQUIRE(got[j * count + i] == host[j][i]);
    REQUIRE_CUDA(cudaStreamDestroy(copy[r]));
    REQUIRE_CUDA(cudaEventDestroy(ev[r]));
    REQUIRE_CUDA(cudaFreeHost(pinned[r]));
  }
  FreeRanks(ranks);
}

TEST_CASE("nccl emulator: bad arguments and misuse return NCCL's errors", "[nccl]") {
  Devices devices(2);
  auto ranks = MakeRanks(2, 64);
  float host[16] = {};
  REQUIRE(ncclAllGather(ranks[0].buf, ranks[0].buf2, 4, ncclFloat32, nullptr, ranks[0].stream) ==
          ncclInvalidArgument);
  REQUIRE(ncclAllGather(host, ranks[0].buf2, 4, ncclFloat32, ranks[0].comm, ranks[0].stream) ==
          ncclInvalidArgument);  // host memory
  REQUIRE(ncclAllGather(ranks[0].buf, ranks[0].buf2, 16, ncclFloat32, ranks[0].comm, ranks[0].stream) ==
          ncclInvalidArgument);  // 2 x 16 floats overrun the 64-byte receive buffer
  REQUIRE(ncclAllReduce(ranks[1].buf, ranks[0].buf2, 4, ncclFloat32, ncclSum, ranks[0].comm,
                        ranks[0].stream) == ncclInvalidArgument);  // cuda:1's memory on cuda:0's comm
  // The enums' sentinels: not a type / op, but inside each enum's range (a value outside
  // it, such as 42, would be undefined behaviour before the call).
  REQUIRE(ncclAllReduce(ranks[0].buf, ranks[0].buf2, 4, ncclNumTypes, ncclSum, ranks[0].comm,
                        ranks[0].stream) == ncclInvalidArgument);
  REQUIRE(ncclAllReduce(ranks[0].buf, ranks[0].buf2, 4, ncclFloat32, ncclNumOps, ranks[0].comm,
                        ranks[0].stream) == ncclInvalidArgument);
  REQUIRE(ncclReduceScatter(ranks[0].buf, ranks[0].buf2, 12, ncclFloat32, ncclSum, ranks[0].comm,
                            ranks[0].stream) == ncclInvalidArgument);  // 2 x 12 floats > 64 bytes
  REQUIRE(ncclGroupEnd() == ncclInvalidUsage);
  const int dup[2] = {1, 1};
  ncclComm_t c2[2];
  REQUIRE(ncclCommInitAll(c2, 2, dup) == ncclInvalidUsage);
  const int bad[1] = {5};
  REQUIRE(ncclCommInitAll(c2, 1, bad) == ncclInvalidArgument);
  REQUIRE(ncclCommInitAll(c2, 0, nullptr) == ncclInvalidArgument);
  ncclUniqueId id;
  REQUIRE_NCCL(ncclGetUniqueId(&id));
  ncclComm_t c = nullptr;
  REQUIRE(ncclCommInitRank(&c, 2, id, 2) == ncclInvalidArgument);
  REQUIRE(ncclCommInitRank(&c, 0, id, 0) == ncclInvalidArgument);
  REQUIRE(ncclCommInitRank(nullptr, 2, id, 0) == ncclInvalidArgument);
  REQUIRE(std::string(ncclGetErrorString(ncclInvalidUsage)).find("invalid usage") != std::string::npos);
  int version = 0;
  REQUIRE_NCCL(ncclGetVersion(&version));
  REQUIRE(version >= 22800);
  FreeRanks(ranks);
  // A destroyed communicator is no longer valid.
  REQUIRE(ncclAllGather(ranks[0].buf, ranks[0].buf2, 1, ncclFloat32, ranks[0].comm, nullptr) ==
          ncclInvalidArgument);
}

TEST_CASE("nccl emulator: ranks whose matching calls disagree fail on the stream instead of hanging",
          "[nccl]") {
  Devices devices(2);
  auto ranks = MakeRanks(2, 64);
  REQUIRE_NCCL(ncclAllReduce(ranks[0].buf, ranks[0].buf, 4, ncclFloat32, ncclSum, ranks[0].comm, ranks[0].stream));
  REQUIRE_NCCL(ncclAllReduce(ranks[1].buf, ranks[1].buf, 3, ncclFloat32, ncclSum, ranks[1].comm, ranks[1].stream));
  for (int r = 0; r < 2; ++r) {
    REQUIRE_CUDA(cudaSetDevice(r));
    REQUIRE(cudaStreamSynchronize(ranks[r].stream) == cudaErrorLaunchFailure);
    ncclResult_t async = ncclSuccess;
    REQUIRE_NCCL(ncclCommGetAsyncError(ranks[r].comm, &async));
    REQUIRE(async != ncclSuccess);
    l2l_cuda_emu::ClearStickyErrorForTesting();
  }
  FreeRanks(ranks);
}

TEST_CASE("nccl emulator: ncclCommAbort fails a collective waiting for a peer that never comes", "[nccl]") {
  Devices devices(2);
  auto ranks = MakeRanks(2, 64);
  // Only rank 0 calls: it waits for rank 1 until the abort.
  REQUIRE_NCCL(ncclAllReduce(ranks[0].buf, ranks[0].buf, 4, ncclFloat32, ncclSum, ranks[0].comm, ranks[0].stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(cudaStreamQuery(ranks[0].stream) == cudaErrorNotReady);
  REQUIRE_NCCL(ncclCommAbort(ranks[1].comm));
  REQUIRE_CUDA(cudaSetDevice(0));
  REQUIRE(cudaStreamSynchronize(ranks[0].stream) == cudaErrorLaunchFailure);
  l2l_cuda_emu::ClearStickyErrorForTesting();
  for (Rank& r : ranks) {
    REQUIRE_CUDA(cudaSetDevice(r.device));
    REQUIRE_CUDA(cudaStreamDestroy(r.stream));
    REQUIRE_CUDA(cudaFree(r.buf));
    REQUIRE_CUDA(cudaFree(r.buf2));
  }
  REQUIRE_NCCL(ncclCommDestroy(ranks[0].comm));
  REQUIRE(ncclCommDestroy(ranks[1].comm) == ncclInvalidArgument);  // already gone (aborted)
}

// Timing of the CUDA backend's attention ops (hidden Catch2 case "[.flashbench]", run by
// scripts/gpu_check.sh next to PyTorch's scaled_dot_product_attention on the same
// shapes): for each shape and mode (fp32 / bf16 products) the fused kernel
// (L2L_CUDA_ATTENTION=flash) and the GEMM path, forward and forward+backward, milliseconds
// per call (median of 5 after 2 warm-up calls, the stream synchronised around each).
// Prints one line per measurement:
//   flashbench: impl=flash mode=bf16 B=4 T=1024 NH=16 NKV=16 hs=64 fwd_ms=... fwdbwd_ms=...
// Not a test of correctness (flash_attention_test.cc is); it fails only if a backend
// cannot be created or a buffer allocated. On the emulator it is far too slow to run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

std::unique_ptr<Backend> Make(kernels::CudaAttentionKind kind, bool bf16) {
  kernels::CudaBackendOptions opt;
  opt.attention = kind;
  opt.gemm = bf16 ? kernels::CudaGemmPrecision::kBf16 : kernels::CudaGemmPrecision::kFp32;
  auto r = kernels::CreateCudaBackend(0, opt);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return std::move(r).value();
}

DeviceBuffer Alloc(Backend& be, size_t floats, std::mt19937& rng) {
  auto r = DeviceBuffer::Create(&be, std::max<size_t>(1, floats) * sizeof(float));
  REQUIRE(r.ok());
  const auto host = RandomVec(rng, floats);
  if (floats > 0) be.CopyToDevice(r->data(), host.data(), floats * sizeof(float));
  return std::move(r).value();
}

double MedianMs(Backend& be, const std::function<void()>& op) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 2; ++i) op();
  be.Synchronize();
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    op();
    be.Synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[2];
}

TEST_CASE("flash attention timing", "[.flashbench]") {
  Both();
  // B, T, NH, NKV, hs
  const std::vector<std::vector<int64_t>> shapes = {
      {4, 1024, 16, 16, 64}, {4, 1024, 16, 16, 128}, {2, 4096, 16, 16, 64}, {2, 4096, 32, 8, 128}};
  for (bool bf16 : {false, true}) {
    for (auto kind : {kernels::CudaAttentionKind::kFlash, kernels::CudaAttentionKind::kGemm}) {
      auto be = Make(kind, bf16);
      for (const auto& s : shapes) {
        const int64_t B = s[0], T = s[1], NH = s[2], NKV = s[3], hs = s[4];
        const int64_t W = (NH + 2 * NKV) * hs, A = NH * hs;
        std::mt19937 rng(1);
        DeviceBuffer qkv = Alloc(*be, B * T * W, rng), out = Alloc(*be, B * T * A, rng);
        DeviceBuffer dout = Alloc(*be, B * T * A, rng), dqkv = Alloc(*be, B * T * W, rng);
        DeviceBuffer att = Alloc(*be, be->CausalAttentionFloats(B, T, NH, hs), rng);
        DeviceBuffer scr = Alloc(*be, be->CausalAttentionScratchFloats(B, T, NH, hs), rng);
        auto fwd = [&] { be->AttentionForwardGqa(out.f32(), att.f32(), qkv.f32(), B, T, NH, NKV, hs); };
        auto fwdbwd = [&] {
          fwd();
          be->AttentionBackwardGqa(dqkv.f32(), scr.f32(), dout.f32(), qkv.f32(), att.f32(), B, T, NH, NKV, hs);
        };
        const double f = MedianMs(*be, fwd), fb = MedianMs(*be, fwdbwd);
        std::printf("flashbench: impl=%s mode=%s B=%lld T=%lld NH=%lld NKV=%lld hs=%lld fwd_ms=%.3f fwdbwd_ms=%.3f\n",
                    kind == kernels::CudaAttentionKind::kFlash ? "flash" : "gemm", bf16 ? "bf16" : "fp32",
                    static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(NH),
                    static_cast<long long>(NKV), static_cast<long long>(hs), f, fb);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace l2l::gpu_test

// The CUDA backend's fused attention (kernels/cuda/flash_attention.h) against the CPU
// backend, for every form it serves: causal multi-head (AttentionForward/Backward),
// grouped-query with group sizes 1, 2, 4, the sliding window, and BERT's bidirectional
// attention with key padding masks (padded query rows; a sequence with a single real
// key). Odd T (1, 17, 33, 70: partial tiles) and head sizes 64, 80, 96, 128.
//
// fp32 mode: both sides compute in fp32, so out, the log-sum-exp stash (the CPU keeps the
// same one) and the gradients agree at the conformance test's GEMM tolerances (atol 1e-4,
// rtol 1e-4; x4 for the backward chain). bf16 mode (WMMA tensor-core products): against
// the CPU on bf16-rounded inputs within Bf16AttentionBounds (tests/testing/bf16_reference.h:
// P and dS rounded by at most 2^-8 relative) plus what this kernel rounds beyond the GEMM
// path: D = rowsum(dO * O) from the bf16 P V product (|dD_i| <= sum_d |dO_id| * bound
// out_id), which moves dS_ij by scale * P_ij * |dD_i|; plus the fp32 tolerance.
// Also: no (T,T) stash (the size hooks), and L2L_CUDA_ATTENTION selecting the GEMM path.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"
#include "tests/testing/scoped_env.h"

namespace l2l::gpu_test {
namespace {

using testing::AttentionBounds;
using testing::Bf16AttentionBounds;
using testing::CpuAttentionProbs;
using testing::ExpectWithin;
using testing::RoundedBf16;
using testing::ScopedEnv;

constexpr double kAtol = 1e-4, kRtol = 1e-4;

// A CUDA backend with the fused attention, fp32 or bf16 products.
Backend& FlashBackend(bool bf16) {
  static std::unique_ptr<Backend> be[2];
  std::unique_ptr<Backend>& slot = be[bf16 ? 1 : 0];
  if (!slot) {
    kernels::CudaBackendOptions opt;
    opt.gemm = bf16 ? kernels::CudaGemmPrecision::kBf16 : kernels::CudaGemmPrecision::kFp32;
    opt.attention = kernels::CudaAttentionKind::kFlash;
    auto r = kernels::CreateCudaBackend(0, opt);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    slot = std::move(r).value();
  }
  return *slot;
}

struct Buf {
  DeviceBuffer d;
  static Buf Of(Backend& be, const std::vector<float>& host) {
    auto r = DeviceBuffer::Create(&be, std::max<size_t>(1, host.size()) * sizeof(float));
    REQUIRE(r.ok());
    Buf b{std::move(r).value()};
    if (!host.empty()) be.CopyToDevice(b.d.data(), host.data(), host.size() * sizeof(float));
    return b;
  }
  static Buf OfInt(Backend& be, const std::vector<int32_t>& host) {
    auto r = DeviceBuffer::Create(&be, host.size() * sizeof(int32_t));
    REQUIRE(r.ok());
    Buf b{std::move(r).value()};
    be.CopyToDevice(b.d.data(), host.data(), host.size() * sizeof(int32_t));
    return b;
  }
  float* p() const { return d.f32(); }
  std::vector<float> Host(Backend& be, size_t n) const {
    std::vector<float> v(n);
    be.CopyToHost(v.data(), d.data(), n * sizeof(float));
    return v;
  }
};

// GQA shapes: B, T, NH, NKV, hs, window.
TEST_CASE("flash attention (causal, GQA, window) equals the cpu in fp32", "[gpu][flash]") {
  Backends& b = Both();
  Backend& fl = FlashBackend(false);
  const auto s = GENERATE(std::vector<int64_t>{1, 1, 2, 2, 64, 0}, std::vector<int64_t>{2, 17, 4, 2, 80, 0},
                          std::vector<int64_t>{1, 33, 4, 1, 96, 0}, std::vector<int64_t>{1, 70, 2, 2, 128, 0},
                          std::vector<int64_t>{2, 33, 4, 4, 64, 5}, std::vector<int64_t>{1, 70, 4, 2, 64, 20},
                          std::vector<int64_t>{1, 17, 4, 1, 128, 3}, std::vector<int64_t>{1, 70, 2, 1, 80, 16});
  const int64_t B = s[0], T = s[1], NH = s[2], NKV = s[3], hs = s[4], window = s[5];
  CAPTURE(B, T, NH, NKV, hs, window);
  const int64_t W = (NH + 2 * NKV) * hs, A = NH * hs;
  // The stash is the row log-sum-exps and the scratch D: no (T,T) buffer.
  REQUIRE(fl.CausalAttentionFloats(B, T, NH, hs) == static_cast<size_t>(B * NH * T));
  REQUIRE(fl.CausalAttentionScratchFloats(B, T, NH, hs) == static_cast<size_t>(B * NH * T));
  std::mt19937 rng(static_cast<unsigned>(T * 131 + hs + NKV));
  const auto qkv = RandomVec(rng, B * T * W), dout = RandomVec(rng, B * T * A), dqkv0 = RandomVec(rng, B * T * W);
  const size_t natt = B * NH * T;

  Buf c_qkv = Buf::Of(*b.cpu, qkv), c_out = Buf::Of(*b.cpu, std::vector<float>(B * T * A));
  Buf c_att = Buf::Of(*b.cpu, std::vector<float>(natt));
  Buf g_qkv = Buf::Of(fl, qkv), g_out = Buf::Of(fl, std::vector<float>(B * T * A));
  Buf g_att = Buf::Of(fl, std::vector<float>(natt));
  b.cpu->AttentionForwardGqaWindow(c_out.p(), c_att.p(), c_qkv.p(), B, T, NH, NKV, hs, window);
  fl.AttentionForwardGqaWindow(g_out.p(), g_att.p(), g_qkv.p(), B, T, NH, NKV, hs, window);
  ExpectClose(g_out.Host(fl, B * T * A), c_out.Host(*b.cpu, B * T * A), kAtol, kRtol, "out");
  ExpectClose(g_att.Host(fl, natt), c_att.Host(*b.cpu, natt), kAtol, kRtol, "log-sum-exps");

  Buf c_dout = Buf::Of(*b.cpu, dout), c_dqkv = Buf::Of(*b.cpu, dqkv0), c_scr = Buf::Of(*b.cpu, {});
  Buf g_dout = Buf::Of(fl, dout), g_dqkv = Buf::Of(fl, dqkv0), g_scr = Buf::Of(fl, std::vector<float>(natt));
  b.cpu->AttentionBackwardGqaWindow(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, NH, NKV, hs,
                                    window);
  fl.AttentionBackwardGqaWindow(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att.p(), B, T, NH, NKV, hs, window);
  ExpectClose(g_dqkv.Host(fl, B * T * W), c_dqkv.Host(*b.cpu, B * T * W), 4 * kAtol, 4 * kRtol, "dqkv");
}

TEST_CASE("flash multi-head attention (AttentionForward/Backward) equals the cpu in fp32", "[gpu][flash]") {
  Backends& b = Both();
  Backend& fl = FlashBackend(false);
  const auto s = GENERATE(std::vector<int64_t>{2, 17, 2, 64}, std::vector<int64_t>{1, 33, 3, 96});
  const int64_t B = s[0], T = s[1], NH = s[2], hs = s[3], C = NH * hs;
  CAPTURE(B, T, NH, hs);
  std::mt19937 rng(static_cast<unsigned>(T + hs));
  const auto qkv = RandomVec(rng, B * T * 3 * C), dout = RandomVec(rng, B * T * C), dqkv0 = RandomVec(rng, B * T * 3 * C);
  const size_t natt = B * NH * T;
  Buf c_qkv = Buf::Of(*b.cpu, qkv), c_out = Buf::Of(*b.cpu, std::vector<float>(B * T * C)),
      c_att = Buf::Of(*b.cpu, std::vector<float>(natt));
  Buf g_qkv = Buf::Of(fl, qkv), g_out = Buf::Of(fl, std::vector<float>(B * T * C)),
      g_att = Buf::Of(fl, std::vector<float>(natt));
  b.cpu->AttentionForward(c_out.p(), c_att.p(), c_qkv.p(), B, T, C, NH);
  fl.AttentionForward(g_out.p(), g_att.p(), g_qkv.p(), B, T, C, NH);
  ExpectClose(g_out.Host(fl, B * T * C), c_out.Host(*b.cpu, B * T * C), kAtol, kRtol, "out");
  Buf c_dout = Buf::Of(*b.cpu, dout), c_dqkv = Buf::Of(*b.cpu, dqkv0), c_scr = Buf::Of(*b.cpu, {});
  Buf g_dout = Buf::Of(fl, dout), g_dqkv = Buf::Of(fl, dqkv0), g_scr = Buf::Of(fl, std::vector<float>(natt));
  b.cpu->AttentionBackward(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, C, NH);
  fl.AttentionBackward(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att.p(), B, T, C, NH);
  ExpectClose(g_dqkv.Host(fl, B * T * 3 * C), c_dqkv.Host(*b.cpu, B * T * 3 * C), 4 * kAtol, 4 * kRtol, "dqkv");
}

// Masked: B = 3 sequences: all real; the last 5 (or T/2) padded (padded query rows still
// attend to the real keys); only key 0 real. Also key_mask == nullptr.
TEST_CASE("flash bidirectional attention with key padding masks equals the cpu in fp32", "[gpu][flash]") {
  Backends& b = Both();
  Backend& fl = FlashBackend(false);
  const auto s = GENERATE(std::vector<int64_t>{17, 2, 64, 1}, std::vector<int64_t>{33, 2, 128, 1},
                          std::vector<int64_t>{17, 1, 80, 0}, std::vector<int64_t>{70, 2, 64, 1});
  const int64_t B = 3, T = s[0], NH = s[1], hs = s[2], C = NH * hs;
  const bool with_mask = s[3] != 0;
  CAPTURE(T, NH, hs, with_mask);
  std::vector<int32_t> mask(B * T, 1);
  for (int64_t t = T - std::min<int64_t>(5, T / 2); t < T; ++t) mask[T + t] = 0;
  for (int64_t t = 1; t < T; ++t) mask[2 * T + t] = 0;
  std::mt19937 rng(static_cast<unsigned>(T * 7 + hs));
  const auto qkv = RandomVec(rng, B * T * 3 * C), dout = RandomVec(rng, B * T * C), dqkv0 = RandomVec(rng, B * T * 3 * C);
  const size_t g_natt = fl.MaskedAttentionFloats(B, T, NH, hs), c_natt = b.cpu->MaskedAttentionFloats(B, T, NH, hs);
  REQUIRE(g_natt == static_cast<size_t>(B * NH * T + B * T));
  REQUIRE(fl.MaskedAttentionScratchFloats(B, T, NH, hs) == static_cast<size_t>(B * NH * T));
  Buf c_mask = Buf::OfInt(*b.cpu, mask), g_mask = Buf::OfInt(fl, mask);
  const int32_t* cm = with_mask ? c_mask.d.i32() : nullptr;
  const int32_t* gm = with_mask ? g_mask.d.i32() : nullptr;
  Buf c_qkv = Buf::Of(*b.cpu, qkv), c_out = Buf::Of(*b.cpu, std::vector<float>(B * T * C)),
      c_att = Buf::Of(*b.cpu, std::vector<float>(c_natt));
  Buf g_qkv = Buf::Of(fl, qkv), g_out = Buf::Of(fl, std::vector<float>(B * T * C)),
      g_att = Buf::Of(fl, std::vector<float>(g_natt));
  b.cpu->AttentionForwardMasked(c_out.p(), c_att.p(), c_qkv.p(), cm, B, T, C, NH);
  fl.AttentionForwardMasked(g_out.p(), g_att.p(), g_qkv.p(), gm, B, T, C, NH);
  ExpectClose(g_out.Host(fl, B * T * C), c_out.Host(*b.cpu, B * T * C), kAtol, kRtol, "out");
  Buf c_dout = Buf::Of(*b.cpu, dout), c_dqkv = Buf::Of(*b.cpu, dqkv0),
      c_scr = Buf::Of(*b.cpu, std::vector<float>(b.cpu->MaskedAttentionScratchFloats(B, T, NH, hs)));
  Buf g_dout = Buf::Of(fl, dout), g_dqkv = Buf::Of(fl, dqkv0), g_scr = Buf::Of(fl, std::vector<float>(B * NH * T));
  b.cpu->AttentionBackwardMasked(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, C, NH);
  fl.AttentionBackwardMasked(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att.p(), B, T, C, NH);
  ExpectClose(g_dqkv.Host(fl, B * T * 3 * C), c_dqkv.Host(*b.cpu, B * T * 3 * C), 4 * kAtol, 4 * kRtol, "dqkv");
}

// The D term (see the header comment) added to the P / dS bounds.
void AddDTerm(AttentionBounds& r, const std::vector<float>& qkv, const std::vector<float>& dout,
              const std::vector<float>& att, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
              bool causal) {
  const int64_t rep = NH / NKV, A = NH * hs, W = (NH + 2 * NKV) * hs;
  const double scale = 1.0 / std::sqrt(double(hs));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      const int64_t g = h / rep, ko = A + g * hs;
      for (int64_t i = 0; i < T; ++i) {
        double dd = 0.0;
        for (int64_t d = 0; d < hs; ++d)
          dd += std::abs(double(dout[(b * T + i) * A + h * hs + d])) * r.out[(b * T + i) * A + h * hs + d];
        for (int64_t j = 0; j < (causal ? i + 1 : T); ++j) {
          const double e = scale * att[((b * NH + h) * T + i) * T + j] * dd;
          for (int64_t d = 0; d < hs; ++d) {
            r.dqkv[(b * T + i) * W + h * hs + d] += e * std::abs(qkv[(b * T + j) * W + ko + d]);
            r.dqkv[(b * T + j) * W + ko + d] += e * std::abs(qkv[(b * T + i) * W + h * hs + d]);
          }
        }
      }
    }
}

TEST_CASE("flash attention in bf16 mode (WMMA) matches the cpu on bf16-rounded inputs within the bounds",
          "[gpu][flash]") {
  Backends& b = Both();
  Backend& fl = FlashBackend(true);
  // T = 150 and 97: several blocks of 64 query rows, whose warps skip the key tiles their
  // own rows do not see.
  const auto s = GENERATE(std::vector<int64_t>{1, 33, 4, 2, 64}, std::vector<int64_t>{1, 17, 2, 2, 128},
                          std::vector<int64_t>{2, 20, 4, 1, 80}, std::vector<int64_t>{1, 17, 2, 2, 96},
                          std::vector<int64_t>{1, 150, 4, 2, 64}, std::vector<int64_t>{1, 97, 2, 1, 128});
  const int64_t B = s[0], T = s[1], NH = s[2], NKV = s[3], hs = s[4];
  CAPTURE(B, T, NH, NKV, hs);
  const int64_t W = (NH + 2 * NKV) * hs, A = NH * hs;
  std::mt19937 rng(static_cast<unsigned>(T * 3 + hs));
  const auto qkv = RandomVec(rng, B * T * W), dout = RandomVec(rng, B * T * A), dqkv0 = RandomVec(rng, B * T * W);
  const auto qkv_r = RoundedBf16(qkv), dout_r = RoundedBf16(dout);
  const size_t natt = B * NH * T;
  Buf c_qkv = Buf::Of(*b.cpu, qkv_r), c_out = Buf::Of(*b.cpu, std::vector<float>(B * T * A)),
      c_att = Buf::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionForwardGqa(c_out.p(), c_att.p(), c_qkv.p(), B, T, NH, NKV, hs);
  Buf g_qkv = Buf::Of(fl, qkv), g_out = Buf::Of(fl, std::vector<float>(B * T * A)),
      g_att = Buf::Of(fl, std::vector<float>(natt));
  fl.AttentionForwardGqa(g_out.p(), g_att.p(), g_qkv.p(), B, T, NH, NKV, hs);
  const auto probs = CpuAttentionProbs(qkv_r, c_att.Host(*b.cpu, natt), B, T, NH, NKV, hs);
  AttentionBounds bounds = Bf16AttentionBounds(qkv_r, dout_r, probs, B, T, NH, NKV, hs, /*causal=*/true);
  ExpectWithin(g_out.Host(fl, B * T * A), c_out.Host(*b.cpu, B * T * A), bounds.out, kAtol, kRtol, "out");
  // bf16 mode really rounds: the unrounded CPU result is further off than fp32 noise.
  Buf u_qkv = Buf::Of(*b.cpu, qkv), u_out = Buf::Of(*b.cpu, std::vector<float>(B * T * A)),
      u_att = Buf::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionForwardGqa(u_out.p(), u_att.p(), u_qkv.p(), B, T, NH, NKV, hs);
  double off = 0.0;
  const auto got = g_out.Host(fl, B * T * A), unrounded = u_out.Host(*b.cpu, B * T * A);
  for (size_t i = 0; i < got.size(); ++i) off = std::max(off, std::abs(double(got[i]) - unrounded[i]));
  CHECK(off > 1e-4);

  Buf c_dout = Buf::Of(*b.cpu, dout_r), c_dqkv = Buf::Of(*b.cpu, dqkv0), c_scr = Buf::Of(*b.cpu, {});
  Buf g_dout = Buf::Of(fl, dout), g_dqkv = Buf::Of(fl, dqkv0), g_scr = Buf::Of(fl, std::vector<float>(natt));
  b.cpu->AttentionBackwardGqa(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, NH, NKV, hs);
  fl.AttentionBackwardGqa(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att.p(), B, T, NH, NKV, hs);
  AddDTerm(bounds, qkv_r, dout_r, probs, B, T, NH, NKV, hs, /*causal=*/true);
  ExpectWithin(g_dqkv.Host(fl, B * T * W), c_dqkv.Host(*b.cpu, B * T * W), bounds.dqkv, 4 * kAtol, 4 * kRtol,
               "dqkv");
}

TEST_CASE("L2L_CUDA_ATTENTION picks the attention and flash is the default where the head size allows",
          "[gpu][flash]") {
  Both();
  const int64_t B = 2, T = 50, NH = 4;
  {
    ScopedEnv env("L2L_CUDA_ATTENTION", "gemm");
    auto be = kernels::CreateBackend("cuda:0");
    REQUIRE(be.ok());
    CHECK((*be)->name().find("attention gemm") != std::string::npos);
    CHECK((*be)->CausalAttentionFloats(B, T, NH, 64) == static_cast<size_t>(B * NH * T * T));
    CHECK((*be)->MaskedAttentionFloats(B, T, NH, 64) == static_cast<size_t>(B * NH * T * T));
  }
  {
    ScopedEnv env("L2L_CUDA_ATTENTION", "");
    auto be = kernels::CreateBackend("cuda:0");
    REQUIRE(be.ok());
    CHECK((*be)->name().find("attention flash") != std::string::npos);
    CHECK((*be)->CausalAttentionFloats(B, T, NH, 64) == static_cast<size_t>(B * NH * T));
    CHECK((*be)->CausalAttentionFloats(B, T, NH, 32) == static_cast<size_t>(B * NH * T * T));  // GEMM path
  }
  {
    ScopedEnv env("L2L_CUDA_ATTENTION", "fastest");
    auto be = kernels::CreateBackend("cuda:0");
    REQUIRE_FALSE(be.ok());
    CHECK(be.status().message().find("L2L_CUDA_ATTENTION") != std::string::npos);
  }
}

// End to end with the fused kernel: GPT with 2 heads of 64 (training_test.cc's SmallSpec
// has heads of 32, which take the GEMM path); the reference trainer and the relay (both
// stash placements, recompute always / never) on cuda track the cpu for 10 steps at
// training_test.cc's tolerance.
JobConfig FlashGptJob() {
  JobConfig cfg = testing::GptJob({512, 64, 128, 2, 2, 512}, {.micro_batch_size = 2, .micro_batches = 2,
                                                             .seq_len = 64, .seed = 1234, .lr = 3e-3f});
  REQUIRE(cfg.model.Validate().ok());
  return cfg;
}

TEST_CASE("reference trainer and relay on cuda with flash attention track the cpu for 10 steps",
          "[gpu][flash]") {
  Backends& b = Both();
  REQUIRE(b.gpu->name().find("attention flash") != std::string::npos);
  JobConfig job = FlashGptJob();
  REQUIRE(b.gpu->CausalAttentionFloats(2, 64, 2, 64) == static_cast<size_t>(2 * 2 * 64));
  const auto cpu_train = TrainLosses(job, "cpu", 10);
  const auto gpu_train = TrainLosses(job, "cuda:0", 10);
  ExpectLossesTrack(gpu_train, cpu_train, 2e-3);
  job.train.stash = GENERATE(StashPlacement::kDevice, StashPlacement::kHost);
  job.train.recompute = GENERATE(RecomputeMode::kAlways, RecomputeMode::kNever);
  CAPTURE(ToString(job.train.stash), ToString(job.train.recompute));
  REQUIRE(job.Validate().ok());
  ExpectLossesTrack(RelayLosses(job, b.gpu.get(), 10), RelayLosses(job, b.cpu.get(), 10), 2e-3);
}

}  // namespace
}  // namespace l2l::gpu_test

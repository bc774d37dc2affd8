// The CUDA backend's fused backward passes (reduce.cu, llama_ops.cu) against the CPU
// backend (the reference) and against their own unfused composition on the GPU:
//   LayerNormBackwardResidual / RMSNormBackwardResidual: one pass (input gradient and the
//     parameter-gradient partials together) for C up to kFused{Layer,Rms}NormMaxC, the
//     two-pass kernels above (shapes on both sides of the limit);
//   GeluBackwardBias: one pass writing the gradient and the bias partials;
//   SwiGLUBackwardInto: the backward without the zeroing pass;
//   LinearForward: the GEMM, then bias + residual or bias + GELU in one pass.
// Tolerances as conformance_test.cc (fp32 on both sides; the differences are summation
// order): inputs gradients atol/rtol 1e-4, parameter gradients (column sums) 4e-4 / 1e-4,
// elementwise 1e-5 / 1e-4. On the GPU itself the fused ops equal their composition bit for
// bit (the residual forms run the same kernel as the accumulating ones; GeluBackwardBias
// keeps BiasBackward's summation order; LinearForward's epilogue does AddBias, Add and
// GeluForward's operations in their order). Label gpu (and emu on the emulator).
#include <catch2/catch.hpp>

#include <array>
#include <random>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

constexpr double kElemAtol = 1e-5, kElemRtol = 1e-4;
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

TEST_CASE("cuda LayerNormBackwardResidual matches the cpu and the gpu's copy + LayerNormBackward",
          "[gpu][fused]") {
  Backends& b = Both();
  // C 4097: past the one-pass limit (the two-pass kernels and a copy of dresid).
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 37}, std::array<int64_t, 2>{67, 768},
                              std::array<int64_t, 2>{2049, 96}, std::array<int64_t, 2>{9, 4097});
  const int64_t N = shape[0], C = shape[1];
  const bool aliased = GENERATE(false, true);
  CAPTURE(N, C, aliased);
  std::mt19937 rng(static_cast<unsigned>(N * 13 + C));
  Twin inp = Twin::Of(b, RandomVec(rng, N * C, -2.0f, 3.0f));
  Twin w = Twin::Of(b, RandomVec(rng, C, 0.5f, 1.5f)), bias = Twin::Of(b, RandomVec(rng, C));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  Twin mean = Twin::Of(b, RandomVec(rng, N)), rstd = Twin::Of(b, RandomVec(rng, N));
  b.cpu->LayerNormForward(out.c(), mean.c(), rstd.c(), inp.c(), w.c(), bias.c(), N, C);
  // Both sides use the CPU's statistics: the backward is compared on identical inputs.
  b.gpu->CopyToDevice(mean.g(), mean.FromCpu(b).data(), mean.bytes);
  b.gpu->CopyToDevice(rstd.g(), rstd.FromCpu(b).data(), rstd.bytes);

  const auto dres_host = RandomVec(rng, N * C), dw0 = RandomVec(rng, C), db0 = RandomVec(rng, C);
  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dres = Twin::Of(b, dres_host);
  Twin dinp = aliased ? Twin::Of(b, dres_host) : Twin::Of(b, RandomVec(rng, N * C));
  Twin dw = Twin::Of(b, dw0), db = Twin::Of(b, db0);
  float* rc = aliased ? dinp.c() : dres.c();
  float* rg = aliased ? dinp.g() : dres.g();
  b.cpu->LayerNormBackwardResidual(dinp.c(), dw.c(), db.c(), rc, dout.c(), inp.c(), w.c(), mean.c(), rstd.c(),
                                   N, C);
  b.gpu->LayerNormBackwardResidual(dinp.g(), dw.g(), db.g(), rg, dout.g(), inp.g(), w.g(), mean.g(), rstd.g(),
                                   N, C);
  ExpectTwinClose(b, dinp, kGemmAtol, kGemmRtol, "LayerNormBackwardResidual dinp");
  ExpectTwinClose(b, dw, 4 * kGemmAtol, kGemmRtol, "LayerNormBackwardResidual dweight");
  ExpectTwinClose(b, db, 4 * kGemmAtol, kGemmRtol, "LayerNormBackwardResidual dbias");

  // The unfused composition on the GPU: the same bits.
  Twin u_in = Twin::Of(b, dres_host), u_w = Twin::Of(b, dw0), u_b = Twin::Of(b, db0);
  b.gpu->LayerNormBackward(u_in.g(), u_w.g(), u_b.g(), dout.g(), inp.g(), w.g(), mean.g(), rstd.g(), N, C);
  CHECK(u_in.FromGpu(b) == dinp.FromGpu(b));
  CHECK(u_w.FromGpu(b) == dw.FromGpu(b));
  CHECK(u_b.FromGpu(b) == db.FromGpu(b));
}

TEST_CASE("cuda RMSNormBackwardResidual matches the cpu and the gpu's copy + RMSNormBackward",
          "[gpu][fused][llama]") {
  Backends& b = Both();
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 37}, std::array<int64_t, 2>{67, 1000},
                              std::array<int64_t, 2>{2049, 64}, std::array<int64_t, 2>{5, 8193});
  const int64_t N = shape[0], C = shape[1];
  const bool aliased = GENERATE(false, true);
  CAPTURE(N, C, aliased);
  std::mt19937 rng(static_cast<unsigned>(N * 29 + C));
  Twin inp = Twin::Of(b, RandomVec(rng, N * C, -2.0f, 3.0f));
  Twin w = Twin::Of(b, RandomVec(rng, C, 0.5f, 1.5f));
  Twin out = Twin::Of(b, RandomVec(rng, N * C)), rstd = Twin::Of(b, RandomVec(rng, N));
  b.cpu->RMSNormForward(out.c(), rstd.c(), inp.c(), w.c(), N, C, 1e-5f);
  b.gpu->CopyToDevice(rstd.g(), rstd.FromCpu(b).data(), rstd.bytes);

  const auto dres_host = RandomVec(rng, N * C), dw0 = RandomVec(rng, C);
  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dres = Twin::Of(b, dres_host);
  Twin dinp = aliased ? Twin::Of(b, dres_host) : Twin::Of(b, RandomVec(rng, N * C));
  Twin dw = Twin::Of(b, dw0);
  float* rc = aliased ? dinp.c() : dres.c();
  float* rg = aliased ? dinp.g() : dres.g();
  b.cpu->RMSNormBackwardResidual(dinp.c(), dw.c(), rc, dout.c(), inp.c(), w.c(), rstd.c(), N, C);
  b.gpu->RMSNormBackwardResidual(dinp.g(), dw.g(), rg, dout.g(), inp.g(), w.g(), rstd.g(), N, C);
  ExpectTwinClose(b, dinp, kGemmAtol, kGemmRtol, "RMSNormBackwardResidual dinp");
  ExpectTwinClose(b, dw, 4 * kGemmAtol, kGemmRtol, "RMSNormBackwardResidual dweight");

  Twin u_in = Twin::Of(b, dres_host), u_w = Twin::Of(b, dw0);
  b.gpu->RMSNormBackward(u_in.g(), u_w.g(), dout.g(), inp.g(), w.g(), rstd.g(), N, C);
  CHECK(u_in.FromGpu(b) == dinp.FromGpu(b));
  CHECK(u_w.FromGpu(b) == dw.FromGpu(b));
}

TEST_CASE("cuda fused GeluBackwardBias matches the cpu and equals the gpu's unfused ops bit for bit",
          "[gpu][fused]") {
  Backends& b = Both();
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 7}, std::array<int64_t, 2>{45, 33},
                              std::array<int64_t, 2>{300, 1536});
  const int64_t N = shape[0], F = shape[1];
  CAPTURE(N, F);
  std::mt19937 rng(static_cast<unsigned>(N * 7 + F));
  Twin x = Twin::Of(b, RandomVec(rng, N * F, -4.0f, 4.0f)), dout = Twin::Of(b, RandomVec(rng, N * F));
  const auto db0 = RandomVec(rng, F);
  Twin din = Twin::Of(b, RandomVec(rng, N * F)), dbias = Twin::Of(b, db0);  // din: garbage
  b.cpu->GeluBackwardBias(din.c(), dbias.c(), x.c(), dout.c(), N, F);
  b.gpu->GeluBackwardBias(din.g(), dbias.g(), x.g(), dout.g(), N, F);
  ExpectTwinClose(b, din, kElemAtol, kElemRtol, "GeluBackwardBias dinp");
  ExpectTwinClose(b, dbias, kGemmAtol, kGemmRtol, "GeluBackwardBias dbias");

  // The Backend default on the GPU (Zero, GeluBackward, BiasBackward): the same bits.
  Twin u_in = Twin::Of(b, RandomVec(rng, N * F)), u_b = Twin::Of(b, db0);
  b.gpu->Backend::GeluBackwardBias(u_in.g(), u_b.g(), x.g(), dout.g(), N, F);
  CHECK(u_in.FromGpu(b) == din.FromGpu(b));
  CHECK(u_b.FromGpu(b) == dbias.FromGpu(b));
  // Null dbias: the gradient only.
  Twin n_in = Twin::Of(b, RandomVec(rng, N * F));
  b.gpu->GeluBackwardBias(n_in.g(), nullptr, x.g(), dout.g(), N, F);
  CHECK(n_in.FromGpu(b) == din.FromGpu(b));
}

TEST_CASE("cuda SwiGLUBackwardInto overwrites, matches the cpu and the gpu's Zero + SwiGLUBackward",
          "[gpu][fused][llama]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67), F = GENERATE(5, 688);
  CAPTURE(N, F);
  std::mt19937 rng(static_cast<unsigned>(N * 3 + F));
  Twin gu = Twin::Of(b, RandomVec(rng, N * 2 * F, -6.0f, 6.0f)), dout = Twin::Of(b, RandomVec(rng, N * F));
  Twin dgu = Twin::Of(b, RandomVec(rng, N * 2 * F));  // garbage: must be overwritten
  b.cpu->SwiGLUBackwardInto(dgu.c(), dout.c(), gu.c(), N, F);
  b.gpu->SwiGLUBackwardInto(dgu.g(), dout.g(), gu.g(), N, F);
  ExpectTwinClose(b, dgu, kElemAtol, kElemRtol, "SwiGLUBackwardInto");
  Twin u = Twin::Of(b, RandomVec(rng, N * 2 * F));
  b.gpu->Zero(u.g(), u.bytes);
  b.gpu->SwiGLUBackward(u.g(), dout.g(), gu.g(), N, F);
  CHECK(u.FromGpu(b) == dgu.FromGpu(b));  // equal values (a -0 may stand for +0)
}

TEST_CASE("cuda LinearForward with its one-pass epilogue matches the cpu and the gpu's separate ops",
          "[gpu][fused]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67), IC = 48, OC = GENERATE(7, 200);
  const bool trans_w = GENERATE(false, true);
  CAPTURE(N, OC, trans_w);
  std::mt19937 rng(static_cast<unsigned>(N * 5 + OC + trans_w));
  Twin x = Twin::Of(b, RandomVec(rng, N * IC)), w = Twin::Of(b, RandomVec(rng, IC * OC));
  Twin bias = Twin::Of(b, RandomVec(rng, OC)), res = Twin::Of(b, RandomVec(rng, N * OC));
  struct Form {
    const char* name;
    bool bias, act, residual;
  };
  for (const Form f : {Form{"plain", false, false, false}, Form{"bias", true, false, false},
                       Form{"bias+gelu", true, true, false}, Form{"gelu", false, true, false},
                       Form{"bias+residual", true, false, true}, Form{"residual", false, false, true}}) {
    INFO(f.name);
    Twin y = Twin::Of(b, RandomVec(rng, N * OC)), act = Twin::Of(b, RandomVec(rng, N * OC));
    b.cpu->LinearForward(y.c(), x.c(), w.c(), trans_w, f.bias ? bias.c() : nullptr, N, IC, OC,
                         f.act ? act.c() : nullptr, f.residual ? res.c() : nullptr);
    b.gpu->LinearForward(y.g(), x.g(), w.g(), trans_w, f.bias ? bias.g() : nullptr, N, IC, OC,
                         f.act ? act.g() : nullptr, f.residual ? res.g() : nullptr);
    ExpectTwinClose(b, y, kGemmAtol, kGemmRtol, "LinearForward y");
    if (f.act) ExpectTwinClose(b, act, kGemmAtol, kGemmRtol, "LinearForward act");
    // The default (Gemm, AddBias, GeluForward / Add) on the GPU: the same bits.
    Twin uy = Twin::Of(b, RandomVec(rng, N * OC)), uact = Twin::Of(b, RandomVec(rng, N * OC));
    b.gpu->Backend::LinearForward(uy.g(), x.g(), w.g(), trans_w, f.bias ? bias.g() : nullptr, N, IC, OC,
                                  f.act ? uact.g() : nullptr, f.residual ? res.g() : nullptr);
    CHECK(uy.FromGpu(b) == y.FromGpu(b));
    if (f.act) CHECK(uact.FromGpu(b) == act.FromGpu(b));
  }
}

}  // namespace
}  // namespace l2l::gpu_test

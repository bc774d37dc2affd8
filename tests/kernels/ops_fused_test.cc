// The fused backward ops of the CPU backend (LayerNormBackwardResidual,
// RMSNormBackwardResidual, SwiGLUBackwardInto) against the unfused composition they
// replace (a copy or a Zero, then the accumulating op) and against the Backend defaults:
// the CPU runs the same arithmetic in the same order, so the bits must be equal, with
// one thread and with two. The accumulating ops themselves are checked against finite
// differences in ops_test.cc / ops_llama_test.cc.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>

#include "kernels/backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT

constexpr float kRmsEps = 1e-6f;

TEST_CASE("LayerNormBackwardResidual equals a copy of dresid then LayerNormBackward, bit for bit",
          "[kernels][cpu][fused]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 7}, std::array<int64_t, 2>{45, 33},
                              std::array<int64_t, 2>{300, 768});
  const int64_t N = shape[0], C = shape[1];
  CAPTURE(N, C);
  std::mt19937 rng(static_cast<uint32_t>(N * 11 + C));
  const auto x = RandomVec(rng, N * C, -2.0f, 3.0f), w = RandomVec(rng, C, 0.5f, 1.5f),
             bias = RandomVec(rng, C), dout = RandomVec(rng, N * C), dres = RandomVec(rng, N * C),
             dw0 = RandomVec(rng, C), db0 = RandomVec(rng, C);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto be = CreateCpuBackend(threads);
    auto dX = Upload(*be, x), dW = Upload(*be, w), dB = Upload(*be, bias), dD = Upload(*be, dout);
    auto out = Upload(*be, RandomVec(rng, N * C)), mean = Upload(*be, RandomVec(rng, N)),
         rstd = Upload(*be, RandomVec(rng, N));
    be->LayerNormForward(out.f32(), mean.f32(), rstd.f32(), dX.f32(), dW.f32(), dB.f32(), N, C);
    auto dR = Upload(*be, dres);

    // Unfused: dinp = copy of dresid; dinp += the norm's gradient.
    auto u_in = Upload(*be, RandomVec(rng, N * C)), u_w = Upload(*be, dw0), u_b = Upload(*be, db0);
    be->CopyDeviceToDevice(u_in.data(), dR.data(), N * C * sizeof(float));
    be->LayerNormBackward(u_in.f32(), u_w.f32(), u_b.f32(), dD.f32(), dX.f32(), dW.f32(), mean.f32(),
                          rstd.f32(), N, C);
    const auto want_in = Download(*be, u_in, N * C), want_w = Download(*be, u_w, C),
               want_b = Download(*be, u_b, C);
    // The gradient really moved away from dresid (the test would pass on a plain copy otherwise).
    CHECK(want_in != dres);

    // Fused into a separate buffer (garbage beforehand: overwritten).
    auto f_in = Upload(*be, RandomVec(rng, N * C)), f_w = Upload(*be, dw0), f_b = Upload(*be, db0);
    be->LayerNormBackwardResidual(f_in.f32(), f_w.f32(), f_b.f32(), dR.f32(), dD.f32(), dX.f32(), dW.f32(),
                                  mean.f32(), rstd.f32(), N, C);
    CHECK(Download(*be, f_in, N * C) == want_in);
    CHECK(Download(*be, f_w, C) == want_w);
    CHECK(Download(*be, f_b, C) == want_b);

    // Fused in place (dinp aliases dresid).
    auto a_in = Upload(*be, dres), a_w = Upload(*be, dw0), a_b = Upload(*be, db0);
    be->LayerNormBackwardResidual(a_in.f32(), a_w.f32(), a_b.f32(), a_in.f32(), dD.f32(), dX.f32(), dW.f32(),
                                  mean.f32(), rstd.f32(), N, C);
    CHECK(Download(*be, a_in, N * C) == want_in);
    CHECK(Download(*be, a_w, C) == want_w);
    CHECK(Download(*be, a_b, C) == want_b);

    // The Backend default (the composition every other backend inherits).
    auto d_in = Upload(*be, RandomVec(rng, N * C)), d_w = Upload(*be, dw0), d_b = Upload(*be, db0);
    be->Backend::LayerNormBackwardResidual(d_in.f32(), d_w.f32(), d_b.f32(), dR.f32(), dD.f32(), dX.f32(),
                                           dW.f32(), mean.f32(), rstd.f32(), N, C);
    CHECK(Download(*be, d_in, N * C) == want_in);
    CHECK(Download(*be, d_w, C) == want_w);
    CHECK(Download(*be, d_b, C) == want_b);
  }
}

TEST_CASE("RMSNormBackwardResidual equals a copy of dresid then RMSNormBackward, bit for bit",
          "[kernels][cpu][fused][llama]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 7}, std::array<int64_t, 2>{45, 33},
                              std::array<int64_t, 2>{300, 768});
  const int64_t N = shape[0], C = shape[1];
  CAPTURE(N, C);
  std::mt19937 rng(static_cast<uint32_t>(N * 17 + C));
  const auto x = RandomVec(rng, N * C, -2.0f, 2.0f), w = RandomVec(rng, C, 0.5f, 1.5f),
             dout = RandomVec(rng, N * C), dres = RandomVec(rng, N * C), dw0 = RandomVec(rng, C);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto be = CreateCpuBackend(threads);
    auto dX = Upload(*be, x), dW = Upload(*be, w), dD = Upload(*be, dout), dR = Upload(*be, dres);
    auto out = Upload(*be, RandomVec(rng, N * C)), rstd = Upload(*be, RandomVec(rng, N));
    be->RMSNormForward(out.f32(), rstd.f32(), dX.f32(), dW.f32(), N, C, kRmsEps);

    auto u_in = Upload(*be, RandomVec(rng, N * C)), u_w = Upload(*be, dw0);
    be->CopyDeviceToDevice(u_in.data(), dR.data(), N * C * sizeof(float));
    be->RMSNormBackward(u_in.f32(), u_w.f32(), dD.f32(), dX.f32(), dW.f32(), rstd.f32(), N, C);
    const auto want_in = Download(*be, u_in, N * C), want_w = Download(*be, u_w, C);
    CHECK(want_in != dres);

    auto f_in = Upload(*be, RandomVec(rng, N * C)), f_w = Upload(*be, dw0);
    be->RMSNormBackwardResidual(f_in.f32(), f_w.f32(), dR.f32(), dD.f32(), dX.f32(), dW.f32(), rstd.f32(), N,
                                C);
    CHECK(Download(*be, f_in, N * C) == want_in);
    CHECK(Download(*be, f_w, C) == want_w);

    auto a_in = Upload(*be, dres), a_w = Upload(*be, dw0);
    be->RMSNormBackwardResidual(a_in.f32(), a_w.f32(), a_in.f32(), dD.f32(), dX.f32(), dW.f32(), rstd.f32(), N,
                                C);
    CHECK(Download(*be, a_in, N * C) == want_in);
    CHECK(Download(*be, a_w, C) == want_w);

    auto d_in = Upload(*be, RandomVec(rng, N * C)), d_w = Upload(*be, dw0);
    be->Backend::RMSNormBackwardResidual(d_in.f32(), d_w.f32(), dR.f32(), dD.f32(), dX.f32(), dW.f32(),
                                         rstd.f32(), N, C);
    CHECK(Download(*be, d_in, N * C) == want_in);
    CHECK(Download(*be, d_w, C) == want_w);
  }
}

TEST_CASE("SwiGLUBackwardInto overwrites and equals Zero then SwiGLUBackward, bit for bit",
          "[kernels][cpu][fused][llama]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 5}, std::array<int64_t, 2>{45, 33},
                              std::array<int64_t, 2>{300, 1024});
  const int64_t N = shape[0], F = shape[1];
  CAPTURE(N, F);
  std::mt19937 rng(static_cast<uint32_t>(N * 19 + F));
  const auto gu = RandomVec(rng, N * 2 * F, -6.0f, 6.0f), dout = RandomVec(rng, N * F);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    auto be = CreateCpuBackend(threads);
    auto dG = Upload(*be, gu), dD = Upload(*be, dout);
    auto u = Upload(*be, RandomVec(rng, N * 2 * F));
    be->Zero(u.data(), N * 2 * F * sizeof(float));
    be->SwiGLUBackward(u.f32(), dD.f32(), dG.f32(), N, F);
    const auto want = Download(*be, u, N * 2 * F);

    auto f = Upload(*be, RandomVec(rng, N * 2 * F));  // garbage: must be overwritten
    be->SwiGLUBackwardInto(f.f32(), dD.f32(), dG.f32(), N, F);
    const auto got = Download(*be, f, N * 2 * F);
    // Bit for bit (memcmp: the CPU adds into a zeroed row as the composition does, so even
    // the signs of zeros agree).
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);

    auto d = Upload(*be, RandomVec(rng, N * 2 * F));
    be->Backend::SwiGLUBackwardInto(d.f32(), dD.f32(), dG.f32(), N, F);
    CHECK(Download(*be, d, N * 2 * F) == want);
  }
}

}  // namespace
}  // namespace l2l::kernels

// Backend::LinearForward (a linear layer with its bias, GELU or residual epilogue): the
// CPU backend's fused version equals the unfused ops (Gemm, AddBias, GeluForward, Add)
// bit for bit, on shapes whose GEMM is split by rows, by columns, or not at all, and
// both matches a double-precision reference within fp32 rounding.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "kernels/backend.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT

TEST_CASE("LinearForward's fused epilogues equal the unfused ops bit for bit",
          "[kernels][cpu][linear]") {
  const auto shape = GENERATE(std::array<int64_t, 3>{5, 7, 3},        // N, IC, OC: one small block
                              std::array<int64_t, 3>{700, 96, 130},   // split by rows
                              std::array<int64_t, 3>{64, 200, 1000},  // split by columns
                              std::array<int64_t, 3>{300, 64, 257});
  const bool trans_w = GENERATE(false, true);
  const int mode = GENERATE(0, 1, 2, 3);  // no bias; bias; bias + GELU; bias + residual
  const int64_t N = shape[0], IC = shape[1], OC = shape[2];
  INFO("N=" << N << " IC=" << IC << " OC=" << OC << " trans_w=" << trans_w << " mode=" << mode);
  std::mt19937 rng(static_cast<uint32_t>(N * 7 + IC * 3 + OC + mode));
  const auto x = RandomVec(rng, N * IC), w = RandomVec(rng, IC * OC), bias = RandomVec(rng, OC);
  const auto res = RandomVec(rng, N * OC);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dW = Upload(*be, w), dB = Upload(*be, bias), dR = Upload(*be, res);
  auto y1 = Upload(*be, RandomVec(rng, N * OC)), a1 = Upload(*be, RandomVec(rng, N * OC));
  auto y2 = Upload(*be, RandomVec(rng, N * OC)), a2 = Upload(*be, RandomVec(rng, N * OC));
  const float* b = mode >= 1 ? dB.f32() : nullptr;
  float* act1 = mode == 2 ? a1.f32() : nullptr;
  const float* r = mode == 3 ? dR.f32() : nullptr;
  be->LinearForward(y1.f32(), dX.f32(), dW.f32(), trans_w, b, N, IC, OC, act1, r);
  // Unfused: Backend's default implementation of the same contract, op by op.
  be->Gemm(false, trans_w, N, OC, IC, 1.0f, dX.f32(), IC, dW.f32(), trans_w ? IC : OC, 0.0f, y2.f32(), OC);
  if (b) be->AddBias(y2.f32(), b, N, OC);
  if (act1) be->GeluForward(a2.f32(), y2.f32(), N * OC);
  if (r) be->Add(y2.f32(), y2.f32(), r, N * OC);
  const auto got = Download(*be, y1, N * OC);
  CHECK(got == Download(*be, y2, N * OC));
  if (act1) CHECK(Download(*be, a1, N * OC) == Download(*be, a2, N * OC));

  // And the math: against double precision.
  std::vector<double> want(N * OC), act(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? bias[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += double(x[n * IC + i]) * (trans_w ? w[o * IC + i] : w[i * OC + o]);
      act[n * OC + o] = GeluRef(s);
      want[n * OC + o] = s + (r ? res[n * OC + o] : 0.0);
    }
  ExpectClose(got, want, 1e-5, 1e-5, "LinearForward y");
  if (act1) ExpectClose(Download(*be, a1, N * OC), act, 1e-5, 1e-5, "LinearForward act");
}

}  // namespace
}  // namespace l2l::kernels

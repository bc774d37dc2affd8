// CPU backend attention and cross-entropy against naive double-precision loops (forward)
// and finite differences of those loops (backward).
#include <catch2/catch.hpp>

#include <array>
#include <cmath>

#include "kernels/backend.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT

TEST_CASE("Attention forward and backward match a naive causal reference",
          "[kernels][cpu][attention]") {
  const auto shape = GENERATE(std::array<int64_t, 4>{1, 1, 4, 1},   // B, T, C, NH
                              std::array<int64_t, 4>{2, 5, 12, 3},
                              std::array<int64_t, 4>{2, 19, 16, 2});
  const int64_t B = shape[0], T = shape[1], C = shape[2], NH = shape[3];
  INFO("B=" << B << " T=" << T << " C=" << C << " NH=" << NH);
  std::mt19937 rng(static_cast<uint32_t>(B * 1000 + T * 10 + C));
  const auto qkv = RandomVec(rng, B * T * 3 * C, -1.5f, 1.5f), R = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * 3 * C);
  auto be = CreateCpuBackend(2);
  auto dQkv = Upload(*be, qkv), dR = Upload(*be, R), dG = Upload(*be, dqkv0);
  auto dOut = Upload(*be, RandomVec(rng, B * T * C));
  auto dAtt = Upload(*be, RandomVec(rng, B * NH * T * T)),
       dScr = Upload(*be, RandomVec(rng, B * NH * T * T));
  be->AttentionForward(dOut.f32(), dAtt.f32(), dQkv.f32(), B, T, C, NH);
  const auto qd = ToDouble(qkv), Rd = ToDouble(R);
  const auto want = AttentionRef(qd.data(), B, T, C, NH);
  ExpectClose(Download(*be, dOut, B * T * C), want, 1e-5, 1e-5, "AttentionForward out");
  // The CPU backend's stash for the backward: each row's log-sum-exp.
  ExpectClose(Download(*be, dAtt, B * NH * T), AttentionLseRef(qd.data(), B, T, NH, NH, C / NH), 1e-5,
              1e-5, "AttentionForward log-sum-exp in att");

  be->AttentionBackward(dG.f32(), dScr.f32(), dR.f32(), dQkv.f32(), dAtt.f32(), B, T, C, NH);
  const auto g = Download(*be, dG, B * T * 3 * C);
  std::vector<float> got;
  std::vector<double> fd;
  for (size_t i : SampleIndices(qkv.size(), 400)) {
    got.push_back(g[i]);
    fd.push_back(dqkv0[i] + FiniteDiff([&](const auto& v) { return Dot(AttentionRef(v.data(), B, T, C, NH), Rd); }, qd, i));
  }
  ExpectClose(got, fd, 1e-4, 1e-3, "AttentionBackward dqkv");
}

TEST_CASE("CrossEntropy forward is stable and backward matches finite differences",
          "[kernels][cpu][cross_entropy]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{3, 7}, std::array<int64_t, 2>{41, 333});
  const float offset = GENERATE(0.0f, 500.0f);  // large logits must not overflow
  const int64_t N = shape[0], V = shape[1];
  INFO("N=" << N << " V=" << V << " offset=" << offset);
  std::mt19937 rng(static_cast<uint32_t>(N * V));
  auto logits = RandomVec(rng, N * V, -4.0f, 4.0f);
  for (float& x : logits) x += offset;
  const auto targets = RandomTokens(rng, N, int32_t(V));
  auto be = CreateCpuBackend(2);
  auto dL = Upload(*be, logits), dT = Upload(*be, targets);
  auto dLoss = Upload(*be, RandomVec(rng, N)), dP = Upload(*be, RandomVec(rng, N * V));
  be->CrossEntropyForward(dLoss.f32(), dP.f32(), dL.f32(), dT.i32(), N, V);
  std::vector<double> probs;
  const auto ld = ToDouble(logits);
  const auto want = CrossEntropyRef(ld.data(), targets.data(), N, V, &probs);
  ExpectClose(Download(*be, dLoss, N), want, 1e-5, 1e-5, "CrossEntropyForward losses");
  ExpectClose(Download(*be, dP, N * V), probs, 1e-6, 1e-4, "CrossEntropyForward probs");

  // probs may alias logits.
  auto dL2 = Upload(*be, logits), dLoss2 = Upload(*be, RandomVec(rng, N));
  be->CrossEntropyForward(dLoss2.f32(), dL2.f32(), dL2.f32(), dT.i32(), N, V);
  CHECK(Download(*be, dLoss2, N) == Download(*be, dLoss, N));
  CHECK(Download(*be, dL2, N * V) == Download(*be, dP, N * V));

  // loss = scale * sum(losses); dlogits overwritten (here in place over the probs).
  const float scale = 0.37f;
  be->CrossEntropyBackward(dL2.f32(), dL2.f32(), dT.i32(), scale, N, V);
  const auto g = Download(*be, dL2, N * V);
  std::vector<float> got;
  std::vector<double> fd;
  for (size_t i : SampleIndices(N * V, 300)) {
    got.push_back(g[i]);
    fd.push_back(scale * FiniteDiff([&](const auto& v) {
                   double s = 0.0;
                   for (double l : CrossEntropyRef(v.data(), targets.data(), N, V)) s += l;
                   return s;
                 }, ld, i, 1e-4));
  }
  ExpectClose(got, fd, 1e-5, 1e-3, "CrossEntropyBackward");
}

TEST_CASE("CrossEntropyForwardBackward gives the bits of the forward then the backward",
          "[kernels][cpu][cross_entropy]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{3, 7}, std::array<int64_t, 2>{67, 1001});
  const int64_t N = shape[0], V = shape[1];
  CAPTURE(N, V);
  std::mt19937 rng(static_cast<uint32_t>(N + V));
  const auto logits = RandomVec(rng, N * V, -6.0f, 6.0f);
  auto targets = RandomTokens(rng, N, int32_t(V));
  targets[1] = kIgnoreTarget;  // a loss-masked row: loss 0, gradient row 0
  const float scale = 0.013f;
  auto be = CreateCpuBackend(2);
  auto dT = Upload(*be, targets);
  // The two ops, in place as the head runs them.
  auto two = Upload(*be, logits), loss_two = Upload(*be, RandomVec(rng, N));
  be->CrossEntropyForward(loss_two.f32(), two.f32(), two.f32(), dT.i32(), N, V);
  be->CrossEntropyBackward(two.f32(), two.f32(), dT.i32(), scale, N, V);
  // Fused, in place and into a separate buffer.
  auto one = Upload(*be, logits), loss_one = Upload(*be, RandomVec(rng, N));
  be->CrossEntropyForwardBackward(loss_one.f32(), one.f32(), one.f32(), dT.i32(), scale, N, V);
  auto src = Upload(*be, logits), sep = Upload(*be, RandomVec(rng, N * V)), loss_sep = Upload(*be, RandomVec(rng, N));
  be->CrossEntropyForwardBackward(loss_sep.f32(), sep.f32(), src.f32(), dT.i32(), scale, N, V);
  const auto want = Download(*be, two, N * V), want_loss = Download(*be, loss_two, N);
  CHECK(Download(*be, one, N * V) == want);
  CHECK(Download(*be, loss_one, N) == want_loss);
  CHECK(Download(*be, sep, N * V) == want);
  CHECK(Download(*be, loss_sep, N) == want_loss);
  CHECK(Download(*be, src, N * V) == logits);  // the input is left alone when not aliased
  const auto g = Download(*be, one, N * V);
  CHECK(want_loss[1] == 0.0f);
  for (int64_t v = 0; v < V; ++v) REQUIRE(g[V + v] == 0.0f);
  // Each trained row sums to ~0 (scale * (1 - 1)).
  double row0 = 0.0;
  for (int64_t v = 0; v < V; ++v) row0 += g[v];
  CHECK(std::abs(row0) < 1e-6);
}

}  // namespace
}  // namespace l2l::kernels

// Tests of the interleaved-optimizer performance model (common/optimizer_model.h): the
// seed's closed form on the figures its paper states, the simulated timeline on a case
// worked by hand, the spreading of a fixed fraction, and the edge cases (a device no
// faster than the CPU, no device, free transfers).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/optimizer_model.h"

namespace l2l {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST_CASE("the seed's update stride matches its V100 worked example", "[common][optimizer_model]") {
  // Deep Optimizer States (seed 003), section 5, "Verifying the Correctness of Our
  // Performance Model", 4xV100 machine, 7B model: "GPU-host transfers (B) peaked 3 Billion
  // P/s; GPU (U_g) and CPU (U_c) update throughputs at 35 Billion P/s and 2 Billion P/s,
  // respectively; and FP32->FP16 conversion (D_c) on host at 8.7 Billion P/s. Using these
  // values in Equation 1 results in k = 2". By hand: (3/3 + 1/35) / (1/2 + 1/8.7 - 1/6)
  // = 1.02857 / 0.44828 = 2.2945.
  const double k = SeedUpdateStride(2e9, 8.7e9, 35e9, 3e9);
  CHECK(k == Approx(2.2945).epsilon(1e-4));
  CHECK(std::lround(k) == 2);
}

TEST_CASE("the seed's update stride matches its H100 testbed figures", "[common][optimizer_model]") {
  // Seed 003, section 1: on the 4xH100 testbed "the 192 CPUs update the model at ~8
  // Billion P/s" and "4xH100 GPUs update ~100 Billion" (25 Billion per GPU); section 5.1:
  // "~55 GB/s unidirectional D2H and H2D throughput for pinned host memory" (55/4 = 13.75
  // Billion fp32 P/s per GPU); Table 1: H32<->H16 conversion at 62 GB/s (15.5 Billion
  // fp32 P/s read). Section 5.1: "the optimal dynamic update stride k = 2". By hand:
  // (3/13.75 + 1/25) / (1/8 + 1/15.5 - 1/27.5) = 0.25818 / 0.15315 = 1.686.
  const double k = SeedUpdateStride(8e9, 15.5e9, 25e9, 13.75e9);
  CHECK(k == Approx(1.686).epsilon(1e-3));
  CHECK(std::lround(k) == 2);
  // A link so slow that the CPU's fp16 copies alone outrun the CPU update: no balance.
  CHECK(std::isinf(SeedUpdateStride(1e9, 1e9, 10e9, 0.1e9)));
}

OptimizerModelInput TwoLayers() {
  OptimizerModelInput in;
  in.rates.cpu_update_params_per_s = 1e9;
  in.rates.cpu_cast_params_per_s = 4e9;
  in.rates.gpu_update_params_per_s = 1e10;
  in.rates.h2d_bytes_per_s = 12e9;  // p, m, v of 1e6 params in 1 ms
  in.rates.d2h_bytes_per_s = 6e9;   // ... in 2 ms
  in.layers = {{2'000'000, 3e-3}, {1'000'000, 2e-3}};
  in.forward_s = 1e-3;
  return in;
}

TEST_CASE("the timeline prediction equals a hand-worked two-layer step", "[common][optimizer_model]") {
  const OptimizerModelInput in = TwoLayers();
  // Daemon only. Backward: layer 1 ends at 2 ms, layer 0 at 5 ms. CPU: layer 1 at 2 ms
  // for 1 + 0.25 ms -> 3.25 ms; layer 0 at 5 ms for 2 + 0.5 ms -> 7.5 ms. Step = 1 + 7.5.
  double tail = 0;
  CHECK(PredictStepTime(in, {false, false}, &tail) == Approx(8.5e-3));
  CHECK(tail == Approx(2.5e-3));
  // Layer 0 on the device. Its p, m, v cross H2D from 2 ms for 2 ms (ready at 4 ms); its
  // backward ends at 5 ms, the update takes 0.2 ms (5.2 ms), D2H 4 ms (9.2 ms), then the
  // daemon casts it for 0.5 ms: 9.7 ms. Step = 1 + 9.7; tail = 9.7 - 5.
  CHECK(PredictStepTime(in, {true, false}, &tail) == Approx(10.7e-3));
  CHECK(tail == Approx(4.7e-3));
  // The model therefore keeps both on the daemon.
  Result<InterleavePlan> plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->gpu_fraction == 0);
  CHECK(plan->step_s == Approx(8.5e-3));
  CHECK(plan->daemon_only_step_s == Approx(8.5e-3));
}

TEST_CASE("a fixed fraction spreads its layers over the update order", "[common][optimizer_model]") {
  const std::vector<LayerCost> six(6, LayerCost{1000, 1e-3});
  auto count = [](const std::vector<bool>& v) { return std::count(v.begin(), v.end(), true); };
  CHECK(count(SpreadLayers(six, 0)) == 0);
  CHECK(count(SpreadLayers(six, 1)) == 6);
  const std::vector<bool> third = SpreadLayers(six, 0.33);
  CHECK(count(third) == 2);
  // Every third layer in update order (5, 4, 3, 2, 1, 0): the second of each three.
  CHECK(third == std::vector<bool>{false, true, false, false, true, false});
  CHECK(count(SpreadLayers(six, 0.5)) == 3);
  // Uneven sizes: the share follows parameters, not layer count.
  const std::vector<LayerCost> uneven = {{100, 0}, {100, 0}, {800, 0}};
  const std::vector<bool> half = SpreadLayers(uneven, 0.5);
  CHECK(half == std::vector<bool>{false, false, true});
}

TEST_CASE("fixed fractions give their plans, and a device that cannot update is an error",
          "[common][optimizer_model]") {
  OptimizerModelInput in = TwoLayers();
  Result<InterleavePlan> all = PlanFixedFraction(in, 1);
  REQUIRE(all.ok());
  CHECK(all->gpu_fraction == 1);
  CHECK(all->on_gpu == std::vector<bool>{true, true});
  Result<InterleavePlan> none = PlanFixedFraction(in, 0);
  REQUIRE(none.ok());
  CHECK(none->step_s == none->daemon_only_step_s);
  CHECK(!PlanFixedFraction(in, 1.5).ok());
  in.rates.gpu_update_params_per_s = 0;
  Result<InterleavePlan> bad = PlanFixedFraction(in, 0.5);
  REQUIRE(!bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("gpu rate 0"));
  Result<InterleavePlan> auto_plan = PlanAuto(in);
  REQUIRE(auto_plan.ok());
  CHECK(auto_plan->gpu_fraction == 0);
}

TEST_CASE("a device no faster than the CPU takes no updates", "[common][optimizer_model]") {
  OptimizerModelInput in;
  in.rates = {1e9, kInf, 1e9, kInf, kInf};  // equal rates, free transfers
  in.layers.assign(8, LayerCost{1'000'000, 0});  // no backward to hide anything in
  Result<InterleavePlan> plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->gpu_fraction == 0);
  in.rates.gpu_update_params_per_s = 0.5e9;
  plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->gpu_fraction == 0);
  // A faster one does take some.
  in.rates.gpu_update_params_per_s = 10e9;
  plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->gpu_fraction > 0);
  CHECK(plan->step_s < plan->daemon_only_step_s);
}

TEST_CASE("with free transfers the device takes what the backward window cannot hide",
          "[common][optimizer_model]") {
  // 8 layers of 1e6 params, 1 ms of backward each; the CPU needs 2 ms per layer, the
  // device 1 us, transfers and casts are free. The CPU can finish only 3 layers inside
  // the 8 ms backward (4 layers are 8 ms of work starting no earlier than 1 ms), so the
  // fastest split hands 5 layers to the device and ends 5 us after the backward.
  OptimizerModelInput in;
  in.rates = {0.5e9, kInf, 1e12, kInf, kInf};
  in.layers.assign(8, LayerCost{1'000'000, 1e-3});
  Result<InterleavePlan> plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->gpu_fraction == Approx(5.0 / 8));
  CHECK(plan->step_s == Approx(8e-3 + 5e-6));
  CHECK(plan->daemon_only_step_s == Approx(17e-3));  // 1 ms + 8 x 2 ms
  double cpu_work = 0;
  for (size_t l = 0; l < 8; ++l) cpu_work += plan->on_gpu[l] ? 0 : 2e-3;
  CHECK(cpu_work <= 8e-3);
  // A CPU that keeps up with the backward on its own: only the last layer (whose update
  // is exposed whichever side runs it) goes to the faster device.
  in.rates.cpu_update_params_per_s = 1e9;
  plan = PlanAuto(in);
  REQUIRE(plan.ok());
  CHECK(plan->on_gpu == std::vector<bool>{true, false, false, false, false, false, false, false});
  CHECK(plan->step_s == Approx(8e-3 + 1e-6));
}

TEST_CASE("bad model inputs are errors naming the field", "[common][optimizer_model]") {
  OptimizerModelInput in = TwoLayers();
  in.rates.h2d_bytes_per_s = 0;
  Result<InterleavePlan> p = PlanAuto(in);
  REQUIRE(!p.ok());
  CHECK_THAT(p.status().message(), Catch::Contains("h2d_bytes_per_s"));
  in = TwoLayers();
  in.layers[1].params = 0;
  p = PlanAuto(in);
  REQUIRE(!p.ok());
  CHECK_THAT(p.status().message(), Catch::Contains("layer 1"));
  in.layers.clear();
  CHECK(!PlanAuto(in).ok());
}

TEST_CASE("the plan's description names its inputs and choice", "[common][optimizer_model]") {
  const OptimizerModelInput in = TwoLayers();
  Result<InterleavePlan> plan = PlanFixedFraction(in, 1);
  REQUIRE(plan.ok());
  const std::string s = DescribePlan(in, *plan);
  CHECK_THAT(s, Catch::Contains("cpu_update=1e+09"));
  CHECK_THAT(s, Catch::Contains("gpu_fraction=1.000"));
  CHECK_THAT(s, Catch::Contains("device layers [0,1]"));
}

}  // namespace
}  // namespace l2l

// Tests of the daemon's job-start choice of the interleaved optimizer's split
// (eps_server/optimizer_split.h): a fixed share picks its layers without rates, auto
// without a device rate is 0, auto with one follows the performance model, and the log
// line names the setting, the inputs and the choice.
#include <catch2/catch.hpp>

#include <limits>

#include "eps_server/optimizer_split.h"

namespace l2l::eps {
namespace {

OptimizerRates CpuOnly() {
  OptimizerRates r;
  r.cpu_update_params_per_s = 1e9;
  r.cpu_cast_params_per_s = std::numeric_limits<double>::infinity();
  r.h2d_bytes_per_s = r.d2h_bytes_per_s = 25e9;
  return r;
}

TEST_CASE("a fixed gpu_fraction picks its layers and logs them", "[eps][optimizer_split]") {
  OptimizerConfig o;
  o.gpu_fraction = GpuFraction{.automatic = false, .value = 0.33};
  Result<OptimizerSplit> s = ChooseOptimizerSplit(o, {100, 100, 100}, CpuOnly(), {});
  REQUIRE(s.ok());
  CHECK(s->on_gpu == std::vector<bool>{false, true, false});
  CHECK(s->gpu_fraction == Approx(1.0 / 3));
  CHECK_THAT(s->description, Catch::Contains("optim.gpu_fraction=0.33"));
  CHECK_THAT(s->description, Catch::Contains("layers [1] of 3"));
  o.gpu_fraction.value = 0;
  s = ChooseOptimizerSplit(o, {100, 100, 100}, CpuOnly(), {});
  REQUIRE(s.ok());
  CHECK(s->gpu_fraction == 0);
}

TEST_CASE("auto without a device rate keeps every layer on the daemon", "[eps][optimizer_split]") {
  OptimizerConfig o;  // gpu_fraction: auto
  Result<OptimizerSplit> s = ChooseOptimizerSplit(o, {100, 200}, CpuOnly(), {});
  REQUIRE(s.ok());
  CHECK(s->gpu_fraction == 0);
  CHECK_THAT(s->description, Catch::Contains("no worker reports a device update rate"));
  CHECK_THAT(s->description, Catch::Contains("cpu_update=1e+09"));
  // With a fast device and a backward to hide most of the update in, auto hands some over.
  OptimizerRates r = CpuOnly();
  r.gpu_update_params_per_s = 1e12;
  s = ChooseOptimizerSplit(o, {1'000'000, 1'000'000, 1'000'000, 1'000'000}, r, {1e-3, 1e-3, 1e-3, 1e-3});
  REQUIRE(s.ok());
  CHECK(s->gpu_fraction > 0);
  CHECK(s->gpu_fraction < 1);
  CHECK(s->on_gpu[0]);  // the last layer updated is the one whose update is exposed
}

TEST_CASE("bad inputs to the split are errors", "[eps][optimizer_split]") {
  OptimizerConfig o;
  CHECK(!ChooseOptimizerSplit(o, {}, CpuOnly(), {}).ok());
  CHECK(!ChooseOptimizerSplit(o, {100, 0}, CpuOnly(), {}).ok());
}

TEST_CASE("the CPU update rate measures as a positive rate", "[eps][optimizer_split]") {
  CHECK(MeasureCpuUpdateRate(1 << 12) > 0);
}

}  // namespace
}  // namespace l2l::eps

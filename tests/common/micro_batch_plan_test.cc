// Tests of the micro-batch planner (common/micro_batch_plan.h) on synthetic rates whose
// answers are worked out by hand here: slow PCIe or a slow host update asks for more
// micro-batches, a small device budget caps them (and says so), the CPU backend (no
// link) is planned from the update alone, and bad inputs are refused by name.
#include <catch2/catch.hpp>

#include "common/micro_batch_plan.h"

namespace l2l {
namespace {

// A 7B-like block (233M params) with 4096 tokens per micro-batch: 6 FLOPs/param/token,
// so compute(1) = 6 * 233e6 * 4096 / 400e12 = 14.3 ms on a 400 TFLOP/s device.
MicroBatchPlanInputs Gpu() {
  MicroBatchPlanInputs in;
  in.layer_params = 233'000'000;
  in.flops_per_token = 6.0 * 233e6;
  in.tokens_per_micro_batch = 4096;
  in.device_flops_per_s = 400e12;
  in.h2d_bytes_per_s = 50e9;               // 466 MB of bf16 in: 9.32 ms
  in.d2h_bytes_per_s = 50e9;               // 932 MB of fp32 out: 18.64 ms
  in.host_update_params_per_s = 20e9;      // 11.65 ms
  in.activation_bytes_per_micro_batch = 4096.0 * 3584 * 4;  // block input, fp32
  in.stash_layers = 28;
  in.activation_budget_bytes = 64e9;
  return in;
}

TEST_CASE("The planner hides the slower of transfer and update behind compute", "[common][planner]") {
  Result<MicroBatchPlan> p = PlanMicroBatches(Gpu());
  REQUIRE(p.ok());
  // transfer = max(9.32, 18.64) ms = 18.64 ms > update 11.65 ms; compute(1) = 14.33 ms: 2.
  CHECK(p->transfer_s == Approx(932e6 / 50e9));
  CHECK(p->update_s == Approx(233e6 / 20e9));
  CHECK(p->wanted == 2);
  CHECK(p->micro_batches == 2);
  CHECK(p->binding == "transfer");
  CHECK(p->compute_s >= p->transfer_s);
  CHECK(p->compute_s >= p->update_s);
  CHECK(p->Describe().find("micro_batches auto: 2 (binding: transfer)") != std::string::npos);
}

TEST_CASE("Slower PCIe asks for more micro-batches", "[common][planner]") {
  MicroBatchPlanInputs in = Gpu();
  int64_t last = 0;
  for (double rate : {50e9, 25e9, 12.5e9, 6e9}) {
    in.h2d_bytes_per_s = in.d2h_bytes_per_s = rate;
    Result<MicroBatchPlan> p = PlanMicroBatches(in);
    REQUIRE(p.ok());
    CHECK(p->micro_batches > last);
    CHECK(p->compute_s >= p->transfer_s);
    last = p->micro_batches;
  }
  // 6 GB/s: 932e6 / 6e9 = 155.3 ms over 14.33 ms per micro-batch: ceil(10.84) = 11.
  CHECK(last == 11);
}

TEST_CASE("A slow host update binds when the link is fast", "[common][planner]") {
  MicroBatchPlanInputs in = Gpu();
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 1e12;
  in.host_update_params_per_s = 2e9;  // 116.5 ms per layer: ceil(116.5 / 14.33) = 9
  Result<MicroBatchPlan> p = PlanMicroBatches(in);
  REQUIRE(p.ok());
  CHECK(p->binding == "update");
  CHECK(p->micro_batches == 9);
}

TEST_CASE("A small device budget caps the micro-batches and says the relay will wait", "[common][planner]") {
  MicroBatchPlanInputs in = Gpu();
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 6e9;  // wants 11
  // 28 layers x 58.7 MB per micro-batch = 1.644 GB each: 5 GB allows 3.
  in.activation_budget_bytes = 5e9;
  Result<MicroBatchPlan> p = PlanMicroBatches(in);
  REQUIRE(p.ok());
  CHECK(p->wanted == 11);
  CHECK(p->memory_cap == 3);
  CHECK(p->micro_batches == 3);
  CHECK(p->binding == "memory");
  CHECK(p->Describe().find("the relay waits") != std::string::npos);
  // Not even one fits: refused, with the arithmetic.
  in.activation_budget_bytes = 1e9;
  Result<MicroBatchPlan> none = PlanMicroBatches(in);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == StatusCode::kFailedPrecondition);
  CHECK(none.status().message().find("activation budget is 1000000000 bytes") != std::string::npos);
}

TEST_CASE("max_micro_batches caps when memory does not", "[common][planner]") {
  MicroBatchPlanInputs in = Gpu();
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 1e8;
  in.activation_budget_bytes = 0;  // uncapped
  in.max_micro_batches = 16;
  Result<MicroBatchPlan> p = PlanMicroBatches(in);
  REQUIRE(p.ok());
  CHECK(p->micro_batches == 16);
  CHECK(p->binding == "max");
}

TEST_CASE("The CPU backend (no link) is planned from the host update alone", "[common][planner]") {
  // A small model on a few cores: 1M params per block, 256 tokens, 50 GFLOP/s compute,
  // AdamW at 200M params/s. compute(1) = 6e6 * 256 / 50e9 = 30.7 ms; update 5 ms: 1.
  MicroBatchPlanInputs in;
  in.layer_params = 1'000'000;
  in.flops_per_token = 6e6;
  in.tokens_per_micro_batch = 256;
  in.device_flops_per_s = 50e9;
  in.host_update_params_per_s = 200e6;
  in.min_micro_batches = 1;
  Result<MicroBatchPlan> p = PlanMicroBatches(in);
  REQUIRE(p.ok());
  CHECK(p->transfer_s == 0);
  CHECK(p->micro_batches == 1);
  CHECK(p->binding == "min");
  // A device group of 2 needs at least one micro-batch each.
  in.min_micro_batches = 2;
  p = PlanMicroBatches(in);
  REQUIRE(p.ok());
  CHECK(p->micro_batches == 2);
}

TEST_CASE("The planner refuses inputs it cannot plan with, naming them", "[common][planner]") {
  MicroBatchPlanInputs in = Gpu();
  in.device_flops_per_s = 0;
  Result<MicroBatchPlan> p = PlanMicroBatches(in);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message().find("device_flops_per_s") != std::string::npos);
  in = Gpu();
  in.host_update_params_per_s = -1;
  CHECK_FALSE(PlanMicroBatches(in).ok());
  in = Gpu();
  in.min_micro_batches = 4;
  in.max_micro_batches = 2;
  CHECK_FALSE(PlanMicroBatches(in).ok());
}

}  // namespace
}  // namespace l2l

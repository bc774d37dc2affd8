// Tests of the daemon's start-up host-memory arithmetic (eps_server/host_budget.h) at the
// size issue 27 is about: Qwen2.5-7B's layers (an untied 152,064 x 3,584 embedding and
// head, 28 blocks of 233,057,792 parameters) on a host with 128 GB of RAM and a 64 GB
// disk. The expected figures are worked out here by hand (12 B/param of state, 4 B/param
// of bf16 published copies, 4 B/param of guard when every layer is deferred).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "eps_server/host_budget.h"

namespace l2l::eps {
namespace {

constexpr uint64_t kGB = 1000ull * 1000 * 1000;
constexpr size_t kEmbed = 152064ull * 3584;  // 544,997,376
constexpr size_t kBlock = 233057792;         // q/k/v (+biases), o, gate/up/down, 2 norms

HostBudgetInputs Qwen7B() {
  HostBudgetInputs in;
  in.layer_numel.push_back(kEmbed);
  for (int i = 0; i < 28; ++i) in.layer_numel.push_back(kBlock);
  in.layer_numel.push_back(kEmbed + 3584);  // final norm + lm_head
  in.page_bytes = 4 << 20;
  in.publish_dtype = DType::kBF16;
  in.workers = 1;
  in.grad_slots = 4;
  in.shm = true;
  in.spill = true;
  in.disk_free_bytes = 64 * kGB;
  in.ram_bytes = 128 * kGB;
  in.host_bytes = 110 * kGB;
  return in;
}

uint64_t Params() { return 2 * kEmbed + 3584 + 28ull * kBlock; }

TEST_CASE("At 7B the unbounded undo copies are refused up front with the arithmetic", "[eps][budget]") {
  HostBudgetInputs in = Qwen7B();
  in.guard_bytes = 0;  // 12 B/param of undo copies beside host_bytes: 110 + 91 + 8.7 GB > 128 GB
  Result<HostBudget> b = PlanHostBudget(in);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == StatusCode::kResourceExhausted);
  const std::string& msg = b.status().message();
  INFO(msg);
  CHECK(msg.find("memory.guard_bytes is 0") != std::string::npos);
  CHECK(msg.find("but the host has 128000000000 B") != std::string::npos);
  CHECK(msg.find("non-finite guard " + std::to_string(12 * Params()) + " B") != std::string::npos);
}

TEST_CASE("At 7B a bounded guard, host_bytes and the SSD tier fit 128 GB of RAM and a 64 GB disk",
          "[eps][budget]") {
  HostBudgetInputs in = Qwen7B();
  in.guard_bytes = 32 * kGB;  // >= 4 B/param = 30.46 GB
  Result<HostBudget> b = PlanHostBudget(in);
  INFO(b.status().ToString());
  REQUIRE(b.ok());
  CHECK(b->params == Params());
  CHECK(b->state_bytes >= 12 * Params());
  CHECK(b->state_bytes < 12 * Params() + 3 * 30 * (4 << 20));  // < one page per layer and kind more
  CHECK(b->published_bytes == 4 * Params());
  // 32 GB - 4 B/param leaves 1.54 GB: not 8 B/param of any layer (1.86 GB a block).
  CHECK(b->undo_layers == 0);
  CHECK(b->guard_bytes == 4 * Params());
  CHECK(b->guard_carved);
  CHECK(b->store_host_bytes == 78 * kGB);
  // On SSD: state - (store budget - published - staging of the largest layer).
  const uint64_t staging = 3 * ((kEmbed + 3584 + (1 << 20) - 1) / (1 << 20)) * (4 << 20);
  CHECK(b->staging_min_bytes == staging);
  CHECK(b->spill_bytes == b->state_bytes - (78 * kGB - 4 * Params() - staging));
  CHECK(b->spill_bytes < 64 * kGB);
  CHECK(b->ram_bytes == 78 * kGB + 4 * Params() + 4ull * (kEmbed + 3584) * 4);
  CHECK(b->ram_bytes < 128 * kGB);
  CHECK(b->Describe().find("undo copies for 0 layers") != std::string::npos);
  // A larger guard buys undo copies for the layers whose gradients come first.
  in.guard_bytes = 4 * Params() + 8 * (kEmbed + 3584) + 8 * kBlock;
  in.host_bytes = 115 * kGB;  // RAM: 78.4 + 36.6 + 8.7 GB of gradient slots < 128
  b = PlanHostBudget(in);
  REQUIRE(b.ok());
  CHECK(b->undo_layers == 2);  // the head and the last block
}

TEST_CASE("A state beyond RAM budget + free disk is refused naming spill.dir's free space", "[eps][budget]") {
  HostBudgetInputs in = Qwen7B();
  in.guard_bytes = 32 * kGB;
  in.disk_free_bytes = 40 * kGB;  // ~51 GB must go to SSD
  Result<HostBudget> b = PlanHostBudget(in);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == StatusCode::kResourceExhausted);
  INFO(b.status().message());
  CHECK(b.status().message().find("must live in spill.dir, which has 40000000000 B") != std::string::npos);
  // Without spill.dir at all: refused, asking for it.
  in.spill = false;
  b = PlanHostBudget(in);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("set spill.dir") != std::string::npos);
}

TEST_CASE("memory.guard_bytes below 4 B/param or not below host_bytes is refused", "[eps][budget]") {
  HostBudgetInputs in = Qwen7B();
  in.guard_bytes = 4 * Params() - 1;
  Result<HostBudget> b = PlanHostBudget(in);
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().message().find("memory.guard_bytes=" + std::to_string(4 * Params() - 1)) != std::string::npos);
  in.guard_bytes = in.host_bytes;
  CHECK_FALSE(PlanHostBudget(in).ok());
}

TEST_CASE("A small model with no limits keeps today's plan: unbounded undo, nothing spilled", "[eps][budget]") {
  HostBudgetInputs in;
  in.layer_numel = {1000, 5000, 1000};
  in.page_bytes = 4096;
  in.ram_bytes = 16 * kGB;
  Result<HostBudget> b = PlanHostBudget(in);
  REQUIRE(b.ok());
  CHECK(b->pipeline_undo_budget == SIZE_MAX);
  CHECK(b->undo_layers == 3);
  CHECK(b->guard_bytes == 12 * 7000);
  CHECK(b->store_host_bytes == 0);
  CHECK(b->spill_bytes == 0);
}

}  // namespace
}  // namespace l2l::eps

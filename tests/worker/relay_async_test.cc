// The relay's asynchronous copy path (the one the CUDA backend takes: copy queues beside
// the compute stream, events, double-buffered weight slots, bf16 widened "on the device",
// gradients copied device-to-host before the push, the host stash on its own queue), run
// on the CPU through EmulatedAsyncBackend (tests/worker/emulated_async_backend.h): every
// emulated copy poisons its destination and lands late, so a missing or misplaced wait
// shows as different (or NaN) numbers.
//
// Oracle: the plain CPU relay (the direct path) on the same job and data. The copies
// move bytes exactly and the compute ops are the same CPU ops in the same order, so the
// losses and the EPS's final weights must be BIT-identical; any difference is a bug in
// the async path. (The shm transport's page-locked segments and zero-copy gradient
// slots are covered in tests/integration/relay_async_shm_test.cc.)
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/fake_eps_client.h"
#include "common/dtype.h"
#include "common/lora.h"
#include "kernels/backend.h"
#include "tests/testing/batches.h"
#include "tests/testing/jobs.h"
#include "tests/worker/emulated_async_backend.h"
#include "worker/data_loader.h"
#include "worker/relay.h"

namespace l2l::worker {
namespace {

JobConfig AsyncJob() {
  return testing::GptJob(testing::kTinyGpt,
                         {.micro_batch_size = 2, .micro_batches = 3, .seq_len = 16, .seed = 91,
                          .clip = l2l::ClipMode::kGlobal, .lr = 3e-3f, .warmup_steps = 1,
                          .weight_decay = 0.1f, .grad_clip = 1.0f});
}

std::vector<MicroBatch> Batches(const JobConfig& job, int64_t step) {
  return testing::LcgBatches(job, 1234567 + static_cast<uint64_t>(step) * 7919, 5, 3);
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
  CopyMode prefetch_mode = CopyMode::kDirect, push_mode = CopyMode::kDirect;
  int64_t bounced = 0, pinned = 0, staged_pushes = 0, slot_pushes = 0;
  bool stash_async = false;
};

Run Train(const JobConfig& job, kernels::Backend* backend, int steps) {
  auto eps = FakeEps::Create(job, {});
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto opts = RelayOptions::FromJob(job);
  REQUIRE(opts.ok());
  Run run;
  {
    auto relay = Relay::Create(client->get(), backend, job, *opts);
    INFO(relay.status().ToString());
    REQUIRE(relay.ok());
    for (int s = 0; s < steps; ++s) {
      auto report = (*relay)->RunStep(s, Batches(job, s));
      INFO("step " << s << ": " << report.status().ToString());
      REQUIRE(report.ok());
      run.losses.push_back(report->loss);
      REQUIRE((*client)->StepDone(*report).ok());
    }
    run.prefetch_mode = (*relay)->prefetcher().mode();
    run.push_mode = (*relay)->pusher().mode();
    run.bounced = (*relay)->prefetcher().bounced_fetches();
    run.pinned = (*relay)->prefetcher().pinned_fetches();
    run.staged_pushes = (*relay)->pusher().staged_pushes();
    run.slot_pushes = (*relay)->pusher().slot_pushes();
    run.stash_async = (*relay)->stash().async();
  }
  (*eps)->Flush();
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) run.params.push_back((*eps)->Master(l));
  return run;
}

TEST_CASE("Relay on a backend with copy queues gives the bits of the plain CPU relay",
          "[worker][relay][async]") {
  JobConfig job = AsyncJob();
  job.train.stash = GENERATE(StashPlacement::kDevice, StashPlacement::kHost);
  job.publish_dtype = GENERATE(DType::kF32, DType::kBF16);
  // The async path is family-blind: a Llama model (GQA, untied) takes it the same way.
  if (GENERATE(false, true)) {
    job.model.family = ModelFamily::kLlama;
    job.model.n_kv_heads = 2;
    job.model.tied_embeddings = false;
  }
  CAPTURE(ToString(job.train.stash), DTypeName(job.publish_dtype), ToString(job.model.family));
  REQUIRE(job.Validate().ok());
  const int steps = 3;

  auto cpu = kernels::CreateCpuBackend(1);
  Run plain = Train(job, cpu.get(), steps);
  CHECK(plain.prefetch_mode == CopyMode::kDirect);

  testing::EmulatedAsyncBackend emu(1, {});
  Run async = Train(job, &emu, steps);
  CHECK(async.prefetch_mode == CopyMode::kAsync);
  CHECK(async.push_mode == CopyMode::kAsync);
  CHECK(async.stash_async == (job.train.stash == l2l::StashPlacement::kHost));
  // FakeEps shares no memory: every layer went through the pinned bounce buffer and every
  // gradient through pinned staging + PushGradient.
  const int64_t fetches = steps * (2 * job.model.n_layer + 2);
  CHECK(async.bounced == fetches);
  CHECK(async.pinned == 0);
  CHECK(async.staged_pushes == steps * (job.model.n_layer + 2));
  {
    std::lock_guard<std::mutex> lk(emu.stats().mu);
    // The copies really ran on the queues: one H2D per fetch (+ stash reloads), bf16
    // widened on the "device", one D2H per gradient (+ stash offloads).
    CHECK(emu.stats().copies_to_device >= fetches);
    CHECK(emu.stats().widenings == (job.publish_dtype == DType::kBF16 ? fetches : 0));
    CHECK(emu.stats().copies_to_host >= steps * (job.model.n_layer + 2));
    // A bf16 layer's bits are noted to the backend while it is resident (a bf16-mode CUDA
    // backend multiplies them instead of casting the weights again): once per fetch,
    // forgotten at its release, and still bf16(weights) at every GEMM that used them.
    const bool bf16 = job.publish_dtype == DType::kBF16;
    CHECK(emu.stats().bf16_notes == (bf16 ? fetches : 0));
    CHECK(emu.stats().bf16_live == 0);  // every note forgotten by the end
    CHECK((emu.stats().bf16_operand_hits > 0) == bf16);
    CHECK(emu.stats().bf16_stale_elements == 0);
  }

  REQUIRE(plain.losses.size() == async.losses.size());
  for (size_t s = 0; s < plain.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(std::isfinite(async.losses[s]));
    CHECK(async.losses[s] == plain.losses[s]);  // bit-identical
  }
  CHECK(async.losses.back() < async.losses.front());  // it trains
  for (size_t l = 0; l < plain.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(async.params[l] == plain.params[l]);
  }
}

TEST_CASE("A bf16 stash on copy queues gives the bits of the plain CPU relay", "[worker][relay][async][stash]") {
  JobConfig job = AsyncJob();
  job.train.stash = GENERATE(StashPlacement::kDevice, StashPlacement::kHost);
  job.train.stash_dtype = DType::kBF16;
  CAPTURE(ToString(job.train.stash));
  REQUIRE(job.Validate().ok());
  const int steps = 3;
  auto cpu = kernels::CreateCpuBackend(1);
  Run plain = Train(job, cpu.get(), steps);
  testing::EmulatedAsyncBackend emu(1, {});
  Run async = Train(job, &emu, steps);
  CHECK(async.stash_async == (job.train.stash == l2l::StashPlacement::kHost));
  {
    std::lock_guard<std::mutex> lk(emu.stats().mu);
    // Host placement: each reload moved bf16 bits and was widened on the copy queue
    // (publish_dtype is f32, so every widening is the stash's); device placement widens
    // on the compute stream instead.
    if (job.train.stash == l2l::StashPlacement::kHost) {
      CHECK(emu.stats().widenings > 0);
    } else {
      CHECK(emu.stats().widenings == 0);
    }
  }
  REQUIRE(plain.losses.size() == async.losses.size());
  for (size_t s = 0; s < plain.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(std::isfinite(async.losses[s]));
    CHECK(async.losses[s] == plain.losses[s]);  // bit-identical
  }
  for (size_t l = 0; l < plain.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(async.params[l] == plain.params[l]);
  }
  // And it differs from the fp32 stash (the rounding happened on both paths).
  job.train.stash_dtype = DType::kF32;
  Run f32 = Train(job, cpu.get(), steps);
  bool differs = false;
  for (size_t l = 0; l < f32.params.size(); ++l) differs = differs || f32.params[l] != plain.params[l];
  CHECK(differs);
}

TEST_CASE("Relay on copy queues decodes a LoRA job's frozen base as the CPU relay does",
          "[worker][relay][async][lora]") {
  // The frozen record goes up as bytes and is widened / dequantized on the copy queue
  // (CopyQueue::WidenToF32, DequantizeBlocks); the CPU relay decodes it on the host
  // (DecodeFrozen). Both must give the same bits.
  JobConfig job = AsyncJob();
  job.model.family = ModelFamily::kLlama;
  job.model.n_kv_heads = 2;
  job.model.tied_embeddings = false;
  job.lora.enabled = true;
  job.lora.r = 4;
  job.lora.alpha = 8;
  job.lora.modules_to_save = {"lm_head"};
  job.lora.base_dtype = GENERATE(LoraBaseDType::kF32, LoraBaseDType::kBF16, LoraBaseDType::kQ4, LoraBaseDType::kQ8);
  job.publish_dtype = GENERATE(DType::kF32, DType::kBF16);
  CAPTURE(ToString(job.lora.base_dtype), DTypeName(job.publish_dtype));
  REQUIRE(job.Validate().ok());
  const int steps = 2;
  auto cpu = kernels::CreateCpuBackend(1);
  Run plain = Train(job, cpu.get(), steps);
  testing::EmulatedAsyncBackend emu(1, {});
  Run async = Train(job, &emu, steps);
  CHECK(async.prefetch_mode == CopyMode::kAsync);
  CHECK(async.bounced == steps * (2 * job.model.n_layer + 2));
  {
    std::lock_guard<std::mutex> lk(emu.stats().mu);
    CHECK(emu.stats().widenings > 0);  // records decoded on the queue
  }
  REQUIRE(plain.losses.size() == async.losses.size());
  for (size_t s = 0; s < plain.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(std::isfinite(async.losses[s]));
    CHECK(async.losses[s] == plain.losses[s]);
  }
  for (size_t l = 0; l < plain.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(async.params[l] == plain.params[l]);
  }
}

TEST_CASE("Relay on copy queues with the host stash and one micro-batch keeps its order",
          "[worker][relay][async]") {
  // One micro-batch: the stash's double-buffered staging tensors alternate between layers
  // instead of micro-batches (Load of layer l's output right after its Commit).
  JobConfig job = AsyncJob();
  job.train.micro_batches = 1;
  job.train.stash = l2l::StashPlacement::kHost;
  job.model.tied_embeddings = false;
  REQUIRE(job.Validate().ok());
  auto cpu = kernels::CreateCpuBackend(1);
  Run plain = Train(job, cpu.get(), 3);
  testing::EmulatedAsyncBackend::Options o;
  o.copy_delay = std::chrono::microseconds(1000);  // copies later than the compute by far
  testing::EmulatedAsyncBackend emu(1, o);
  Run async = Train(job, &emu, 3);
  CHECK(async.stash_async);
  CHECK(async.losses == plain.losses);
  for (size_t l = 0; l < plain.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(async.params[l] == plain.params[l]);
  }
}

}  // namespace
}  // namespace l2l::worker

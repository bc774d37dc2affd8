// Shared by the GPU training tests (training_test, bf16_gemm_test, cuda_worker_test): the
// small GPT they train, learnable batches, the reference trainer's losses on a device,
// and a scoped environment variable (the CUDA backend reads L2L_CUDA_GEMM, the emulator
// its L2L_CUDA_EMU_* switches). Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
#include "kernels/backend.h"
#include "tests/testing/jobs.h"
#include "worker/data_loader.h"
#include "bench/fake_eps_client.h"
#include "worker/relay.h"
#include "worker/reference/reference_trainer.h"
#include "tests/testing/scoped_env.h"

namespace l2l::gpu_test {

// GPT: V 512, T 64, d_model 128, 2 layers, 4 heads, d_ff 512, tied embeddings.
inline constexpr testing::GptShape kSmallGpt{512, 64, 128, 2, 4, 512};
inline ModelSpec SmallSpec() {
  ModelSpec s = testing::GptModel(kSmallGpt);
  REQUIRE(s.Validate().ok());
  return s;
}

// SmallSpec, 2 micro-batches of 4 x 64 tokens, AdamW lr 3e-3.
inline JobConfig SmallJob() {
  JobConfig cfg = testing::GptJob(kSmallGpt, {.micro_batch_size = 4, .micro_batches = 2, .seq_len = 64,
                                              .seed = 1234, .lr = 3e-3f});
  REQUIRE(cfg.model.Validate().ok());
  return cfg;
}

// Learnable data: each sequence follows x[t+1] = (5 x[t] + 3) mod V from a random start,
// so the loss falls quickly and a broken backward shows as a loss that does not.
inline std::vector<worker::MicroBatch> LearnableBatches(std::mt19937& rng, const JobConfig& cfg) {
  const int32_t V = static_cast<int32_t>(cfg.model.vocab_size);
  std::vector<worker::MicroBatch> out;
  for (int64_t m = 0; m < cfg.train.micro_batches; ++m) {
    worker::MicroBatch mb;
    mb.B = cfg.train.micro_batch_size;
    mb.T = cfg.seq_len();
    for (int64_t s = 0; s < mb.B; ++s) {
      int32_t x = std::uniform_int_distribution<int32_t>(0, V - 1)(rng);
      for (int64_t t = 0; t < mb.T; ++t) {
        mb.inputs.push_back(x);
        x = (5 * x + 3) % V;
        mb.targets.push_back(x);
      }
    }
    out.push_back(std::move(mb));
  }
  return out;
}

// A step's micro-batches; called for steps 0, 1, ... in order.
using BatchSource = std::function<std::vector<worker::MicroBatch>(int step)>;

// LearnableBatches from an mt19937 seeded 7 (the default of TrainLosses and RelayLosses,
// so every device and path sees the same data).
inline BatchSource LearnableSource(const JobConfig& cfg) {
  auto rng = std::make_shared<std::mt19937>(7);
  return [rng, cfg](int) { return LearnableBatches(*rng, cfg); };
}

// The reference trainer's loss for each of `steps` steps on `device`, on `batches`
// (default LearnableSource(cfg)).
inline std::vector<float> TrainLosses(const JobConfig& cfg, const std::string& device, int steps,
                                      BatchSource batches = {}) {
  if (!batches) batches = LearnableSource(cfg);
  worker::ReferenceTrainerOptions opts;
  opts.device = device;
  auto trainer = worker::ReferenceTrainer::Create(cfg, opts);
  INFO(device << ": " << trainer.status().ToString());
  REQUIRE(trainer.ok());
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto loss = (*trainer)->Step(batches(s));
    INFO(device << " step " << s << ": " << loss.status().ToString());
    REQUIRE(loss.ok());
    losses.push_back(*loss);
  }
  return losses;
}

using testing::ScopedEnv;

// The layer-to-layer relay against an in-process EPS (bench/fake_eps_client.h), one
// worker, on `backend`; the same batches as TrainLosses (default LearnableSource(job)).
inline std::vector<float> RelayLosses(const JobConfig& job, kernels::Backend* backend, int steps,
                                      BatchSource batches = {}) {
  if (!batches) batches = LearnableSource(job);
  auto eps = worker::FakeEps::Create(job, {});
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto opts = worker::RelayOptions::FromJob(job);
  REQUIRE(opts.ok());
  auto relay = worker::Relay::Create(client->get(), backend, job, *opts);
  INFO(backend->name() << ": " << relay.status().ToString());
  REQUIRE(relay.ok());
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto report = (*relay)->RunStep(s, batches(s));
    INFO(backend->name() << " relay step " << s << ": " << report.status().ToString());
    REQUIRE(report.ok());
    losses.push_back(report->loss);
  }
  return losses;
}

}  // namespace l2l::gpu_test

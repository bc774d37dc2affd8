// GPT-2-small training throughput on the CUDA backend with the reference trainer: the
// measurement scripts/gpu_check.sh prints (tokens/s, model FLOPs, peak device memory).
// A benchmark, not a test: the tag "[.gpt2bench]" hides it from every default run and
// from ctest discovery's normal use; it runs only when asked for by that tag, and never
// fails on speed (only on errors or a non-finite loss).
//
// Knobs (environment): L2L_BENCH_STEPS (timed steps, default 5, after 1 warm-up step),
// L2L_BENCH_B (sequences per micro-batch, default 4), L2L_BENCH_M (micro-batches per
// step, default 2), L2L_BENCH_T (sequence length, default 1024), L2L_BENCH_MODEL
// (gpt2-small | gpt2-medium, default gpt2-small); L2L_CUDA_GEMM=tf32 for TF32 GEMMs.
// Output: one line "gpt2bench: key=value ..." that gpu_check.sh parses.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::gpu_test {
namespace {

int64_t EnvInt(const char* name, int64_t def) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : def;
}

ModelSpec Gpt2(const std::string& name) {
  ModelSpec s;
  s.vocab_size = 50257;
  s.seq_len = 1024;
  s.tied_embeddings = true;
  if (name == "gpt2-medium") {
    s.d_model = 1024, s.n_layer = 24, s.n_head = 16, s.d_ff = 4096;
  } else {
    s.d_model = 768, s.n_layer = 12, s.n_head = 12, s.d_ff = 3072;
  }
  return s;
}

TEST_CASE("gpt2 training throughput on cuda", "[.gpt2bench]") {
  Both();
  const char* model_env = std::getenv("L2L_BENCH_MODEL");
  const std::string model = model_env && *model_env ? model_env : "gpt2-small";
  JobConfig cfg;
  cfg.model = Gpt2(model);
  cfg.train.micro_batch_size = EnvInt("L2L_BENCH_B", 4);
  cfg.train.micro_batches = EnvInt("L2L_BENCH_M", 2);
  cfg.train.seq_len = EnvInt("L2L_BENCH_T", 1024);
  cfg.optim.lr = 1e-4f;
  REQUIRE(cfg.Validate().ok());
  const int64_t steps = EnvInt("L2L_BENCH_STEPS", 5);
  const int64_t B = cfg.train.micro_batch_size, T = cfg.seq_len(), M = cfg.train.micro_batches;

  worker::ReferenceTrainerOptions opts;
  opts.device = "cuda:0";
  auto trainer = worker::ReferenceTrainer::Create(cfg, opts);
  INFO(trainer.status().ToString());
  REQUIRE(trainer.ok());
  kernels::Backend& be = *(*trainer)->backend();

  std::mt19937 rng(1);
  auto batches = [&] {
    std::vector<worker::MicroBatch> out(M);
    for (auto& mb : out) {
      mb.B = B;
      mb.T = T;
      mb.inputs = RandomTokens(rng, B * T, static_cast<int32_t>(cfg.model.vocab_size));
      mb.targets = RandomTokens(rng, B * T, static_cast<int32_t>(cfg.model.vocab_size));
    }
    return out;
  };
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point a) {
    return std::chrono::duration<double>(Clock::now() - a).count();
  };

  auto warm = (*trainer)->Step(batches());  // cuBLASLt plans, scratch growth, page faults
  REQUIRE(warm.ok());
  REQUIRE(kernels::ResetCudaPeakMemory(be).ok());

  // Whole optimizer steps (forward, backward, gradient download, host AdamW, upload).
  double step_s = 0;
  float loss = 0;
  for (int64_t s = 0; s < steps; ++s) {
    auto data = batches();
    auto t0 = Clock::now();
    auto l = (*trainer)->Step(data);
    be.Synchronize();
    step_s += secs(t0);
    REQUIRE(l.ok());
    loss = *l;
  }
  // Forward + backward only: what the GPU itself sustains.
  double fb_s = 0;
  for (int64_t s = 0; s < steps; ++s) {
    auto data = batches();
    auto t0 = Clock::now();
    auto l = (*trainer)->ComputeGradients(data);
    be.Synchronize();
    fb_s += secs(t0);
    REQUIRE(l.ok());
  }
  CHECK(std::isfinite(loss));
  auto mem = kernels::GetCudaMemoryStats(be);
  REQUIRE(mem.ok());
  const double tokens = static_cast<double>(B * T * M * steps);
  std::printf(
      "gpt2bench: model=%s params=%lld B=%lld T=%lld M=%lld steps=%lld backend=\"%s\" loss=%.4f "
      "step_tokens_per_s=%.1f fwdbwd_tokens_per_s=%.1f peak_alloc_bytes=%zu internal_bytes=%zu "
      "device_used_bytes=%zu device_total_bytes=%zu\n",
      model.c_str(), static_cast<long long>(cfg.model.NumParams()), static_cast<long long>(B),
      static_cast<long long>(T), static_cast<long long>(M), static_cast<long long>(steps),
      be.name().c_str(), loss, tokens / step_s, tokens / fb_s, mem->peak_allocated, mem->internal,
      mem->device_used, mem->device_total);
  std::fflush(stdout);
}

}  // namespace
}  // namespace l2l::gpu_test

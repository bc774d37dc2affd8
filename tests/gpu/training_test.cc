// The GPT-2 layers (kernels/layers) and the reference trainer (worker/reference/reference_trainer.h)
// on the CUDA backend against the CPU backend: same weights, same data.
// Label gpu: fails (never skips) without a GPU.
//
// Also: 10 relay steps (worker/relay.h against an in-process EPS) on cuda vs cpu, with
// the stash on the device and on the host, recomputing every block or keeping every
// block's intermediates (train.recompute), same losses tolerance. On cuda the relay takes
// its copy-stream path (worker/prefetch.h); FakeEps shares no memory, so layers go through
// the pinned bounce buffer (cuda_worker_test.cc covers the shm zero-copy path).
// Tolerances: one layer, fp32 on both sides: atol 1e-4, rtol 1e-3 on outputs and
// gradients (summation order only). Ten AdamW steps of a small model: every step's loss
// within 1e-4 + 2e-3 * |loss| of the CPU's (early steps agree to ~1e-6; AdamW's
// m / sqrt(v) amplifies tiny gradient differences on near-zero gradients, so later
// steps drift slowly). With L2L_CUDA_GEMM=tf32: 2e-2 relative.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "bench/fake_eps_client.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"
#include "worker/relay.h"

namespace l2l::gpu_test {
namespace {

TEST_CASE("cuda GPT-2 block forward and recomputing backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const ModelSpec spec = SmallSpec();
  const auto layouts = BuildLayout(spec);
  const LayerLayout& block = layouts[1];
  std::mt19937 rng(11);
  ExpectBlockMatches(b, spec, block, InitParams(spec, block), 2, 64, rng);
}

TEST_CASE("cuda embedding and tied head losses and gradients match the cpu", "[gpu]") {
  Backends& b = Both();
  std::mt19937 rng(12);
  ExpectEmbeddingAndHeadMatch(b, SmallSpec(), 2, 64, rng, 1e-6, 1e-5, "wte.weight");
}

TEST_CASE("reference trainer on cuda tracks the cpu losses for 10 steps", "[gpu]") {
  Both();
  const JobConfig cfg = SmallJob();
  auto cpu = TrainLosses(cfg, "cpu", 10);
  auto gpu = TrainLosses(cfg, "cuda:0", 10);
  ExpectLossesTrack(gpu, cpu, 2e-3);
}

TEST_CASE("reference trainer on cuda with tf32 GEMMs tracks the cpu losses", "[gpu]") {
  Both();
  const JobConfig cfg = SmallJob();
  auto cpu = TrainLosses(cfg, "cpu", 10);
  std::vector<float> gpu;
  {
    ScopedEnv env("L2L_CUDA_GEMM", "tf32");
    gpu = TrainLosses(cfg, "cuda:0", 10);
  }
  ExpectLossesTrack(gpu, cpu, 2e-2);
}

TEST_CASE("relay on cuda tracks the cpu relay for 10 steps", "[gpu]") {
  Backends& b = Both();
  JobConfig job = SmallJob();
  job.train.stash = GENERATE(StashPlacement::kDevice, StashPlacement::kHost);
  // never: every block keeps its forward intermediates (the CUDA ops read them from the
  // exchanged buffers instead of recomputing).
  job.train.recompute = GENERATE(RecomputeMode::kAlways, RecomputeMode::kNever);
  CAPTURE(ToString(job.train.stash), ToString(job.train.recompute));
  REQUIRE(job.Validate().ok());
  auto cpu = RelayLosses(job, b.cpu.get(), 10);
  auto gpu = RelayLosses(job, b.gpu.get(), 10);
  ExpectLossesTrack(gpu, cpu, 2e-3);
}

}  // namespace
}  // namespace l2l::gpu_test

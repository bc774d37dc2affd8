// The GPT-2 layers (kernels/layers) and the reference trainer (worker/reference_trainer.h)
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

#include "common/config.h"
#include "common/model_spec.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"
#include "worker/data_loader.h"
#include "worker/fake_eps_client.h"
#include "worker/reference_trainer.h"
#include "worker/relay.h"

namespace l2l::gpu_test {
namespace {

struct Workspaces {
  std::unique_ptr<layers::LayerWorkspace> cpu, gpu;
};
Workspaces MakeWorkspaces(Backends& b, const ModelSpec& spec, int64_t B, int64_t T) {
  auto c = layers::LayerWorkspace::Create(b.cpu.get(), spec, B, T);
  auto g = layers::LayerWorkspace::Create(b.gpu.get(), spec, B, T);
  REQUIRE(c.ok());
  REQUIRE(g.ok());
  return {std::make_unique<layers::LayerWorkspace>(std::move(c).value()),
          std::make_unique<layers::LayerWorkspace>(std::move(g).value())};
}

std::vector<float> InitParams(const ModelSpec& spec, const LayerLayout& layout) {
  std::vector<float> p(layout.numel);
  InitLayerParams(spec, layout, 42, p.data());
  return p;
}

TEST_CASE("cuda GPT-2 block forward and recomputing backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const ModelSpec spec = SmallSpec();
  const auto layouts = BuildLayout(spec);
  const LayerLayout& block = layouts[1];
  const int64_t B = 2, T = 64, C = spec.d_model;
  std::mt19937 rng(11);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin params = Twin::Of(b, InitParams(spec, block));
  Twin in = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::BlockForward(*b.cpu, spec, block, params.c(), in.c(), out.c(), B, T, *ws.cpu);
  layers::BlockForward(*b.gpu, spec, block, params.g(), in.g(), out.g(), B, T, *ws.gpu);
  ExpectTwinClose(b, out, 1e-4, 1e-3, "block out");

  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dparams = Twin::Of(b, RandomVec(rng, block.numel, -0.01f, 0.01f));  // accumulates
  layers::BlockBackward(*b.cpu, spec, block, params.c(), in.c(), dout.c(), din.c(), dparams.c(), B,
                        T, *ws.cpu);
  layers::BlockBackward(*b.gpu, spec, block, params.g(), in.g(), dout.g(), din.g(), dparams.g(), B,
                        T, *ws.gpu);
  ExpectTwinClose(b, din, 1e-4, 1e-3, "block din");
  ExpectTwinClose(b, dparams, 1e-4, 1e-3, "block dparams");
}

TEST_CASE("cuda embedding and tied head losses and gradients match the cpu", "[gpu]") {
  Backends& b = Both();
  const ModelSpec spec = SmallSpec();
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const LayerLayout& head = layouts.back();
  const int64_t B = 2, T = 64, C = spec.d_model;
  std::mt19937 rng(12);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin emb_params = Twin::Of(b, InitParams(spec, emb));
  Twin head_params = Twin::Of(b, InitParams(spec, head));
  const int32_t V = static_cast<int32_t>(spec.vocab_size);
  Twin tokens = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin targets = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin hidden = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::EmbeddingForward(*b.cpu, spec, emb, emb_params.c(), tokens.ci(), hidden.c(), B, T);
  layers::EmbeddingForward(*b.gpu, spec, emb, emb_params.g(), tokens.gi(), hidden.g(), B, T);
  ExpectTwinClose(b, hidden, 1e-6, 1e-5, "embedding out");

  const size_t wte_off = emb.Find("wte.weight")->offset;
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dhead = Twin::Of(b, std::vector<float>(head.numel, 0.0f));
  Twin demb = Twin::Of(b, std::vector<float>(emb.numel, 0.0f));
  float lc = layers::HeadForwardBackward(*b.cpu, spec, head, head_params.c(), emb_params.c() + wte_off,
                                         hidden.c(), targets.ci(), 0.5f, din.c(), dhead.c(),
                                         demb.c() + wte_off, B, T, *ws.cpu);
  float lg = layers::HeadForwardBackward(*b.gpu, spec, head, head_params.g(), emb_params.g() + wte_off,
                                         hidden.g(), targets.gi(), 0.5f, din.g(), dhead.g(),
                                         demb.g() + wte_off, B, T, *ws.gpu);
  CHECK(std::abs(lg - lc) <= 1e-5 + 1e-5 * std::abs(lc));
  ExpectTwinClose(b, din, 1e-6, 1e-3, "head din");
  ExpectTwinClose(b, dhead, 1e-6, 1e-3, "head dparams");
  layers::EmbeddingBackward(*b.cpu, spec, emb, tokens.ci(), din.c(), demb.c(), B, T);
  layers::EmbeddingBackward(*b.gpu, spec, emb, tokens.gi(), din.g(), demb.g(), B, T);
  ExpectTwinClose(b, demb, 1e-6, 1e-3, "embedding dparams (tied wte: head + embedding)");
}

void ExpectLossesTrack(const std::vector<float>& gpu, const std::vector<float>& cpu, double rtol) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t s = 0; s < cpu.size(); ++s) {
    INFO("step " << s << ": gpu loss " << gpu[s] << ", cpu loss " << cpu[s]);
    CHECK(std::abs(gpu[s] - cpu[s]) <= 1e-4 + rtol * std::abs(cpu[s]));
  }
  // It trains: the last loss is well below the first (the data is learnable).
  CHECK(gpu.back() < 0.9f * gpu.front());
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

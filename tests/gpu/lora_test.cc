// LoRA adapters (kernels/layers/lora.h) on the CUDA backend against the CPU: a block of
// each family with adapters on every linear (non-zero A and B), forward, then the
// recomputing backward (adapter gradients, the base's weight gradients skipped, dx through
// base and adapters), without and with adapter dropout; and Backend::CounterDropout's mask
// bit for bit against the CPU's and common/rng.h's formula. The adapters are Backend::Gemm
// calls, so this checks the CUDA backend's GEMMs at the adapters' shapes and strides
// (column slices of q|k|v and gate|up).
// Label gpu (a GPU build) or emu (the emulator).
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/lora.h"
#include "common/rng.h"
#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

ModelSpec LoraSpec(const std::string& family) {
  ModelSpec s;
  s.vocab_size = 96;
  s.seq_len = 32;
  s.d_model = 48;
  s.n_layer = 2;
  s.n_head = 6;
  s.d_ff = 80;
  if (family == "llama") {
    s.family = ModelFamily::kLlama;
    s.n_kv_heads = 2;
    s.tied_embeddings = false;
  }
  REQUIRE(s.Validate().ok());
  return s;
}

TEST_CASE("cuda LoRA block forward and backward match the cpu", "[gpu][lora]") {
  Backends& b = Both();
  const std::string family = GENERATE("llama", "gpt2");
  const double dropout = GENERATE(0.0, 0.1);
  CAPTURE(family, dropout);
  const ModelSpec spec = LoraSpec(family);
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 5;
  lora.alpha = 10;
  lora.dropout = dropout;
  REQUIRE(ValidateLora(spec, lora).ok());
  const std::vector<LayerLayout> base = BuildLayout(spec), lo = BuildLoraLayout(spec, lora);
  const LayerLayout& block = lo[1];
  REQUIRE(block.lora_r == 5);
  std::vector<float> p = InitParams(spec, base[1]);
  std::mt19937 rng(31);
  for (size_t i = p.size(); i < block.numel; ++i) p.push_back(std::uniform_real_distribution<float>(-0.2f, 0.2f)(rng));
  REQUIRE(p.size() == block.numel);
  // With dropout: the adapters read the counter-based mask's dropped input on both
  // backends (a training micro-batch: step 3, global micro-batch 2).
  ExpectBlockMatches(b, spec, block, p, 2, 32, rng, {dropout, 7, 3, 2});
}

TEST_CASE("cuda CounterDropout draws the cpu's mask bit for bit", "[gpu][lora]") {
  Backends& b = Both();
  const int64_t N = 37, C = 53, ldx = 61, ldo = 59;  // odd sizes, strided rows
  const double p = GENERATE(0.1, 0.5);
  CAPTURE(p);
  const uint64_t stream = LoraDropoutStream(11, 4, 1, 3, "self_attn.q_proj.weight");
  const uint32_t threshold = DropoutThreshold(p);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::mt19937 rng(5);
  std::vector<float> x = RandomVec(rng, N * ldx, 0.5f, 2.0f);  // never 0: a 0 output is a drop
  Twin xin = Twin::Of(b, x);
  Twin out = Twin::Of(b, RandomVec(rng, N * ldo));
  Twin acc = Twin::Of(b, RandomVec(rng, N * ldo));
  const std::vector<float> acc0 = acc.FromCpu(b);
  b.cpu->CounterDropout(out.c(), ldo, xin.c(), ldx, N, C, stream, threshold, scale, false);
  b.gpu->CounterDropout(out.g(), ldo, xin.g(), ldx, N, C, stream, threshold, scale, false);
  b.cpu->CounterDropout(acc.c(), ldo, xin.c(), ldx, N, C, stream, threshold, scale, true);
  b.gpu->CounterDropout(acc.g(), ldo, xin.g(), ldx, N, C, stream, threshold, scale, true);
  b.gpu->Synchronize();
  const std::vector<float> oc = out.FromCpu(b), og = out.FromGpu(b);
  const std::vector<float> ac = acc.FromCpu(b), ag = acc.FromGpu(b);
  int64_t kept = 0, mismatched = 0, wrong = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const size_t o = static_cast<size_t>(n * ldo + c);
      // The oracle: common/rng.h's formula on the host.
      const bool keep = DropoutKeep(stream, static_cast<uint64_t>(n * C + c), threshold);
      const float want = keep ? x[static_cast<size_t>(n * ldx + c)] * scale : 0.0f;
      kept += keep;
      mismatched += oc[o] != og[o] || ac[o] != ag[o];
      wrong += oc[o] != want || ac[o] != acc0[o] + want;
    }
    for (int64_t c = C; c < ldo; ++c) {  // padding columns untouched
      const size_t o = static_cast<size_t>(n * ldo + c);
      wrong += ac[o] != acc0[o] || og[o] != oc[o];
    }
  }
  CHECK(mismatched == 0);
  CHECK(wrong == 0);
  INFO("kept " << kept << " of " << N * C);
  CHECK(kept > 0);
  CHECK(kept < N * C);
}

}  // namespace
}  // namespace l2l::gpu_test

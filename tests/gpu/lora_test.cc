// LoRA adapters (kernels/layers/lora.h) on the CUDA backend against the CPU: a block of
// each family with adapters on every linear (non-zero A and B), forward, then the
// recomputing backward (adapter gradients, the base's weight gradients skipped, dx through
// base and adapters). The adapters are Backend::Gemm calls, so this checks the CUDA
// backend's GEMMs at the adapters' shapes and strides (column slices of q|k|v and gate|up).
// Label gpu (a GPU build) or emu (the emulator).
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/lora.h"
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
  CAPTURE(family);
  const ModelSpec spec = LoraSpec(family);
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 5;
  lora.alpha = 10;
  REQUIRE(ValidateLora(spec, lora).ok());
  const std::vector<LayerLayout> base = BuildLayout(spec), lo = BuildLoraLayout(spec, lora);
  const LayerLayout& block = lo[1];
  REQUIRE(block.lora_r == 5);
  std::vector<float> p = InitParams(spec, base[1]);
  std::mt19937 rng(31);
  for (size_t i = p.size(); i < block.numel; ++i) p.push_back(std::uniform_real_distribution<float>(-0.2f, 0.2f)(rng));
  REQUIRE(p.size() == block.numel);
  ExpectBlockMatches(b, spec, block, p, 2, 32, rng);
}

}  // namespace
}  // namespace l2l::gpu_test

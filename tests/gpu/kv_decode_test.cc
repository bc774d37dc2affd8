// KV-cache decoding (kernels/layers/kv_decode.h) on the CUDA backend (the emulator in CI)
// against the same decoder on the CPU backend, for GPT-2, Llama (GQA 4/2, q/k/v
// biases, rotary) and Gemma 3 (a sliding and a global block): the next-token distribution after a 4-token prefill and after each of
// 12 decode steps agrees within atol 1e-6 / rtol 1e-3 (the CUDA-vs-CPU bound of the other
// head tests; the CPU decoder itself equals the full forward, tests/kernels/kv_decode_test.cc).
#include <catch2/catch.hpp>

#include <vector>

#include "kernels/layers/kv_decode.h"
#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

TEST_CASE("cuda KV-cache decoding matches the cpu decoder", "[gpu][decode]") {
  Backends& b = Both();
  for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama, ModelFamily::kGemma3}) {
    INFO("family " << ToString(family));
    ModelSpec spec;
    spec.family = family;
    spec.vocab_size = 61;
    spec.seq_len = 20;
    spec.d_model = 32;
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.d_ff = 48;
    if (family == ModelFamily::kLlama) {
      spec.n_kv_heads = 2;
      spec.qkv_bias = true;
      spec.tied_embeddings = false;
    }
    if (family == ModelFamily::kGemma3) {  // a sliding block (window 5), then a global one
      spec.n_kv_heads = 2;
      spec.head_size = 6;
      spec.qk_norm = true;
      spec.sliding_window = 5;
      spec.sliding_window_pattern = 2;
      spec.rope_local_theta = 100.0;
      spec.query_pre_attn_scalar = 20.0;
    }
    REQUIRE(spec.Validate().ok());
    std::vector<Twin> params;
    std::vector<const float*> cpu_ptrs, gpu_ptrs;
    for (const LayerLayout& l : BuildLayout(spec)) {
      params.push_back(Twin::Of(b, InitParams(spec, l)));
      cpu_ptrs.push_back(params.back().c());
      gpu_ptrs.push_back(params.back().g());
    }
    auto cpu = layers::KvDecoder::Create(b.cpu.get(), spec, cpu_ptrs);
    auto gpu = layers::KvDecoder::Create(b.gpu.get(), spec, gpu_ptrs);
    REQUIRE(cpu.ok());
    REQUIRE(gpu.ok());
    std::vector<int32_t> context = {4, 40, 13, 7};
    for (int step = 0; step <= 12; ++step) {
      auto pc = (*cpu)->NextProbs(context);
      auto pg = (*gpu)->NextProbs(context);
      REQUIRE(pc.ok());
      REQUIRE(pg.ok());
      size_t bad = 0;
      for (size_t i = 0; i < pc->size(); ++i) bad += !(std::abs((*pg)[i] - (*pc)[i]) <= 1e-6 + 1e-3 * std::abs((*pc)[i]));
      INFO("context of " << context.size() << " tokens");
      CHECK(bad == 0);
      context.push_back(static_cast<int32_t>((step * 17 + 3) % spec.vocab_size));
    }
    CHECK((*gpu)->decoded_tokens() == 12);
  }
}

}  // namespace
}  // namespace l2l::gpu_test

// KV-cache decoding (kernels/layers/kv_decode.h) on the CPU backend against the full
// forward of the whole context (EmbeddingForward, BlockForward, HeadProbs of the last
// row: what sampling without a cache runs for every token), for GPT-2 and Llama (GQA
// 4/2, q/k/v biases, rotary): every next-token distribution of a growing context equals
// the full forward within atol 2e-6 / rtol 1e-4 (the two differ only in GEMM shapes and
// the attention's summation order, fp32); a context that is not an extension of the cache
// (a slid window) is prefilled again and still equal; Qwen3-style and Gemma 3 blocks with
// sliding windows too; BERT is refused.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/kv_decode.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {
namespace {

using kernels::DeviceBuffer;

ModelSpec Spec(ModelFamily family) {
  ModelSpec s;
  s.family = family;
  s.vocab_size = 61;
  s.seq_len = 24;
  s.d_model = 32;
  s.n_layer = 3;
  s.n_head = 4;
  s.d_ff = 48;
  if (family == ModelFamily::kLlama) {
    s.n_kv_heads = 2;
    s.qkv_bias = true;
    s.tied_embeddings = false;
    s.rope_theta = 500.0;  // short wavelengths, so positions matter within 24 tokens
  }
  return s;
}

// The model's weights on the backend: InitLayerParams plus U(+-0.1).
struct Model {
  ModelSpec spec;
  std::vector<LayerLayout> layouts;
  std::vector<DeviceBuffer> params;
  std::vector<const float*> ptrs;

  Model(kernels::Backend& be, const ModelSpec& s) : spec(s), layouts(BuildLayout(s)) {
    std::mt19937 rng(3);
    for (const LayerLayout& l : layouts) {
      std::vector<float> p(l.numel);
      InitLayerParams(spec, l, 11, p.data());
      for (float& x : p) x += std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
      auto b = DeviceBuffer::Create(&be, p.size() * sizeof(float));
      REQUIRE(b.ok());
      be.CopyToDevice(b->data(), p.data(), p.size() * sizeof(float));
      ptrs.push_back(b->f32());
      params.push_back(std::move(b).value());
    }
  }

  // Probabilities after `context`, by the full forward of the whole context.
  std::vector<float> FullProbs(kernels::Backend& be, const std::vector<int32_t>& context) const {
    const int64_t T = static_cast<int64_t>(context.size()), C = spec.d_model, V = spec.vocab_size;
    auto ws = LayerWorkspace::Create(&be, spec, 1, T);
    REQUIRE(ws.ok());
    auto tok = DeviceBuffer::Create(&be, T * sizeof(int32_t));
    auto a = DeviceBuffer::Create(&be, T * C * sizeof(float));
    auto b = DeviceBuffer::Create(&be, T * C * sizeof(float));
    auto probs = DeviceBuffer::Create(&be, T * V * sizeof(float));
    REQUIRE((tok.ok() && a.ok() && b.ok() && probs.ok()));
    be.CopyToDevice(tok->data(), context.data(), T * sizeof(int32_t));
    EmbeddingForward(be, spec, layouts[0], ptrs[0], tok->i32(), a->f32(), 1, T, {}, &*ws);
    float* x = a->f32();
    float* y = b->f32();
    for (int64_t l = 1; l <= spec.n_layer; ++l) {
      BlockForward(be, spec, layouts[l], ptrs[l], x, y, 1, T, *ws);
      std::swap(x, y);
    }
    const float* wte = ptrs[0] + EmbeddingTable(spec, layouts[0]).offset;
    HeadProbs(be, spec, layouts.back(), ptrs.back(), wte, x, probs->f32(), 1, T, *ws);
    std::vector<float> all(static_cast<size_t>(T * V));
    be.CopyToHost(all.data(), probs->data(), all.size() * sizeof(float));
    return std::vector<float>(all.end() - V, all.end());
  }
};

void ExpectProbsClose(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_d = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - ref[i]);
    if (!(d <= 2e-6 + 1e-4 * std::abs(double(ref[i])))) ++bad;
    if (!(d <= worst_d)) worst_d = d, worst = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside; worst [" << worst << "] " << got[worst] << " vs "
            << ref[worst]);
  CHECK(bad == 0);
}

TEST_CASE("KV-cache decoding equals the full forward of the context, token by token", "[layers][decode]") {
  auto be = kernels::CreateCpuBackend(2);
  for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    INFO("family " << ToString(family));
    const Model m(*be, Spec(family));
    auto dec = KvDecoder::Create(be.get(), m.spec, m.ptrs);
    REQUIRE(dec.ok());
    std::mt19937 rng(5);
    std::vector<int32_t> context = {3, 17, 42, 8, 0};  // a 5-token prompt: prefill
    while (static_cast<int64_t>(context.size()) <= m.spec.seq_len) {
      auto p = (*dec)->NextProbs(context);
      REQUIRE(p.ok());
      ExpectProbsClose(*p, m.FullProbs(*be, context), "context of " + std::to_string(context.size()));
      context.push_back(static_cast<int32_t>(rng() % m.spec.vocab_size));
    }
    // One prefill of 5 tokens, then one decode step per extra token: nothing recomputed.
    CHECK((*dec)->prefilled_tokens() == 5);
    CHECK((*dec)->decoded_tokens() == m.spec.seq_len - 5);

    // A slid window (the sampler's context once it exceeds seq_len) is not an extension
    // of the cache: prefilled again, equal again, and decoding continues from it.
    std::vector<int32_t> window(context.end() - 10, context.end());
    auto p = (*dec)->NextProbs(window);
    REQUIRE(p.ok());
    ExpectProbsClose(*p, m.FullProbs(*be, window), "slid window");
    CHECK((*dec)->prefilled_tokens() == 15);
    window.push_back(7);
    p = (*dec)->NextProbs(window);
    REQUIRE(p.ok());
    ExpectProbsClose(*p, m.FullProbs(*be, window), "decode after the new prefill");
    CHECK((*dec)->cached() == 11);
  }
}

// Qwen3-style blocks (q/k head norms, a head size that is not d_model / n_head) whose
// later blocks slide (window 6 of a 24-token context): the cached attention sees only the
// window, as the full forward's windowed attention does.
TEST_CASE("KV-cache decoding with q/k norms and a sliding window equals the full forward", "[layers][decode]") {
  auto be = kernels::CreateCpuBackend(2);
  ModelSpec s = Spec(ModelFamily::kLlama);
  s.qkv_bias = false;
  s.qk_norm = true;
  s.head_size = 6;
  s.sliding_window = 6;
  s.max_window_layers = 1;
  REQUIRE(s.Validate().ok());
  const Model m(*be, s);
  auto dec = KvDecoder::Create(be.get(), m.spec, m.ptrs);
  REQUIRE(dec.ok());
  std::mt19937 rng(9);
  std::vector<int32_t> context = {3, 17, 42};
  while (static_cast<int64_t>(context.size()) <= m.spec.seq_len) {
    auto p = (*dec)->NextProbs(context);
    REQUIRE(p.ok());
    ExpectProbsClose(*p, m.FullProbs(*be, context), "context of " + std::to_string(context.size()));
    context.push_back(static_cast<int32_t>(rng() % m.spec.vocab_size));
  }
  CHECK((*dec)->decoded_tokens() == m.spec.seq_len - 3);
}

// Gemma 3 blocks: (1 + w) norms, q/k norms, a query scale from query_pre_attn_scalar,
// interleaved sliding (window 5, local rotary base) and global (linear-scaled rotary)
// blocks, the embedding scaled by sqrt(C): the cached decode equals the full forward.
TEST_CASE("KV-cache decoding of Gemma 3 (sliding and global blocks) equals the full forward", "[layers][decode]") {
  auto be = kernels::CreateCpuBackend(2);
  ModelSpec s = Spec(ModelFamily::kGemma3);
  s.n_kv_heads = 2;
  s.head_size = 6;
  s.qk_norm = true;
  s.sliding_window = 5;
  s.sliding_window_pattern = 2;  // blocks 0 and 2 slide, block 1 is global
  s.rope_theta = 500.0;
  s.rope_local_theta = 100.0;
  s.query_pre_attn_scalar = 20.0;
  s.rope_scaling = {RopeScalingType::kLinear, 2.0, 1.0, 4.0, 8192};
  REQUIRE(s.Validate().ok());
  const Model m(*be, s);
  auto dec = KvDecoder::Create(be.get(), m.spec, m.ptrs);
  REQUIRE(dec.ok());
  std::mt19937 rng(13);
  std::vector<int32_t> context = {3, 17, 42, 8};
  while (static_cast<int64_t>(context.size()) <= m.spec.seq_len) {
    auto p = (*dec)->NextProbs(context);
    REQUIRE(p.ok());
    ExpectProbsClose(*p, m.FullProbs(*be, context), "context of " + std::to_string(context.size()));
    context.push_back(static_cast<int32_t>(rng() % m.spec.vocab_size));
  }
  CHECK((*dec)->prefilled_tokens() == 4);
  CHECK((*dec)->decoded_tokens() == m.spec.seq_len - 4);
}

TEST_CASE("KV-cache decoding refuses an encoder, bad contexts and ids", "[layers][decode]") {
  auto be = kernels::CreateCpuBackend(1);
  ModelSpec bert = Spec(ModelFamily::kBert);
  const Model mb(*be, bert);
  auto refused = KvDecoder::Create(be.get(), bert, mb.ptrs);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kFailedPrecondition);
  CHECK(refused.status().message().find("bert") != std::string::npos);

  const Model m(*be, Spec(ModelFamily::kGpt2));
  auto dec = KvDecoder::Create(be.get(), m.spec, m.ptrs);
  REQUIRE(dec.ok());
  CHECK_FALSE((*dec)->NextProbs({}).ok());
  CHECK_FALSE((*dec)->NextProbs(std::vector<int32_t>(m.spec.seq_len + 1, 1)).ok());
  auto bad_id = (*dec)->NextProbs({1, 61});
  REQUIRE_FALSE(bad_id.ok());
  CHECK(bad_id.status().message().find("61") != std::string::npos);
  CHECK_FALSE(KvDecoder::Create(be.get(), m.spec, {m.ptrs[0]}).ok());
  // A decoder sized for 8 positions takes contexts up to 8; beyond seq_len is refused.
  auto small = KvDecoder::Create(be.get(), m.spec, m.ptrs, 8);
  REQUIRE(small.ok());
  CHECK((*small)->NextProbs(std::vector<int32_t>(8, 1)).ok());
  CHECK_FALSE((*small)->NextProbs(std::vector<int32_t>(9, 1)).ok());
  CHECK_FALSE(KvDecoder::Create(be.get(), m.spec, m.ptrs, m.spec.seq_len + 1).ok());
}

}  // namespace
}  // namespace l2l::layers

// The attention variants and the Gemma 3 family on the CUDA backend against the CPU
// backend (the reference; the CPU itself is checked against transformers by
// tests/import/family_fixtures_test.cc): sliding-window grouped-query attention, GeGLU,
// Copy2D, then whole blocks (Qwen3: q/k norms and head_dim != C/NH; Mistral-style sliding
// windows; Gemma 3 sliding and global blocks) forward and recomputing backward, and the
// Gemma 3 embedding and head. Label gpu (emu on the emulator): fails without a GPU.
// Tolerances as tests/gpu/llama_test.cc's.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "common/model_spec.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

constexpr double kElemAtol = 1e-5, kElemRtol = 1e-4;
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

TEST_CASE("cuda sliding-window GQA forward and backward match the cpu", "[gpu][window]") {
  Backends& b = Both();
  // {B, T, NH, NKV, hs, window}: windows shorter than T (1, a few, more than a CPU strip),
  // and one >= T (the plain causal attention).
  const auto s = GENERATE(std::vector<int64_t>{2, 37, 4, 2, 16, 5}, std::vector<int64_t>{1, 150, 4, 1, 8, 70},
                          std::vector<int64_t>{1, 17, 2, 2, 8, 1}, std::vector<int64_t>{1, 20, 2, 1, 8, 64});
  const int64_t B = s[0], T = s[1], NH = s[2], NKV = s[3], hs = s[4], window = s[5];
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs;
  std::mt19937 rng(static_cast<unsigned>(B + 3 * T + 17 * NH + 71 * NKV + hs + window));
  CAPTURE(B, T, NH, NKV, hs, window);
  Twin qkv = Twin::Of(b, RandomVec(rng, B * T * W, -2.0f, 2.0f));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin att = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionForwardGqaWindow(out.c(), att.c(), qkv.c(), B, T, NH, NKV, hs, window);
  b.gpu->AttentionForwardGqaWindow(out.g(), att.g(), qkv.g(), B, T, NH, NKV, hs, window);
  ExpectTwinClose(b, out, kGemmAtol, kGemmRtol, "windowed GQA out");
  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dqkv = Twin::Of(b, RandomVec(rng, B * T * W));  // accumulates
  Twin scratch = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionBackwardGqaWindow(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, NH, NKV, hs, window);
  b.gpu->AttentionBackwardGqaWindow(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, NH, NKV, hs, window);
  ExpectTwinClose(b, dqkv, 4 * kGemmAtol, 4 * kGemmRtol, "windowed GQA dqkv");
}

TEST_CASE("cuda GeGLU forward and backward and Copy2D match the cpu", "[gpu][gemma3]") {
  Backends& b = Both();
  const int64_t N = 67, F = 45;
  std::mt19937 rng(5);
  Twin gate_up = Twin::Of(b, RandomVec(rng, N * 2 * F, -3.0f, 3.0f));
  Twin out = Twin::Of(b, RandomVec(rng, N * F));
  b.cpu->GegluForward(out.c(), gate_up.c(), N, F);
  b.gpu->GegluForward(out.g(), gate_up.g(), N, F);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "GegluForward");
  Twin dout = Twin::Of(b, RandomVec(rng, N * F));
  Twin dgu = Twin::Of(b, RandomVec(rng, N * 2 * F));  // accumulates
  b.cpu->GegluBackward(dgu.c(), dout.c(), gate_up.c(), N, F);
  b.gpu->GegluBackward(dgu.g(), dout.g(), gate_up.g(), N, F);
  ExpectTwinClose(b, dgu, kElemAtol, kElemRtol, "GegluBackward");
  Twin dst = Twin::Of(b, RandomVec(rng, N * 50));
  b.cpu->Copy2D(dst.c() + 3, 50, gate_up.c() + 7, 2 * F, N, 40);
  b.gpu->Copy2D(dst.g() + 3, 50, gate_up.g() + 7, 2 * F, N, 40);
  ExpectTwinClose(b, dst, 0.0, 0.0, "Copy2D");  // a copy: exact
}

ModelSpec Qwen3Like(int64_t window) {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 53;
  s.seq_len = 64;
  s.d_model = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_heads = 2;
  s.head_size = 12;
  s.qk_norm = true;
  s.d_ff = 40;
  s.sliding_window = window;
  return s;
}

// 3 blocks (0 slides, 2 is global) of 4 query heads of 12 on 2 key/value heads.
ModelSpec SmallGemma3() { return Gemma3Spec({.d_model = 32, .n_head = 4, .n_kv_heads = 2, .head_size = 12, .d_ff = 40}); }

// InitParams, with every 1-D tensor (norms) moved off its init so (1 + w) and the q/k
// norm weights are exercised.
std::vector<float> Perturbed(const ModelSpec& spec, const LayerLayout& layout, std::mt19937& rng) {
  std::vector<float> p = InitParams(spec, layout);
  for (const ParamInfo& t : layout.params) {
    if (t.shape.size() != 1) continue;
    for (size_t i = 0; i < t.numel; ++i) p[t.offset + i] += 0.1f * std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  return p;
}

TEST_CASE("cuda Qwen3-style block (q/k norms, head_dim != C/NH, window) matches the cpu", "[gpu][qwen3]") {
  Backends& b = Both();
  const int64_t window = GENERATE(0, 5);
  CAPTURE(window);
  const ModelSpec spec = Qwen3Like(window);
  REQUIRE(spec.Validate().ok());
  const auto layouts = BuildLayout(spec);
  std::mt19937 rng(static_cast<unsigned>(31 + window));
  ExpectBlockMatches(b, spec, layouts[1], Perturbed(spec, layouts[1], rng), 2, 24, rng);
}

TEST_CASE("cuda Gemma 3 sliding and global blocks match the cpu", "[gpu][gemma3]") {
  Backends& b = Both();
  const ModelSpec spec = SmallGemma3();
  REQUIRE(spec.Validate().ok());
  const auto layouts = BuildLayout(spec);
  const int64_t block = GENERATE(0, 2);  // block 0 slides, block 2 is global
  CAPTURE(block);
  CHECK(spec.SlidingBlock(block) == (block == 0));
  std::mt19937 rng(static_cast<unsigned>(41 + block));
  const LayerLayout& layer = layouts[1 + block];
  ExpectBlockMatches(b, spec, layer, Perturbed(spec, layer, rng), 2, 24, rng);
}

// As gpu_test_util.h's ExpectEmbeddingAndHeadMatch, with the workspace Gemma 3's
// embedding backward needs (its scratch for the sqrt(C)-scaled gradient) and the tied
// table the head reads.
TEST_CASE("cuda Gemma 3 embedding and tied head losses and gradients match the cpu", "[gpu][gemma3]") {
  Backends& b = Both();
  std::mt19937 rng(43);
  const ModelSpec spec = SmallGemma3();
  const int64_t B = 2, T = 24, C = spec.d_model;
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const LayerLayout& head = layouts.back();
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin emb_params = Twin::Of(b, InitParams(spec, emb));
  Twin head_params = Twin::Of(b, Perturbed(spec, head, rng));
  const int32_t V = static_cast<int32_t>(spec.vocab_size);
  Twin tokens = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin targets = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin hidden = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::EmbeddingForward(*b.cpu, spec, emb, emb_params.c(), tokens.ci(), hidden.c(), B, T);
  layers::EmbeddingForward(*b.gpu, spec, emb, emb_params.g(), tokens.gi(), hidden.g(), B, T);
  ExpectTwinClose(b, hidden, kElemAtol, kElemRtol, "embedding out");
  const size_t off = emb.Find("embed_tokens.weight")->offset;
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dhead = Twin::Of(b, std::vector<float>(head.numel, 0.0f));
  Twin demb = Twin::Of(b, std::vector<float>(emb.numel, 0.0f));
  const float lc = layers::HeadForwardBackward(*b.cpu, spec, head, head_params.c(), emb_params.c() + off, hidden.c(),
                                               targets.ci(), 0.5f, din.c(), dhead.c(), demb.c() + off, B, T, *ws.cpu);
  const float lg = layers::HeadForwardBackward(*b.gpu, spec, head, head_params.g(), emb_params.g() + off, hidden.g(),
                                               targets.gi(), 0.5f, din.g(), dhead.g(), demb.g() + off, B, T, *ws.gpu);
  CHECK(std::abs(lg - lc) <= 1e-5 + 1e-5 * std::abs(lc));
  ExpectTwinClose(b, din, 1e-6, 1e-3, "head din");
  ExpectTwinClose(b, dhead, 1e-6, 1e-3, "head dparams");
  layers::EmbeddingBackward(*b.cpu, spec, emb, tokens.ci(), din.c(), demb.c(), B, T, {}, nullptr, ws.cpu.get());
  layers::EmbeddingBackward(*b.gpu, spec, emb, tokens.gi(), din.g(), demb.g(), B, T, {}, nullptr, ws.gpu.get());
  ExpectTwinClose(b, demb, 1e-6, 1e-3, "embedding dparams (tied table: head + embedding)");
}

}  // namespace
}  // namespace l2l::gpu_test

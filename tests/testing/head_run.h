// RunHead: one language-model head (kernels/layers/layers.h HeadForwardBackward, a
// forward-only call and HeadProbs) run on a backend with a chosen number of logits rows
// per chunk, from inputs that depend only on the seed (so two backends, or two chunk
// sizes, see the same numbers). Used by the chunked-head tests on the CPU backend
// (tests/kernels) and on the CUDA backend (tests/gpu, the emulator in CI).
// HeadCases: one head per kind the families have: GPT-2 (tied, LayerNorm), Llama (untied
// lm_head, RMSNorm), BERT's masked-LM head (transform + tied decoder + logits bias).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::testing {

struct HeadCase {
  std::string name;
  ModelSpec spec;
  const char* tied_table;  // the embedding tensor a tied head reads; nullptr: untied
};

inline std::vector<HeadCase> HeadCases() {
  auto base = [](ModelFamily f) {
    ModelSpec s;
    s.family = f;
    s.vocab_size = 53;  // odd, so no row of logits is a multiple of a vector width
    s.seq_len = 12;
    s.d_model = 16;
    s.n_layer = 1;
    s.n_head = 4;
    s.d_ff = 40;
    return s;
  };
  HeadCase gpt2{"gpt2 (tied)", base(ModelFamily::kGpt2), "wte.weight"};
  HeadCase llama{"llama (untied)", base(ModelFamily::kLlama), nullptr};
  llama.spec.n_kv_heads = 2;
  llama.spec.tied_embeddings = false;
  HeadCase bert{"bert masked-LM (tied decoder, bias)", base(ModelFamily::kBert),
                "embeddings.word_embeddings.weight"};
  return {gpt2, llama, bert};
}

struct HeadResult {
  float loss = 0, forward_loss = 0;
  std::vector<float> din, dhead, dtable, probs;
};

inline std::vector<float> HeadRandom(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Runs the head of `c` on `be` for a (B,T) micro-batch with `head_rows` logits rows per
// chunk. A third of the targets are kIgnoreTarget (loss-masked). Parameters are the
// family's initialisation plus U(+-0.05) (so biases are not zero).
inline HeadResult RunHead(kernels::Backend& be, const HeadCase& c, int64_t B, int64_t T, int64_t head_rows,
                          uint32_t seed) {
  using kernels::DeviceBuffer;
  const ModelSpec& spec = c.spec;
  REQUIRE(spec.Validate().ok());
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const LayerLayout& head = layouts.back();
  const int64_t N = B * T, C = spec.d_model, V = spec.vocab_size;
  std::mt19937 rng(seed);
  auto params = [&](const LayerLayout& l) {
    std::vector<float> p(l.numel);
    InitLayerParams(spec, l, 42, p.data());
    for (float& x : p) x += std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng);
    return p;
  };
  const std::vector<float> emb_p = params(emb), head_p = params(head);
  std::vector<int32_t> targets(static_cast<size_t>(N));
  for (size_t i = 0; i < targets.size(); ++i) {
    targets[i] = i % 3 == 1 ? kernels::kIgnoreTarget : static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  }
  const std::vector<float> hidden = HeadRandom(rng, static_cast<size_t>(N * C), -1.0f, 1.0f);
  auto upload = [&](const void* src, size_t bytes) {
    auto b = DeviceBuffer::Create(&be, bytes);
    REQUIRE(b.ok());
    be.CopyToDevice(b->data(), src, bytes);
    return std::move(b).value();
  };
  auto zeros = [&](size_t floats) {
    std::vector<float> z(floats, 0.0f);
    return upload(z.data(), floats * sizeof(float));
  };
  auto download = [&](const DeviceBuffer& b, size_t offset, size_t floats) {
    std::vector<float> v(floats);
    be.CopyToHost(v.data(), b.f32() + offset, floats * sizeof(float));
    return v;
  };
  auto ws = layers::LayerWorkspace::Create(&be, spec, B, T, head_rows);
  REQUIRE(ws.ok());
  REQUIRE(ws->head_rows() == std::min(head_rows, N));
  REQUIRE(ws->logits.bytes() >= static_cast<size_t>(ws->head_rows() * V) * sizeof(float));
  DeviceBuffer d_emb = upload(emb_p.data(), emb_p.size() * sizeof(float));
  DeviceBuffer d_head = upload(head_p.data(), head_p.size() * sizeof(float));
  DeviceBuffer d_targets = upload(targets.data(), targets.size() * sizeof(int32_t));
  DeviceBuffer d_in = upload(hidden.data(), hidden.size() * sizeof(float));
  DeviceBuffer d_din = zeros(static_cast<size_t>(N * C));
  DeviceBuffer d_dhead = zeros(head.numel), d_demb = zeros(emb.numel);
  DeviceBuffer d_probs = zeros(static_cast<size_t>(N * V));
  size_t off = 0;
  if (c.tied_table != nullptr) {
    const ParamInfo* t = emb.Find(c.tied_table);
    REQUIRE(t != nullptr);
    off = t->offset;
  }
  const float* wte = c.tied_table != nullptr ? d_emb.f32() + off : nullptr;
  float* dwte = c.tied_table != nullptr ? d_demb.f32() + off : nullptr;
  HeadResult r;
  r.forward_loss = layers::HeadForwardBackward(be, spec, head, d_head.f32(), wte, d_in.f32(), d_targets.i32(), 0.5f,
                                               nullptr, nullptr, nullptr, B, T, *ws);
  r.loss = layers::HeadForwardBackward(be, spec, head, d_head.f32(), wte, d_in.f32(), d_targets.i32(), 0.5f,
                                       d_din.f32(), d_dhead.f32(), dwte, B, T, *ws);
  layers::HeadProbs(be, spec, head, d_head.f32(), wte, d_in.f32(), d_probs.f32(), B, T, *ws);
  r.din = download(d_din, 0, static_cast<size_t>(N * C));
  r.dhead = download(d_dhead, 0, head.numel);
  if (c.tied_table != nullptr) r.dtable = download(d_demb, off, static_cast<size_t>(V * C));
  r.probs = download(d_probs, 0, static_cast<size_t>(N * V));
  return r;
}

// |got - ref| <= atol + rtol * |ref| for every element (NaN fails); reports the worst.
inline void ExpectHeadClose(const std::vector<float>& got, const std::vector<float>& ref, double atol, double rtol,
                            const std::string& what) {
  REQUIRE(got.size() == ref.size());
  if (got.empty()) return;
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(ref[i])), lim = atol + rtol * std::abs(double(ref[i]));
    if (!(d <= lim)) ++bad;
    if (!(d - lim <= worst_excess)) worst_excess = d - lim, worst = i;
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside atol " << atol << " rtol " << rtol << "; worst ["
            << worst << "] got " << got[worst] << " ref " << ref[worst]);
  CHECK(bad == 0);
}

inline void ExpectSameHead(const HeadResult& got, const HeadResult& ref, double loss_rtol, double atol, double rtol,
                           const std::string& what) {
  INFO(what << ": loss " << got.loss << " vs " << ref.loss << ", forward-only " << got.forward_loss << " vs "
            << ref.forward_loss);
  CHECK(std::abs(got.loss - ref.loss) <= loss_rtol * std::abs(ref.loss));
  CHECK(std::abs(got.forward_loss - ref.forward_loss) <= loss_rtol * std::abs(ref.forward_loss));
  CHECK(std::abs(got.loss - got.forward_loss) <= 1e-6 * std::abs(got.forward_loss));  // with or without backward
  ExpectHeadClose(got.probs, ref.probs, atol, rtol, what + " probs");
  ExpectHeadClose(got.din, ref.din, atol, rtol, what + " din");
  ExpectHeadClose(got.dhead, ref.dhead, atol, rtol, what + " dparams");
  ExpectHeadClose(got.dtable, ref.dtable, atol, rtol, what + " dwte (tied)");
}

}  // namespace l2l::testing

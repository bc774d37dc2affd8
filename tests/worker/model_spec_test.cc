// Tests for common/model_spec: validation messages, Hugging Face GPT-2 layout (names,
// shapes, offsets, decay flags), parameter counts against GPT-2 small's published size,
// and deterministic initialisation statistics.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/model_spec.h"

namespace l2l {
namespace {

ModelSpec Gpt2Small() {
  ModelSpec s;
  s.vocab_size = 50257;
  s.seq_len = 1024;
  s.d_model = 768;
  s.n_layer = 12;
  s.n_head = 12;
  s.d_ff = 3072;
  s.tied_embeddings = true;
  return s;
}

TEST_CASE("GPT-2 small has 124,439,808 parameters with tied embeddings", "[model_spec]") {
  const ModelSpec s = Gpt2Small();
  REQUIRE(s.Validate().ok());
  // 124,439,808 is the well-known count for HF "gpt2" (tied wte/lm_head).
  CHECK(s.NumParams() == 124439808);
  size_t total = 0;
  for (const LayerLayout& l : BuildLayout(s)) total += l.numel;
  CHECK(total == 124439808u);
  ModelSpec untied = s;
  untied.tied_embeddings = false;
  CHECK(untied.NumParams() == 124439808 + 50257 * 768);
}

TEST_CASE("BuildLayout uses Hugging Face GPT-2 names, shapes and order", "[model_spec]") {
  ModelSpec s;
  s.vocab_size = 11;
  s.seq_len = 7;
  s.d_model = 8;
  s.n_layer = 3;
  s.n_head = 2;
  s.d_ff = 20;
  s.tied_embeddings = false;
  REQUIRE(s.Validate().ok());
  const auto layers = BuildLayout(s);
  REQUIRE(layers.size() == 5);
  REQUIRE(s.NumLayers() == 5);

  CHECK(layers[0].kind == LayerKind::kEmbedding);
  CHECK(layers[0].block == -1);
  REQUIRE(layers[0].params.size() == 2);
  CHECK(layers[0].params[0].name == "wte.weight");
  CHECK(layers[0].params[0].shape == std::vector<int64_t>{11, 8});
  CHECK(layers[0].params[1].name == "wpe.weight");
  CHECK(layers[0].params[1].shape == std::vector<int64_t>{7, 8});

  const std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
      {"ln_1.weight", {8}},         {"ln_1.bias", {8}},           {"attn.c_attn.weight", {8, 24}},
      {"attn.c_attn.bias", {24}},   {"attn.c_proj.weight", {8, 8}}, {"attn.c_proj.bias", {8}},
      {"ln_2.weight", {8}},         {"ln_2.bias", {8}},           {"mlp.c_fc.weight", {8, 20}},
      {"mlp.c_fc.bias", {20}},      {"mlp.c_proj.weight", {20, 8}}, {"mlp.c_proj.bias", {8}}};
  for (int i = 0; i < 3; ++i) {
    const LayerLayout& l = layers[1 + i];
    CHECK(l.kind == LayerKind::kBlock);
    CHECK(l.index == 1 + i);
    CHECK(l.block == i);
    REQUIRE(l.params.size() == block.size());
    for (size_t k = 0; k < block.size(); ++k) {
      CHECK(l.params[k].name == "h." + std::to_string(i) + "." + block[k].first);
      CHECK(l.params[k].shape == block[k].second);
      CHECK(l.params[k].decay == (block[k].second.size() == 2));
    }
  }
  const LayerLayout& head = layers[4];
  CHECK(head.kind == LayerKind::kHead);
  REQUIRE(head.params.size() == 3);
  CHECK(head.params[0].name == "ln_f.weight");
  CHECK(head.params[1].name == "ln_f.bias");
  CHECK(head.params[2].name == "lm_head.weight");
  CHECK(head.params[2].shape == std::vector<int64_t>{11, 8});
  CHECK(head.params[2].decay);
  CHECK(layers[0].params[0].decay);
  CHECK(layers[0].params[1].decay);
  CHECK_FALSE(head.params[0].decay);

  s.tied_embeddings = true;
  CHECK(BuildLayout(s).back().params.size() == 2);

  // Offsets are contiguous and numel matches the shapes.
  for (const LayerLayout& l : layers) {
    size_t off = 0;
    for (const ParamInfo& p : l.params) {
      CHECK(p.offset == off);
      size_t n = 1;
      for (int64_t d : p.shape) n *= static_cast<size_t>(d);
      CHECK(p.numel == n);
      off += n;
    }
    CHECK(l.numel == off);
  }
}

TEST_CASE("LayerLayout::Find matches full names and the suffix after h.N.", "[model_spec]") {
  ModelSpec s;
  s.n_layer = 12;
  const auto layers = BuildLayout(s);
  const LayerLayout& b11 = layers[12];
  const ParamInfo* p = b11.Find("attn.c_proj.weight");
  REQUIRE(p != nullptr);
  CHECK(p->name == "h.11.attn.c_proj.weight");
  REQUIRE(b11.Find("h.11.ln_2.bias") != nullptr);
  CHECK(b11.Find("h.11.ln_2.bias")->name == "h.11.ln_2.bias");
  CHECK(b11.Find("c_proj.weight") == nullptr);  // partial suffix is ambiguous: no match
  CHECK(b11.Find("h.1.ln_2.bias") == nullptr);  // another block's name
  CHECK(b11.Find("wte.weight") == nullptr);
  REQUIRE(layers[0].Find("wpe.weight") != nullptr);
  CHECK(layers[0].Find("wpe.weight")->offset == static_cast<size_t>(s.vocab_size * s.d_model));
  CHECK(layers.back().Find("ln_f.bias") != nullptr);
}

TEST_CASE("ModelSpec::Validate names the offending field and value", "[model_spec]") {
  ModelSpec s;
  s.d_model = 1000;
  s.n_head = 12;
  Status st = s.Validate();
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message() == "model.n_head=12 does not divide model.d_model=1000");

  struct Case {
    const char* field;
    void (*set)(ModelSpec*);
    const char* expect;
  };
  const Case cases[] = {
      {"vocab_size", [](ModelSpec* m) { m->vocab_size = 0; }, "model.vocab_size=0"},
      {"seq_len", [](ModelSpec* m) { m->seq_len = -3; }, "model.seq_len=-3"},
      {"d_model", [](ModelSpec* m) { m->d_model = 0; }, "model.d_model=0"},
      {"n_layer", [](ModelSpec* m) { m->n_layer = 0; }, "model.n_layer=0"},
      {"n_head", [](ModelSpec* m) { m->n_head = 0; }, "model.n_head=0"},
      {"d_ff", [](ModelSpec* m) { m->d_ff = -1; }, "model.d_ff=-1"},
  };
  for (const Case& c : cases) {
    ModelSpec m;
    c.set(&m);
    Status e = m.Validate();
    INFO(c.field);
    REQUIRE_FALSE(e.ok());
    CHECK(e.message().find(c.expect) != std::string::npos);
  }
  CHECK(ModelSpec().Validate().ok());
  CHECK(std::string(LayerKindName(LayerKind::kEmbedding)) == "embedding");
  CHECK(std::string(LayerKindName(LayerKind::kBlock)) == "block");
  CHECK(std::string(LayerKindName(LayerKind::kHead)) == "head");
}

// Mean and standard deviation of a view.
std::pair<double, double> Moments(const float* x, size_t n) {
  double s = 0, ss = 0;
  for (size_t i = 0; i < n; ++i) {
    s += x[i];
    ss += static_cast<double>(x[i]) * x[i];
  }
  const double mean = s / n;
  return {mean, std::sqrt(ss / n - mean * mean)};
}

TEST_CASE("InitLayerParams is deterministic and follows GPT-2's initialisation", "[model_spec]") {
  ModelSpec s;
  s.vocab_size = 512;
  s.d_model = 128;
  s.n_layer = 8;
  s.n_head = 4;
  s.d_ff = 512;
  const auto layers = BuildLayout(s);
  const LayerLayout& b = layers[3];
  std::vector<float> a(b.numel, -7.f), a2(b.numel, 3.f), other_seed(b.numel), other_layer(layers[4].numel);
  InitLayerParams(s, b, 42, a.data());
  InitLayerParams(s, b, 42, a2.data());
  CHECK(a == a2);  // bit-identical, whatever the buffer held before
  InitLayerParams(s, b, 43, other_seed.data());
  InitLayerParams(s, layers[4], 42, other_layer.data());
  const ParamInfo* w = b.Find("attn.c_attn.weight");
  CHECK(a[w->offset] != other_seed[w->offset]);
  CHECK(a[w->offset + 5] != other_layer[w->offset + 5]);

  for (const ParamInfo& p : b.params) {
    INFO(p.name);
    const float* x = a.data() + p.offset;
    if (p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight")) {
      for (size_t i = 0; i < p.numel; ++i) REQUIRE(x[i] == 1.0f);
    } else if (p.shape.size() == 1) {
      for (size_t i = 0; i < p.numel; ++i) REQUIRE(x[i] == 0.0f);
    } else {
      const auto [mean, sd] = Moments(x, p.numel);
      const double want = p.name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(2.0 * s.n_layer) : 0.02;
      // n >= 16384 samples: the sample sd is within ~1% of the true value (5 sigma ~ 3%).
      CHECK(std::abs(sd - want) < 0.03 * want);
      CHECK(std::abs(mean) < 5 * want / std::sqrt(static_cast<double>(p.numel)));
    }
  }
  // Gaussian tails: about 4.55% of N(0, sd) samples lie beyond 2 sd.
  const ParamInfo* fc = b.Find("mlp.c_fc.weight");
  size_t beyond = 0;
  for (size_t i = 0; i < fc->numel; ++i) beyond += std::abs(a[fc->offset + i]) > 0.04f;
  const double frac = static_cast<double>(beyond) / fc->numel;
  CHECK(frac > 0.040);
  CHECK(frac < 0.051);
  std::set<float> distinct(a.begin() + fc->offset, a.begin() + fc->offset + fc->numel);
  CHECK(distinct.size() > fc->numel * 99 / 100);
}

}  // namespace
}  // namespace l2l

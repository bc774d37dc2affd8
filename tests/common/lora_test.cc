// Tests for common/lora.h and the job's `lora:` section (common/config.h): the keys load
// and round-trip, a job without them is unchanged, every refusal names the key, the file
// and line and what is accepted, the LoRA layouts (Llama q..down, GPT-2's fused Conv1D
// targets) hold the adapters after an unchanged base with one contiguous trainable span,
// and the adapters start as PEFT's (A in +-1/sqrt(in), B = 0).
#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include "common/config.h"
#include "common/lora.h"
#include "tests/common/temp_dir.h"

namespace l2l {
namespace {

using testing::TempDir;

const char* kLlama = "model: {family: llama, vocab_size: 64, seq_len: 16, d_model: 32, n_layer: 2, n_head: 4, "
                     "n_kv_heads: 2, d_ff: 48, tied_embeddings: false}\n";
const char* kGpt2 = "model: {vocab_size: 64, seq_len: 16, d_model: 24, n_layer: 2, n_head: 3, d_ff: 40}\n";

Result<JobConfig> Parse(const TempDir& dir, const std::string& text) { return LoadJobConfig(dir.Write("job.yaml", text)); }

void ExpectError(const Result<JobConfig>& r, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(r.ok());
  const std::string msg = r.status().message();
  INFO("message: " << msg);
  for (const std::string& n : needles) CHECK(msg.find(n) != std::string::npos);
}

}  // namespace

TEST_CASE("lora: keys load, round-trip, and their absence changes nothing", "[config][lora]") {
  TempDir dir;
  Result<JobConfig> a = Parse(dir, std::string(kLlama) + R"(lora:
  r: 6
  alpha: 12.5
  dropout: 0.1
  target: [q_proj, v_proj, down_proj]
  base_dtype: bf16
  init_seed: 99
  modules_to_save: [lm_head]
)");
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  const LoraConfig& l = a->lora;
  CHECK(l.enabled);
  CHECK(l.r == 6);
  CHECK(l.alpha == 12.5);
  CHECK(l.dropout == 0.1);  // adapter dropout is accepted (kernels/layers/lora.h applies it)
  CHECK(l.target == std::vector<std::string>{"q_proj", "v_proj", "down_proj"});
  CHECK(l.base_dtype == LoraBaseDType::kBF16);
  CHECK(l.init_seed == 99);
  CHECK(l.modules_to_save == std::vector<std::string>{"lm_head"});
  CHECK(l.scale() == Approx(12.5 / 6));
  const std::string text = JobConfigToYaml(*a);
  Result<JobConfig> b = ParseJobConfig(text, "<roundtrip>");
  INFO(text);
  REQUIRE(b.ok());
  CHECK(b->lora == l);

  // Defaults: `lora: {}` is r 8, alpha 16, all-linear, fp32 base.
  Result<JobConfig> d = Parse(dir, std::string(kGpt2) + "lora: {}\n");
  REQUIRE(d.ok());
  CHECK(d->lora.enabled);
  CHECK(d->lora.r == 8);
  CHECK(d->lora.target == std::vector<std::string>{"all-linear"});
  CHECK(d->lora.base_dtype == LoraBaseDType::kF32);
  CHECK(Parse(dir, std::string(kGpt2) + "lora: {target: all-linear}\n").ok());

  // --set overrides reach the section (and add it): lora.r, a target list.
  JobConfig o = *d;
  o.lora = LoraConfig{};
  REQUIRE(ApplyOverride(&o, "lora.r=4").ok());
  CHECK(o.lora.enabled);
  CHECK(o.lora.r == 4);
  REQUIRE(ApplyOverride(&o, "lora.target=[c_attn, c_fc]").ok());
  CHECK(o.lora.target == std::vector<std::string>{"c_attn", "c_fc"});
  CHECK(o.lora.r == 4);
  CHECK_FALSE(ApplyOverride(&o, "lora.r=-1").ok());

  // Without the section: no lora, and the written YAML has no lora key.
  Result<JobConfig> n = Parse(dir, kGpt2);
  REQUIRE(n.ok());
  CHECK_FALSE(n->lora.enabled);
  CHECK(JobConfigToYaml(*n).find("lora") == std::string::npos);
  CHECK(BuildLoraLayout(n->model, n->lora).size() == BuildLayout(n->model).size());
  for (const LayerLayout& layer : BuildLoraLayout(n->model, n->lora)) {
    CHECK(TrainableRange(layer).offset == 0);
    CHECK(TrainableRange(layer).numel == layer.numel);
    CHECK(layer.lora_r == 0);
  }
}

TEST_CASE("lora: bad values are refused naming the key, the line and what is accepted", "[config][lora]") {
  TempDir dir;
  const std::string file = dir.File("job.yaml");
  const std::string llama = kLlama, gpt2 = kGpt2;
  ExpectError(Parse(dir, llama + "lora:\n  r: 0\n"), {file + ":3", "lora.r=0", "> 0"});
  ExpectError(Parse(dir, llama + "lora:\n  alpha: -2\n"), {file + ":3", "lora.alpha=-2", "> 0"});
  ExpectError(Parse(dir, llama + "lora:\n  dropout: 1\n"), {file + ":3", "lora.dropout=1", "[0, 1)"});
  ExpectError(Parse(dir, llama + "lora:\n  dropout: -0.1\n"), {file + ":3", "lora.dropout=-0.1", "[0, 1)"});
  ExpectError(Parse(dir, llama + "lora:\n  target: [q_proj, qkv]\n"),
              {file + ":3", "lora.target", "no module \"qkv\"", "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                                                  "down_proj"});
  ExpectError(Parse(dir, gpt2 + "lora:\n  target: [q_proj]\n"), {"no module \"q_proj\"", "c_attn, c_proj, c_fc"});
  ExpectError(Parse(dir, llama + "lora:\n  target: [all-linear, q_proj]\n"), {"all-linear stands alone"});
  ExpectError(Parse(dir, llama + "lora:\n  target: []\n"), {"lora.target=[]"});
  for (const std::string q : {"q4", "q8"}) {  // block-quantized bases (common/lora_frozen.h)
    const Result<JobConfig> r = Parse(dir, llama + "lora:\n  base_dtype: " + q + "\n");
    INFO(r.status().ToString());
    CHECK(r.ok());
  }
  ExpectError(Parse(dir, llama + "lora:\n  base_dtype: int3\n"), {file + ":3", "lora.base_dtype", "bf16, fp32, q4"});
  ExpectError(Parse(dir, gpt2 + "lora:\n  modules_to_save: [lm_head]\n"),
              {"lora.modules_to_save", "\"lm_head\"", "tied", "wte"});
  ExpectError(Parse(dir, llama + "lora:\n  modules_to_save: [encoder]\n"), {"no \"encoder\"", "embed_tokens"});
  ExpectError(Parse(dir, llama + "lora:\n  rank: 4\n"), {file + ":3", "lora.rank"});
  ExpectError(Parse(dir, llama + "lora:\n  target: {q: 1}\n"), {"lora.target", "list of names"});
  ExpectError(Parse(dir, "model: {family: bert, vocab_size: 64, seq_len: 16, d_model: 24, n_layer: 1, n_head: 3, "
                         "d_ff: 40}\nlora: {}\n"),
              {"bert family has no LoRA support"});
}

TEST_CASE("LoRA layouts: adapters after an unchanged base, one trainable span", "[lora]") {
  ModelSpec spec;
  spec.family = ModelFamily::kLlama;
  spec.vocab_size = 64;
  spec.seq_len = 16;
  spec.d_model = 32;
  spec.n_layer = 2;
  spec.n_head = 4;
  spec.n_kv_heads = 2;
  spec.d_ff = 48;
  spec.tied_embeddings = false;
  REQUIRE(spec.Validate().ok());
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 3;
  lora.alpha = 6;
  lora.modules_to_save = {"lm_head"};
  REQUIRE(ValidateLora(spec, lora).ok());
  const std::vector<LayerLayout> base = BuildLayout(spec), lo = BuildLoraLayout(spec, lora);
  REQUIRE(lo.size() == base.size());
  const int64_t C = 32, F = 48, kv = 16, r = 3;
  // q (32x32), k, v (16x32), o (32x32), gate, up (48x32), down (32x48): r*(in+out) each.
  const size_t adapters = static_cast<size_t>(r * ((C + C) + 2 * (C + kv) + (C + C) + 2 * (C + F) + (F + C)));
  for (size_t l = 0; l < lo.size(); ++l) {
    INFO("layer " << l);
    CHECK(BaseNumel(lo[l]) == base[l].numel);
    for (size_t k = 0; k < base[l].params.size(); ++k) {
      CHECK(lo[l].params[k].name == base[l].params[k].name);
      CHECK(lo[l].params[k].offset == base[l].params[k].offset);
    }
    const TrainableSpan s = TrainableRange(lo[l]);
    CHECK(s.numel == TrainableNumel(lo[l]));
    if (lo[l].kind == LayerKind::kBlock) {
      CHECK(lo[l].lora_r == 3);
      CHECK(lo[l].lora_scale == 2.0f);
      CHECK(s.offset == base[l].numel);
      CHECK(s.numel == adapters);
      const ParamInfo* a = lo[l].Find("self_attn.k_proj.lora_A.weight");
      const ParamInfo* b = lo[l].Find("self_attn.k_proj.lora_B.weight");
      REQUIRE(a != nullptr);
      REQUIRE(b != nullptr);
      CHECK(a->shape == std::vector<int64_t>{r, C});
      CHECK(b->shape == std::vector<int64_t>{kv, r});
    } else if (lo[l].kind == LayerKind::kEmbedding) {
      CHECK(s.numel == 0);  // frozen
    } else {  // head: norm frozen, lm_head trained in full
      const ParamInfo* head = lo[l].Find("lm_head.weight");
      REQUIRE(head != nullptr);
      CHECK(s.offset == head->offset);
      CHECK(s.numel == head->numel);
    }
  }

  // GPT-2: "c_proj" is both projections; c_attn is the fused (in C, out 3C) Conv1D.
  ModelSpec g;
  LoraConfig gl;
  gl.enabled = true;
  gl.r = 2;
  gl.target = {"c_attn", "c_proj"};
  REQUIRE(ValidateLora(g, gl).ok());
  const std::vector<LayerLayout> gs = BuildLoraLayout(g, gl);
  const LayerLayout& blk = gs[1];
  CHECK(blk.Find("attn.c_attn.lora_A.weight")->shape == std::vector<int64_t>{2, g.d_model});
  CHECK(blk.Find("attn.c_attn.lora_B.weight")->shape == std::vector<int64_t>{3 * g.d_model, 2});
  CHECK(blk.Find("attn.c_proj.lora_A.weight") != nullptr);
  CHECK(blk.Find("mlp.c_proj.lora_A.weight")->shape == std::vector<int64_t>{2, g.d_ff});
  CHECK(blk.Find("mlp.c_fc.lora_A.weight") == nullptr);
}

TEST_CASE("LoRA adapters start as PEFT's: A uniform in +-1/sqrt(in) from init_seed, B zero", "[lora]") {
  ModelSpec spec;
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 4;
  lora.init_seed = 7;
  const std::vector<LayerLayout> lo = BuildLoraLayout(spec, lora);
  const LayerLayout& blk = lo[2];
  std::vector<float> a(blk.numel, 5.0f), b(blk.numel, 5.0f), c(blk.numel, 5.0f);
  InitLoraAdapters(lora, blk, a.data());
  InitLoraAdapters(lora, blk, b.data());
  lora.init_seed = 8;
  InitLoraAdapters(lora, blk, c.data());
  CHECK(a == b);
  CHECK(a != c);
  for (const ParamInfo& p : blk.params) {
    INFO(p.name);
    const bool is_a = p.name.find(".lora_A.") != std::string::npos;
    const bool is_b = p.name.find(".lora_B.") != std::string::npos;
    double lo_v = 1e9, hi_v = -1e9;
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
      lo_v = std::min(lo_v, double(a[i]));
      hi_v = std::max(hi_v, double(a[i]));
    }
    if (is_b) {
      CHECK(lo_v == 0.0);
      CHECK(hi_v == 0.0);
    } else if (is_a) {
      const double bound = 1.0 / std::sqrt(double(p.shape[1]));
      CHECK(lo_v >= -bound);
      CHECK(hi_v < bound);
      CHECK(hi_v - lo_v > bound);  // spread over the interval, not a constant
    } else {
      CHECK(lo_v == 5.0);  // the base is untouched
      CHECK(hi_v == 5.0);
    }
  }
}

}  // namespace l2l

// The model-family registry (common/models/, common/model_spec.h): the Llama layout's
// Hugging Face names, shapes and adjacency, parameter counts against the layout, YAML and
// JSON round trips of the family fields, config.json mapping both ways, and the clear
// refusals (sliding windows, unknown architectures, GPT-2 given Llama-only fields).
#include <algorithm>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/formats/model_io.h"
#include "common/formats/safetensors.h"
#include "common/model_spec.h"
#include "common/models/registry.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/jobs.h"

namespace l2l {
namespace {

ModelSpec SmallLlama() {
  ModelSpec s = testing::LlamaModel({50, 32, 24, 2, 6, 2, 40});
  s.qkv_bias = true;
  s.rope_theta = 5e5;
  s.rms_norm_eps = 1e-5;
  s.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 8192};
  return s;
}

void ExpectError(const Status& st, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(st.ok());
  INFO("message: " << st.message());
  for (const std::string& n : needles) CHECK(st.message().find(n) != std::string::npos);
}

TEST_CASE("A Llama spec lays out Hugging Face names with q|k|v and gate|up adjacent",
          "[model_spec][llama]") {
  const ModelSpec s = SmallLlama();
  REQUIRE(s.Validate().ok());
  const auto layers = BuildLayout(s);
  REQUIRE(layers.size() == 4);
  CHECK(s.LayerKinds() == std::vector<LayerKind>{LayerKind::kEmbedding, LayerKind::kBlock, LayerKind::kBlock,
                                                 LayerKind::kHead});
  REQUIRE(layers[0].params.size() == 1);
  CHECK(layers[0].params[0].name == "embed_tokens.weight");
  CHECK(EmbeddingTable(s, layers[0]).shape == std::vector<int64_t>{50, 24});
  CHECK(HfTensorName(s, layers[0].params[0]) == "model.embed_tokens.weight");
  const LayerLayout& b = layers[2];
  const auto* q = b.Find("self_attn.q_proj.weight");
  const auto* k = b.Find("self_attn.k_proj.weight");
  const auto* v = b.Find("self_attn.v_proj.weight");
  REQUIRE((q && k && v));
  CHECK(q->name == "layers.1.self_attn.q_proj.weight");
  CHECK(q->shape == std::vector<int64_t>{24, 24});
  CHECK(k->shape == std::vector<int64_t>{8, 24});  // 2 kv heads of 4
  CHECK(k->offset == q->offset + q->numel);
  CHECK(v->offset == k->offset + k->numel);
  const auto* qb = b.Find("self_attn.q_proj.bias");
  const auto* kb = b.Find("self_attn.k_proj.bias");
  REQUIRE((qb && kb));
  CHECK(kb->offset == qb->offset + qb->numel);
  const auto* gate = b.Find("mlp.gate_proj.weight");
  const auto* up = b.Find("mlp.up_proj.weight");
  REQUIRE((gate && up));
  CHECK(up->offset == gate->offset + gate->numel);
  CHECK(b.Find("mlp.down_proj.weight")->shape == std::vector<int64_t>{24, 40});
  CHECK(b.Find("self_attn.o_proj.weight")->decay);
  CHECK_FALSE(b.Find("input_layernorm.weight")->decay);
  CHECK(HfTensorName(s, *gate) == "model.layers.1.mlp.gate_proj.weight");
  CHECK(layers[3].Find("norm.weight") != nullptr);
  CHECK(HfTensorName(s, *layers[3].Find("lm_head.weight")) == "lm_head.weight");

  for (bool tied : {true, false}) {
    for (bool bias : {true, false}) {
      ModelSpec t = s;
      t.tied_embeddings = tied;
      t.qkv_bias = bias;
      int64_t total = 0;
      for (const LayerLayout& l : BuildLayout(t)) total += static_cast<int64_t>(l.numel);
      CHECK(t.NumParams() == total);
    }
  }
  CHECK(s.TrainFlopsPerToken(32) > 6.0 * 2 * (24 * 40 * 3));
}

TEST_CASE("Llama init: norms 1, biases 0, weights N(0, 0.02), reproducible", "[model_spec][llama]") {
  const ModelSpec s = SmallLlama();
  const auto layers = BuildLayout(s);
  std::vector<float> a(layers[1].numel), b(layers[1].numel);
  InitLayerParams(s, layers[1], 5, a.data());
  InitLayerParams(s, layers[1], 5, b.data());
  CHECK(a == b);
  const ParamInfo* n = layers[1].Find("input_layernorm.weight");
  const ParamInfo* bias = layers[1].Find("self_attn.v_proj.bias");
  const ParamInfo* w = layers[1].Find("mlp.up_proj.weight");
  for (size_t i = 0; i < n->numel; ++i) CHECK(a[n->offset + i] == 1.0f);
  for (size_t i = 0; i < bias->numel; ++i) CHECK(a[bias->offset + i] == 0.0f);
  double ss = 0;
  for (size_t i = 0; i < w->numel; ++i) ss += double(a[w->offset + i]) * a[w->offset + i];
  CHECK(std::sqrt(ss / double(w->numel)) == Approx(0.02).epsilon(0.1));
}

TEST_CASE("Family fields survive YAML and JSON round trips - bad ones are named",
          "[model_spec][config][llama]") {
  JobConfig job;
  job.model = SmallLlama();
  auto back = ParseJobConfig(JobConfigToYaml(job), "<test>");
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(back->model == job.model);
  auto spec = ModelSpecFromJson(ModelSpecToJson(job.model));
  REQUIRE(spec.ok());
  CHECK(*spec == job.model);
  // A GPT-2 spec's JSON has no family key (files from before families read the same).
  CHECK(ModelSpecToJson(ModelSpec{}).find("family") == std::string::npos);

  const std::string base = "model:\n  vocab_size: 50\n  d_model: 24\n  n_head: 6\n";
  auto ok = ParseJobConfig(base + "  family: llama\n  n_kv_heads: 3\n  rope_scaling:\n    type: linear\n    factor: 2\n",
                           "<yaml>");
  INFO(ok.status().ToString());
  REQUIRE(ok.ok());
  CHECK(ok->model.family == ModelFamily::kLlama);
  CHECK(ok->model.kv_heads() == 3);
  CHECK(ok->model.rope_scaling.type == RopeScalingType::kLinear);
  CHECK(ok->model.rope_scaling.factor == 2.0);
  JobConfig over;
  REQUIRE(ApplyOverride(&over, "model.family=llama").ok());
  REQUIRE(ApplyOverride(&over, "model.rope_scaling={type: linear, factor: 3}").ok());
  CHECK(over.model.family == ModelFamily::kLlama);
  CHECK(over.model.rope_scaling.factor == 3.0);
  ExpectError(ApplyOverride(&over, "model.family=gpt3"), {"gpt3"});
  CHECK(over.model.family == ModelFamily::kLlama);
  ExpectError(ParseJobConfig(base + "  family: bert2\n", "<yaml>").status(), {"model.family", "bert2", "gpt2, llama"});
  ExpectError(ParseJobConfig(base + "  family: llama\n  n_kv_heads: 4\n", "<yaml>").status(),
              {"n_kv_heads=4", "n_head=6"});
  ExpectError(ParseJobConfig(base + "  n_kv_heads: 2\n", "<yaml>").status(), {"n_kv_heads", "family=llama"});
  ExpectError(ParseJobConfig(base + "  family: llama\n  rope_scaling:\n    type: yarn\n", "<yaml>").status(),
              {"rope_scaling.type", "yarn"});
  ExpectError(ParseJobConfig(base + "  family: llama\n  rope_scaling:\n    kind: linear\n", "<yaml>").status(),
              {"kind"});
}

TEST_CASE("The Llama presets load - SmolLM2-135M has transformers' parameter count",
          "[model_spec][config][llama]") {
  const std::string models = std::string(L2L_SOURCE_DIR) + "/configs/models/";
  auto smol = LoadJobConfig(models + "smollm2-135m.yaml");
  INFO(smol.status().ToString());
  REQUIRE(smol.ok());
  CHECK(smol->model.family == ModelFamily::kLlama);
  // sum(p.numel() for p in LlamaForCausalLM(config).parameters()), transformers 4.46.3.
  CHECK(smol->model.NumParams() == 134515008);
  auto tiny = LoadJobConfig(models + "llama-tiny.yaml");
  INFO(tiny.status().ToString());
  REQUIRE(tiny.ok());
  CHECK(tiny->model.kv_heads() == 2);
}

// The parameter count of a Llama-family shape from its dimensions alone (the oracle of
// the next test; ModelSpec::NumParams counts through the family's layout): embedding,
// per block q/k/v/o (+ q/k/v biases), gate/up/down and two RMSNorms, the final norm, and
// an untied head.
int64_t LlamaCountFromShapes(int64_t V, int64_t C, int64_t L, int64_t H, int64_t KV, int64_t F, bool bias,
                             bool tied) {
  const int64_t hd = C / H, kv = KV * hd;
  const int64_t block = C * C + 2 * C * kv + C * C + (bias ? C + 2 * kv : 0) + 3 * C * F + 2 * C;
  return V * C + L * block + C + (tied ? 0 : V * C);
}

TEST_CASE("The 7B-class presets have Hugging Face's shapes and parameter counts", "[model_spec][config][llama]") {
  const std::string models = std::string(L2L_SOURCE_DIR) + "/configs/models/";
  struct Want {
    const char* preset;
    int64_t V, C, L, H, KV, F;
    bool bias, tied;
    double theta, eps;
    RopeScalingType rope;
    int64_t hf_params;  // sum(p.numel()) of the Hugging Face model card's checkpoint
  };
  const Want wants[] = {
      {"qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, true, false, 1e6, 1e-6, RopeScalingType::kNone, 7615616512},
      {"qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 8960, true, true, 1e6, 1e-6, RopeScalingType::kNone, 1543714304},
      {"llama-3.1-8b", 128256, 4096, 32, 32, 8, 14336, false, false, 5e5, 1e-5, RopeScalingType::kLlama3,
       8030261248},
  };
  for (const Want& w : wants) {
    INFO(w.preset);
    auto cfg = LoadJobConfig(models + w.preset + ".yaml");
    INFO(cfg.status().ToString());
    REQUIRE(cfg.ok());
    const ModelSpec& s = cfg->model;
    CHECK(s.family == ModelFamily::kLlama);
    CHECK(s.vocab_size == w.V);
    CHECK(s.d_model == w.C);
    CHECK(s.n_layer == w.L);
    CHECK(s.n_head == w.H);
    CHECK(s.kv_heads() == w.KV);
    CHECK(s.d_ff == w.F);
    CHECK(s.qkv_bias == w.bias);
    CHECK(s.tied_embeddings == w.tied);
    CHECK(s.rope_theta == w.theta);
    CHECK(s.rms_norm_eps == w.eps);
    CHECK(s.rope_scaling.type == w.rope);
    CHECK(s.d_model / s.n_head == 128);
    CHECK(LlamaCountFromShapes(w.V, w.C, w.L, w.H, w.KV, w.F, w.bias, w.tied) == w.hf_params);
    CHECK(s.NumParams() == w.hf_params);
    // config.json as transformers writes it: the architecture and the fields it reads.
    const nlohmann::json c = models::Family(s.family).to_hf_config(s);
    CHECK(c["architectures"][0] == (w.bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    CHECK(c["num_key_value_heads"] == w.KV);
    CHECK(c["tie_word_embeddings"] == w.tied);
  }
  const ModelSpec llama = LoadJobConfig(models + "llama-3.1-8b.yaml")->model;
  CHECK(llama.rope_scaling.factor == 8.0);
  CHECK(llama.rope_scaling.low_freq_factor == 1.0);
  CHECK(llama.rope_scaling.high_freq_factor == 4.0);
  CHECK(llama.rope_scaling.original_max_position_embeddings == 8192);
  const nlohmann::json c = models::Family(llama.family).to_hf_config(llama);
  CHECK(c["rope_scaling"]["rope_type"] == "llama3");
  CHECK(c["rope_scaling"]["factor"] == 8.0);
}

TEST_CASE("Hugging Face config.json maps to a spec and back - sliding windows as transformers 4.57 reads them",
          "[model_spec][llama]") {
  const ModelSpec s = SmallLlama();
  const nlohmann::json c = models::Family(s.family).to_hf_config(s);
  CHECK(c["architectures"][0] == "Qwen2ForCausalLM");  // q/k/v biases
  auto back = models::SpecFromHfConfig(c, "config.json");
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(*back == s);
  ModelSpec g;
  auto gb = models::SpecFromHfConfig(models::Family(g.family).to_hf_config(g), "gpt2/config.json");
  REQUIRE(gb.ok());
  CHECK(*gb == g);

  const nlohmann::json smol = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
    "max_position_embeddings": 8192, "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 100000,
    "tie_word_embeddings": true, "vocab_size": 49152, "hidden_act": "silu"})");
  auto sm = models::SpecFromHfConfig(smol, "smol/config.json");
  REQUIRE(sm.ok());
  CHECK(sm->kv_heads() == 3);
  CHECK(sm->tied_embeddings);
  CHECK(sm->rope_theta == 100000.0);

  nlohmann::json mistral = smol;
  mistral["architectures"] = {"MistralForCausalLM"};
  // Mistral: every block slides (a window as long as the context is none).
  mistral["sliding_window"] = 4096;
  auto ms = models::SpecFromHfConfig(mistral, "m/config.json");
  REQUIRE(ms.ok());
  CHECK(ms->sliding_window == 4096);
  CHECK(ms->SlidingBlock(0));
  CHECK(models::Family(ms->family).to_hf_config(*ms)["architectures"][0] == "MistralForCausalLM");
  mistral["sliding_window"] = 8192;
  CHECK(models::SpecFromHfConfig(mistral, "m/config.json")->sliding_window == 0);
  mistral["sliding_window"] = nullptr;
  CHECK(models::SpecFromHfConfig(mistral, "m/config.json").ok());
  // Qwen2: use_sliding_window, the blocks from max_window_layers on (Qwen2Config's
  // defaults: sliding_window 4096, max_window_layers 28); layer_types must agree.
  nlohmann::json qwen = smol;
  qwen["architectures"] = {"Qwen2ForCausalLM"};
  qwen["use_sliding_window"] = true;
  auto qw = models::SpecFromHfConfig(qwen, "q/config.json");
  REQUIRE(qw.ok());
  CHECK(qw->sliding_window == 4096);
  CHECK(qw->max_window_layers == 28);
  CHECK_FALSE(qw->SlidingBlock(27));
  CHECK(qw->SlidingBlock(28));
  qwen["sliding_window"] = 0;
  ExpectError(models::SpecFromHfConfig(qwen, "q/config.json").status(), {"q/config.json", "sliding_window=0"});
  qwen["sliding_window"] = 1024;
  qwen["layer_types"] = nlohmann::json::array();
  for (int i = 0; i < 30; ++i) qwen["layer_types"].push_back(i % 2 ? "sliding_attention" : "full_attention");
  ExpectError(models::SpecFromHfConfig(qwen, "q/config.json").status(), {"layer_types[1]", "not supported"});
  qwen.erase("layer_types");
  qwen["use_sliding_window"] = false;
  auto qs = models::SpecFromHfConfig(qwen, "q/config.json");
  REQUIRE(qs.ok());
  CHECK(qs->qkv_bias);
  nlohmann::json t5 = smol;
  t5["architectures"] = {"T5ForConditionalGeneration"};
  ExpectError(models::SpecFromHfConfig(t5, "t/config.json").status(),
              {"T5ForConditionalGeneration", "LlamaForCausalLM", "BertForMaskedLM"});
  nlohmann::json yarn = smol;
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectError(models::SpecFromHfConfig(yarn, "y/config.json").status(), {"yarn", "not supported"});
}

TEST_CASE("A Llama model saves under Hugging Face names and loads back, with or without the prefix",
          "[model_spec][model_io][llama]") {
  testing::TempDir dir;
  const ModelSpec s = SmallLlama();
  std::vector<std::vector<float>> layers;
  for (const LayerLayout& l : BuildLayout(s)) {
    layers.emplace_back(l.numel);
    InitLayerParams(s, l, 3, layers.back().data());
  }
  const std::string path = dir.File("llama.safetensors");
  REQUIRE(SaveModel(path, s, layers).ok());
  auto r = SafeTensorsReader::Open(path);
  REQUIRE(r.ok());
  std::vector<std::string> names;
  std::vector<TensorToWrite> bare;  // the same tensors without "model."
  for (const SafeTensorInfo& t : r->tensors()) names.push_back(t.name);
  CHECK(std::find(names.begin(), names.end(), "model.embed_tokens.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "model.layers.1.mlp.down_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "lm_head.weight") != names.end());
  auto m = LoadModel(path);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(m->spec == s);
  CHECK(m->layers == layers);

  // Our names without the prefix load too; a missing tensor is named.
  std::vector<std::vector<float>> data;
  for (const SafeTensorInfo& t : r->tensors()) {
    data.emplace_back(t.numel());
    REQUIRE(r->ReadAsFloat(t.name, data.back().data(), data.back().size()).ok());
  }
  for (size_t i = 0; i < r->tensors().size(); ++i) {
    const SafeTensorInfo& t = r->tensors()[i];
    const std::string n = t.name.rfind("model.", 0) == 0 ? t.name.substr(6) : t.name;
    bare.push_back({n, t.shape, DType::kF32, data[i].data()});
  }
  const std::string bare_path = dir.File("bare.safetensors");
  REQUIRE(WriteSafeTensors(bare_path, bare, {{"format", "pt"}}).ok());
  auto loaded = LoadModel(bare_path, s);
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  CHECK(loaded->layers == layers);
  bare.erase(std::remove_if(bare.begin(), bare.end(),
                            [](const TensorToWrite& t) { return t.name == "layers.0.self_attn.k_proj.weight"; }),
             bare.end());
  REQUIRE(WriteSafeTensors(bare_path, bare, {{"format", "pt"}}).ok());
  auto missing = LoadModel(bare_path, s);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("layers.0.self_attn.k_proj.weight") != std::string::npos);
}

}  // namespace
}  // namespace l2l

// Tests for common/model_spec_table.h, the one description of ModelSpec's fields: every
// shipped preset and a spec of every family (with each family field off its default)
// survives YAML (JobConfigToYaml -> ParseJobConfig), the JSON of model files and
// checkpoints (ModelSpecToJson -> ModelSpecFromJson) and the family's Hugging Face
// config.json (to_hf_config -> SpecFromHfConfig); every row reaches a distinct ModelSpec
// member that `==` sees; the comparisons behind `model.from` honour the effective value
// (n_kv_heads 0 = n_head) and the group selector (rope_scaling.type none).
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/formats/model_io.h"
#include "common/model_spec_table.h"
#include "common/models/registry.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;

const std::string kConfigs = std::string(L2L_SOURCE_DIR) + "/configs";

ModelSpec Shape(int64_t V, int64_t T, int64_t C, int64_t L, int64_t NH, int64_t F, bool tied) {
  ModelSpec s;
  s.vocab_size = V;
  s.seq_len = T;
  s.d_model = C;
  s.n_layer = L;
  s.n_head = NH;
  s.d_ff = F;
  s.tied_embeddings = tied;
  return s;
}

// A spec of each family with every field the family reads off its default (where the
// family allows it), so a field dropped from a writer or reader changes the round trip.
std::vector<ModelSpec> FamilySpecs() {
  ModelSpec gpt2 = Shape(1000, 48, 64, 3, 4, 200, false);
  ModelSpec llama = Shape(320, 96, 96, 2, 6, 160, false);
  llama.family = ModelFamily::kLlama;
  llama.n_kv_heads = 2;
  llama.rope_theta = 500000.0;
  llama.rms_norm_eps = 1e-5;
  llama.qkv_bias = true;
  llama.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.5, 3.0, 64};
  ModelSpec llama_linear = llama;
  llama_linear.qkv_bias = false;
  llama_linear.rope_scaling = {RopeScalingType::kLinear, 2.0, 1.0, 4.0, 8192};
  ModelSpec bert = Shape(300, 40, 64, 2, 4, 128, true);
  bert.family = ModelFamily::kBert;
  bert.type_vocab_size = 3;
  bert.layer_norm_eps = 1e-7;
  ModelSpec bert_cls = bert;
  bert_cls.num_labels = 5;
  bert_cls.tied_embeddings = false;
  ModelSpec mixtral = llama_linear;  // MixtralForCausalLM: a mixture of experts
  mixtral.num_experts = 4;
  mixtral.experts_per_token = 2;
  mixtral.router_aux_loss_coef = 0.02;
  mixtral.output_router_logits = true;
  // Qwen3: q/k norms, a head size that is not d_model / n_head, a sliding window from
  // block 1 on; Mistral: a window in every block.
  ModelSpec qwen3 = Shape(320, 96, 96, 2, 6, 160, false);
  qwen3.family = ModelFamily::kLlama;
  qwen3.n_kv_heads = 2;
  qwen3.head_size = 24;
  qwen3.qk_norm = true;
  qwen3.sliding_window = 32;
  qwen3.max_window_layers = 1;
  qwen3.rope_theta = 1e6;
  ModelSpec mistral = llama_linear;
  mistral.sliding_window = 40;
  ModelSpec gemma3 = Shape(300, 96, 64, 4, 4, 128, true);
  gemma3.family = ModelFamily::kGemma3;
  gemma3.n_kv_heads = 2;
  gemma3.head_size = 24;
  gemma3.qk_norm = true;
  gemma3.sliding_window = 16;
  gemma3.sliding_window_pattern = 2;
  gemma3.rope_theta = 1e6;
  gemma3.rope_local_theta = 5000.0;
  gemma3.query_pre_attn_scalar = 20.0;
  gemma3.rope_scaling = {RopeScalingType::kLinear, 8.0, 1.0, 4.0, 8192};
  return {gpt2, llama, llama_linear, bert, bert_cls, mixtral, qwen3, mistral, gemma3};
}

std::vector<ModelSpec> PresetSpecs() {
  std::vector<ModelSpec> specs;
  for (const auto& e : fs::directory_iterator(kConfigs + "/models")) {
    if (e.path().extension() != ".yaml") continue;
    INFO(e.path().string());
    Result<JobConfig> cfg = LoadJobConfig(e.path().string());
    REQUIRE(cfg.ok());
    specs.push_back(cfg->model);
  }
  REQUIRE(specs.size() >= 9);
  return specs;
}

TEST_CASE("Every preset and family spec survives the YAML and JSON the table writes", "[config][spec]") {
  std::vector<ModelSpec> specs = PresetSpecs();
  for (const ModelSpec& s : FamilySpecs()) specs.push_back(s);
  for (const ModelSpec& s : specs) {
    REQUIRE(s.Validate().ok());
    const std::string json = ModelSpecToJson(s);
    INFO(json);
    Result<ModelSpec> back = ModelSpecFromJson(json);
    REQUIRE(back.ok());
    CHECK(*back == s);

    JobConfig job;
    job.model = s;
    job.train.seq_len = 0;
    const std::string yaml = JobConfigToYaml(job);
    INFO(yaml);
    Result<JobConfig> parsed = ParseJobConfig(yaml, "<roundtrip>");
    REQUIRE(parsed.ok());
    CHECK(parsed->model == s);
    // Only the fields the family reads are written.
    for (const SpecField& f : SpecFields()) {
      if (FamilyUses(s, f)) continue;
      const std::string leaf(SpecLeaf(f));
      CHECK(yaml.find(" " + leaf + ":") == std::string::npos);
    }
  }
}

TEST_CASE("Every family's spec survives its Hugging Face config.json", "[config][spec]") {
  std::vector<ModelSpec> specs = FamilySpecs();
  for (const ModelSpec& s : PresetSpecs()) specs.push_back(s);
  std::set<ModelFamily> seen;
  for (const ModelSpec& s : specs) {
    // The hub's llama3 rope scaling and Qwen2's always-on biases are what config.json can
    // say; our linear-scaled Llama without biases is LlamaForCausalLM.
    const nlohmann::json hf = models::Family(s.family).to_hf_config(s);
    INFO(hf.dump());
    Result<ModelSpec> back = models::SpecFromHfConfig(hf, "<config.json>");
    REQUIRE(back.ok());
    CHECK(*back == s);
    seen.insert(s.family);
  }
  CHECK(seen.size() == models::AllFamilies().size());
}

TEST_CASE("Every table row reaches its own ModelSpec member", "[config][spec]") {
  std::set<void*> members;
  ModelSpec probe;
  for (const SpecField& f : SpecFields()) {
    INFO(f.key);
    CHECK(members.insert(f.member(&probe)).second);  // no two rows share a member
    CHECK(FindSpecField(f.key) == &f);
    CHECK(std::string(f.doc).size() > 0);
    // Changing the member through the row is seen by operator== and by the comparison
    // (a group's other fields only count when its selector is off its default).
    ModelSpec base;
    if (!SpecGroup(f).empty() && !f.group_selector) base.rope_scaling.type = RopeScalingType::kLlama3;
    ModelSpec changed = base;
    void* m = f.member(&changed);
    switch (f.type) {
      case SpecType::kInt: *static_cast<int64_t*>(m) += 3; break;
      case SpecType::kFloat: *static_cast<double*>(m) *= 3; break;
      case SpecType::kBool: *static_cast<bool*>(m) = !*static_cast<bool*>(m); break;
      case SpecType::kFamily: *static_cast<ModelFamily*>(m) = ModelFamily::kLlama; break;
      case SpecType::kRopeType: *static_cast<RopeScalingType*>(m) = RopeScalingType::kLinear; break;
    }
    CHECK_FALSE(changed == base);
    CHECK_FALSE(SameSpecKey(changed, base, SpecGroup(f).empty() ? f.key : SpecGroup(f)));
  }
  // The YAML `model:` keys: every top-level field and the rope_scaling group, once.
  const std::vector<std::string>& top = SpecTopLevelKeys();
  CHECK(std::set<std::string>(top.begin(), top.end()).size() == top.size());
  CHECK(std::count(top.begin(), top.end(), "rope_scaling") == 1);
  CHECK(std::count(top.begin(), top.end(), "rms_norm_eps") == 1);
}

TEST_CASE("model.from comparisons use effective values and the rope_scaling selector", "[config][spec]") {
  ModelSpec a = Shape(256, 64, 64, 2, 4, 128, false);
  a.family = ModelFamily::kLlama;
  ModelSpec b = a;
  b.n_kv_heads = 4;  // == n_head: the same model as n_kv_heads 0
  CHECK(SameSpecKey(a, b, "n_kv_heads"));
  CHECK(SpecKeyText(a, "n_kv_heads") == "4");
  b.n_kv_heads = 2;
  CHECK_FALSE(SameSpecKey(a, b, "n_kv_heads"));
  // No scaling on either side: the factors mean nothing.
  b = a;
  b.rope_scaling.factor = 4.0;
  CHECK(SameSpecKey(a, b, "rope_scaling"));
  b.rope_scaling.type = RopeScalingType::kLinear;
  CHECK_FALSE(SameSpecKey(a, b, "rope_scaling"));
  CHECK(SpecKeyText(b, "rope_scaling") ==
        "{type: linear, factor: 4, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192}");
  CHECK(SpecKeyText(a, "rms_norm_eps") == "9.9999999999999995e-07");
}

TEST_CASE("JSON specs: old GPT-2 form, unknown keys and wrong types are named", "[config][spec]") {
  // GPT-2 specs keep their pre-family form (no family key) and read back.
  const std::string gpt2 = ModelSpecToJson(ModelSpec{});
  CHECK(gpt2.find("family") == std::string::npos);
  CHECK(gpt2.find("rope") == std::string::npos);
  auto message = [](const std::string& text) {
    Result<ModelSpec> r = ModelSpecFromJson(text);
    REQUIRE_FALSE(r.ok());
    return r.status().message();
  };
  const std::string base = R"("vocab_size":256,"seq_len":64,"d_model":64,"n_layer":2,"n_head":4,"d_ff":256,"tied_embeddings":true)";
  CHECK(message("{" + base + R"(,"colour":1})").find("unknown field 'colour'") != std::string::npos);
  CHECK(message("{" + base + R"(,"family":"llama","rope_scaling":{"kind":1}})").find("rope_scaling has unknown field 'kind'") !=
        std::string::npos);
  CHECK(message("{" + base + R"(,"family":"llama","qkv_bias":1})").find("qkv_bias=1 is not a boolean") != std::string::npos);
  CHECK(message("{" + base + R"(,"family":"llama","rope_scaling":3})").find("rope_scaling=3 is not an object") !=
        std::string::npos);
  CHECK(message(R"({"vocab_size":256})").find("lacks field 'seq_len'") != std::string::npos);
  // YAML: a bad enum and a bound name the file, line and key.
  Result<JobConfig> bad = ParseJobConfig("model:\n  family: llama\n  rope_scaling:\n    type: yarn\n", "<job>");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("<job>:4") != std::string::npos);
  CHECK(bad.status().message().find("rope_scaling.type") != std::string::npos);
  bad = ParseJobConfig("model:\n  rms_norm_eps: 0\n", "<job>");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("model.rms_norm_eps") != std::string::npos);
}

}  // namespace
}  // namespace l2l

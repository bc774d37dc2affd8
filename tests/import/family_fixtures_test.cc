// The families whose Hugging Face classes need a newer transformers than the CI oracle
// venv's (Gemma 3, Qwen3, Mistral and Qwen2 with sliding windows, Qwen3-MoE with
// norm_topk_prob both ways and the aux loss) against fixtures made by transformers 4.57
// itself (tests/fixtures/make_family_fixtures.py; committed under tests/fixtures/families/
// with the versions that made them): each tiny random model is imported from its Hugging
// Face directory by l2l's importer (Pretrained::Open), its loss
// and every parameter gradient computed by the reference trainer on the CPU backend (fp32)
// for the fixture's token batch, and compared with transformers' (loss rel <= 1e-5, every
// gradient rel <= 1e-4 in the max norm). Then the HF export of the imported weights: the
// exported config.json states what the fixture's does for every key l2l models, and the
// exported tensors have the fixture's names and shapes, bit-equal values. (That
// transformers 4.57 loads the export, <build>/family_exports/<name>, and computes the
// fixture's loss is checked where the fixtures are made: make_family_fixtures.py
// --check-export.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/formats/model_reader.h"
#include "common/formats/safetensors.h"
#include "common/models/registry.h"
#include "common/pretrained/pretrained.h"
#include "worker/reference/reference_trainer.h"

using namespace l2l;

namespace {

std::string FixtureDir(const std::string& name) {
  return std::string(L2L_SOURCE_DIR) + "/tests/fixtures/families/" + name;
}

std::vector<std::vector<float>> LoadAll(const Pretrained& p) {
  std::vector<std::vector<float>> out;
  for (size_t l = 0; l < p.layout().size(); ++l) {
    out.emplace_back(p.layout()[l].numel);
    Status s = p.LoadLayer(static_cast<int64_t>(l), out.back().data());
    REQUIRE(s.ok());
  }
  return out;
}

// max |a - b| / max |b| (the gradient's scale), so tiny elements do not dominate.
double RelMax(const float* a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

void CheckFixture(const std::string& name, ModelFamily family) {
  INFO("fixture " << name);
  const std::string dir = FixtureDir(name);
  Result<std::unique_ptr<Pretrained>> p = Pretrained::Open(dir);
  REQUIRE(p.ok());
  const ModelSpec& spec = (*p)->spec();
  CHECK(spec.family == family);
  Result<SafeTensorsReader> ref = SafeTensorsReader::Open(dir + "/reference.safetensors");
  REQUIRE(ref.ok());
  Result<std::vector<float>> toks = ref->ReadAsFloat("tokens");
  REQUIRE(toks.ok());
  const SafeTensorInfo* ti = ref->Find("tokens");
  REQUIRE(ti->shape.size() == 2);
  const int64_t B = ti->shape[0], T = ti->shape[1] - 1;
  worker::MicroBatch mb;
  mb.B = B;
  mb.T = T;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      mb.inputs.push_back(static_cast<int32_t>((*toks)[b * (T + 1) + t]));
      mb.targets.push_back(static_cast<int32_t>((*toks)[b * (T + 1) + t + 1]));
    }
  }
  JobConfig job;
  job.model = spec;
  job.train.micro_batch_size = B;
  job.train.micro_batches = 1;
  job.train.seq_len = T;
  auto trainer = worker::ReferenceTrainer::Create(job, LoadAll(**p));
  REQUIRE(trainer.ok());
  Result<float> loss = (*trainer)->ComputeGradients({mb});
  REQUIRE(loss.ok());
  const float want_loss = (*ref->ReadAsFloat("loss"))[0];
  INFO("loss " << *loss << " transformers " << want_loss);
  CHECK(std::fabs(*loss - want_loss) <= 1e-5 * std::fabs(want_loss));
  const std::vector<std::vector<float>> grads = (*trainer)->grads();
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  size_t compared = 0;
  for (size_t l = 0; l < layout.size(); ++l) {
    for (const ParamInfo& param : layout[l].params) {
      const std::string hf = HfTensorName(spec, param);
      INFO("gradient of " << hf);
      Result<std::vector<float>> want = ref->ReadAsFloat("grad." + hf);
      REQUIRE(want.ok());
      REQUIRE(want->size() == param.numel);
      const double rel = RelMax(grads[l].data() + param.offset, *want);
      INFO("rel " << rel);
      CHECK(rel <= 1e-4);
      ++compared;
    }
  }
  // Every gradient transformers has was compared (tied: one embedding tensor).
  size_t grads_in_file = 0;
  for (const SafeTensorInfo& t : ref->tensors()) grads_in_file += t.name.rfind("grad.", 0) == 0;
  CHECK(compared == grads_in_file);
}

// l2l's export of the imported fixture: config keys, tensor names, shapes and values.
void CheckExport(const std::string& name) {
  INFO("fixture " << name);
  const std::string dir = FixtureDir(name);
  Result<std::unique_ptr<Pretrained>> p = Pretrained::Open(dir);
  REQUIRE(p.ok());
  const std::vector<std::vector<float>> layers = LoadAll(**p);
  // Left in the build folder for `make_family_fixtures.py --check-export` (transformers
  // loads them); replaced on every run.
  const std::string out = std::string(L2L_BINARY_DIR) + "/family_exports/" + name;
  std::filesystem::remove_all(out);
  Result<int64_t> bytes = ExportHf(out, (*p)->spec(), [&layers](int64_t l, float* dst) {
    std::copy(layers[l].begin(), layers[l].end(), dst);
    return Status::Ok();
  });
  REQUIRE(bytes.ok());
  nlohmann::json want, got;
  std::ifstream(dir + "/config.json") >> want;
  std::ifstream(out + "/config.json") >> got;
  for (const char* key : {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                          "rms_norm_eps", "rope_theta", "tie_word_embeddings", "sliding_window", "use_sliding_window",
                          "max_window_layers", "layer_types", "query_pre_attn_scalar", "rope_local_base_freq",
                          "hidden_activation", "hidden_act", "num_experts", "num_experts_per_tok",
                          "moe_intermediate_size", "norm_topk_prob", "router_aux_loss_coef", "output_router_logits",
                          "decoder_sparse_step", "mlp_only_layers"}) {
    if (!want.contains(key) || want[key].is_null()) {  // absent and null mean the same to transformers
      // (head_dim null: hidden_size / num_attention_heads, which l2l writes out.)
      const bool head_dim = std::string(key) == "head_dim" && got.contains(key) &&
                            got[key] == want["hidden_size"].get<int64_t>() / want["num_attention_heads"].get<int64_t>();
      if (want.contains(key) && got.contains(key) && !head_dim) CHECK(got[key].is_null());
      continue;
    }
    if (std::string(key) == "max_window_layers" && want.value("use_sliding_window", true) == false) continue;
    // Qwen3-MoE's dense width is unused when every block is sparse (l2l writes the experts').
    if (std::string(key) == "intermediate_size" && want.contains("moe_intermediate_size")) continue;
    INFO("config.json key " << key << ": fixture " << want[key].dump() << ", export "
                            << (got.contains(key) ? got[key].dump() : "(absent)"));
    REQUIRE(got.contains(key));
    if (want[key].is_number() && got[key].is_number()) {
      CHECK(want[key].get<double>() == got[key].get<double>());
    } else {
      CHECK(want[key] == got[key]);
    }
  }
  Result<SafeTensorsReader> a = SafeTensorsReader::Open(dir + "/model.safetensors");
  Result<SafeTensorsReader> b = SafeTensorsReader::Open(out + "/model.safetensors");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->tensors().size() == b->tensors().size());
  for (const SafeTensorInfo& t : a->tensors()) {
    INFO("tensor " << t.name);
    const SafeTensorInfo* e = b->Find(t.name);
    REQUIRE(e != nullptr);
    CHECK(e->shape == t.shape);
    CHECK(*a->ReadAsFloat(t.name) == *b->ReadAsFloat(t.name));
  }
}

}  // namespace

TEST_CASE("Gemma 3 imported from transformers 4.57: loss and every gradient match", "[import][fixtures][gemma3]") {
  CheckFixture("gemma3", ModelFamily::kGemma3);
}

TEST_CASE("Qwen3 (head_dim != hidden/heads, GQA, q/k norms) matches transformers 4.57", "[import][fixtures][qwen3]") {
  CheckFixture("qwen3", ModelFamily::kLlama);
}

TEST_CASE("Mistral with a sliding window shorter than T matches transformers 4.57", "[import][fixtures][window]") {
  CheckFixture("mistral_window", ModelFamily::kLlama);
}

TEST_CASE("Qwen2 with a sliding window from max_window_layers matches transformers 4.57", "[import][fixtures][window]") {
  CheckFixture("qwen2_window", ModelFamily::kLlama);
}

TEST_CASE("Qwen3-MoE (q/k norms, 4 experts top-2, normalised top-k, aux loss) matches transformers 4.57",
          "[import][fixtures][qwen3_moe]") {
  CheckFixture("qwen3_moe", ModelFamily::kLlama);
  // The optimizer's per-expert ranges (the daemon skips an expert no token reached) cover
  // Qwen3-MoE's mlp.experts.E.* tensors: E contiguous runs of gate, up, down (3 F C each).
  Result<std::unique_ptr<Pretrained>> p = Pretrained::Open(FixtureDir("qwen3_moe"));
  REQUIRE(p.ok());
  const ModelSpec& s = (*p)->spec();
  const LayerLayout& block = (*p)->layout()[1];
  const std::vector<ExpertRange> r = ExpertRanges(s, block);
  REQUIRE(r.size() == 4);
  const ParamInfo* first = block.Find("mlp.experts.0.gate_proj.weight");
  REQUIRE(first != nullptr);
  for (size_t e = 0; e < r.size(); ++e) {
    CHECK(r[e].begin == first->offset + e * size_t(3 * s.d_ff * s.d_model));
    CHECK(r[e].end - r[e].begin == size_t(3 * s.d_ff * s.d_model));
    CHECK(block.Find("mlp.experts." + std::to_string(e) + ".down_proj.weight")->offset + size_t(s.d_ff * s.d_model) ==
          r[e].end);
  }
}

TEST_CASE("Qwen3-MoE with norm_topk_prob false (raw top-k softmax weights, aux loss) matches transformers 4.57",
          "[import][fixtures][qwen3_moe]") {
  CheckFixture("qwen3_moe_nonorm", ModelFamily::kLlama);
}

TEST_CASE("Qwen3-MoE configs l2l cannot model are refused, naming the key", "[import][fixtures][qwen3_moe]") {
  nlohmann::json c;
  std::ifstream(FixtureDir("qwen3_moe") + "/config.json") >> c;
  REQUIRE(models::SpecFromHfConfig(c, "config.json").ok());
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"decoder_sparse_step", 2}, {"mlp_only_layers", nlohmann::json::array({0})}}) {
    nlohmann::json bad = c;
    bad[key] = value;
    Result<ModelSpec> s = models::SpecFromHfConfig(bad, "config.json");
    INFO(key);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().message().find(key) != std::string::npos);
  }
}

TEST_CASE("HF export of the fixture families keeps their config.json and tensors", "[import][fixtures][export]") {
  for (const char* name : {"gemma3", "qwen3", "mistral_window", "qwen2_window", "qwen3_moe", "qwen3_moe_nonorm"}) {
    CheckExport(name);
  }
}

// GGUF export and re-import of the fixture families: Gemma 3 (norm weights written as
// 1 + w, as llama.cpp's converter stores them, and read back as w), Qwen3 (q/k norms,
// attention.key_length != embedding_length / head_count); a sliding window has no GGUF
// form in l2l's writer for the Llama family: refused.
TEST_CASE("GGUF export of Gemma 3 and Qwen3 fixtures re-imports, a Mistral window is refused", "[import][fixtures][gguf]") {
  for (const char* name : {"gemma3", "qwen3", "mistral_window"}) {
    INFO("fixture " << name);
    Result<std::unique_ptr<Pretrained>> p = Pretrained::Open(FixtureDir(name));
    REQUIRE(p.ok());
    const std::vector<std::vector<float>> layers = LoadAll(**p);
    std::filesystem::create_directories(std::string(L2L_BINARY_DIR) + "/family_exports");
    const std::string out = std::string(L2L_BINARY_DIR) + "/family_exports/" + name + ".gguf";
    const LayerSource read = [&layers](int64_t l, float* dst) {
      std::copy(layers[l].begin(), layers[l].end(), dst);
      return Status::Ok();
    };
    ModelSpec spec = (*p)->spec();
    Result<int64_t> bytes = ExportGguf(out, spec, read);
    if (std::string(name) == "mistral_window") {
      REQUIRE_FALSE(bytes.ok());
      CHECK(bytes.status().message().find("sliding window") != std::string::npos);
      continue;
    }
    if (std::string(name) == "gemma3") {
      // llama.cpp's gemma3 has no keys for these: the fixture's values are refused, and
      // the GGUF-expressible variant (the same tensors) exports.
      REQUIRE_FALSE(bytes.ok());
      CHECK(bytes.status().message().find("sliding_window_pattern 6") != std::string::npos);
      spec.sliding_window_pattern = 6;
      spec.rope_local_theta = 10000.0;
      spec.query_pre_attn_scalar = double(spec.head_dim());
      bytes = ExportGguf(out, spec, read);
    }
    INFO(bytes.status().ToString());
    REQUIRE(bytes.ok());
    Result<std::unique_ptr<Pretrained>> back = Pretrained::Open(out);
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    ModelSpec got = (*back)->spec();
    CHECK(std::fabs(got.rms_norm_eps - spec.rms_norm_eps) <= 1e-6 * spec.rms_norm_eps);  // an f32 in GGUF
    got.rms_norm_eps = spec.rms_norm_eps;
    got.rope_theta = spec.rope_theta;  // f32 too (1000 and 10000: exact, checked below)
    CHECK(float((*back)->spec().rope_theta) == float(spec.rope_theta));
    CHECK(got == spec);
    const std::vector<std::vector<float>> again = LoadAll(**back);
    REQUIRE(again.size() == layers.size());
    // Gemma's norms pass through w + 1 - 1 in fp32: within an ulp of 1.
    for (size_t l = 0; l < layers.size(); ++l) {
      REQUIRE(again[l].size() == layers[l].size());
      for (size_t i = 0; i < layers[l].size(); ++i) CHECK(std::fabs(again[l][i] - layers[l][i]) <= 2e-7);
    }
    if (std::string(name) == "gemma3") {  // the file itself holds 1 + w
      Result<std::unique_ptr<formats::ModelReader>> r = formats::ModelReader::Open(out);
      REQUIRE(r.ok());
      const LayerLayout& blk = (*p)->layout()[1];
      const ParamInfo* norm = blk.Find("input_layernorm.weight");
      REQUIRE(norm != nullptr);
      Result<std::vector<float>> raw = (*r)->ReadF32("blk.0.attn_norm.weight");
      REQUIRE(raw.ok());
      CHECK(std::fabs((*raw)[0] - (layers[1][norm->offset] + 1.0f)) <= 1e-7);
    }
  }
}

// Tests for common/formats/{lora_adapter,peft_adapter,gguf_lora}.h against their oracles
// (tests/formats/lora_oracle.py): a PEFT directory we write loads in transformers + peft
// 0.13.2 with no missing or unexpected keys and logits equal to the hand-merged model's
// (tiny random Llama and GPT-2); an adapter peft itself saves reads back and rewrites to
// the same tensors; our GGUF LoRA reads back through the gguf package with llama.cpp's
// names, orientation, alpha and q/k permutation; bad adapters and mismatched models are
// refused with messages naming the module or key.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/formats/gguf_lora.h"
#include "common/formats/lora_adapter.h"
#include "common/formats/peft_adapter.h"
#include "common/formats/safetensors.h"
#include "common/models/registry.h"
#include "tests/formats/oracle_util.h"
#include "tests/testing/temp_dir.h"

namespace l2l::formats {
namespace {

using testing::RunOracle;
using testing::TempDir;

ModelSpec SpecOf(const std::string& hf_dir) {
  const nlohmann::json config = nlohmann::json::parse(testing::ReadAll(hf_dir + "/config.json"));
  Result<ModelSpec> spec = models::SpecFromHfConfig(config, hf_dir);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return *spec;
}

// Random A and B (N(0, 0.1)) for every linear weight of `spec` whose module name ends with
// "." + one of `targets`.
LoraAdapter MakeAdapter(const ModelSpec& spec, const std::vector<std::string>& targets, int64_t r, double alpha) {
  LoraAdapter a;
  a.r = r;
  a.alpha = alpha;
  a.dropout = 0.05;
  a.target_modules = targets;
  a.base_model = "tiny-random";
  a.family = spec.family;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  const bool in_out = models::Family(spec.family).hf_weights_in_out;
  for (const LayerLayout& lay : BuildLayout(spec)) {
    if (lay.kind != LayerKind::kBlock) continue;
    for (const ParamInfo& p : lay.params) {
      if (p.shape.size() != 2) continue;
      const std::string module = HfModuleName(spec, p);
      bool hit = false;
      for (const std::string& t : targets) hit = hit || module.ends_with("." + t);
      if (!hit) continue;
      LoraModuleWeights m;
      m.module = module;
      m.out = in_out ? p.shape[1] : p.shape[0];
      m.in = in_out ? p.shape[0] : p.shape[1];
      m.a.resize(static_cast<size_t>(r * m.in));
      m.b.resize(static_cast<size_t>(r * m.out));
      for (float& v : m.a) v = dist(rng);
      for (float& v : m.b) v = dist(rng);
      a.modules.push_back(std::move(m));
    }
  }
  return a;
}

void ExpectSameAdapter(const LoraAdapter& x, const LoraAdapter& y) {
  CHECK(x.r == y.r);
  CHECK(x.alpha == y.alpha);
  CHECK(x.target_modules == y.target_modules);
  CHECK(x.base_model == y.base_model);
  REQUIRE(x.modules.size() == y.modules.size());
  for (size_t i = 0; i < x.modules.size(); ++i) {
    INFO(x.modules[i].module);
    CHECK(x.modules[i].module == y.modules[i].module);
    CHECK(x.modules[i].in == y.modules[i].in);
    CHECK(x.modules[i].out == y.modules[i].out);
    CHECK(x.modules[i].a == y.modules[i].a);
    CHECK(x.modules[i].b == y.modules[i].b);
  }
}

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

TEST_CASE("PEFT adapters we write load in peft with no missing keys and the hand-merged logits",
          "[formats][lora]") {
  const std::string family = GENERATE(std::string("llama"), std::string("gpt2"));
  INFO("family " << family);
  TempDir dir("l2l_lora");
  const std::string base = dir.File("base"), peft = dir.File("peft");
  RunOracle("lora_oracle.py", {"make-base", family, base});
  const ModelSpec spec = SpecOf(base);
  const std::vector<std::string> targets = family == "llama"
                                               ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "down_proj"}
                                               : std::vector<std::string>{"c_attn", "c_proj", "c_fc"};
  const LoraAdapter adapter = MakeAdapter(spec, targets, 4, 8.0);
  REQUIRE(adapter.modules.size() == 8u);  // 2 blocks x (q, k, v, down) or (c_attn, attn c_proj, c_fc, mlp c_proj)
  REQUIRE(WritePeftAdapter(peft, adapter).ok());
  const nlohmann::json config = nlohmann::json::parse(testing::ReadAll(peft + "/adapter_config.json"));
  CHECK(config["fan_in_fan_out"] == (family == "gpt2"));
  CHECK(config["lora_alpha"] == 8);
  const std::string out = RunOracle("lora_oracle.py", {"check-peft", base, peft});
  CHECK(out.find("ok peft 16 tensors") != std::string::npos);

  Result<LoraAdapter> back = ReadPeftAdapter(peft);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  ExpectSameAdapter(adapter, *back);
  CHECK(back->dropout == adapter.dropout);

  const std::string gguf = dir.File("lora.gguf");
  const Status g = WriteGgufLora(gguf, spec, adapter, {.name = "test"});
  if (family == "llama") {
    INFO(g.ToString());
    REQUIRE(g.ok());
    CHECK(RunOracle("lora_oracle.py", {"check-gguf", base, peft, gguf}).find("ok gguf 16 tensors alpha 8") !=
          std::string::npos);
  } else {
    ExpectError(g, {"GGUF LoRA export of the gpt2 family is not supported"});
  }
}

TEST_CASE("An adapter saved by peft reads back and rewrites to the same tensors", "[formats][lora]") {
  const std::string family = GENERATE(std::string("llama"), std::string("gpt2"));
  INFO("family " << family);
  TempDir dir("l2l_lora");
  const std::string base = dir.File("base"), theirs = dir.File("theirs"), ours = dir.File("ours");
  RunOracle("lora_oracle.py", {"make-base", family, base});
  RunOracle("lora_oracle.py", {"peft-save", base, family == "llama" ? "q_proj,o_proj,up_proj" : "c_attn,c_fc", theirs});
  Result<LoraAdapter> read = ReadPeftAdapter(theirs);
  INFO(read.status().ToString());
  REQUIRE(read.ok());
  CHECK(read->r == 4);
  CHECK(read->alpha == 16);
  CHECK(read->modules.size() == (family == "llama" ? 6u : 4u));
  const ModelSpec spec = SpecOf(base);
  CHECK(MatchLoraToModel(spec, BuildLayout(spec), *read).ok());
  read->family = spec.family;
  REQUIRE(WritePeftAdapter(ours, *read).ok());
  RunOracle("lora_oracle.py", {"same-adapter", theirs, ours});
}

TEST_CASE("Adapters that do not fit the model are refused naming the module", "[formats][lora]") {
  ModelSpec spec;
  spec.family = ModelFamily::kLlama;
  spec.vocab_size = 128;
  spec.d_model = 64;
  spec.n_layer = 2;
  spec.n_head = 4;
  spec.n_kv_heads = 2;
  spec.d_ff = 96;
  spec.seq_len = 64;
  REQUIRE(spec.Validate().ok());
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  LoraAdapter a = MakeAdapter(spec, {"q_proj", "k_proj"}, 2, 4.0);
  REQUIRE(a.modules.size() == 4);
  REQUIRE(MatchLoraToModel(spec, layout, a).ok());

  SECTION("unknown module") {
    a.modules[1].module = "model.layers.7.self_attn.q_proj";
    ExpectError(MatchLoraToModel(spec, layout, a).status(),
                {"model.layers.7.self_attn.q_proj is not a linear weight", "model.layers.0.self_attn.q_proj"});
  }
  SECTION("shape") {
    // k_proj is (n_kv_head * hs, C) = (32, 64); an adapter for a model with 4 kv heads.
    LoraModuleWeights& k = a.modules[1];
    REQUIRE(k.module == "model.layers.0.self_attn.k_proj");
    k.out = 64;
    k.b.resize(static_cast<size_t>(2 * 64));
    ExpectError(MatchLoraToModel(spec, layout, a).status(),
                {"model.layers.0.self_attn.k_proj has (out, in) (64, 64)", "the model's weight is (out, in) (32, 64)"});
    std::vector<std::vector<float>> layers;
    for (const LayerLayout& l : layout) layers.emplace_back(l.numel, 0.0f);
    ExpectError(MergeLoraIntoModel(spec, a, &layers), {"k_proj"});
  }
  SECTION("invalid adapters") {
    a.modules[0].a.pop_back();
    ExpectError(ValidateLoraAdapter(a), {"model.layers.0.self_attn.q_proj", "expected A (2, 64)"});
    a.modules[0].a.push_back(NAN);
    ExpectError(ValidateLoraAdapter(a), {"is not finite"});
    a.modules[0].a.back() = 0;
    a.modules[1].module = a.modules[0].module;
    ExpectError(ValidateLoraAdapter(a), {"appears twice"});
    a.r = 0;
    ExpectError(ValidateLoraAdapter(a), {"r = 0"});
  }
}

TEST_CASE("Merging adds scale * B A to the weight, transposed for Conv1D", "[formats][lora]") {
  // One module by hand: r = 1, so B A is an outer product we can write down.
  for (ModelFamily fam : {ModelFamily::kLlama, ModelFamily::kGpt2}) {
    ModelSpec spec;
    spec.family = fam;
    spec.vocab_size = 64;
    spec.d_model = 32;
    spec.n_layer = 1;
    spec.n_head = 2;
    spec.n_kv_heads = fam == ModelFamily::kLlama ? 2 : 0;
    spec.d_ff = 64;
    spec.seq_len = 16;
    REQUIRE(spec.Validate().ok());
    const std::vector<LayerLayout> layout = BuildLayout(spec);
    LoraAdapter a = MakeAdapter(spec, {fam == ModelFamily::kLlama ? "down_proj" : "c_fc"}, 1, 3.0);
    REQUIRE(a.modules.size() == 1);
    const LoraModuleWeights& m = a.modules[0];
    std::vector<std::vector<float>> layers;
    for (const LayerLayout& l : layout) layers.emplace_back(l.numel, 1.0f);
    REQUIRE(MergeLoraIntoModel(spec, a, &layers).ok());
    const ParamInfo* p = layout[1].Find(fam == ModelFamily::kLlama ? "mlp.down_proj.weight" : "mlp.c_fc.weight");
    REQUIRE(p != nullptr);
    for (int64_t o = 0; o < m.out; ++o) {
      for (int64_t i = 0; i < m.in; ++i) {
        const size_t at = fam == ModelFamily::kLlama ? o * m.in + i : i * m.out + o;  // (out, in) or (in, out)
        const double want = 1.0 + 3.0 * static_cast<double>(m.b[o]) * m.a[i];
        REQUIRE(std::fabs(layers[1][p->offset + at] - want) <= 1e-6 * std::fabs(want));
      }
    }
    // Everything else untouched.
    size_t changed = 0;
    for (const std::vector<float>& l : layers) {
      for (float v : l) changed += v != 1.0f;
    }
    CHECK(changed <= static_cast<size_t>(m.out * m.in));
    // The same through a layer reader (what an export with --merge pulls).
    Result<LayerReader> merged = MergedLayerReader(
        spec,
        [&](int64_t l, float* out) {
          std::fill(out, out + layout[static_cast<size_t>(l)].numel, 1.0f);
          return Status::Ok();
        },
        std::make_shared<const LoraAdapter>(a));
    REQUIRE(merged.ok());
    for (size_t l = 0; l < layout.size(); ++l) {
      std::vector<float> got(layout[l].numel);
      REQUIRE((*merged)(static_cast<int64_t>(l), got.data()).ok());
      CHECK(got == layers[l]);
    }
  }
}

TEST_CASE("Broken PEFT adapter directories are refused with the file and the key", "[formats][lora]") {
  ModelSpec spec;
  spec.family = ModelFamily::kLlama;
  spec.vocab_size = 64;
  spec.d_model = 32;
  spec.n_layer = 1;
  spec.n_head = 2;
  spec.n_kv_heads = 2;
  spec.d_ff = 64;
  spec.seq_len = 16;
  REQUIRE(spec.Validate().ok());
  TempDir dir("l2l_lora");
  const std::string d = dir.File("a");
  REQUIRE(WritePeftAdapter(d, MakeAdapter(spec, {"q_proj"}, 2, 4.0)).ok());
  const std::string cfg_path = d + "/adapter_config.json";
  const nlohmann::json good = nlohmann::json::parse(testing::ReadAll(cfg_path));
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    nlohmann::json j = good;
    j[key] = v;
    testing::WriteFileForTest(cfg_path, j.dump());
    return ReadPeftAdapter(d).status();
  };
  ExpectError(with("peft_type", "IA3"), {"adapter_config.json", "peft_type", "LORA"});
  ExpectError(with("bias", "all"), {"\"bias\"", "only \"none\""});
  ExpectError(with("use_dora", true), {"DoRA"});
  // modules_to_save is read now (lora_export_test.cc), but it must come with its tensors.
  ExpectError(with("modules_to_save", {"lm_head"}), {"modules_to_save lists lm_head but no tensor of it is saved"});
  ExpectError(with("r", 3), {"adapter_model.safetensors", "lora_A.weight has shape (2, 32), expected (r, in) with r = 3"});
  ExpectError(with("lora_alpha", "x"), {"lora_alpha"});
  testing::WriteFileForTest(cfg_path, "{not json");
  ExpectError(ReadPeftAdapter(d).status(), {"adapter_config.json: not valid JSON"});
  testing::WriteFileForTest(cfg_path, good.dump());
  REQUIRE(ReadPeftAdapter(d).ok());

  // Unexpected tensors, a lone lora_A, a pickle only.
  const LoraAdapter one = MakeAdapter(spec, {"q_proj"}, 2, 4.0);
  std::vector<float> extra(4, 1.0f);
  const std::string w = d + "/adapter_model.safetensors";
  REQUIRE(WriteSafeTensors(w, {{.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                                .shape = {2, 32}, .f32 = one.modules[0].a.data()},
                               {.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
                                .shape = {4}, .f32 = extra.data()}})
              .ok());
  ExpectError(ReadPeftAdapter(d).status(), {"unexpected tensor \"base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector\""});
  REQUIRE(WriteSafeTensors(w, {{.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                                .shape = {2, 32}, .f32 = one.modules[0].a.data()}})
              .ok());
  ExpectError(ReadPeftAdapter(d).status(), {"module model.layers.0.self_attn.q_proj has no lora_B weight"});
  std::filesystem::remove(w);
  testing::WriteFileForTest(d + "/adapter_model.bin", "pickle");
  ExpectError(ReadPeftAdapter(d).status(), {"adapter_model.bin", "safe_serialization"});
  ExpectError(ReadPeftAdapter(dir.File("none")).status(), {"no such adapter directory"});
}

}  // namespace
}  // namespace l2l::formats

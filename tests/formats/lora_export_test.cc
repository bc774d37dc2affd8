// Tests for common/formats/lora_export.h: AdapterFromLayers returns ExtractLoraAdapters'
// adapters (names, A, B) and the modules_to_save tensors as trained; MergedLayerSource
// gives MergeLoraIntoModel's merged layers (and, spot-checked by hand, W + s * B A in
// the family's orientation); the adapter round-trips through the one PEFT writer and
// reader with its modules_to_save; a GGUF LoRA refuses modules_to_save; bad input is
// refused naming what. The transformers + peft oracle of the same code path:
// tests/formats/lora_export_oracle.py (ctest formats.lora_export_oracle).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/formats/gguf_lora.h"
#include "common/formats/lora_export.h"
#include "common/formats/peft_adapter.h"
#include "common/lora.h"
#include "tests/testing/temp_dir.h"

namespace l2l::formats {
namespace {

using testing::TempDir;

ModelSpec Spec(ModelFamily family) {
  ModelSpec s;
  s.family = family;
  s.vocab_size = 40;
  s.d_model = 16;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_kv_heads = family == ModelFamily::kLlama ? 1 : 0;
  s.d_ff = 24;
  s.seq_len = 8;
  s.tied_embeddings = family != ModelFamily::kLlama;
  REQUIRE(s.Validate().ok());
  return s;
}

LoraConfig Lora(std::vector<std::string> target, std::vector<std::string> saved) {
  LoraConfig l;
  l.enabled = true;
  l.r = 3;
  l.alpha = 7;
  l.target = std::move(target);
  l.modules_to_save = std::move(saved);
  l.init_seed = 5;
  return l;
}

// LoRA layers: random base (InitLayerParams), A from InitLoraAdapters, B and the
// modules_to_save tensors moved by noise (a trained adapter).
std::vector<std::vector<float>> TrainedLayers(const ModelSpec& spec, const LoraConfig& lora) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::vector<std::vector<float>> layers;
  for (const LayerLayout& layout : BuildLoraLayout(spec, lora)) {
    std::vector<float> full(layout.numel, 0.0f);
    InitLayerParams(spec, BuildLayout(spec)[static_cast<size_t>(layout.index)], 3, full.data());
    InitLoraAdapters(lora, layout, full.data());
    for (const ParamInfo& p : layout.params) {
      if (!p.trainable || p.name.ends_with(".lora_A.weight")) continue;
      for (size_t i = 0; i < p.numel; ++i) full[p.offset + i] += noise(rng);
    }
    layers.push_back(std::move(full));
  }
  return layers;
}

LoraLayerReader ReaderOf(const std::vector<std::vector<float>>& layers) {
  return [&layers](int64_t l, float* out) {
    std::copy(layers[static_cast<size_t>(l)].begin(), layers[static_cast<size_t>(l)].end(), out);
    return Status::Ok();
  };
}

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.ToString().find(n) != std::string::npos);
}

TEST_CASE("AdapterFromLayers: ExtractLoraAdapters' adapters and the modules_to_save as trained", "[formats][lora]") {
  const bool llama = GENERATE(true, false);
  const ModelSpec spec = Spec(llama ? ModelFamily::kLlama : ModelFamily::kGpt2);
  const LoraConfig lora = llama ? Lora({"all-linear"}, {"lm_head"}) : Lora({"c_attn", "c_proj"}, {});
  INFO(ToString(spec.family));
  const std::vector<LayerLayout> layouts = BuildLoraLayout(spec, lora);
  const std::vector<std::vector<float>> layers = TrainedLayers(spec, lora);
  Result<LoraAdapter> a = AdapterFromLayers(spec, lora, ReaderOf(layers));
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->r == 3);
  CHECK(a->alpha == 7);
  CHECK(a->family == spec.family);
  CHECK(a->target_modules == (llama ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                "up_proj", "down_proj"}
                                    : std::vector<std::string>{"c_attn", "c_proj"}));
  const std::vector<LoraAdapterTensors> want = ExtractLoraAdapters(spec, lora, layouts, layers);
  REQUIRE(want.size() == (llama ? 14u : 6u));  // 2 blocks x 7, or x (c_attn, attn c_proj, mlp c_proj)
  REQUIRE(a->modules.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].module);
    CHECK(a->modules[i].module == want[i].module);
    CHECK(a->modules[i].in == want[i].in);
    CHECK(a->modules[i].out == want[i].out);
    CHECK(a->modules[i].a == want[i].A);
    CHECK(a->modules[i].b == want[i].B);
  }
  if (llama) {
    CHECK(a->modules.front().module == "model.layers.0.self_attn.q_proj");
    CHECK(a->modules_to_save == std::vector<std::string>{"lm_head"});
    REQUIRE(a->saved.size() == 1);
    CHECK(a->saved[0].name == "lm_head.weight");
    CHECK(a->saved[0].shape == std::vector<int64_t>{40, 16});
    const LayerLayout& head = layouts.back();
    const ParamInfo* p = head.Find("lm_head.weight");
    REQUIRE(p != nullptr);
    CHECK(a->saved[0].values == std::vector<float>(layers.back().begin() + p->offset,
                                                   layers.back().begin() + p->offset + p->numel));
  } else {
    CHECK(a->modules.front().module == "transformer.h.0.attn.c_attn");
    CHECK(a->saved.empty());
  }
}

TEST_CASE("MergedLayerSource: MergeLoraIntoModel's layers, W + s B A by hand, saved tensors as trained",
          "[formats][lora]") {
  const bool llama = GENERATE(true, false);
  const ModelSpec spec = Spec(llama ? ModelFamily::kLlama : ModelFamily::kGpt2);
  const LoraConfig lora = llama ? Lora({"all-linear"}, {"lm_head"}) : Lora({"c_attn", "c_fc"}, {});
  INFO(ToString(spec.family));
  const std::vector<LayerLayout> base = BuildLayout(spec);
  const std::vector<std::vector<float>> layers = TrainedLayers(spec, lora);
  Result<LoraAdapter> a = AdapterFromLayers(spec, lora, ReaderOf(layers));
  REQUIRE(a.ok());

  // The existing merge of the adapter into the base prefix of every layer.
  std::vector<std::vector<float>> want;
  for (size_t l = 0; l < base.size(); ++l) want.emplace_back(layers[l].begin(), layers[l].begin() + base[l].numel);
  std::vector<std::vector<float>> unmerged = want;
  REQUIRE(MergeLoraIntoModel(spec, *a, &want).ok());

  int reads = 0;
  const auto merged = MergedLayerSource(spec, lora, [&](int64_t l, float* out) {
    ++reads;
    return ReaderOf(layers)(l, out);
  });
  for (size_t l = 0; l < base.size(); ++l) {
    std::vector<float> got(base[l].numel, NAN);
    REQUIRE(merged(static_cast<int64_t>(l), got.data()).ok());
    CHECK(got == want[l]);
  }
  CHECK(reads == static_cast<int>(base.size()));

  // By hand: one element of block 1's first target, W[o][i] (Conv1D: W[i][o]) + s * sum_k B[o][k] A[k][i].
  const LayerLayout lay = BuildLoraLayout(spec, lora)[2];  // block 1
  const std::string module = llama ? "self_attn.q_proj" : "attn.c_attn";
  const ParamInfo* w = lay.Find(module + ".weight");
  const ParamInfo* pa = lay.Find(module + ".lora_A.weight");
  REQUIRE(w != nullptr);
  REQUIRE(pa != nullptr);
  const ParamInfo& pb = lay.params[static_cast<size_t>(pa - lay.params.data()) + 1];
  const int64_t in = pa->shape[1], out = pb.shape[0];
  std::vector<float> got(base[2].numel);
  REQUIRE(merged(2, got.data()).ok());
  for (auto [o, i] : {std::pair<int64_t, int64_t>{0, 0}, {out - 1, in - 1}, {out / 2, 1}}) {
    double delta = 0;
    for (int64_t k = 0; k < lora.r; ++k) {
      delta += static_cast<double>(layers[2][pb.offset + o * lora.r + k]) * layers[2][pa->offset + k * in + i];
    }
    const size_t at = w->offset + (llama ? o * in + i : i * out + o);
    const double want_v = layers[2][at] + lora.scale() * delta;
    CHECK(std::fabs(got[at] - want_v) <= 1e-6 * std::max(1.0, std::fabs(want_v)));
    CHECK(got[at] != layers[2][at]);
  }
  if (llama) {
    // modules_to_save: the merged head is the trained head (not the base's: the layers hold only the trained).
    const ParamInfo* head = base.back().Find("lm_head.weight");
    REQUIRE(head != nullptr);
    std::vector<float> h(base.back().numel);
    REQUIRE(merged(static_cast<int64_t>(base.size() - 1), h.data()).ok());
    CHECK(std::equal(h.begin() + head->offset, h.begin() + head->offset + head->numel,
                     layers.back().begin() + head->offset));
  }
  CHECK(unmerged != want);  // the merge changed something
}

TEST_CASE("A LoRA job's adapter round-trips through the PEFT writer and reader with modules_to_save",
          "[formats][lora]") {
  const ModelSpec spec = Spec(ModelFamily::kLlama);
  const LoraConfig lora = Lora({"q_proj", "v_proj"}, {"lm_head"});
  const std::vector<std::vector<float>> layers = TrainedLayers(spec, lora);
  Result<LoraAdapter> a = AdapterFromLayers(spec, lora, ReaderOf(layers));
  REQUIRE(a.ok());
  TempDir dir("l2l_lora_export");
  REQUIRE(WritePeftAdapter(dir.File("peft"), *a).ok());
  Result<LoraAdapter> back = ReadPeftAdapter(dir.File("peft"));
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(back->modules_to_save == std::vector<std::string>{"lm_head"});
  REQUIRE(back->saved.size() == 1);
  CHECK(back->saved[0].name == "lm_head.weight");
  CHECK(back->saved[0].shape == a->saved[0].shape);
  CHECK(back->saved[0].values == a->saved[0].values);
  REQUIRE(back->modules.size() == a->modules.size());
  for (size_t i = 0; i < a->modules.size(); ++i) {
    CHECK(back->modules[i].module == a->modules[i].module);
    CHECK(back->modules[i].a == a->modules[i].a);
    CHECK(back->modules[i].b == a->modules[i].b);
  }
  // Merging what was read gives MergedLayerSource's layers.
  const std::vector<LayerLayout> base = BuildLayout(spec);
  std::vector<std::vector<float>> via_file;
  for (size_t l = 0; l < base.size(); ++l) {
    via_file.emplace_back(layers[l].begin(), layers[l].begin() + base[l].numel);
  }
  const ParamInfo* head = base.back().Find("lm_head.weight");
  std::fill(via_file.back().begin() + head->offset, via_file.back().begin() + head->offset + head->numel, 0.0f);
  back->family = spec.family;
  REQUIRE(MergeLoraIntoModel(spec, *back, &via_file).ok());  // the zeroed head comes back as trained
  const auto merged = MergedLayerSource(spec, lora, ReaderOf(layers));
  for (size_t l = 0; l < base.size(); ++l) {
    std::vector<float> got(base[l].numel);
    REQUIRE(merged(static_cast<int64_t>(l), got.data()).ok());
    CHECK(got == via_file[l]);
  }
  // A GGUF LoRA cannot hold the trained head: refused, naming what to use instead.
  ExpectError(WriteGgufLora(dir.File("a.gguf"), spec, *a), {"modules_to_save (lm_head)", "--merge", "--format peft"});
  // Without modules_to_save it writes.
  LoraAdapter plain = *a;
  plain.modules_to_save.clear();
  plain.saved.clear();
  CHECK(WriteGgufLora(dir.File("b.gguf"), spec, plain).ok());
}

TEST_CASE("LoRA export refuses a job without lora, reader errors and bad saved tensors", "[formats][lora]") {
  const ModelSpec spec = Spec(ModelFamily::kLlama);
  LoraConfig off;
  const std::vector<std::vector<float>> none;
  ExpectError(AdapterFromLayers(spec, off, ReaderOf(none)).status(), {"the job has no lora section"});
  std::vector<float> out(BuildLayout(spec)[0].numel);
  ExpectError(MergedLayerSource(spec, off, ReaderOf(none))(0, out.data()), {"the job has no lora section"});
  const LoraConfig bad = Lora({"c_attn"}, {});
  ExpectError(AdapterFromLayers(spec, bad, ReaderOf(none)).status(), {"lora.target=[c_attn]"});

  const LoraConfig lora = Lora({"q_proj"}, {"lm_head"});
  const auto failing = [](int64_t l, float*) {
    return l == 2 ? Internal("disk on fire") : Status::Ok();
  };
  ExpectError(AdapterFromLayers(spec, lora, failing).status(), {"reading layer 2", "disk on fire"});
  ExpectError(MergedLayerSource(spec, lora, failing)(2, out.data()), {"reading layer 2", "disk on fire"});
  ExpectError(MergedLayerSource(spec, lora, failing)(9, out.data()), {"layer 9 of a model with 4 layers"});

  std::vector<std::vector<float>> layers = TrainedLayers(spec, lora);
  Result<LoraAdapter> a = AdapterFromLayers(spec, lora, ReaderOf(layers));
  REQUIRE(a.ok());
  LoraAdapter x = *a;
  x.saved[0].name = "model.norm.weight";
  ExpectError(ValidateLoraAdapter(x), {"saved tensor model.norm.weight belongs to no module of modules_to_save [lm_head]"});
  x = *a;
  x.saved.clear();
  ExpectError(ValidateLoraAdapter(x), {"modules_to_save lists lm_head but no tensor of it is saved"});
  x = *a;
  x.saved[0].shape = {16, 40};
  REQUIRE(ValidateLoraAdapter(x).ok());
  ExpectError(MatchLoraToModel(spec, BuildLayout(spec), x).status(),
              {"saved tensor (modules_to_save) lm_head.weight has shape (16, 40), the model's is (40, 16)"});
  x = *a;
  x.saved[0].values[3] = INFINITY;
  ExpectError(AdapterFromLayers(spec, lora, [&](int64_t l, float* o) {
                std::vector<float> v = layers[static_cast<size_t>(l)];
                if (l == 3) v[BuildLoraLayout(spec, lora)[3].Find("lm_head.weight")->offset + 3] = INFINITY;
                std::copy(v.begin(), v.end(), o);
                return Status::Ok();
              }).status(),
              {"lm_head.weight[3] is not finite"});
}

}  // namespace
}  // namespace l2l::formats

// Importing a headless BERT checkpoint (a BertModel directory, as sentence encoders such as
// all-MiniLM-L6-v2 ship): tensors with or without "bert.", model.num_labels picks the head,
// the head tensors the file lacks are InitLayerParams(train.seed)'s, the pooler comes from
// the file when the head uses it (and is skipped when not), and a num_labels beside
// model.from that contradicts a file with its head is still an error.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/file_util.h"
#include "common/formats/safetensors.h"
#include "common/models/registry.h"
#include "common/pretrained/pretrained.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/jobs.h"

namespace l2l {
namespace {

// V 50, T 16, C 16 in 2 heads, F 32, 2 blocks.
ModelSpec TinyBert(int64_t num_labels) { return testing::BertModel({50, 16, 16, 2, 2, 32}, num_labels); }

std::vector<std::vector<float>> Layers(const ModelSpec& spec, uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (const LayerLayout& l : BuildLayout(spec)) {
    out.emplace_back(l.numel);
    InitLayerParams(spec, l, seed, out.back().data());
    for (size_t i = 0; i < l.numel; ++i) out.back()[i] += 0.001f * static_cast<float>(i % 7);
  }
  return out;
}

const ParamInfo& Param(const LayerLayout& l, const std::string& name) {
  for (const ParamInfo& p : l.params) {
    if (p.name == name) return p;
  }
  FAIL("no param " << name);
  return l.params[0];
}

// A BertModel directory: the base tensors of a 2-label classifier's layers (embeddings,
// encoder, pooler; no classifier), named with `prefix`, plus the position_ids buffer.
void WriteHeadless(const std::string& dir, const std::vector<std::vector<float>>& layers, const std::string& prefix) {
  const ModelSpec spec = TinyBert(2);
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  std::vector<TensorToWrite> tensors;
  for (size_t l = 0; l < layout.size(); ++l) {
    for (const ParamInfo& p : layout[l].params) {
      if (p.name.rfind("classifier.", 0) == 0) continue;
      tensors.push_back({.name = prefix + p.name, .shape = p.shape, .f32 = layers[l].data() + p.offset});
    }
  }
  std::vector<float> position_ids(16);
  for (int i = 0; i < 16; ++i) position_ids[static_cast<size_t>(i)] = static_cast<float>(i);
  tensors.push_back({.name = prefix + "embeddings.position_ids", .shape = {1, 16}, .f32 = position_ids.data()});
  std::filesystem::create_directories(dir);
  REQUIRE(WriteSafeTensors(dir + "/model.safetensors", tensors).ok());
  nlohmann::json c = models::Family(ModelFamily::kBert).to_hf_config(TinyBert(0));
  c["architectures"] = {"BertModel"};
  std::ofstream(dir + "/config.json") << c.dump(2);
}

std::vector<float> Load(const Pretrained& p, int64_t l) {
  std::vector<float> out(p.layout()[static_cast<size_t>(l)].numel);
  REQUIRE(p.LoadLayer(l, out.data()).ok());
  return out;
}

TEST_CASE("A headless BertModel imports with or without bert., the head chosen by num_labels", "[import][bert]") {
  testing::TempDir tmp;
  const auto layers = Layers(TinyBert(2), 3);
  for (const std::string prefix : {"", "bert."}) {
    DYNAMIC_SECTION("prefix '" << prefix << "'") {
      const std::string dir = tmp.path() + "/m" + prefix;
      WriteHeadless(dir, layers, prefix);

      // Default: the masked-LM head, initialised; the pooler skipped.
      Result<std::unique_ptr<Pretrained>> mlm = Pretrained::Open(dir, {.init_seed = 9});
      INFO(mlm.status().ToString());
      REQUIRE(mlm.ok());
      CHECK((*mlm)->headless());
      CHECK((*mlm)->spec().num_labels == 0);
      CHECK((*mlm)->spec().tied_embeddings);
      CHECK((*mlm)->initialised().size() == 5);
      const LayerLayout& mhead = (*mlm)->layout().back();
      std::vector<float> want(mhead.numel);
      InitLayerParams((*mlm)->spec(), mhead, 9, want.data());
      CHECK(Load(**mlm, static_cast<int64_t>((*mlm)->layout().size()) - 1) == want);
      CHECK(Load(**mlm, 1) == layers[1]);  // a block: the file's

      // num_labels 3: the pooler is the file's, the classifier InitLayerParams(seed)'s.
      Result<std::unique_ptr<Pretrained>> cls = Pretrained::Open(dir, {.num_labels = 3, .init_seed = 9});
      INFO(cls.status().ToString());
      REQUIRE(cls.ok());
      const ModelSpec& s3 = (*cls)->spec();
      CHECK(s3.num_labels == 3);
      CHECK_FALSE(s3.tied_embeddings);
      CHECK((*cls)->initialised() == std::vector<std::string>{"classifier.weight", "classifier.bias"});
      const LayerLayout& head = (*cls)->layout().back();
      const std::vector<float> got = Load(**cls, static_cast<int64_t>((*cls)->layout().size()) - 1);
      std::vector<float> init(head.numel);
      InitLayerParams(s3, head, 9, init.data());
      const ParamInfo& wc = Param(head, "classifier.weight");
      CHECK(std::vector<float>(got.begin() + wc.offset, got.begin() + wc.offset + wc.numel) ==
            std::vector<float>(init.begin() + wc.offset, init.begin() + wc.offset + wc.numel));
      const std::vector<LayerLayout> layout2 = BuildLayout(TinyBert(2));
      const LayerLayout& head2 = layout2.back();
      const ParamInfo& wp = Param(head, "pooler.dense.weight");
      const ParamInfo& wp2 = Param(head2, "pooler.dense.weight");
      CHECK(std::vector<float>(got.begin() + wp.offset, got.begin() + wp.offset + wp.numel) ==
            std::vector<float>(layers.back().begin() + wp2.offset, layers.back().begin() + wp2.offset + wp2.numel));
      // Another seed, another classifier; the same seed, the same one.
      Result<std::unique_ptr<Pretrained>> other = Pretrained::Open(dir, {.num_labels = 3, .init_seed = 10});
      REQUIRE(other.ok());
      CHECK(Load(**other, static_cast<int64_t>(head.index)) != got);
    }
  }
}

TEST_CASE("model.from a headless BertModel with num_labels and task classify resolves", "[import][bert]") {
  testing::TempDir tmp;
  WriteHeadless(tmp.path() + "/m", Layers(TinyBert(2), 3), "");
  auto cfg = ParseJobConfig("model:\n  from: m\n  num_labels: 4\ntask: classify\ntrain: {seed: 5}\n", "job.yaml",
                            tmp.path());
  INFO(cfg.status().ToString());
  REQUIRE(cfg.ok());
  auto model = ResolveModelFrom(&*cfg, cfg->model_from);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  CHECK(cfg->model.num_labels == 4);
  CHECK(cfg->effective_task() == Task::kClassify);
  CHECK((*model)->spec().num_labels == 4);

  // Without num_labels the head is the masked LM's, and task classify is refused.
  auto no_labels = ParseJobConfig("model:\n  from: m\ntask: classify\n", "job.yaml", tmp.path());
  REQUIRE(no_labels.ok());
  auto r = ResolveModelFrom(&*no_labels, no_labels->model_from);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("num_labels > 0") != std::string::npos);
}

TEST_CASE("num_labels beside model.from must agree with a checkpoint that has its head", "[import][bert]") {
  testing::TempDir tmp;
  const ModelSpec spec = TinyBert(2);
  const auto layers = Layers(spec, 3);
  REQUIRE(ExportHf(tmp.path() + "/cls", spec, [&](int64_t l, float* out) {
            std::copy(layers[static_cast<size_t>(l)].begin(), layers[static_cast<size_t>(l)].end(), out);
            return Status::Ok();
          }).ok());
  auto cfg = ParseJobConfig("model:\n  from: cls\n  num_labels: 3\n", "job.yaml", tmp.path());
  REQUIRE(cfg.ok());
  auto r = ResolveModelFrom(&*cfg, cfg->model_from);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("model.num_labels=3") != std::string::npos);
  CHECK(r.status().message().find("num_labels=2") != std::string::npos);
}

}  // namespace
}  // namespace l2l

// tools/inference_model.h: loading a checkpoint (directory and root) gives exactly the
// masters that were checkpointed (not m or v), the job's step and imported_from; an l2l
// safetensors file gives its layers; damaged checkpoints and unknown paths are one-line
// errors naming the file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/config.h"
#include "common/formats/model_io.h"
#include "eps_server/checkpoint.h"
#include "eps_server/param_store.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/jobs.h"
#include "tools/inference_model.h"

namespace l2l::tools {
namespace {

namespace fs = std::filesystem;

ModelSpec TinyLlama() {
  return testing::LlamaModel({50, 16, 16, 2, 4, 2, 24});
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

// Writes a checkpoint of step 7 under root; returns the masters.
std::vector<std::vector<float>> WriteTinyCheckpoint(const std::string& root, const std::string& imported_from) {
  JobConfig job;
  job.model = TinyLlama();
  job.imported_from = imported_from;
  auto store = eps::ParamStore::Create(job.model, eps::ParamStoreOptions{});
  REQUIRE(store.ok());
  std::vector<std::vector<float>> masters;
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) {
    const size_t n = static_cast<size_t>((*store)->layout(l).numel);
    masters.push_back(Random(n, 100 + l, 1.0f));
    const auto m = Random(n, 200 + l, 5.0f), v = Random(n, 300 + l, 9.0f);
    REQUIRE((*store)->WriteLayer(l, masters.back().data(), m.data(), v.data()).ok());
  }
  eps::CheckpointMeta meta;
  meta.step = 7;
  meta.job = job;
  auto w = eps::WriteCheckpoint(**store, meta, root + "/" + eps::CheckpointDirName(7), /*update_latest=*/true);
  REQUIRE(w.ok());
  return masters;
}

TEST_CASE("A checkpoint loads as its masters, from its directory or its root", "[tools]") {
  testing::TempDir tmp;
  const std::string root = tmp.path() + "/ckpt";
  const auto masters = WriteTinyCheckpoint(root, "/models/some-hf-dir");
  for (const std::string& p : {root, root + "/" + eps::CheckpointDirName(7)}) {
    auto m = LoadInferenceModel(p);
    REQUIRE(m.ok());
    CHECK(m->kind == ModelSourceKind::kCheckpoint);
    CHECK(m->step == 7);
    CHECK(m->tokenizer_path == "/models/some-hf-dir");
    CHECK(m->spec.family == ModelFamily::kLlama);
    CHECK(m->spec.n_kv_heads == 2);
    CHECK(m->layers == masters);
    auto c = LoadCheckpointModel(p);
    REQUIRE(c.ok());
    CHECK(c->layers == masters);
  }
}

TEST_CASE("Damaged checkpoints and unknown paths are errors naming the file", "[tools]") {
  testing::TempDir tmp;
  const std::string root = tmp.path() + "/ckpt";
  WriteTinyCheckpoint(root, "");
  const std::string dir = root + "/" + eps::CheckpointDirName(7);
  std::string layer_file;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("layer-", 0) == 0) layer_file = e.path().string();
  }
  REQUIRE(!layer_file.empty());
  fs::resize_file(layer_file, fs::file_size(layer_file) - 4);
  auto m = LoadInferenceModel(root);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().ToString().find(layer_file) != std::string::npos);
  fs::remove(layer_file);
  m = LoadCheckpointModel(dir);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().ToString().find(layer_file) != std::string::npos);

  auto missing = LoadInferenceModel(tmp.path() + "/nothing");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().ToString().find(tmp.path() + "/nothing") != std::string::npos);
  fs::create_directories(tmp.path() + "/empty");
  auto empty = LoadInferenceModel(tmp.path() + "/empty");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().ToString().find("config.json") != std::string::npos);
  auto not_ckpt = LoadCheckpointModel(tmp.path() + "/empty");
  REQUIRE_FALSE(not_ckpt.ok());
  CHECK(not_ckpt.status().ToString().find("manifest.json") != std::string::npos);
}

TEST_CASE("An l2l safetensors file loads with its spec and no tokenizer", "[tools]") {
  testing::TempDir tmp;
  ModelSpec spec;  // GPT-2 defaults, byte vocabulary
  std::vector<std::vector<float>> layers;
  for (const LayerLayout& l : BuildLayout(spec)) layers.push_back(Random(static_cast<size_t>(l.numel), 7, 0.1f));
  const std::string path = tmp.path() + "/model.safetensors";
  REQUIRE(SaveModel(path, spec, layers).ok());
  auto m = LoadInferenceModel(path);
  REQUIRE(m.ok());
  CHECK(m->kind == ModelSourceKind::kSafetensors);
  CHECK(m->tokenizer_path.empty());
  CHECK(m->spec.vocab_size == 256);
  CHECK(m->layers == layers);
}

}  // namespace
}  // namespace l2l::tools

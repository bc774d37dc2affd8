// eps_server/job_start.h: every start (checkpoint, pretrained, safetensors, buffers) fills
// a store that held other state with the source's weights, zero moments (a checkpoint's
// own moments), and survives a second load (a rollback); ChooseJobStart picks the start
// for a --resume, a --job file and a CreateJob request and names the origin in errors.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/model_io.h"
#include "common/pretrained/pretrained.h"
#include "eps_server/checkpoint.h"
#include "eps_server/job_start.h"
#include "eps_server/param_store.h"
#include "tests/testing/jobs.h"
#include "tests/testing/temp_dir.h"

namespace l2l::eps {
namespace {

using Layers = std::vector<std::vector<float>>;

// Weights no seed gives: the seed's init with a ramp added (norms not all 1).
Layers Source(const ModelSpec& spec, uint64_t seed) {
  Layers out;
  for (const LayerLayout& l : BuildLayout(spec)) {
    out.emplace_back(l.numel);
    InitLayerParams(spec, l, seed, out.back().data());
    for (size_t i = 0; i < l.numel; ++i) out.back()[i] += 0.001f * static_cast<float>(i % 7);
  }
  return out;
}

// A store whose master, m and v all hold 7s: a start must overwrite every array.
std::unique_ptr<ParamStore> DirtyStore(const ModelSpec& spec) {
  auto store = ParamStore::Create(spec, ParamStoreOptions{});
  REQUIRE(store.ok());
  for (int64_t l = 0; l < (*store)->num_layers(); ++l) {
    const std::vector<float> sevens((*store)->layout(l).numel, 7.0f);
    REQUIRE((*store)->WriteLayer(l, sevens.data(), sevens.data(), sevens.data()).ok());
  }
  return std::move(store).value();
}

// One array (0 master, 1 m, 2 v) of every layer.
Layers ReadAll(const ParamStore& store, int which) {
  Layers out;
  for (int64_t l = 0; l < store.num_layers(); ++l) {
    out.emplace_back(store.layout(l).numel);
    REQUIRE(store.ReadState(l, which, out.back().data()).ok());
  }
  return out;
}

Layers Zeros(const Layers& like) {
  Layers out;
  for (const auto& l : like) out.emplace_back(l.size(), 0.0f);
  return out;
}

// Loads `start` into a dirty store, twice (CreateJob, then a rollback), and checks the
// weights are `weights` and the moments zero.
void CheckFreshStart(const JobStart& start, const ModelSpec& spec, const Layers& weights) {
  REQUIRE(start.load);
  auto store = DirtyStore(spec);
  for (int load = 0; load < 2; ++load) {
    Status s = start.load(store.get());
    REQUIRE(s.ok());
    CHECK(ReadAll(*store, 0) == weights);
    CHECK(ReadAll(*store, 1) == Zeros(weights));
    CHECK(ReadAll(*store, 2) == Zeros(weights));
  }
}

LayerSource From(const Layers& layers) {
  return [&layers](int64_t l, float* out) {
    std::copy(layers[l].begin(), layers[l].end(), out);
    return Status::Ok();
  };
}

}  // namespace

TEST_CASE("FromBuffers: the buffers' weights, zero moments, count and sizes checked at load", "[eps][job_start]") {
  const ModelSpec spec = testing::GptModel(testing::kTinyGpt);
  const Layers weights = Source(spec, 3);
  const JobStart start = FromBuffers(weights);
  CHECK(start.description == "initial weights");
  CHECK(start.step == 0);
  CheckFreshStart(start, spec, weights);

  Layers fewer = weights;
  fewer.pop_back();
  auto store = DirtyStore(spec);
  Status s = FromBuffers(fewer).load(store.get());
  CHECK(s.message().find("initial weights have 4 layers, the model has 5") != std::string::npos);
  Layers shorter = weights;
  shorter[1].pop_back();
  s = FromBuffers(shorter).load(store.get());
  CHECK(s.message().find("initial weights of layer 1 have") != std::string::npos);
}

TEST_CASE("FromSafetensors: the file's weights, zero moments, the file checked when chosen",
          "[eps][job_start]") {
  testing::TempDir tmp;
  const ModelSpec spec = testing::GptModel(testing::kTinyGpt);
  const Layers weights = Source(spec, 4);
  const std::string file = tmp.File("model.safetensors");
  REQUIRE(SaveModel(file, spec, weights).ok());
  auto start = FromSafetensors(file, spec);
  REQUIRE(start.ok());
  CHECK(start->description == file);
  CheckFreshStart(*start, spec, weights);

  ModelSpec wider = spec;
  wider.d_ff = 64;
  auto bad = FromSafetensors(file, wider);
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("model.safetensors") != std::string::npos);
  CHECK(!FromSafetensors(tmp.File("missing.safetensors"), spec).ok());
}

TEST_CASE("FromPretrained: the HF directory's weights, zero moments", "[eps][job_start]") {
  testing::TempDir tmp;
  const ModelSpec spec = testing::GptModel(testing::kTinyGpt);
  const Layers weights = Source(spec, 5);
  REQUIRE(ExportHf(tmp.File("hf"), spec, From(weights)).ok());
  auto model = OpenPretrained(tmp.File("hf"));
  REQUIRE(model.ok());
  const JobStart start = FromPretrained(std::shared_ptr<const Pretrained>(std::move(model).value()));
  CHECK(start.description == tmp.File("hf"));
  CheckFreshStart(start, spec, weights);

  // A store of another depth is refused, naming the file.
  ModelSpec deeper = spec;
  deeper.n_layer = 4;
  auto other = DirtyStore(deeper);
  Status s = start.load(other.get());
  CHECK(s.message().find(tmp.File("hf") + ": 5 layers, the store has 6") != std::string::npos);
}

TEST_CASE("FromCheckpoint: the checkpoint's master and moments, step and data positions", "[eps][job_start]") {
  testing::TempDir tmp;
  const JobConfig job = testing::GptJob(testing::kTinyGpt);
  const Layers weights = Source(job.model, 6);
  Layers m = weights, v = weights;
  for (auto& l : m) for (float& x : l) x *= 0.5f;
  for (auto& l : v) for (float& x : l) x = x * x;
  auto written = DirtyStore(job.model);
  for (int64_t l = 0; l < written->num_layers(); ++l) {
    REQUIRE(written->WriteLayer(l, weights[l].data(), m[l].data(), v[l].data()).ok());
  }
  CheckpointMeta meta;
  meta.step = 12;
  meta.job = job;
  meta.expected_workers = 2;
  meta.workers = {{0, "a", "pos-a"}, {1, "b", "pos-b"}};
  const std::string dir = tmp.File("ckpt/" + CheckpointDirName(12));
  REQUIRE(WriteCheckpoint(*written, meta, dir, /*update_latest=*/true).ok());

  auto manifest = ReadCheckpointManifest(dir);
  REQUIRE(manifest.ok());
  const JobStart start = FromCheckpoint(std::move(manifest).value());
  CHECK(start.step == 12);
  CHECK(start.checkpoint_dir == dir);
  CHECK(start.description == "checkpoint " + dir);
  CHECK(start.data_positions == std::vector<std::string>{"pos-a", "pos-b"});
  auto store = DirtyStore(job.model);
  REQUIRE(start.load(store.get()).ok());
  CHECK(ReadAll(*store, 0) == weights);
  CHECK(ReadAll(*store, 1) == m);
  CHECK(ReadAll(*store, 2) == v);

  SECTION("ChooseJobStart: a checkpoint root resumes its `latest`, with its job and workers") {
    JobSource source;
    source.checkpoint = tmp.File("ckpt");
    auto plan = ChooseJobStart(source);
    REQUIRE(plan.ok());
    CHECK(plan->job.model == job.model);
    CHECK(plan->checkpoint_workers == 2);
    CHECK(plan->start.step == 12);
    CHECK(plan->start.checkpoint_dir == dir);
  }
}

TEST_CASE("ChooseJobStart: model.from, init_safetensors or the seed, errors naming the origin",
          "[eps][job_start]") {
  testing::TempDir tmp;
  const ModelSpec spec = testing::GptModel(testing::kTinyGpt);
  const Layers weights = Source(spec, 7);
  REQUIRE(ExportHf(tmp.File("src"), spec, From(weights)).ok());
  REQUIRE(SaveModel(tmp.File("model.safetensors"), spec, weights).ok());
  JobConfig seeded = testing::GptJob(testing::kTinyGpt);
  seeded.train.seed = 99;

  SECTION("a --job file's model.from, resolved against the file") {
    JobSource source;
    source.job_file = tmp.Write("job.yaml", "model:\n  from: src\ntrain:\n  seq_len: 16\n");
    auto plan = ChooseJobStart(source);
    REQUIRE(plan.ok());
    CHECK(plan->job.model == spec);
    CHECK(plan->checkpoint_workers == 0);
    CHECK(plan->start.description == tmp.File("src"));
    CheckFreshStart(plan->start, spec, weights);

    source.job_file = tmp.Write("bad.yaml", "model:\n  from: src\n  n_layer: 2\n");
    auto bad = ChooseJobStart(source);
    REQUIRE(!bad.ok());
    CHECK(bad.status().message().rfind(source.job_file + ": ", 0) == 0);
    CHECK(bad.status().message().find("n_layer=2") != std::string::npos);
  }
  SECTION("a request: paths confined to the roots, resolved against the base dir, errors naming the field") {
    JobSource source;
    PathRoots roots;
    roots.AddToAll(tmp.path());
    source.roots = &roots;
    source.base_dir = tmp.path();
    const std::string real = std::filesystem::canonical(tmp.path()).string();
    source.job_yaml = "model: {from: src}\ntrain: {seq_len: 16}\n";
    auto plan = ChooseJobStart(source);
    REQUIRE(plan.ok());
    CHECK(plan->start.description == real + "/src");
    CHECK(plan->start.data_roots == std::vector<std::string>{real});
    CheckFreshStart(plan->start, spec, weights);

    source.job_yaml = "model: {from: ../elsewhere}\n";
    auto escape = ChooseJobStart(source);
    REQUIRE(!escape.ok());
    CHECK(escape.status().code() == StatusCode::kPermissionDenied);
    CHECK(escape.status().message().rfind("<rpc CreateJob>: model.from: refused: allowed only inside [" + real + "]",
                                          0) == 0);

    source.job_yaml = "model: {from: src}\n";
    source.init_safetensors = "model.safetensors";
    auto both = ChooseJobStart(source);
    REQUIRE(!both.ok());
    CHECK(both.status().message() == "CreateJob: model.from and init_safetensors are exclusive");

    source.job_yaml = JobConfigToYaml(seeded);
    plan = ChooseJobStart(source);
    REQUIRE(plan.ok());
    CHECK(plan->start.description == real + "/model.safetensors");
    CheckFreshStart(plan->start, spec, weights);

    source.init_safetensors = "../model.safetensors";
    auto out = ChooseJobStart(source);
    REQUIRE(!out.ok());
    CHECK(out.status().code() == StatusCode::kPermissionDenied);
    CHECK(out.status().message().rfind("CreateJob: init_safetensors: refused: allowed only inside [" + real + "]",
                                       0) == 0);

    source.init_safetensors = "missing.safetensors";
    auto missing = ChooseJobStart(source);
    REQUIRE(!missing.ok());
    CHECK(missing.status().message().rfind("CreateJob init_safetensors " + real + "/missing.safetensors", 0) == 0);
  }
  SECTION("neither: the seed") {
    JobSource source;
    source.job_yaml = JobConfigToYaml(seeded);
    auto plan = ChooseJobStart(source);
    REQUIRE(plan.ok());
    CHECK(plan->job.train.seed == 99);
    CHECK(!plan->start.load);
    CHECK(plan->start.description == "seed");
  }
}

}  // namespace l2l::eps

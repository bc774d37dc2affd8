// common/pretrained (model.from import, HF / GGUF export) and the daemon's CreateJob /
// Export rpcs with them. Round trips: l2l layers -> ExportHf / ExportGguf -> Pretrained
// (an independent check against transformers is tests/import/import_oracle.py).
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/config.h"
#include "common/pretrained/pretrained.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/control.grpc.pb.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/jobs.h"

namespace fs = std::filesystem;
using namespace l2l;
namespace ctl = l2l::control::v1;

namespace {

ModelSpec TinyLlama(bool tied, bool qkv_bias) {
  ModelSpec s = testing::LlamaModel({40, 32, 32, 2, 4, 2, 64, tied});
  s.qkv_bias = qkv_bias;
  s.rms_norm_eps = 1e-5;
  return s;
}

std::vector<std::vector<float>> Layers(const ModelSpec& spec, uint64_t seed) {
  std::vector<std::vector<float>> out;
  for (const LayerLayout& l : BuildLayout(spec)) {
    out.emplace_back(l.numel);
    InitLayerParams(spec, l, seed, out.back().data());
    for (size_t i = 0; i < l.numel; ++i) out.back()[i] += 0.001f * static_cast<float>(i % 7);  // norms not all 1
  }
  return out;
}

LayerSource From(const std::vector<std::vector<float>>& layers) {
  return [&layers](int64_t l, float* out) {
    std::copy(layers[l].begin(), layers[l].end(), out);
    return Status::Ok();
  };
}

std::vector<std::vector<float>> LoadAll(const Pretrained& p) {
  std::vector<std::vector<float>> out;
  for (int64_t l = 0; l < static_cast<int64_t>(p.layout().size()); ++l) {
    out.emplace_back(p.layout()[l].numel);
    Status s = p.LoadLayer(l, out.back().data());
    REQUIRE(s.ok());
  }
  return out;
}

}  // namespace

TEST_CASE("ExportHf and ExportGguf round-trip through OpenPretrained", "[import]") {
  testing::TempDir tmp;
  for (bool tied : {false, true}) {
    for (bool bias : {false, true}) {
      const ModelSpec spec = TinyLlama(tied, bias);
      const auto layers = Layers(spec, 3);
      const std::string dir = tmp.path() + "/hf" + std::to_string(tied) + std::to_string(bias);
      REQUIRE(ExportHf(dir, spec, From(layers)).ok());
      CHECK(fs::exists(dir + "/config.json"));
      CHECK(fs::exists(dir + "/generation_config.json"));
      auto p = OpenPretrained(dir);
      REQUIRE(p.ok());
      CHECK((*p)->spec() == spec);
      CHECK(LoadAll(**p) == layers);

      const std::string g = dir + ".gguf";
      REQUIRE(ExportGguf(g, spec, From(layers)).ok());
      auto q = OpenPretrained(g);
      REQUIRE(q.ok());
      CHECK((*q)->spec().d_model == spec.d_model);
      CHECK((*q)->spec().qkv_bias == bias);
      CHECK((*q)->spec().tied_embeddings == tied);
      CHECK(LoadAll(**q) == layers);  // q/k permuted on write, unpermuted on read
    }
  }
}

TEST_CASE("HF export is sharded above max_shard_bytes and bf16 on request", "[import]") {
  testing::TempDir tmp;
  const ModelSpec spec = TinyLlama(false, false);
  const auto layers = Layers(spec, 4);
  HfExportOptions o;
  o.max_shard_bytes = 20000;
  o.dtype = DType::kBF16;
  REQUIRE(ExportHf(tmp.path() + "/d", spec, From(layers), o).ok());
  CHECK(fs::exists(tmp.path() + "/d/model.safetensors.index.json"));
  CHECK(!fs::exists(tmp.path() + "/d/model.safetensors"));
  auto p = OpenPretrained(tmp.path() + "/d");
  REQUIRE(p.ok());
  const auto got = LoadAll(**p);
  for (size_t l = 0; l < got.size(); ++l) {
    for (size_t i = 0; i < got[l].size(); ++i) {
      if (got[l][i] != Bf16ToFloat(FloatToBf16(layers[l][i]))) FAIL("bf16 differs at " << l << "," << i);
    }
  }
}

TEST_CASE("LoadLayer refuses non-finite weights, naming file and tensor", "[import]") {
  testing::TempDir tmp;
  const ModelSpec spec = TinyLlama(false, false);
  auto layers = Layers(spec, 5);
  layers[1][BuildLayout(spec)[1].Find("mlp.down_proj.weight")->offset + 3] = NAN;
  REQUIRE(ExportHf(tmp.path() + "/d", spec, From(layers)).ok());
  auto p = OpenPretrained(tmp.path() + "/d");
  REQUIRE(p.ok());  // shapes are fine; values are checked as they load
  std::vector<float> buf((*p)->layout()[1].numel);
  Status s = (*p)->LoadLayer(1, buf.data());
  REQUIRE(!s.ok());
  CHECK(s.message().find("model.layers.0.mlp.down_proj.weight") != std::string::npos);
  CHECK(s.message().find("model.safetensors") != std::string::npos);
}

TEST_CASE("model.from in the job YAML: recorded, resolved against the file, contradictions named", "[import]") {
  testing::TempDir tmp;
  const ModelSpec spec = TinyLlama(true, false);
  const auto layers = Layers(spec, 6);
  REQUIRE(ExportHf(tmp.path() + "/m", spec, From(layers)).ok());
  auto cfg = ParseJobConfig("model:\n  from: m\n  n_head: 4\ntrain: {seq_len: 16}\n", "job.yaml", tmp.path());
  REQUIRE(cfg.ok());
  CHECK(cfg->model_from == tmp.path() + "/m");
  CHECK(cfg->model_from_written == "m");
  REQUIRE(cfg->model_keys_set.size() == 1);
  JobConfig ok = *cfg;
  auto model = ResolveModelFrom(&ok, ok.model_from);
  REQUIRE(model.ok());
  CHECK(ok.model == spec);
  CHECK(ok.imported_from == tmp.path() + "/m");
  CHECK(ok.model_from.empty());
  // The daemon's copy of the job (checkpoints, Register) keeps the spec and the source.
  auto back = ParseJobConfig(JobConfigToYaml(ok), "back");
  REQUIRE(back.ok());
  CHECK(back->model == spec);
  CHECK(back->imported_from == ok.imported_from);
  CHECK(back->model_from.empty());

  auto bad = ParseJobConfig("model:\n  from: m\n  d_ff: 128\n", "job.yaml", tmp.path());
  REQUIRE(bad.ok());
  auto r = ResolveModelFrom(&*bad, bad->model_from);
  REQUIRE(!r.ok());
  CHECK(r.status().message().find("job.yaml:3") != std::string::npos);
  CHECK(r.status().message().find("model.d_ff=128") != std::string::npos);
  CHECK(r.status().message().find("d_ff=64") != std::string::npos);
  auto both = ParseJobConfig("model:\n  from: m\n  preset: gpt2-tiny\n", "job.yaml", tmp.path());
  CHECK(!both.ok());
}

TEST_CASE("CreateJob rpc imports model.from (confined to the state dir) and Export writes hf / gguf",
          "[import][eps]") {
  testing::TempDir tmp;
  const std::string state = tmp.path() + "/state";
  fs::create_directories(state);
  const ModelSpec spec = TinyLlama(false, true);
  const auto layers = Layers(spec, 8);
  REQUIRE(ExportHf(state + "/src", spec, From(layers)).ok());
  eps::CoreOptions o;
  o.job_id = "imp" + std::to_string(getpid());
  o.state_dir = state;
  o.transport = Transport::kGrpc;
  eps::EpsCore core(o);
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(server.ok());
  auto stub = ctl::Control::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->port()), grpc::InsecureChannelCredentials()));
  auto create = [&](const std::string& yaml) {
    grpc::ClientContext c;
    ctl::CreateJobRequest req;
    req.set_config_yaml(yaml);
    ctl::CreateJobReply rep;
    return stub->CreateJob(&c, req, &rep);
  };
  grpc::Status s = create("model: {from: ../elsewhere}\n");
  CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  s = create("model: {from: src, n_layer: 3}\n");
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message().find("n_layer=3") != std::string::npos);
  CHECK(!core.has_job());
  s = create("model: {from: src}\ntrain: {seq_len: 16}\n");
  REQUIRE(s.ok());
  CHECK(core.job_config().model == spec);
  for (int64_t l = 0; l < core.store()->num_layers(); ++l) {
    std::vector<float> m(core.store()->layout(l).numel), v(m.size());
    REQUIRE(core.store()->ReadState(l, 0, m.data()).ok());
    REQUIRE(core.store()->ReadState(l, 2, v.data()).ok());
    CHECK(m == layers[l]);
    CHECK(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }));
  }
  for (const char* fmt : {"hf", "gguf"}) {
    grpc::ClientContext c;
    ctl::ExportRequest req;
    req.set_path(std::string("out.") + fmt);
    req.set_format(fmt);
    ctl::ExportReply rep;
    REQUIRE(stub->Export(&c, req, &rep).ok());
    auto p = OpenPretrained(rep.path());
    REQUIRE(p.ok());
    CHECK(LoadAll(**p) == layers);
  }
  (*server)->Shutdown();
  core.Stop();
}

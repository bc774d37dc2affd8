// LoRA through the real system: build/bin/l2l-eps with a `lora:` job and l2l-worker
// processes (shared memory and gRPC, 1 and 2 workers, fp32 / bf16 / NF4 / Q8_0 bases),
// checked against the reference trainer in LoRA mode (which computes with the same held
// base, common/lora_frozen.h RoundToHeld) through the daemon's checkpoint: its layer files
// hold the adapters' (and modules_to_save's) masters and nothing of the base. And in
// process: a resume refuses a base that is not the one the adapters were trained on.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/lora.h"
#include "common/lora_frozen.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core.h"
#include "eps_server/job_start.h"
#include "eps_server/param_store.h"
#include "tests/integration/harness.h"
#include "tests/integration/relay_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
using namespace relay;  // tests/integration/relay_util.h

void LoraJob(JobConfig* job, LoraBaseDType base) {
  job->model.family = ModelFamily::kLlama;
  job->model.n_kv_heads = 2;
  job->model.tied_embeddings = false;
  job->lora.enabled = true;
  job->lora.r = 4;
  job->lora.alpha = 8;
  job->lora.init_seed = 3;
  job->lora.base_dtype = base;
  job->lora.modules_to_save = {"lm_head"};
  REQUIRE(job->Validate().ok());
}

// The masters a checkpoint holds, layer by layer (the trainable vectors of a LoRA job).
std::vector<std::vector<float>> CheckpointMasters(const JobConfig& job, const std::string& dir) {
  auto m = eps::ReadCheckpointManifest(dir);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(m->meta.lora_base_hash.size() == 16);
  eps::ParamStoreOptions o;
  o.lora = job.lora;
  auto store = eps::ParamStore::Create(job.model, o);
  REQUIRE(store.ok());
  REQUIRE(eps::LoadCheckpointState(*m, store->get()).ok());
  std::vector<std::vector<float>> out;
  for (int64_t l = 0; l < (*store)->num_layers(); ++l) {
    out.emplace_back((*store)->layout(l).numel);
    REQUIRE((*store)->ReadState(l, 0, out.back().data()).ok());
  }
  return out;
}

// An in-process daemon's options: a fresh job id (so its shm names are its own), gRPC.
eps::CoreOptions CoreOpts(const std::string& state_dir) {
  static int counter = 0;
  eps::CoreOptions o;
  o.job_id = "lora" + std::to_string(getpid()) + "x" + std::to_string(counter++);
  o.expected_workers = 1;
  o.page_bytes = 8192;
  o.transport = Transport::kGrpc;
  o.state_dir = state_dir;
  return o;
}

}  // namespace

TEST_CASE("l2l-eps + l2l-worker processes train LoRA adapters like the reference trainer",
          "[integration][relay][lora]") {
  struct Case {
    LoraBaseDType base;
    Transport transport;
    int workers;
  };
  const Case c = GENERATE(Case{LoraBaseDType::kF32, Transport::kAuto, 1}, Case{LoraBaseDType::kQ4, Transport::kAuto, 2},
                          Case{LoraBaseDType::kQ8, Transport::kGrpc, 1}, Case{LoraBaseDType::kBF16, Transport::kGrpc, 2});
  INFO("base " << ToString(c.base) << ", transport " << ToString(c.transport) << ", " << c.workers << " worker(s)");
  Run r = Prepare("lora");
  LoraJob(&r.job, c.base);
  DaemonOptions o;
  o.workers = c.workers;
  o.transport = c.transport;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, c.workers);
  for (const std::string& log : logs) REQUIRE(ParseProgress(log).size() == static_cast<size_t>(r.job.train.steps));
  auto ck = (*eps)->Checkpoint();
  INFO(ck.status().ToString());
  REQUIRE(ck.ok());
  const std::vector<std::vector<float>> got = CheckpointMasters(r.job, *ck);
  const std::vector<std::vector<float>> ref = Reference(r.job, c.workers);
  auto fresh = worker::ReferenceTrainer::Create(r.job);
  REQUIRE(fresh.ok());
  const std::vector<LayerLayout> layouts = BuildLoraLayout(r.job.model, r.job.lora);
  REQUIRE(got.size() == layouts.size());
  double worst = 0, b_max = 0;
  std::string worst_name;
  for (size_t l = 0; l < layouts.size(); ++l) {
    const LayerLayout t = TrainableLayout(layouts[l]);
    REQUIRE(got[l].size() == t.numel);  // the checkpoint holds the trainable vector only
    std::vector<float> want(t.numel);
    PackTrainable(layouts[l], ref[l].data(), want.data());
    for (const ParamInfo& p : t.params) {
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double ratio = std::fabs(double(got[l][i]) - want[i]) / (kAtol + kRtol * std::fabs(want[i]));
        if (ratio > worst) {
          worst = ratio;
          worst_name = p.name;
        }
        if (p.name.find(".lora_B.") != std::string::npos) b_max = std::max(b_max, std::fabs(double(got[l][i])));
      }
    }
  }
  INFO("worst elementwise ratio " << worst << " (" << worst_name << ")");
  CHECK(worst <= 1.0);
  CHECK(b_max > 1e-3);  // the adapters trained (every B started at 0)
  REQUIRE((*eps)->Shutdown().ok());
  CHECK((*eps)->ShmSegments().empty());
}

TEST_CASE("A LoRA checkpoint names its base, resume refuses another base and restores with the same",
          "[integration][eps][lora]") {
  auto tmp = testing::TempDir::Create("l2l-eps-lora");
  REQUIRE(tmp.ok());
  JobConfig job = relay::SmallJob((*tmp)->File("unused.bin"));
  LoraJob(&job, LoraBaseDType::kQ4);
  const std::vector<LayerLayout> base_layouts = BuildLayout(job.model);
  std::vector<std::vector<float>> base, other;
  for (const LayerLayout& l : base_layouts) {
    base.emplace_back(l.numel);
    InitLayerParams(job.model, l, 21, base.back().data());
    other.push_back(base.back());
  }
  other[1][0] += 0.5f;  // one weight of block 0 differs
  auto opts = [&] { return CoreOpts((*tmp)->path()); };
  std::string ckpt;
  std::vector<std::vector<float>> masters;
  {
    eps::EpsCore core(opts());
    REQUIRE(core.CreateJob(job, eps::FromBuffers(base)).ok());
    // The frozen base is held as NF4 / bf16: what the store reads back is the held base.
    for (int64_t l = 0; l < core.store()->num_layers(); ++l) {
      const LayerLayout& full = core.store()->full_layout(l);
      std::vector<float> got(full.numel), want(full.numel, 0.0f);
      REQUIRE(core.store()->ReadFullLayer(l, got.data()).ok());
      std::copy(base[static_cast<size_t>(l)].begin(), base[static_cast<size_t>(l)].end(), want.begin());
      InitLoraAdapters(job.lora, full, want.data());
      REQUIRE(RoundToHeld(full, job.lora, want.data()).ok());
      CHECK(got == want);
      masters.emplace_back(core.store()->layout(l).numel);
      REQUIRE(core.store()->ReadState(l, 0, masters.back().data()).ok());
    }
    auto ck = core.Checkpoint("");
    INFO(ck.status().ToString());
    REQUIRE(ck.ok());
    ckpt = ck->dir;
    core.Stop();
  }
  {
    auto m = eps::ReadCheckpointManifest(ckpt);
    REQUIRE(m.ok());
    eps::EpsCore core(opts());
    const Status s = core.CreateJob(job, eps::FromCheckpoint(std::move(m).value(), eps::FromBuffers(other)));
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(s.message().find("resume needs the same base") != std::string::npos);
  }
  {
    auto m = eps::ReadCheckpointManifest(ckpt);
    REQUIRE(m.ok());
    eps::EpsCore core(opts());
    const Status s = core.CreateJob(job, eps::FromCheckpoint(std::move(m).value(), eps::FromBuffers(base)));
    INFO(s.ToString());
    REQUIRE(s.ok());
    for (int64_t l = 0; l < core.store()->num_layers(); ++l) {
      std::vector<float> got(core.store()->layout(l).numel);
      REQUIRE(core.store()->ReadState(l, 0, got.data()).ok());
      CHECK(got == masters[static_cast<size_t>(l)]);
    }
    core.Stop();
  }
  // A base with a non-finite value is refused before anything runs (it has no master for
  // the usual finiteness check).
  {
    std::vector<std::vector<float>> bad = base;
    bad[1][3] = std::numeric_limits<float>::infinity();
    eps::EpsCore core(opts());
    const Status s = core.CreateJob(job, eps::FromBuffers(bad));
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("layer 1's frozen base is not finite") != std::string::npos);
    CHECK_FALSE(core.has_job());
  }
  // A manifest without its base is refused.
  {
    const std::string path = ckpt + "/manifest.json";
    std::string text = testing::ReadAll(path);
    const size_t at = text.find("\"lora_base\"");
    REQUIRE(at != std::string::npos);
    text.replace(at, 11, "\"lora_gone\"");
    std::ofstream(path, std::ios::trunc) << text;
    auto m = eps::ReadCheckpointManifest(ckpt);
    REQUIRE_FALSE(m.ok());
    CHECK(m.status().message().find("lora_base.hash") != std::string::npos);
  }
}

TEST_CASE("A LoRA job from a model file resumes only on that file, unchanged", "[integration][eps][lora]") {
  // The base is a Hugging Face directory (the committed tiny Qwen3 fixture, copied): the
  // checkpoint names it by model.from and hash; a changed or missing file is refused.
  namespace fs = std::filesystem;
  auto tmp = testing::TempDir::Create("l2l-eps-lora-file");
  REQUIRE(tmp.ok());
  const std::string base_dir = (*tmp)->File("base");
  fs::create_directories(base_dir);
  for (const char* f : {"config.json", "model.safetensors"}) {
    fs::copy_file(std::string(L2L_SOURCE_DIR) + "/tests/fixtures/families/qwen3/" + f, base_dir + "/" + f);
  }
  const std::string tokens = (*tmp)->File("train.bin");
  REQUIRE(WriteTokens(tokens, MakeTokens(4000, 64)).ok());
  eps::JobSource src;
  src.job_yaml = "model: {from: " + base_dir + "}\n"
                 "train: {steps: 2, micro_batch_size: 1, micro_batches: 1, seq_len: 8}\n"
                 "data: {train_path: " + tokens + "}\n"
                 "lora: {r: 2, alpha: 4, target: all-linear, base_dtype: q4}\n";
  auto plan = eps::ChooseJobStart(src);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  auto opts = [&] { return CoreOpts((*tmp)->path()); };
  std::string ckpt;
  {
    eps::EpsCore core(opts());
    REQUIRE(core.CreateJob(plan->job, plan->start).ok());
    auto ck = core.Checkpoint("");
    REQUIRE(ck.ok());
    ckpt = ck->dir;
    core.Stop();
  }
  auto resume = [&]() -> Status {
    eps::JobSource r;
    r.checkpoint = ckpt;
    auto p = eps::ChooseJobStart(r);
    if (!p.ok()) return p.status();
    eps::EpsCore core(opts());
    Status s = core.CreateJob(p->job, p->start);
    core.Stop();
    return s;
  };
  {
    const Status s = resume();  // the same file
    INFO(s.ToString());
    CHECK(s.ok());
  }
  {
    // One weight of the file changes (its last 4 bytes: a float of the last tensor).
    const std::string f = base_dir + "/model.safetensors";
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-4, std::ios::end);
    float v = 0;
    io.read(reinterpret_cast<char*>(&v), 4);
    v += 0.25f;
    io.seekp(-4, std::ios::end);
    io.write(reinterpret_cast<const char*>(&v), 4);
  }
  {
    const Status s = resume();
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kFailedPrecondition);
    CHECK(s.message().find("resume needs the same base") != std::string::npos);
  }
  fs::remove_all(base_dir);
  {
    const Status s = resume();
    INFO(s.ToString());
    CHECK_FALSE(s.ok());
    CHECK(s.message().find("resume needs the base the adapters were trained on") != std::string::npos);
    CHECK(s.message().find(base_dir) != std::string::npos);
  }
}

}  // namespace l2l::itest

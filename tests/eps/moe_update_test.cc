// The EPS's update of a mixture-of-experts model (eps_server/update_pipeline.h "Mixture of
// experts"): only the experts some worker reported (ReportExperts) are updated, each with
// its own AdamW step count; an unreported expert keeps master, m and v bit for bit and is
// published unchanged, even when its pushed gradient is non-zero (the report, not a zero
// gradient, decides); a step whose block gradient arrives without any report fails the
// pipeline with a message; the counts are what a checkpoint stores, and a checkpoint
// manifest round-trips them (and a MoE job's manifest without them is refused).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/adamw.h"
#include "eps_server/checkpoint.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"
#include "tests/eps/grads_util.h"
#include "tests/testing/jobs.h"
#include "tests/testing/temp_dir.h"

namespace l2l::eps {
namespace {

JobConfig MoeJob() {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 24}, {.clip = ClipMode::kNone, .lr = 1e-2f, .warmup_steps = 2,
                                                         .total_steps = 10, .weight_decay = 0.1f});
  j.model.family = ModelFamily::kLlama;
  j.model.tied_embeddings = false;
  // Explicit: a checkpoint's job_yaml writes n_kv_heads' effective value, its model_spec
  // the stored one, and ReadCheckpointManifest compares them (0 would differ from 4).
  j.model.n_kv_heads = 2;
  j.model.num_experts = 4;
  j.model.experts_per_token = 1;
  j.publish_dtype = DType::kF32;
  REQUIRE(j.Validate().ok());
  return j;
}

std::unique_ptr<ParamStore> MakeStore(const JobConfig& job) {
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = DType::kF32;
  auto s = ParamStore::Create(job.model, o);
  REQUIRE(s.ok());
  REQUIRE((*s)->InitFromSeed(11).ok());
  for (int64_t l = 0; l < (*s)->num_layers(); ++l) REQUIRE((*s)->PublishMaster(l, 0).ok());
  return std::move(s).value();
}

// touched[step][worker]: n_layer * E bytes. Step 0: worker 0 block 0 expert 0, worker 1
// block 0 expert 1 and block 1 expert 2; step 1: worker 0 block 0 experts 0 and 2, worker 1
// nothing; step 2: worker 0 every expert of block 1, worker 1 block 0 expert 3. Block 0
// expert 0 then has 2 steps, expert 1 one, expert 2 one, expert 3 one; block 1 expert 2
// two, the other experts of block 1 one.
std::vector<std::vector<std::vector<uint8_t>>> Touched() {
  auto at = [](std::initializer_list<int> on) {
    std::vector<uint8_t> t(8, 0);
    for (int i : on) t[static_cast<size_t>(i)] = 1;
    return t;
  };
  return {{at({0}), at({1, 6})}, {at({0, 2}), at({})}, {at({4, 5, 6, 7}), at({3})}};
}

}  // namespace

TEST_CASE("UpdatePipeline updates only the reported experts, each with its own AdamW step count",
          "[eps][pipeline][moe]") {
  const JobConfig job = MoeJob();
  auto ps = MakeStore(job);
  const int W = 2;
  const int64_t L = ps->num_layers(), E = job.model.num_experts;
  const Grads g = MakeGrads(*ps, 3, W, 5);  // non-zero everywhere, unreported experts included
  const auto touched = Touched();
  const std::vector<int64_t> mbs = {2, 3};

  // The expected state: torch.optim.AdamW with .grad None for the experts nobody reported.
  std::vector<std::vector<float>> p(L), m(L), v(L);
  for (int64_t l = 0; l < L; ++l) {
    p[l].resize(ps->layout(l).numel);
    InitLayerParams(job.model, ps->layout(l), 11, p[l].data());
    m[l].assign(p[l].size(), 0.0f);
    v[l].assign(p[l].size(), 0.0f);
  }
  std::vector<int64_t> counts(static_cast<size_t>(job.model.n_layer * E), 0);
  const float inv = 1.0f / 5.0f;
  for (size_t step = 0; step < g.size(); ++step) {
    std::vector<uint8_t> any(counts.size(), 0);
    for (int w = 0; w < W; ++w) {
      for (size_t k = 0; k < any.size(); ++k) any[k] |= touched[step][w][k];
    }
    for (int64_t l = 0; l < L; ++l) {
      std::vector<float> sum = g[step][0][l];
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + g[step][1][l][i];
      const AdamWStepArgs a = AdamWStepArgsAt(job.optim, static_cast<int64_t>(step), inv);
      const std::vector<ExpertRange> experts = ExpertRanges(job.model, ps->layout(l));
      for (const ParamInfo& info : ps->layout(l).params) {
        AdamWStepArgs ai = WithDecay(a, info.decay);
        for (size_t e = 0; e < experts.size(); ++e) {
          if (info.offset < experts[e].begin || info.offset >= experts[e].end) continue;
          const size_t k = static_cast<size_t>(ps->layout(l).block * E) + e;
          ai.t = any[k] ? counts[k] + 1 : 0;
        }
        if (ai.t == 0) continue;
        AdamWStep(p[l].data() + info.offset, sum.data() + info.offset, m[l].data() + info.offset,
                  v[l].data() + info.offset, info.numel, ai);
      }
    }
    for (size_t k = 0; k < counts.size(); ++k) counts[k] += any[k];
  }
  CHECK(counts == std::vector<int64_t>{2, 1, 1, 1, 1, 1, 2, 1});

  {
    UpdatePipeline pipe(ps.get(), job, W, 0);
    for (size_t step = 0; step < g.size(); ++step) {
      for (int w = 0; w < W; ++w) REQUIRE(pipe.ReportExperts(w, static_cast<int64_t>(step), touched[step][w]).ok());
      for (int64_t l = L - 1; l >= 0; --l) {
        for (int w = 0; w < W; ++w) {
          GradientRef r;
          r.worker_id = w;
          r.data = g[step][w][l].data();
          r.numel = g[step][w][l].size();
          r.micro_batches = mbs[w];
          REQUIRE(pipe.Submit(l, static_cast<int64_t>(step), std::move(r)).ok());
        }
      }
      REQUIRE(pipe.WaitForStep(static_cast<int64_t>(step) + 1, std::chrono::seconds(30)));
    }
    CHECK(pipe.expert_steps() == counts);
    CHECK(pipe.set_expert_steps({1, 2}).code() == StatusCode::kInvalidArgument);
    CHECK(pipe.ReportExperts(0, 3, std::vector<uint8_t>(3, 1)).code() == StatusCode::kInvalidArgument);
  }
  for (int64_t l = 0; l < L; ++l) {
    INFO("layer " << l);
    std::vector<float> master(p[l].size()), mm(p[l].size()), vv(p[l].size());
    REQUIRE(ps->ReadState(l, 0, master.data()).ok());
    REQUIRE(ps->ReadState(l, 1, mm.data()).ok());
    REQUIRE(ps->ReadState(l, 2, vv.data()).ok());
    CHECK(std::memcmp(master.data(), p[l].data(), p[l].size() * 4) == 0);
    CHECK(std::memcmp(mm.data(), m[l].data(), m[l].size() * 4) == 0);
    CHECK(std::memcmp(vv.data(), v[l].data(), v[l].size() * 4) == 0);
    auto pin = ps->Acquire(l, 3, std::chrono::milliseconds(100));
    REQUIRE(pin.ok());
    CHECK(std::memcmp(pin->data(), p[l].data(), p[l].size() * 4) == 0);
  }
}

TEST_CASE("UpdatePipeline fails a mixture-of-experts step whose experts nobody reported", "[eps][pipeline][moe]") {
  const JobConfig job = MoeJob();
  auto ps = MakeStore(job);
  const Grads g = MakeGrads(*ps, 1, 1, 3);
  UpdatePipeline pipe(ps.get(), job, 1, 0);
  for (int64_t l = ps->num_layers() - 1; l >= 0; --l) {
    GradientRef r;
    r.worker_id = 0;
    r.data = g[0][0][l].data();
    r.numel = g[0][0][l].size();
    pipe.Submit(l, 0, std::move(r)).IgnoreError();  // a failed pipeline refuses later ones
  }
  CHECK_FALSE(pipe.WaitForStep(1, std::chrono::seconds(5)));
  INFO(pipe.failure().ToString());
  CHECK(pipe.failure().code() == StatusCode::kFailedPrecondition);
  CHECK(pipe.failure().ToString().find("ReportExperts") != std::string::npos);
}

TEST_CASE("A checkpoint manifest keeps the per-expert step counts", "[eps][checkpoint][moe]") {
  const JobConfig job = MoeJob();
  auto ps = MakeStore(job);
  auto dir = testing::TempDir::Create("l2l-moe-ckpt");
  REQUIRE(dir.ok());
  CheckpointMeta meta;
  meta.step = 3;
  meta.job = job;
  meta.expert_steps = {2, 1, 1, 1, 1, 1, 2, 0};
  const std::string path = (*dir)->File("step-3");
  REQUIRE(WriteCheckpoint(*ps, meta, path, false).ok());
  auto m = ReadCheckpointManifest(path);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(m->meta.expert_steps == meta.expert_steps);

  meta.expert_steps.clear();  // a MoE job's checkpoint must carry them
  const std::string bad = (*dir)->File("step-4");
  REQUIRE(WriteCheckpoint(*ps, meta, bad, false).ok());
  auto r = ReadCheckpointManifest(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK(r.status().ToString().find("expert_steps") != std::string::npos);
}

}  // namespace l2l::eps

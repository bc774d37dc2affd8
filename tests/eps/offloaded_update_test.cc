// Tests of the update pipeline's offloaded path (eps_server/update_pipeline.h
// set_offload, OffloadedUpdater): layers updated through CpuOffloadedUpdater (AdamWStep
// on copies of the state, as a CPU-backend worker would run it) end bit-identical to the
// daemon's fused pass -- masters, m, v and the published copy -- at device shares 0, 0.33
// and 1 over several steps, with global and per-layer clipping and a bf16 publish; a
// restart from the state in the middle equals the uninterrupted run; an updater error
// fails the update.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <random>
#include <vector>

#include "common/optimizer_model.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"
#include "tests/eps/grads_util.h"
#include "tests/eps/state_util.h"
#include "tests/testing/jobs.h"
#include "tests/testing/temp_dir.h"

namespace l2l::eps {
namespace {

JobConfig Job(const std::string& clip) {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 128},
                                {.clip = ParseClipMode(clip).value(), .lr = 1e-2f, .warmup_steps = 2,
                                 .total_steps = 10, .grad_clip = 0.05f});
  j.publish_dtype = DType::kBF16;
  return j;
}

// spill_dir non-empty: about a third of the state pages live on the SSD tier there.
std::unique_ptr<ParamStore> Store(const JobConfig& job, const std::string& spill_dir = "") {
  ParamStoreOptions o;
  o.page_bytes = 4096;  // layers span several pages: copies out and back cross page edges
  o.publish_dtype = job.publish_dtype;
  if (!spill_dir.empty()) {
    o.spill.dir = spill_dir;
    o.spill.block_bytes = 4096;
    o.spill.queue_depth = 8;
    o.host_bytes = ParamStore::RequiredHostBytes(job.model, o) * 2 / 3;
  }
  auto s = ParamStore::Create(job.model, o);
  L2L_CHECK(s.ok()) << s.status().ToString();
  if (!spill_dir.empty()) L2L_CHECK((*s)->ssd_bytes() > 0) << "nothing spilled";
  return std::move(s).value();
}

// Steps [first, last) through a pipeline whose store starts from `start` (or the seed).
State Run(const JobConfig& job, const Grads& g, const std::vector<bool>* mask, int first, int last,
          const State* start, OffloadedUpdater* updater, const std::string& spill_dir = "") {
  auto ps = Store(job, spill_dir);
  if (start != nullptr) {
    for (int64_t l = 0; l < ps->num_layers(); ++l) {
      REQUIRE(ps->WriteLayer(l, start->p[l].data(), start->m[l].data(), start->v[l].data()).ok());
    }
  } else {
    REQUIRE(ps->InitFromSeed(11).ok());
  }
  for (int64_t l = 0; l < ps->num_layers(); ++l) REQUIRE(ps->PublishMaster(l, first).ok());
  const int W = static_cast<int>(g[0].size());
  {
    UpdatePipeline pipe(ps.get(), job, W, first);
    if (mask != nullptr) pipe.set_offload(*mask, updater);
    for (int step = first; step < last; ++step) {
      for (int64_t l = ps->num_layers() - 1; l >= 0; --l) {
        for (int w = 0; w < W; ++w) {
          GradientRef r;
          r.worker_id = w;
          r.data = g[step][w][l].data();
          r.numel = g[step][w][l].size();
          r.micro_batches = 2;
          REQUIRE(pipe.Submit(l, step, std::move(r)).ok());
        }
      }
      REQUIRE(pipe.WaitForStep(step + 1, std::chrono::seconds(30)));
    }
  }
  return Read(*ps, last);
}

std::vector<bool> Mask(const ParamStore& ps, double fraction) {
  std::vector<LayerCost> layers;
  for (int64_t l = 0; l < ps.num_layers(); ++l) layers.push_back({static_cast<int64_t>(ps.layout(l).numel), 0});
  return SpreadLayers(layers, fraction);
}

// CpuOffloadedUpdater, counting the layers it updated (the offloaded path really ran).
class CountingUpdater : public OffloadedUpdater {
 public:
  Status Update(int64_t layer, const AdamWStepArgs& a, const std::vector<DecayRange>& r, float* p, float* m,
                float* v, const float* g, size_t n) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_[layer];
    }
    return cpu_.Update(layer, a, r, p, m, v, g, n);
  }
  std::map<int64_t, int> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  CpuOffloadedUpdater cpu_;
  mutable std::mutex mu_;
  std::map<int64_t, int> calls_;
};

TEST_CASE("offloaded layer updates are bit-identical to the daemon's at shares 0, 0.33 and 1",
          "[eps][pipeline][offload]") {
  const std::string clip = GENERATE(as<std::string>{}, "global", "per_layer", "none");
  const JobConfig job = Job(clip);
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 4, 2, 7);
  const State daemon = Run(job, g, nullptr, 0, 4, nullptr, nullptr);
  for (double f : {0.0, 0.33, 1.0}) {
    CAPTURE(clip, f);
    CountingUpdater cpu;
    const std::vector<bool> mask = Mask(*probe, f);
    if (f == 0.33) {
      const auto n = std::count(mask.begin(), mask.end(), true);
      CHECK(n > 0);
      CHECK(n < static_cast<long>(mask.size()));
    }
    CheckSame(Run(job, g, &mask, 0, 4, nullptr, &cpu), daemon);
    std::map<int64_t, int> expected;
    for (size_t l = 0; l < mask.size(); ++l) {
      if (mask[l]) expected[static_cast<int64_t>(l)] = 4;  // every step
    }
    CHECK(cpu.calls() == expected);
  }
}

TEST_CASE("a restart from the state in the middle equals the uninterrupted offloaded run",
          "[eps][pipeline][offload]") {
  const JobConfig job = Job("global");
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 4, 2, 7);
  CpuOffloadedUpdater cpu;
  const std::vector<bool> mask = Mask(*probe, 0.33);
  const State whole = Run(job, g, &mask, 0, 4, nullptr, &cpu);
  const State half = Run(job, g, &mask, 0, 2, nullptr, &cpu);
  CheckSame(Run(job, g, &mask, 2, 4, &half, &cpu), whole);
  // ... and equals the daemon-only run restarted the same way.
  const State daemon_half = Run(job, g, nullptr, 0, 2, nullptr, nullptr);
  CheckSame(Run(job, g, nullptr, 2, 4, &daemon_half, nullptr), whole);
}

TEST_CASE("offloaded updates of layers whose state is on the SSD tier equal the daemon's",
          "[eps][pipeline][offload]") {
  const JobConfig job = Job("global");
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 3, 2, 7);
  CpuOffloadedUpdater cpu;
  const State daemon = Run(job, g, nullptr, 0, 3, nullptr, nullptr);
  for (double f : {0.33, 1.0}) {
    CAPTURE(f);
    testing::TempDir dir("l2l_offload_spill");
    const std::vector<bool> mask = Mask(*probe, f);
    CheckSame(Run(job, g, &mask, 0, 3, nullptr, &cpu, dir.path()), daemon);
  }
}

class FailingUpdater : public OffloadedUpdater {
 public:
  Status Update(int64_t, const AdamWStepArgs&, const std::vector<DecayRange>&, float*, float*, float*,
                const float*, size_t) override {
    return Unavailable("device lost");
  }
};

TEST_CASE("an offloaded update that fails fails the pipeline naming the layer", "[eps][pipeline][offload]") {
  const JobConfig job = Job("none");
  auto ps = Store(job);
  REQUIRE(ps->InitFromSeed(11).ok());
  for (int64_t l = 0; l < ps->num_layers(); ++l) REQUIRE(ps->PublishMaster(l, 0).ok());
  const Grads g = MakeGrads(*ps, 1, 1, 7);
  FailingUpdater bad;
  std::vector<bool> mask(ps->num_layers(), false);
  mask.back() = true;
  UpdatePipeline pipe(ps.get(), job, 1, 0);
  pipe.set_offload(mask, &bad);
  const int64_t l = ps->num_layers() - 1;
  GradientRef r;
  r.worker_id = 0;
  r.data = g[0][0][l].data();
  r.numel = g[0][0][l].size();
  r.micro_batches = 1;
  REQUIRE(pipe.Submit(l, 0, std::move(r)).ok());
  CHECK_FALSE(pipe.WaitForStep(1, std::chrono::seconds(5)));
  const Status st = pipe.failure();
  REQUIRE(!st.ok());
  CHECK_THAT(st.message(), Catch::Contains("device lost"));
  CHECK_THAT(st.message(), Catch::Contains("layer " + std::to_string(l)));
}

}  // namespace
}  // namespace l2l::eps

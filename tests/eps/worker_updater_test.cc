// Tests of the interleaved optimizer's daemon-side transport (eps_server/worker_updater.h)
// inside the update pipeline, with in-process "workers" that speak its pull protocol
// (Take, update p/m/v in the shm exchange segment with common/adamw.h AdamWStep, Done):
// shares 0, 0.33 and 1 end bit-identical to the daemon's fused pass (masters, m, v and the
// published copy) with the updates really run by the worker; a worker that holds a task
// past the deadline, is removed while holding one, reports an error, or sends a malformed
// Done (wrong numel, layer or task id) makes the daemon update the layer itself from the
// untouched state (still bit-identical), with a clear error for the bad Done, and a
// worker that writes its segment after being timed out corrupts nothing.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/adamw.h"
#include "common/optimizer_model.h"
#include "common/shm.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"
#include "eps_server/worker_updater.h"
#include "tests/eps/grads_util.h"
#include "tests/eps/state_util.h"
#include "tests/testing/jobs.h"

namespace l2l::eps {
namespace {

JobConfig Job() {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 128},
                                {.clip = ParseClipMode("global").value(), .lr = 1e-2f, .warmup_steps = 2,
                                 .total_steps = 10, .grad_clip = 0.05f});
  j.publish_dtype = DType::kBF16;
  return j;
}

std::unique_ptr<ParamStore> Store(const JobConfig& job) {
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = job.publish_dtype;
  auto s = ParamStore::Create(job.model, o);
  L2L_CHECK(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

std::vector<bool> Mask(const ParamStore& ps, double fraction) {
  std::vector<LayerCost> layers;
  for (int64_t l = 0; l < ps.num_layers(); ++l) layers.push_back({static_cast<int64_t>(ps.layout(l).numel), 0});
  return SpreadLayers(layers, fraction);
}

// Failures seen on the fake workers' threads (Catch's assertions are for the test's own
// thread only): counted there, checked by the test after the worker thread is joined.
std::atomic<int> g_worker_errors{0};

// The worker's half of one task: AdamWStep over the ranges, in the segment.
void Apply(const UpdateTask& t) {
  auto seg = ShmSegment::Open(t.segment, true);
  if (!seg.ok()) {
    ++g_worker_errors;
    return;
  }
  char* b = static_cast<char*>(seg->data());
  auto* p = reinterpret_cast<float*>(b + t.p_offset);
  auto* m = reinterpret_cast<float*>(b + t.m_offset);
  auto* v = reinterpret_cast<float*>(b + t.v_offset);
  auto* g = reinterpret_cast<const float*>(b + t.g_offset);
  for (const DecayRange& r : t.ranges) {
    AdamWStep(p + r.begin, g + r.begin, m + r.begin, v + r.begin, r.end - r.begin, WithDecay(t.args, r.decay));
  }
}

// A polling worker thread: `on_task` decides what to do with each task (return false to
// stop polling).
class FakeWorker {
 public:
  FakeWorker(WorkerUpdater* u, int32_t id, std::function<bool(WorkerUpdater*, const UpdateTask&)> on_task)
      : thread_([this, u, id, on_task] {
          while (!stop_) {
            auto t = u->Take(id, std::chrono::milliseconds(50));
            if (!t.ok()) {
              last_take_error = t.status();
              return;
            }
            if (t->id == 0) continue;
            if (!on_task(u, *t)) return;
          }
        }) {}
  ~FakeWorker() {
    stop_ = true;
    thread_.join();
    CHECK(g_worker_errors.exchange(0) == 0);
  }
  Status last_take_error;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

bool Honest(WorkerUpdater* u, const UpdateTask& t) {
  Apply(t);
  if (!u->Done(0, t.id, t.layer, static_cast<int64_t>(t.numel), "").ok()) ++g_worker_errors;
  return true;
}

// Steps [0, steps) with the mask's layers through `updater` (nullptr: daemon only).
State Run(const JobConfig& job, const Grads& g, const std::vector<bool>* mask, OffloadedUpdater* updater) {
  auto ps = Store(job);
  REQUIRE(ps->InitFromSeed(11).ok());
  for (int64_t l = 0; l < ps->num_layers(); ++l) REQUIRE(ps->PublishMaster(l, 0).ok());
  const int W = static_cast<int>(g[0].size());
  {
    UpdatePipeline pipe(ps.get(), job, W, 0);
    if (mask != nullptr) pipe.set_offload(*mask, updater);
    for (int step = 0; step < static_cast<int>(g.size()); ++step) {
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
      REQUIRE(pipe.WaitForStep(step + 1, std::chrono::seconds(60)));
    }
  }
  return Read(*ps, static_cast<int64_t>(g.size()));
}

WorkerUpdaterOptions Opts(const ParamStore& ps, int deadline_ms) {
  WorkerUpdaterOptions o;
  o.job_id = "wutest" + std::to_string(::getpid());
  o.max_layer_numel = ps.max_layer_numel();
  o.deadline = std::chrono::milliseconds(deadline_ms);
  return o;
}

TEST_CASE("layers updated by a worker through the exchange segment are bit-identical to the daemon's",
          "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 3, 2, 7);
  const State daemon = Run(job, g, nullptr, nullptr);
  for (double f : {0.0, 0.33, 1.0}) {
    CAPTURE(f);
    const std::vector<bool> mask = Mask(*probe, f);
    WorkerUpdater u(Opts(*probe, 30000));
    REQUIRE(u.AddWorker(0, {true, "test", 1e9, 0, 0}).ok());
    CHECK(u.eligible() == 1);
    FakeWorker w(&u, 0, Honest);
    CheckSame(Run(job, g, &mask, &u), daemon);
    const auto on = std::count(mask.begin(), mask.end(), true);
    CHECK(u.stats().on_worker == 3 * on);  // every chosen layer, every step, on the worker
    CHECK(u.stats().fallbacks == 0);
  }
}

TEST_CASE("with no worker taking updates the daemon updates the chosen layers itself", "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 2, 1, 9);
  const State daemon = Run(job, g, nullptr, nullptr);
  const std::vector<bool> mask = Mask(*probe, 1.0);
  WorkerUpdater u(Opts(*probe, 30000));
  CheckSame(Run(job, g, &mask, &u), daemon);
  CHECK(u.stats().on_worker == 0);
  CHECK(u.stats().fallbacks == 2 * static_cast<int64_t>(mask.size()));
}

TEST_CASE("a worker that holds an update past the deadline: the daemon updates the layer, the late write corrupts "
          "nothing",
          "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 3, 1, 5);
  const State daemon = Run(job, g, nullptr, nullptr);
  const std::vector<bool> mask = Mask(*probe, 1.0);
  WorkerUpdater u(Opts(*probe, 300));
  REQUIRE(u.AddWorker(0, {true, "test", 1e9, 0, 0}).ok());
  std::atomic<int> n{0};
  Status late_done;
  {
    // Answers two tasks, then sits on the third past the deadline and scribbles over
    // its segment afterwards (a device that came back too late).
    FakeWorker w(&u, 0, [&](WorkerUpdater* up, const UpdateTask& t) {
      if (n++ < 2) return Honest(up, t);
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      auto seg = ShmSegment::Open(t.segment, true);
      if (seg.ok()) std::memset(seg->data(), 0x7f, seg->size());
      late_done = up->Done(0, t.id, t.layer, static_cast<int64_t>(t.numel), "");
      return false;
    });
    CheckSame(Run(job, g, &mask, &u), daemon);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    CHECK(u.stats().on_worker == 2);
    CHECK(u.stats().fallbacks >= 1);
    CHECK_THAT(u.stats().last_fallback_reason, Catch::Contains("did not finish it within 300 ms"));
    CHECK(u.eligible() == 0);
  }
  CHECK(late_done.code() == StatusCode::kNotFound);  // the late Done is refused
  // Excluded: its next Take is refused with the reason.
  auto t = u.Take(0, std::chrono::milliseconds(10));
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(t.status().message(), Catch::Contains("no more updates"));
}

TEST_CASE("a worker removed while it holds an update: the daemon updates the layer at once",
          "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 2, 1, 3);
  const State daemon = Run(job, g, nullptr, nullptr);
  const std::vector<bool> mask = Mask(*probe, 1.0);
  WorkerUpdater u(Opts(*probe, 60000));  // far beyond the test: only the removal ends the wait
  REQUIRE(u.AddWorker(0, {true, "test", 1e9, 0, 0}).ok());
  const auto t0 = std::chrono::steady_clock::now();
  {
    FakeWorker w(&u, 0, [&](WorkerUpdater* up, const UpdateTask&) {
      up->RemoveWorker(0, "worker 0 is lost (test)");
      return false;
    });
    CheckSame(Run(job, g, &mask, &u), daemon);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
  CHECK_THAT(u.stats().last_fallback_reason, Catch::Contains("worker 0 is lost (test)"));
}

TEST_CASE("a malformed UpdateDone gets a clear error and corrupts nothing", "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 2, 1, 4);
  const State daemon = Run(job, g, nullptr, nullptr);
  const std::vector<bool> mask = Mask(*probe, 1.0);
  struct Case {
    const char* name;
    int64_t dlayer, dnumel;
    uint64_t dtask;
    StatusCode code;
    const char* msg;
  };
  const Case cases[] = {
      {"wrong numel", 0, 5, 0, StatusCode::kInvalidArgument, "does not match the task it holds"},
      {"wrong layer", 1, 0, 0, StatusCode::kInvalidArgument, "does not match the task it holds"},
      {"unknown task", 0, 0, 1000, StatusCode::kInvalidArgument, "does not match the task it holds"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    WorkerUpdater u(Opts(*probe, 30000));
    REQUIRE(u.AddWorker(0, {true, "test", 1e9, 0, 0}).ok());
    Status got;
    {
      FakeWorker w(&u, 0, [&](WorkerUpdater* up, const UpdateTask& t) {
        Apply(t);
        std::memset(ShmSegment::Open(t.segment, true)->data(), 0xff, t.numel * 4);  // garbage p
        got = up->Done(0, t.id + c.dtask, t.layer + c.dlayer, static_cast<int64_t>(t.numel) + c.dnumel, "");
        return false;
      });
      CheckSame(Run(job, g, &mask, &u), daemon);
    }
    CHECK(got.code() == c.code);
    CHECK_THAT(got.message(), Catch::Contains(c.msg));
    CHECK(u.eligible() == 0);
  }
  // An id that never took updates.
  WorkerUpdater u(Opts(*probe, 30000));
  Status s = u.Done(3, 1, 0, 10, "");
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK_THAT(s.message(), Catch::Contains("takes no updates"));
}

TEST_CASE("a worker that reports an update error: the daemon updates the layer, the worker stays eligible",
          "[eps][pipeline][offload][worker_updater]") {
  const JobConfig job = Job();
  auto probe = Store(job);
  const Grads g = MakeGrads(*probe, 2, 1, 8);
  const State daemon = Run(job, g, nullptr, nullptr);
  const std::vector<bool> mask = Mask(*probe, 1.0);
  WorkerUpdater u(Opts(*probe, 30000));
  REQUIRE(u.AddWorker(0, {true, "test", 1e9, 0, 0}).ok());
  std::atomic<int> n{0};
  {
    FakeWorker w(&u, 0, [&](WorkerUpdater* up, const UpdateTask& t) {
      if (n++ == 0) {
        if (!up->Done(0, t.id, t.layer, static_cast<int64_t>(t.numel), "out of device memory").ok()) ++g_worker_errors;
        return true;
      }
      return Honest(up, t);
    });
    CheckSame(Run(job, g, &mask, &u), daemon);
  }
  CHECK(u.stats().fallbacks == 1);
  CHECK_THAT(u.stats().last_fallback_reason, Catch::Contains("out of device memory"));
  CHECK(u.eligible() == 1);
  CHECK(u.stats().on_worker == 2 * static_cast<int64_t>(mask.size()) - 1);
}

}  // namespace
}  // namespace l2l::eps

// Tests of eps_server/update_pipeline.h: the published result equals AdamW applied by
// the test itself with common/adamw.h (sum over workers, 1/total micro-batches, clip
// none | per_layer | global), does not depend on the order gradients arrive in, and
// rejects bad gradients with the right codes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/adamw.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"
#include "tests/eps/grads_util.h"
#include "tests/testing/jobs.h"

namespace l2l::eps {
namespace {

JobConfig SmallJob(const std::string& clip) {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 128},
                                {.clip = ParseClipMode(clip).value(), .lr = 1e-2f, .warmup_steps = 2,
                                 .total_steps = 10, .grad_clip = 0.05f /* small enough that clipping is active */});
  j.publish_dtype = DType::kF32;
  return j;
}

std::unique_ptr<ParamStore> MakeStore(const JobConfig& job) {
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = DType::kF32;
  auto s = ParamStore::Create(job.model, o);
  L2L_CHECK(s.ok()) << s.status().ToString();
  REQUIRE((*s)->InitFromSeed(11).ok());
  for (int64_t l = 0; l < (*s)->num_layers(); ++l) REQUIRE((*s)->PublishMaster(l, 0).ok());
  return std::move(s).value();
}


// The reference: AdamW per tensor with common/adamw.h on plain vectors.
std::vector<std::vector<float>> Reference(const JobConfig& job, const ParamStore& ps, const Grads& g,
                                          const std::vector<int64_t>& mbs) {
  const int64_t L = ps.num_layers();
  std::vector<std::vector<float>> p(L), m(L), v(L);
  for (int64_t l = 0; l < L; ++l) {
    p[l].resize(ps.layout(l).numel);
    InitLayerParams(job.model, ps.layout(l), 11, p[l].data());
    m[l].assign(p[l].size(), 0.0f);
    v[l].assign(p[l].size(), 0.0f);
  }
  int64_t total_mb = 0;
  for (int64_t x : mbs) total_mb += x;
  const float inv = 1.0f / static_cast<float>(total_mb);
  for (size_t step = 0; step < g.size(); ++step) {
    std::vector<std::vector<float>> sum(L);
    std::vector<double> n2(L, 0.0);
    for (int64_t l = 0; l < L; ++l) {
      sum[l] = g[step][0][l];
      for (size_t w = 1; w < g[step].size(); ++w)
        for (size_t i = 0; i < sum[l].size(); ++i) sum[l][i] = sum[l][i] + g[step][w][l][i];
      std::vector<float> avg(sum[l].size());
      for (size_t i = 0; i < avg.size(); ++i) avg[i] = sum[l][i] * inv;
      n2[l] = SumSquares(avg.data(), avg.size());
    }
    double total = 0;
    for (double x : n2) total += x;
    for (int64_t l = 0; l < L; ++l) {
      float coef = 1.0f;
      if (job.train.clip == l2l::ClipMode::kGlobal) coef = ClipCoefficient(std::sqrt(total), job.optim.grad_clip);
      if (job.train.clip == l2l::ClipMode::kPerLayer) coef = ClipCoefficient(std::sqrt(n2[l]), job.optim.grad_clip);
      for (const ParamInfo& pi : ps.layout(l).params) {
        AdamWStep(p[l].data() + pi.offset, sum[l].data() + pi.offset, m[l].data() + pi.offset,
                  v[l].data() + pi.offset, pi.numel,
                  WithDecay(AdamWStepArgsAt(job.optim, static_cast<int64_t>(step), inv * coef), pi.decay));
      }
    }
  }
  return p;
}

// Runs the pipeline, pushing each step's gradients in an order chosen by `order_seed`
// (layers in backward order per worker, workers interleaved at random).
std::vector<std::vector<float>> RunPipeline(const JobConfig& job, const Grads& g,
                                            const std::vector<int64_t>& mbs, uint32_t order_seed,
                                            size_t undo_budget = SIZE_MAX) {
  auto ps = MakeStore(job);
  const int W = static_cast<int>(g[0].size());
  const int64_t L = ps->num_layers();
  {
    UpdatePipeline pipe(ps.get(), job, W, 0, undo_budget);
    std::mt19937 rng(order_seed);
    for (size_t step = 0; step < g.size(); ++step) {
      std::vector<int64_t> next(W, L - 1);
      for (int left = W * static_cast<int>(L); left > 0; --left) {
        int w;
        do { w = static_cast<int>(rng() % W); } while (next[w] < 0);
        const int64_t l = next[w]--;
        GradientRef r;
        r.worker_id = w;
        r.data = g[step][w][l].data();
        r.numel = g[step][w][l].size();
        r.micro_batches = mbs[w];
        REQUIRE(pipe.Submit(l, static_cast<int64_t>(step), std::move(r)).ok());
      }
      REQUIRE(pipe.WaitForStep(static_cast<int64_t>(step) + 1, std::chrono::seconds(30)));
    }
  }
  std::vector<std::vector<float>> out(L);
  for (int64_t l = 0; l < L; ++l) {
    CHECK(ps->published_version(l) == static_cast<int64_t>(g.size()));
    auto pin = ps->Acquire(l, static_cast<int64_t>(g.size()), std::chrono::milliseconds(100));
    REQUIRE(pin.ok());
    out[l].resize(ps->layout(l).numel);
    std::memcpy(out[l].data(), pin->data(), out[l].size() * 4);
    std::vector<float> master(out[l].size());
    REQUIRE(ps->ReadState(l, 0, master.data()).ok());
    CHECK(master == out[l]);
  }
  return out;
}

// Undo budgets for the bounded guard (update_pipeline.h): 0 -> unbounded (every layer has
// an undo copy), 1 -> the least (every layer deferred), 2 -> undo copies for the two
// layers whose gradients come first (the last two), the rest deferred.
// An undo copy costs 8 B/param beyond the deferred 4 (12 with global clip).
size_t UndoBudget(const ParamStore& ps, const JobConfig& job, int kind, int64_t* undo_layers) {
  std::vector<size_t> numel;
  for (int64_t l = 0; l < ps.num_layers(); ++l) numel.push_back(ps.layout(l).numel);
  const bool global = job.train.clip == l2l::ClipMode::kGlobal && job.optim.grad_clip > 0;
  size_t b = SIZE_MAX;
  if (kind == 1) b = UpdatePipeline::MinGuardBytes(numel);
  if (kind == 2) {
    b = UpdatePipeline::MinGuardBytes(numel) + (global ? 12 : 8) * (numel[numel.size() - 1] + numel[numel.size() - 2]);
  }
  const size_t bytes = UpdatePipeline::GuardBytes(numel, b, global, undo_layers);
  if (b != SIZE_MAX) CHECK(bytes <= b);  // the plan stays inside its budget
  return b;
}

}  // namespace

TEST_CASE("UpdatePipeline with a bounded undo budget publishes the unbounded result bit for bit",
          "[eps][pipeline][nonfinite]") {
  const std::string clip = GENERATE("none", "per_layer", "global");
  const int kind = GENERATE(1, 2);
  INFO("clip=" << clip << " budget kind=" << kind);
  const JobConfig job = SmallJob(clip);
  auto probe = MakeStore(job);
  int64_t undo_layers = -1;
  const size_t budget = UndoBudget(*probe, job, kind, &undo_layers);
  CHECK(undo_layers == (kind == 1 ? 0 : 2));  // the plan the budget asks for
  const Grads g = MakeGrads(*probe, 3, 2, 5);
  const std::vector<int64_t> mbs = {2, 3};
  const auto want = Reference(job, *probe, g, mbs);
  const auto a = RunPipeline(job, g, mbs, 7, budget);
  for (size_t l = 0; l < want.size(); ++l) {
    INFO("layer " << l);
    CHECK(std::memcmp(a[l].data(), want[l].data(), want[l].size() * 4) == 0);
  }
}

TEST_CASE("UpdatePipeline publishes exactly AdamW of the summed gradients, in any arrival order",
          "[eps][pipeline]") {
  const std::string clip = GENERATE("none", "per_layer", "global");
  INFO("clip=" << clip);
  const JobConfig job = SmallJob(clip);
  auto probe = MakeStore(job);
  const Grads g = MakeGrads(*probe, 3, 2, 5);
  const std::vector<int64_t> mbs = {2, 3};
  const auto want = Reference(job, *probe, g, mbs);
  const auto a = RunPipeline(job, g, mbs, 1);
  const auto b = RunPipeline(job, g, mbs, 999);
  for (size_t l = 0; l < want.size(); ++l) {
    INFO("layer " << l);
    CHECK(std::memcmp(a[l].data(), want[l].data(), want[l].size() * 4) == 0);
    CHECK(std::memcmp(b[l].data(), want[l].data(), want[l].size() * 4) == 0);
  }
}

TEST_CASE("UpdatePipeline rejects bad gradients with codes and keeps going", "[eps][pipeline]") {
  const JobConfig job = SmallJob("none");
  auto ps = MakeStore(job);
  UpdatePipeline pipe(ps.get(), job, 2, 0);
  std::vector<float> g(ps->layout(3).numel, 0.01f);
  int released = 0;
  auto ref = [&](int32_t w, size_t n) {
    GradientRef r;
    r.worker_id = w;
    r.data = g.data();
    r.numel = n;
    r.micro_batches = 1;
    r.release = [&] { ++released; };
    return r;
  };
  CHECK(pipe.Submit(7, 0, ref(0, g.size())).code() == StatusCode::kNotFound);
  CHECK(pipe.Submit(3, 0, ref(0, g.size() - 1)).code() == StatusCode::kInvalidArgument);
  CHECK(pipe.Submit(3, 1, ref(0, g.size())).code() == StatusCode::kFailedPrecondition);
  CHECK(pipe.Submit(3, 0, ref(5, g.size())).code() == StatusCode::kNotFound);
  CHECK(released == 4);
  REQUIRE(pipe.Submit(3, 0, ref(0, g.size())).ok());
  CHECK(pipe.Submit(3, 0, ref(0, g.size())).code() == StatusCode::kAlreadyExists);
  CHECK(ps->published_version(3) == 0);
  REQUIRE(pipe.Submit(3, 0, ref(1, g.size())).ok());
  // A step is published when every layer has it: the other layers' gradients.
  std::vector<std::vector<float>> others;
  for (int64_t l = 0; l < ps->num_layers(); ++l) {
    if (l == 3) continue;
    others.emplace_back(ps->layout(l).numel, 0.01f);
    for (int32_t w : {0, 1}) {
      GradientRef r;
      r.worker_id = w;
      r.data = others.back().data();
      r.numel = others.back().size();
      REQUIRE(pipe.Submit(l, 0, std::move(r)).ok());
    }
  }
  auto pin = ps->Acquire(3, 1, std::chrono::seconds(10));
  REQUIRE(pin.ok());
  CHECK(pin->version() == 1);
}

TEST_CASE("UpdatePipeline Hold stops updates at a step boundary until Release", "[eps][pipeline]") {
  const JobConfig job = SmallJob("none");
  auto ps = MakeStore(job);
  UpdatePipeline pipe(ps.get(), job, 1, 0);
  std::vector<float> g(ps->layout(3).numel, 0.01f);
  CHECK(pipe.Hold() == 0);
  std::vector<std::vector<float>> grads;
  for (int64_t l = 0; l < ps->num_layers(); ++l) {
    grads.emplace_back(ps->layout(l).numel, 0.01f);
    GradientRef r;
    r.worker_id = 0;
    r.data = grads.back().data();
    r.numel = grads.back().size();
    REQUIRE(pipe.Submit(l, 0, std::move(r)).ok());
  }
  CHECK_FALSE(ps->Acquire(3, 1, std::chrono::milliseconds(50)).ok());
  pipe.Release();
  CHECK(ps->Acquire(3, 1, std::chrono::seconds(10)).ok());
}

}  // namespace l2l::eps

namespace l2l::eps {

TEST_CASE("UpdatePipeline in lock-free mode holds a gradient pushed ahead of the layer's step",
          "[eps][pipeline]") {
  JobConfig job = SmallJob("none");
  job.train.mode = l2l::TrainMode::kLockfree;
  job.train.staleness = 1;
  auto probe = MakeStore(job);
  const Grads g = MakeGrads(*probe, 2, 2, 5);
  const std::vector<int64_t> mbs = {1, 1};
  const auto want = Reference(job, *probe, g, mbs);
  auto ps = MakeStore(job);
  const int64_t L = ps->num_layers();
  {
    UpdatePipeline pipe(ps.get(), job, 2, 0);
    auto push = [&](int w, int64_t step, int64_t l) {
      GradientRef r;
      r.worker_id = w;
      const auto& src = g[std::min<int64_t>(step, 1)][w][l];  // step 2: any bytes (rejected)
      r.data = src.data();
      r.numel = src.size();
      r.micro_batches = 1;
      return pipe.Submit(l, step, std::move(r));
    };
    // Worker 0 runs a whole step ahead: its step-1 gradients wait for step 0.
    for (int64_t l = L - 1; l >= 0; --l) REQUIRE(push(0, 0, l).ok());
    for (int64_t l = L - 1; l >= 0; --l) REQUIRE(push(0, 1, l).ok());
    CHECK(push(0, 1, 2).code() == StatusCode::kAlreadyExists);
    CHECK(push(0, 2, 2).code() == StatusCode::kFailedPrecondition);  // beyond staleness 1
    CHECK(pipe.stats().completed_step == 0);
    for (int64_t l = L - 1; l >= 0; --l) REQUIRE(push(1, 0, l).ok());
    REQUIRE(pipe.WaitForStep(1, std::chrono::seconds(30)));
    for (int64_t l = 0; l < L; ++l) CHECK(ps->published_version(l) == 1);  // step 1 still needs worker 1
    for (int64_t l = L - 1; l >= 0; --l) REQUIRE(push(1, 1, l).ok());
    REQUIRE(pipe.WaitForStep(2, std::chrono::seconds(30)));
  }
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> master(ps->layout(l).numel);
    REQUIRE(ps->ReadState(l, 0, master.data()).ok());
    CHECK(std::memcmp(master.data(), want[l].data(), master.size() * 4) == 0);
  }
}

}  // namespace l2l::eps

namespace l2l::eps {
namespace {

// Every layer's master, m and v, concatenated (for bit-exact comparisons).
std::vector<float> State(const ParamStore& ps) {
  std::vector<float> out;
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    std::vector<float> buf(ps.layout(l).numel);
    for (int which = 0; which < 3; ++which) {
      REQUIRE(ps.ReadState(l, which, buf.data()).ok());
      out.insert(out.end(), buf.begin(), buf.end());
    }
  }
  return out;
}

// The published copy of every layer at `version`, as floats (f32 store).
std::vector<float> Published(ParamStore& ps, int64_t version) {
  std::vector<float> out;
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    auto pin = ps.Acquire(l, version, std::chrono::seconds(10));
    REQUIRE(pin.ok());
    CHECK(pin->version() == version);
    const float* p = static_cast<const float*>(pin->data());
    out.insert(out.end(), p, p + ps.layout(l).numel);
  }
  return out;
}

// Submits worker w's gradients of `step` for every layer, in backward order.
void PushStep(UpdatePipeline& pipe, const ParamStore& ps, const Grads& g, int64_t step, int w) {
  for (int64_t l = ps.num_layers() - 1; l >= 0; --l) {
    GradientRef r;
    r.worker_id = w;
    r.data = g[step][w][l].data();
    r.numel = g[step][w][l].size();
    r.micro_batches = 1;
    REQUIRE(pipe.Submit(l, step, std::move(r)).ok());
  }
}

}  // namespace

TEST_CASE("UpdatePipeline skips a step with a non-finite gradient in every layer, bit for bit",
          "[eps][pipeline][nonfinite]") {
  const std::string clip = GENERATE("none", "per_layer", "global");
  const float bad = GENERATE(std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity());
  // Undo budget (UndoBudget): unbounded, none (every layer deferred), the top two layers.
  const int kind = GENERATE(0, 1, 2);
  INFO("clip=" << clip << " bad=" << bad << " budget kind=" << kind);
  JobConfig job = SmallJob(clip);
  job.train.skip_pause_after = 0;
  auto ps = MakeStore(job);
  Grads g = MakeGrads(*ps, 3, 2, 5);
  // Step 1: worker 1's gradient of the middle layer holds one bad value; the top layers
  // are updated before it arrives (eager), the bottom ones after.
  g[1][1][ps->num_layers() / 2][17] = bad;
  int64_t undo_layers = 0;
  UpdatePipeline pipe(ps.get(), job, 2, 0, UndoBudget(*ps, job, kind, &undo_layers));
  std::mutex events_mu;
  std::vector<SkipEvent> events;  // GUARDED_BY(events_mu): on_skip runs on an update thread
  pipe.set_on_skip([&](const SkipEvent& e) {
    std::lock_guard<std::mutex> lock(events_mu);
    events.push_back(e);
  });
  for (int w : {0, 1}) PushStep(pipe, *ps, g, 0, w);
  REQUIRE(pipe.WaitForStep(1, std::chrono::seconds(30)));
  const auto before = State(*ps);
  const auto published_before = Published(*ps, 1);
  for (int w : {0, 1}) PushStep(pipe, *ps, g, 1, w);
  REQUIRE(pipe.WaitForStep(2, std::chrono::seconds(30)));
  // Version 2 is out (workers go on) with exactly the weights of version 1.
  CHECK(State(*ps) == before);
  CHECK(Published(*ps, 2) == published_before);
  const PipelineStats st = pipe.stats();
  CHECK(st.skipped_steps == 1);
  CHECK(st.consecutive_skips == 1);
  CHECK(st.last_skip_reason.find("layer " + std::to_string(ps->num_layers() / 2)) != std::string::npos);
  // The callback runs just after the commit, outside the pipeline's lock.
  auto skip_events = [&] {
    std::lock_guard<std::mutex> lock(events_mu);
    return events;
  };
  for (int i = 0; i < 200 && skip_events().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  REQUIRE(skip_events().size() == 1);
  CHECK(skip_events()[0].step == 1);
  // The next good step applies normally and resets the run of skips.
  for (int w : {0, 1}) PushStep(pipe, *ps, g, 2, w);
  REQUIRE(pipe.WaitForStep(3, std::chrono::seconds(30)));
  CHECK(State(*ps) != before);
  CHECK(pipe.stats().consecutive_skips == 0);
  for (float x : State(*ps)) REQUIRE(std::isfinite(x));
}

TEST_CASE("UpdatePipeline skips a step whose reported loss is NaN and pauses after K skips in a row",
          "[eps][pipeline][nonfinite]") {
  const int kind = GENERATE(0, 1, 2);  // undo budget (UndoBudget)
  INFO("budget kind=" << kind);
  JobConfig job = SmallJob("per_layer");
  job.train.skip_pause_after = 2;
  auto ps = MakeStore(job);
  const Grads g = MakeGrads(*ps, 4, 2, 5);
  int64_t undo_layers = 0;
  UpdatePipeline pipe(ps.get(), job, 2, 0, UndoBudget(*ps, job, kind, &undo_layers));
  pipe.set_gate_on_losses(true);
  auto step = [&](int64_t s, double loss1) {
    for (int w : {0, 1}) PushStep(pipe, *ps, g, s, w);
    pipe.ReportLoss(0, s, 2.5);
    pipe.ReportLoss(1, s, loss1);
  };
  // All gradients in, but the step waits for its losses before it publishes.
  for (int w : {0, 1}) PushStep(pipe, *ps, g, 0, w);
  CHECK_FALSE(pipe.WaitForStep(1, std::chrono::milliseconds(200)));
  CHECK(ps->published_version(0) == 0);
  pipe.ReportLoss(0, 0, 2.5);
  pipe.ReportLoss(1, 0, 2.4);
  REQUIRE(pipe.WaitForStep(1, std::chrono::seconds(30)));
  const auto s1 = State(*ps);
  step(1, std::nan(""));
  REQUIRE(pipe.WaitForStep(2, std::chrono::seconds(30)));
  CHECK(State(*ps) == s1);
  CHECK(pipe.stats().last_skip_reason.find("worker 1 reported loss") != std::string::npos);
  CHECK_FALSE(pipe.stats().skip_paused);
  step(2, std::numeric_limits<double>::infinity());
  REQUIRE(pipe.WaitForStep(3, std::chrono::seconds(30)));
  CHECK(State(*ps) == s1);
  // Two in a row: the gate is closed; step 3's good gradients wait.
  CHECK(pipe.stats().skip_paused);
  CHECK(pipe.stats().skipped_steps == 2);
  step(3, 2.3);
  CHECK_FALSE(pipe.WaitForStep(4, std::chrono::milliseconds(300)));
  CHECK(State(*ps) == s1);
  pipe.ClearSkipPause();
  REQUIRE(pipe.WaitForStep(4, std::chrono::seconds(30)));
  CHECK(State(*ps) != s1);
  CHECK_FALSE(pipe.stats().skip_paused);
}

TEST_CASE("UpdatePipeline ResetToStep undoes layers applied ahead of the step's commit, bit for bit",
          "[eps][pipeline][nonfinite]") {
  JobConfig job = SmallJob("none");
  auto ps = MakeStore(job);
  const Grads g = MakeGrads(*ps, 1, 1, 5);
  const auto want = Reference(job, *ps, g, {1});
  UpdatePipeline pipe(ps.get(), job, 1, 0);
  pipe.set_gate_on_losses(true);
  PushStep(pipe, *ps, g, 0, 0);
  // Every layer applied step 0 and waits for the loss: not a boundary.
  const std::vector<float> init = [&] {
    auto fresh = MakeStore(job);
    return State(*fresh);
  }();
  // Poll under Freeze(), which waits for running updates (reading the state while the
  // pipeline may write it would race); the gate stays open between polls.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  UpdatePipeline::Frozen f = pipe.Freeze();
  for (int i = 0; i < 100 && State(*ps) == init; ++i) {
    pipe.Release();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    f = pipe.Freeze();
  }
  CHECK(f.step == 0);
  CHECK_FALSE(f.at_boundary);
  CHECK(State(*ps) != init);
  CHECK(ps->published_version(0) == 0);
  // The step is abandoned (a worker was lost): the state is the boundary's again.
  pipe.ResetToStep(0);
  CHECK(State(*ps) == init);
  pipe.Release();
  PushStep(pipe, *ps, g, 0, 0);
  pipe.ReportLoss(0, 0, 1.0);
  REQUIRE(pipe.WaitForStep(1, std::chrono::seconds(30)));
  for (int64_t l = 0; l < ps->num_layers(); ++l) {
    std::vector<float> master(ps->layout(l).numel);
    REQUIRE(ps->ReadState(l, 0, master.data()).ok());
    CHECK(std::memcmp(master.data(), want[l].data(), master.size() * 4) == 0);
  }
}

}  // namespace l2l::eps

namespace l2l::eps {
namespace {

TEST_CASE("UpdatePipeline keeps each published version's update times: work, lag, wait for the losses",
          "[eps][pipeline][timeline]") {
  const JobConfig job = SmallJob("none");
  auto ps = MakeStore(job);
  const int64_t steps = UpdatePipeline::kUpdateHistory + 2;
  const Grads g = MakeGrads(*ps, static_cast<int>(steps), 1, 5);
  UpdatePipeline pipe(ps.get(), job, 1, 0);
  pipe.set_gate_on_losses(true);
  CHECK_FALSE(pipe.UpdateTimesFor(0).has_value());  // the initial weights: no update
  // Step 0: every gradient in, the loss 300 ms later; the commit waits for it.
  PushStep(pipe, *ps, g, 0, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  pipe.ReportLoss(0, 0, 2.5);
  REQUIRE(pipe.WaitForStep(1, std::chrono::seconds(30)));
  const auto t1 = pipe.UpdateTimesFor(1);
  REQUIRE(t1.has_value());
  CHECK(t1->busy_s > 0);
  CHECK(t1->commit_wait_s >= 0.25);
  CHECK(t1->lag_s >= t1->commit_wait_s);
  CHECK(t1->lag_s < 30);
  // Later steps: the loss comes with the gradients, so the commit does not wait long;
  // only the last kUpdateHistory versions are kept.
  for (int64_t s = 1; s < steps; ++s) {
    pipe.ReportLoss(0, s, 2.5);
    PushStep(pipe, *ps, g, s, 0);
    REQUIRE(pipe.WaitForStep(s + 1, std::chrono::seconds(30)));
  }
  CHECK_FALSE(pipe.UpdateTimesFor(1).has_value());
  CHECK_FALSE(pipe.UpdateTimesFor(steps - UpdatePipeline::kUpdateHistory).has_value());
  for (int64_t v = steps - UpdatePipeline::kUpdateHistory + 1; v <= steps; ++v) {
    const auto t = pipe.UpdateTimesFor(v);
    REQUIRE(t.has_value());
    CHECK(t->busy_s > 0);
    CHECK(t->commit_wait_s <= t->lag_s);
  }
  CHECK_FALSE(pipe.UpdateTimesFor(steps + 1).has_value());
}

}  // namespace
}  // namespace l2l::eps

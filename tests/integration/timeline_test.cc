// The per-step timeline in run.jsonl (docs/operations.md "run.jsonl"): a real l2l-eps
// and l2l-worker train a tiny job; every step's line must carry the worker's and the
// daemon's timeline fields, non-negative and consistent with each other (the worker's
// phases fit in its relay step, the relay step fits in the daemon's step), and a delay
// injected at a known place (L2L_DELAY_AT, common/fault_point.h) must show up in the
// field that names it: a slow layer fetch in wait_layer_s / wait_first_layer_s, a slow
// update on the daemon in update_lag_s and in the next step's wait_first_layer_s.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/integration/harness.h"
#include "tests/testing/scoped_env.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

using testing::ScopedEnv;

// Runs the tiny job with L2L_DELAY_AT set for the daemon and for the worker; returns the
// step lines of run.jsonl.
std::vector<Json> RunJob(const std::string& eps_delay, const std::string& worker_delay) {
  auto dir = TempDir::Create("l2l-timeline");
  REQUIRE(dir.ok());
  Result<JobConfig> made = SmallOpsJob(**dir);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  const JobConfig job = *made;
  Result<std::unique_ptr<EpsDaemon>> eps = Internal("not started");
  {
    ScopedEnv env("L2L_DELAY_AT", eps_delay);
    eps = EpsDaemon::Start(job, DaemonOptions{}, **dir);
  }
  REQUIRE(eps.ok());
  Result<std::unique_ptr<Process>> worker = Internal("not started");
  {
    ScopedEnv env("L2L_DELAY_AT", worker_delay);
    worker = StartWorker((*eps)->address(), "w0", (*dir)->File("worker.log"));
  }
  REQUIRE(worker.ok());
  auto wc = (*worker)->Wait(180s);
  INFO("worker log:\n" << (*worker)->LogTail() << "\neps log:\n" << (*eps)->process().LogTail());
  REQUIRE(wc.ok());
  REQUIRE(*wc == 0);
  REQUIRE((*eps)->Shutdown().ok());
  std::ifstream f((*eps)->state_dir() + "/run.jsonl");
  REQUIRE(f.good());
  std::vector<Json> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(Json::parse(line));
  REQUIRE(static_cast<int64_t>(lines.size()) == job.train.steps);
  return lines;
}

double Get(const Json& j, const char* name) {
  INFO("run.jsonl line " << j.dump() << " field " << name);
  REQUIRE(j.contains(name));
  const double v = j.at(name).get<double>();
  CHECK(std::isfinite(v));
  CHECK(v >= 0);
  return v;
}

// Fields present, non-negative, and nested as the timeline says. Tolerances: 5 ms and
// 5% for the clocks of two processes and the instants between the measured intervals.
void CheckConsistent(const std::vector<Json>& lines) {
  for (const Json& j : lines) {
    INFO("run.jsonl line " << j.dump());
    const int64_t step = j.at("step").get<int64_t>();
    const double step_s = Get(j, "step_s"), worker_step = Get(j, "worker_step_s");
    const double compute = Get(j, "compute_s"), wait_layer = Get(j, "wait_layer_s");
    const double wait_first = Get(j, "wait_first_layer_s"), wait_push = Get(j, "wait_push_s");
    const double between = Get(j, "between_s");
    CHECK(compute > 0);
    CHECK(worker_step > 0);
    CHECK(wait_first <= wait_layer + 1e-9);
    // The worker's phases are disjoint parts of its relay step.
    CHECK(compute + wait_layer + wait_push <= worker_step * 1.05 + 0.005);
    // The forward/backward split is the same compute, seen by phase.
    CHECK(Get(j, "forward_s") + Get(j, "backward_s") + Get(j, "recompute_s") <= compute * 1.05 + 0.005);
    if (step == 1) {
      CHECK(between == 0);
      // No update published this step's weights: the job's initial version.
      CHECK(!j.contains("update_s"));
      CHECK(!j.contains("update_lag_s"));
      CHECK(!j.contains("commit_wait_s"));
    } else {
      // The daemon's step runs from the previous StepDone to this one: it holds this
      // relay step, and the previous StepDone's reply plus the data loading.
      CHECK(worker_step <= step_s * 1.05 + 0.005);
      CHECK(worker_step + between >= step_s * 0.95 - 0.005);
      CHECK(worker_step + between <= step_s * 1.05 + 0.05);
      const double update_lag = Get(j, "update_lag_s");
      CHECK(Get(j, "commit_wait_s") <= update_lag + 1e-9);
      Get(j, "update_s");
    }
  }
}

TEST_CASE("run.jsonl carries a per-step timeline from the worker and the daemon", "[integration][ops][timeline]") {
  SECTION("no delay: fields present and consistent") {
    CheckConsistent(RunJob("", ""));
  }
  SECTION("a slow layer fetch on the worker shows in wait_layer_s and wait_first_layer_s") {
    // Every fetch (6 a step: embedding, 2 blocks, head, then 2 blocks again) sleeps 150 ms
    // holding the layer; the tiny layers compute in well under that, so the relay waits.
    const std::vector<Json> lines = RunJob("", "worker.fetch:150");
    CheckConsistent(lines);
    for (const Json& j : lines) {
      INFO("run.jsonl line " << j.dump());
      CHECK(j.at("wait_layer_s").get<double>() >= 0.5);
      CHECK(j.at("wait_first_layer_s").get<double>() >= 0.1);
    }
  }
  SECTION("a slow update on the daemon shows in update_lag_s and the next step's first fetch") {
    // Every layer's update sleeps 300 ms: the embedding's gradient comes last, so its
    // version is published at least 300 ms after it arrived, and the next step's first
    // fetch (the embedding) waits for that publish.
    const std::vector<Json> lines = RunJob("eps.update:300", "");
    CheckConsistent(lines);
    for (const Json& j : lines) {
      INFO("run.jsonl line " << j.dump());
      if (j.at("step").get<int64_t>() == 1) continue;
      CHECK(j.at("update_lag_s").get<double>() >= 0.3);
      CHECK(j.at("wait_first_layer_s").get<double>() >= 0.15);
      CHECK(j.at("update_s").get<double>() >= 4 * 0.3);  // 4 layers, each slept
    }
  }
}

}  // namespace
}  // namespace l2l::itest

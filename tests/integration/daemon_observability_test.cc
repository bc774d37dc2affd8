// l2l-eps as operators observe it: a real daemon and worker train a tiny job; the daemon
// must write one run.jsonl line per completed step (with the workers' phase times) and
// serve the Prometheus text format on --metrics-listen.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>

#include "tests/integration/harness.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;

// The value of an unlabelled sample `name` in a Prometheus text body; NaN if absent.
double Sample(const std::string& body, const std::string& name) {
  std::smatch m;
  if (std::regex_search(body, m, std::regex("\n" + name + " ([^\n]+)\n"))) return std::stod(m[1]);
  return std::nan("");
}

TEST_CASE("l2l-eps logs every step to run.jsonl and serves Prometheus metrics", "[integration][ops]") {
  auto dir = TempDir::Create("l2l-observe");
  REQUIRE(dir.ok());
  Result<JobConfig> made = SmallOpsJob(**dir);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  const JobConfig job = *made;

  DaemonOptions o;
  o.extra_args = {"--metrics-listen", "127.0.0.1:0"};
  auto eps = EpsDaemon::Start(job, o, **dir);
  REQUIRE(eps.ok());
  auto worker = StartWorker((*eps)->address(), "w0", (*dir)->File("worker.log"));
  REQUIRE(worker.ok());
  auto wc = (*worker)->Wait(120s);
  INFO("worker log:\n" << (*worker)->LogTail() << "\neps log:\n" << (*eps)->process().LogTail());
  REQUIRE(wc.ok());
  REQUIRE(*wc == 0);

  // run.jsonl: steps 1..5 in order, each with a finite loss and the workers' phase times.
  std::ifstream f((*eps)->state_dir() + "/run.jsonl");
  REQUIRE(f.good());
  std::string line;
  int64_t expect = 1;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    CHECK(j.at("step").get<int64_t>() == expect);
    CHECK(std::isfinite(j.at("loss").get<double>()));
    CHECK(j.at("loss").get<double>() > 0);
    CHECK(j.at("tokens_per_s").get<double>() > 0);
    CHECK(j.at("forward_s").get<double>() > 0);
    // backward_s excludes the recompute estimate, which can take all of it on tiny layers.
    CHECK(j.at("backward_s").get<double>() + j.at("recompute_s").get<double>() > 0);
    ++expect;
  }
  CHECK(expect == job.train.steps + 1);

  // /metrics: the port is printed on the daemon's stdout.
  std::smatch m;
  const std::string log = (*eps)->process().Log();
  REQUIRE(std::regex_search(log, m, std::regex("metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics")));
  const Result<std::string> got = HttpGet(std::stoi(m[1]), "/metrics");
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  const std::string& resp = *got;
  REQUIRE(resp.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(Sample(resp, "l2l_step") == 5);
  CHECK(Sample(resp, "l2l_step_seconds_count") == 5);
  REQUIRE((*eps)->Shutdown().ok());
}

}  // namespace
}  // namespace l2l::itest

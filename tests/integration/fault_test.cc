// Faults an operator meets, injected into real processes (tests/integration/harness.h):
// the daemon killed under a running worker (the worker must exit non-zero with one
// clear line, never hang), a final checkpoint that cannot be written (stop and SIGTERM
// must not report a clean stop; the daemon keeps serving, paused, with its state), and
// a worker started with --steps below the job's (it must finish its last step).
//
// Each fault is made the way it happens: kill -9, a checkpoint root that cannot be
// created (a regular file in its place: chmod does not stop root), a short --steps.
#include <catch2/catch.hpp>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/adamw.h"
#include "tests/integration/harness.h"
#include "tests/integration/relay_util.h"
#include "worker/eps_client.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

struct CtlRun {
  int code = -1;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// build/bin/l2lctl `args`, stdout and stderr captured separately.
CtlRun Ctl(const TempDir& dir, const std::vector<std::string>& args) {
  static int n = 0;
  const std::string out = dir.File("fctl" + std::to_string(n) + ".out");
  const std::string err = dir.File("fctl" + std::to_string(n++) + ".err");
  std::string cmd = "exec '" + BinaryPath("l2lctl") + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>'" + err + "'";
  auto p = Process::Spawn({"/bin/sh", "-c", cmd}, out);
  REQUIRE(p.ok());
  auto code = (*p)->Wait(120s);
  REQUIRE(code.ok());
  return CtlRun{*code, Slurp(out), Slurp(err)};
}

// Waits until the worker's log shows `steps` completed steps.
bool WaitProgress(Process& worker, size_t steps, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ParseProgress(worker.Log()).size() >= steps) return true;
    if (!worker.Running()) return false;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

}  // namespace

TEST_CASE("A worker whose daemon is killed exits non-zero within seconds with one clear line",
          "[integration][fault]") {
  const Transport transport = GENERATE(Transport::kShm, Transport::kGrpc);
  INFO("transport " << ToString(transport));
  relay::Run r = relay::Prepare(std::string("daemon-kill-") + ToString(transport));
  r.job.train.steps = 100000;  // runs until the daemon dies
  DaemonOptions o;
  // The daemon serves shm to local workers in auto mode.
  o.transport = transport == Transport::kGrpc ? Transport::kGrpc : Transport::kAuto;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  auto worker = StartWorker((*eps)->address(), "w0", r.dir->File("w0.log"), {"--transport", ToString(transport)});
  REQUIRE(worker.ok());
  REQUIRE(WaitProgress(**worker, 2, 60s));
  (*eps)->process().Signal(SIGKILL);
  REQUIRE((*eps)->process().Wait(10s).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto code = (*worker)->Wait(30s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO((*worker)->LogTail());
  REQUIRE(code.ok());  // not still waiting on the dead daemon
  CHECK(*code != 0);
  CHECK(secs < 15.0);
  const std::string log = (*worker)->Log();
  CHECK(log.find("l2l-worker: error:") != std::string::npos);
  // shm: a wait on the segment notices the dead pid; a gRPC call in flight (StepDone,
  // a heartbeat) may notice the closed connection first.
  if (transport == Transport::kShm) {
    CHECK((log.find("is gone (killed or crashed)") != std::string::npos ||
           log.find("UNAVAILABLE") != std::string::npos));
  }
  // The dead daemon's segments are the next daemon's to remove; none of the worker's.
}

TEST_CASE("A stop whose final checkpoint fails is not a clean stop: the daemon keeps its state, paused",
          "[integration][fault]") {
  const bool by_signal = GENERATE(false, true);
  INFO((by_signal ? "SIGTERM" : "l2lctl stop"));
  relay::Run r = relay::Prepare(by_signal ? "ckpt-fail-sig" : "ckpt-fail-ctl");
  r.job.train.steps = 3;
  auto eps = EpsDaemon::Start(r.job, DaemonOptions{}, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  // Train 2 of 3 steps: state a restart could not recreate without a checkpoint.
  auto worker = StartWorker(d.address(), "w0", r.dir->File("w0.log"), {"--steps", "2"});
  REQUIRE(worker.ok());
  auto wc = (*worker)->Wait(120s);
  INFO((*worker)->LogTail());
  REQUIRE(wc.ok());
  REQUIRE(*wc == 0);
  // The checkpoint root cannot be created: a regular file sits where it goes.
  const std::string root = d.state_dir() + "/checkpoints";
  fs::remove_all(root);
  { std::ofstream(root) << "not a directory\n"; }

  if (by_signal) {
    d.process().Signal(SIGTERM);
    std::this_thread::sleep_for(2s);
    REQUIRE(d.process().Running());
    CHECK(d.process().Log().find("NOT stopping") != std::string::npos);
  } else {
    const CtlRun s = Ctl(*r.dir, {"--eps", d.address(), "stop"});
    INFO(s.out << s.err);
    CHECK(s.code != 0);
    CHECK(s.err.find("final checkpoint") != std::string::npos);
    CHECK(s.out.find("stopped") == std::string::npos);
  }
  // Still serving, paused, with the state of step 2.
  auto st = d.GetStatus();
  REQUIRE(st.ok());
  CHECK(st->state == "paused");
  CHECK(st->step == 2);
  CHECK(d.process().Running());

  // The operator frees the way and stops again: now it is a clean stop with the state.
  fs::remove(root);
  if (by_signal) {
    d.process().Signal(SIGTERM);
  } else {
    const CtlRun s = Ctl(*r.dir, {"--eps", d.address(), "stop"});
    INFO(s.out << s.err);
    CHECK(s.code == 0);
  }
  auto code = d.process().Wait(60s);
  REQUIRE(code.ok());
  CHECK(*code == 0);
  CHECK(fs::is_directory(root + "/step-00000002"));
  CHECK(Slurp(root + "/latest").find("step-00000002") != std::string::npos);
  CHECK(d.ShmSegments().empty());
}

TEST_CASE("A worker started with --steps below the job's finishes its last step", "[integration][fault]") {
  relay::Run r = relay::Prepare("short-steps");
  r.job.train.steps = 5;
  auto eps = EpsDaemon::Start(r.job, DaemonOptions{}, *r.dir);
  REQUIRE(eps.ok());
  auto worker = StartWorker((*eps)->address(), "w0", r.dir->File("w0.log"), {"--steps", "2"});
  REQUIRE(worker.ok());
  auto code = (*worker)->Wait(120s);
  INFO((*worker)->LogTail());
  REQUIRE(code.ok());
  CHECK(*code == 0);
  // Step 2's gradients all reached the daemon: every layer is at version 2.
  bool at2 = false;
  for (int i = 0; i < 100 && !at2; ++i) {
    auto st = (*eps)->GetStatus();
    REQUIRE(st.ok());
    at2 = st->step == 2;
    for (int64_t v : st->layer_version) at2 = at2 && v == 2;
    if (!at2) std::this_thread::sleep_for(50ms);
  }
  CHECK(at2);
  REQUIRE((*eps)->Shutdown().ok());
}

TEST_CASE("A worker refused because the job is full retries within its connect timeout, then exits 3",
          "[integration][fault]") {
  relay::Run r = relay::Prepare("job-full");
  r.job.train.steps = 100000;
  auto eps = EpsDaemon::Start(r.job, DaemonOptions{}, *r.dir);
  REQUIRE(eps.ok());
  auto first = StartWorker((*eps)->address(), "w0", r.dir->File("w0.log"));
  REQUIRE(first.ok());
  REQUIRE(WaitProgress(**first, 1, 60s));
  const auto t0 = std::chrono::steady_clock::now();
  auto second = StartWorker((*eps)->address(), "w1", r.dir->File("w1.log"), {"--connect-timeout-ms", "1500"});
  REQUIRE(second.ok());
  auto code = (*second)->Wait(30s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO((*second)->LogTail());
  REQUIRE(code.ok());
  CHECK(*code == 3);
  CHECK(secs >= 1.4);  // it kept asking for the whole connect timeout
  CHECK((*second)->Log().find("stayed full") != std::string::npos);
  (*first)->Stop();
}

TEST_CASE("A replacement for a killed same-host worker takes its place at once, not after the heartbeat timeout",
          "[integration][fault]") {
  relay::Run r = relay::Prepare("takeover");
  r.job.train.steps = 100000;
  DaemonOptions o;
  o.heartbeat_timeout_ms = 60000;  // far beyond the bound checked below
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  REQUIRE(eps.ok());
  auto first = StartWorker((*eps)->address(), "w0", r.dir->File("w0.log"));
  REQUIRE(first.ok());
  REQUIRE(WaitProgress(**first, 1, 60s));
  (*first)->Signal(SIGKILL);
  REQUIRE((*first)->Wait(10s).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto second = StartWorker((*eps)->address(), "w0b", r.dir->File("w0b.log"), {"--connect-timeout-ms", "3000"});
  REQUIRE(second.ok());
  const bool trains = WaitProgress(**second, 1, 30s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO((*second)->LogTail());
  INFO((*eps)->process().LogTail());
  CHECK(trains);
  CHECK(secs < 30.0);
  CHECK((*eps)->process().Log().find("on this host is gone: declared lost now") != std::string::npos);
  (*second)->Stop();
}

TEST_CASE("l2l-eps skips a step whose loss is NaN: WARN in its log, counted by l2lctl and in run.jsonl",
          "[integration][fault][nonfinite]") {
  relay::Run r = relay::Prepare("nan-loss");
  r.job.train.steps = 10;
  auto eps = EpsDaemon::Start(r.job, DaemonOptions{}, *r.dir);
  REQUIRE(eps.ok());
  worker::ClientOptions co;
  co.transport = Transport::kGrpc;
  co.connect_timeout = 10000ms;
  auto c = worker::ConnectEps((*eps)->address(), co);
  REQUIRE(c.ok());
  const auto layouts = BuildLayout(r.job.model);
  auto step = [&](int64_t s, double loss) {
    for (int64_t l = 0; l < static_cast<int64_t>(layouts.size()); ++l) {
      auto w = (*c)->AcquireLayer(l, s, 20s);
      REQUIRE(w.ok());
      (*c)->ReleaseLayer(l);
    }
    for (int64_t l = static_cast<int64_t>(layouts.size()) - 1; l >= 0; --l) {
      std::vector<float> g(layouts[l].numel, 0.01f);
      REQUIRE((*c)->PushGradient(l, s, 1, g.data(), g.size()).ok());
    }
    worker::StepReport rep;
    rep.step = s;
    rep.loss = loss;
    rep.tokens = 100;
    REQUIRE((*c)->StepDone(rep).ok());
  };
  step(0, 2.0);
  step(1, std::nan(""));
  step(2, 2.0);  // version 2 was published (with step 1's weights): the job goes on
  const CtlRun st = Ctl(*r.dir, {"--eps", (*eps)->address(), "status", "--json"});
  INFO(st.out << st.err);
  REQUIRE(st.code == 0);
  const auto j = nlohmann::json::parse(st.out);
  CHECK(j.at("skipped_steps") == 1);
  CHECK(j.at("step") == 3);
  CHECK(j.at("last_skip_reason").get<std::string>().find("reported loss nan") != std::string::npos);
  // The daemon warned, naming the worker and the step.
  const std::string log = (*eps)->process().Log();
  CHECK(log.find(" W ") != std::string::npos);
  CHECK(log.find("reported a non-finite loss (nan) for step 1") != std::string::npos);
  // run.jsonl: the step's line, then a line counting the skip; lr from the job.
  std::ifstream f((*eps)->state_dir() + "/run.jsonl");
  std::string line;
  int skip_lines = 0;
  while (std::getline(f, line)) {
    const auto rec = nlohmann::json::parse(line);
    if (rec.contains("skipped_steps")) {
      ++skip_lines;
      CHECK(rec.at("step") == 2);
      CHECK(rec.at("skipped_steps") == 1);
    } else {
      const int64_t n = rec.at("step").get<int64_t>();
      CHECK(rec.at("lr").get<double>() == Approx(LearningRate(r.job.optim, n - 1)));
    }
  }
  CHECK(skip_lines == 1);
  c->reset();
  REQUIRE((*eps)->Shutdown().ok());
}

}  // namespace l2l::itest

// The real system end to end: build/bin/l2l-eps on 127.0.0.1:0 and l2l-worker processes
// (tests/integration/harness.h), trained for a few steps on a tokens file, checked against
// the reference trainer (worker/reference/reference_trainer.h) on the same data, initialisation and
// micro-batching. Tolerances as in tests/worker/relay_test.cc: elementwise
// |eps - ref| <= 5e-6 + 1e-5 |ref| and per tensor ||eps - ref|| <= 1e-5 ||ref|| + 5e-6 sqrt(n).
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "common/formats/model_io.h"
#include "tests/integration/harness.h"
#include "tests/integration/relay_util.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
using namespace relay;  // tests/integration/relay_util.h

}  // namespace

TEST_CASE("l2l-eps + l2l-worker processes train like the reference trainer",
          "[integration][relay]") {
  Run r = Prepare("equiv");
  std::string transport = GENERATE(std::string("auto"), std::string("grpc"));
  int workers = GENERATE(1, 2);
  INFO("transport " << transport << ", " << workers << " worker(s)");
  DaemonOptions o;
  o.workers = workers;
  o.transport = ParseTransport(transport).value();
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, workers);
  for (const std::string& log : logs) {
    const auto progress = ParseProgress(log);
    REQUIRE(progress.size() == static_cast<size_t>(r.job.train.steps));
    CHECK(ParseSummary(log).at("max_lag") == 0);
  }
  auto status = (*eps)->GetStatus();
  REQUIRE(status.ok());
  for (int64_t v : status->layer_version) CHECK(v == r.job.train.steps);
  RequireClose(r.job, Exported(**eps, r.job.model), Reference(r.job, workers));
  REQUIRE((*eps)->Shutdown().ok());
  CHECK((*eps)->ShmSegments().empty());
}

TEST_CASE("train.micro_batches: auto is planned by the worker on the CPU backend, logged, and trained with",
          "[integration][relay][planner]") {
  Run r = Prepare("mb-auto");
  r.job.train.micro_batches_auto = true;
  r.job.train.steps = 3;
  DaemonOptions o;
  o.workers = 1;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, 1);
  const std::string& log = logs[0];
  // "micro_batches auto: M (binding: B); per layer: transfer ... measured on cpu ...".
  const size_t at = log.find("micro_batches auto: ");
  INFO(log);
  REQUIRE(at != std::string::npos);
  const int64_t m = std::stoll(log.substr(at + std::string("micro_batches auto: ").size()));
  CHECK(m >= 1);
  CHECK(m <= 64);
  CHECK(log.find("(binding: ", at) != std::string::npos);
  CHECK(log.find("measured on cpu", at) != std::string::npos);
  CHECK(log.find("host AdamW", at) != std::string::npos);
  REQUIRE(ParseProgress(log).size() == static_cast<size_t>(r.job.train.steps));
  // The chosen M is what the worker trained with: the reference with that M agrees.
  JobConfig planned = r.job;
  planned.train.micro_batches_auto = false;
  planned.train.micro_batches = m;
  RequireClose(planned, Exported(**eps, r.job.model), Reference(planned, 1));
  REQUIRE((*eps)->Shutdown().ok());
}

TEST_CASE("l2l-eps + l2l-worker processes train a Llama-family model like the reference trainer",
          "[integration][relay][llama]") {
  Run r = Prepare("equiv-llama");
  // Grouped-query attention, llama3 rope scaling, q/k/v biases, an untied head.
  r.job.model.family = ModelFamily::kLlama;
  r.job.model.n_kv_heads = 2;
  r.job.model.qkv_bias = true;
  r.job.model.tied_embeddings = false;
  r.job.model.rope_scaling = {RopeScalingType::kLlama3, 4.0, 1.0, 4.0, 16};
  REQUIRE(r.job.model.Validate().ok());
  // "auto" puts local workers on shared memory.
  const Transport transport = GENERATE(Transport::kAuto, Transport::kGrpc);
  int workers = GENERATE(1, 2);
  INFO("transport " << ToString(transport) << ", " << workers << " worker(s)");
  DaemonOptions o;
  o.workers = workers;
  o.transport = transport;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, workers);
  for (const std::string& log : logs) {
    REQUIRE(ParseProgress(log).size() == static_cast<size_t>(r.job.train.steps));
    CHECK(ParseSummary(log).at("max_lag") == 0);
  }
  RequireClose(r.job, Exported(**eps, r.job.model), Reference(r.job, workers));
  REQUIRE((*eps)->Shutdown().ok());
  CHECK((*eps)->ShmSegments().empty());
}

TEST_CASE("l2l-eps + l2l-worker processes train a mixture-of-experts model like the reference trainer",
          "[integration][relay][moe]") {
  Run r = Prepare("equiv-moe");
  // 32 experts, top-1, 96 tokens a step per worker: in every block some experts get no
  // token in a step and are skipped (the workers report which got tokens), and which ones
  // varies from step to step (per-expert AdamW step counts). With the auxiliary loss.
  r.job.model.family = ModelFamily::kLlama;
  r.job.model.n_kv_heads = 2;
  r.job.model.tied_embeddings = false;
  r.job.model.d_ff = 16;
  r.job.model.num_experts = 32;
  r.job.model.experts_per_token = 1;
  r.job.model.output_router_logits = true;
  r.job.model.router_aux_loss_coef = 0.05;
  REQUIRE(r.job.Validate().ok());
  const Transport transport = GENERATE(Transport::kAuto, Transport::kGrpc);
  int workers = GENERATE(1, 2);
  INFO("transport " << ToString(transport) << ", " << workers << " worker(s)");
  DaemonOptions o;
  o.workers = workers;
  o.transport = transport;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, workers);
  for (const std::string& log : logs) {
    REQUIRE(ParseProgress(log).size() == static_cast<size_t>(r.job.train.steps));
  }
  const auto ref = TrainedReference(r.job, workers, r.job.train.steps);
  int64_t skipped = 0;  // expert updates the reference skipped
  for (int64_t n : ref->expert_steps()) skipped += r.job.train.steps - n;
  INFO("expert updates skipped over the run: " << skipped);
  CHECK(skipped > 0);
  RequireClose(r.job, Exported(**eps, r.job.model), ref->params());
  REQUIRE((*eps)->Shutdown().ok());
}

TEST_CASE("Worker peak memory grows with depth only by the stash", "[integration][memory]") {
  // Narrow layers, many tokens: the stash (L+1 x M x B*T*C floats) dominates what depth
  // adds. gRPC transport, so layer bytes are the worker's own short-lived buffers (with
  // shm the EPS's mapped weight pages would count in RSS too).
  Run r = Prepare("memory");
  r.job.model.d_model = 32;
  r.job.model.n_head = 2;
  r.job.model.d_ff = 64;
  r.job.model.seq_len = 64;
  r.job.train.micro_batch_size = 8;
  r.job.train.micro_batches = 8;
  r.job.train.steps = 1;
  const int64_t per_layer = r.job.train.micro_batch_size * r.job.seq_len() * r.job.model.d_model *
                            r.job.train.micro_batches * int64_t{sizeof(float)};  // 512 KiB
  std::map<StashPlacement, std::map<int, std::map<std::string, int64_t>>> got;  // stash -> L -> summary
  for (StashPlacement stash : {StashPlacement::kDevice, StashPlacement::kHost}) {
    for (int layers : {4, 32}) {
      JobConfig job = r.job;
      job.model.n_layer = layers;
      job.train.stash = stash;
      DaemonOptions o;
      o.transport = l2l::Transport::kGrpc;
      auto eps = EpsDaemon::Start(job, o, *r.dir);
      REQUIRE(eps.ok());
      auto logs = RunWorkers(**eps, *r.dir, 1);
      got[stash][layers] = ParseSummary(logs[0]);
      REQUIRE(got[stash][layers].count("peak_rss_kb"));
      REQUIRE((*eps)->Shutdown().ok());
    }
  }
  const int64_t stash_growth = 28 * per_layer;
  for (StashPlacement stash : {StashPlacement::kDevice, StashPlacement::kHost}) {
    const auto& a = got[stash][4];
    const auto& b = got[stash][32];
    const int64_t rss = (b.at("peak_rss_kb") - a.at("peak_rss_kb")) * 1024;
    const int64_t dev = b.at("device_bytes") - a.at("device_bytes");
    WARN("stash " << ToString(stash) << ": peak RSS 4 layers " << a.at("peak_rss_kb") << " KiB, 32 layers "
                  << b.at("peak_rss_kb") << " KiB (+" << rss / 1024 << " KiB); device bytes +" << dev
                  << "; stash of 28 layers = " << stash_growth / 1024 << " KiB");
    // Backend ("device") memory: grows by exactly the stash, or not at all when it is on the host.
    CHECK(dev == (stash == StashPlacement::kDevice ? stash_growth : 0));
    // Process memory: on the CPU backend both placements are host memory, so RSS grows by
    // the stash and by nothing else that scales with depth (margin: 4 MiB + 10%).
    CHECK(rss >= stash_growth * 9 / 10 - (4 << 20));
    CHECK(rss <= stash_growth * 11 / 10 + (4 << 20));
  }
}

namespace {
void RunLockFree(int workers) {
  Run r = Prepare("lockfree");
  r.job.train.mode = l2l::TrainMode::kLockfree;
  r.job.train.staleness = 1;
  r.job.train.steps = 12;
  r.job.optim.lr = 1e-2f;
  DaemonOptions o;
  o.workers = workers;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  REQUIRE(eps.ok());
  const auto logs = RunWorkers(**eps, *r.dir, workers);
  for (const std::string& log : logs) {
    const auto progress = ParseProgress(log);
    REQUIRE(progress.size() == 12u);
    for (const auto& p : progress) CHECK(p.lag <= 1);
    CHECK(ParseSummary(log).at("max_lag") <= 1);
    const double first = (progress[0].loss + progress[1].loss) / 2;
    const double last = (progress[10].loss + progress[11].loss) / 2;
    INFO("loss " << first << " -> " << last);
    CHECK(last < first - 0.1);
  }
}
}  // namespace

TEST_CASE("A lock-free worker trains and never uses a version older than the bound",
          "[integration][lockfree]") {
  RunLockFree(1);
}

// With two lock-free workers one can push its step t+1 gradient of a layer before the EPS
// applied step t to it: the EPS holds gradients up to `staleness` steps ahead.
TEST_CASE("Two lock-free workers train and never use a version older than the bound",
          "[integration][lockfree]") {
  RunLockFree(2);
}

TEST_CASE("Killing one of two workers leaves the EPS up and a restarted worker rejoins",
          "[integration][fault]") {
  Run r = Prepare("fault");
  r.job.train.steps = 40;
  DaemonOptions o;
  o.workers = 2;
  o.heartbeat_timeout_ms = 1500;
  o.on_worker_loss = l2l::OnWorkerLoss::kPause;
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  REQUIRE(eps.ok());
  auto w0 = StartWorker((*eps)->address(), "w0", r.dir->File("w0.log"));
  auto w1 = StartWorker((*eps)->address(), "w1", r.dir->File("w1.log"));
  REQUIRE(w0.ok());
  REQUIRE(w1.ok());
  // Let both run a few steps, then kill -9 worker 1 mid-step.
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (ParseProgress((*w1)->Log()).size() < 3) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
  (*w1)->Signal(SIGKILL);
  REQUIRE((*w1)->Wait(5s).ok());

  // The EPS stays up and reports the lost worker.
  DaemonStatus st;
  deadline = std::chrono::steady_clock::now() + 20s;
  bool lost = false;
  while (!lost) {
    REQUIRE((*eps)->process().Running());
    auto s = (*eps)->GetStatus();
    REQUIRE(s.ok());
    st = *s;
    for (const auto& w : st.workers) lost |= (w.name == "w1" && w.state == "lost");
    if (!lost) {
      INFO("workers: " << st.workers.size() << ", state " << st.state);
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(100ms);
    }
  }
  // No partial step: every layer is at the last completed step's version or one more
  // (those whose gradients from BOTH workers had arrived), and paused it stays that way.
  const int64_t lo = *std::min_element(st.layer_version.begin(), st.layer_version.end());
  const int64_t hi = *std::max_element(st.layer_version.begin(), st.layer_version.end());
  CHECK(hi - lo <= 1);
  std::this_thread::sleep_for(1500ms);
  auto paused = (*eps)->GetStatus();
  REQUIRE(paused.ok());
  CHECK(paused->layer_version == st.layer_version);

  // Restart: it rejoins and training goes on to the end.
  auto w1b = StartWorker((*eps)->address(), "w1", r.dir->File("w1b.log"));
  REQUIRE(w1b.ok());
  auto c0 = (*w0)->Wait(240s);
  auto c1 = (*w1b)->Wait(60s);
  INFO("w0: " << (*w0)->LogTail() << "\nw1b: " << (*w1b)->LogTail());
  REQUIRE(c0.ok());
  REQUIRE(c1.ok());
  CHECK(*c0 == 0);
  CHECK(*c1 == 0);
  auto end = (*eps)->GetStatus();
  REQUIRE(end.ok());
  CHECK(end->step == r.job.train.steps);
  REQUIRE((*eps)->Shutdown().ok());
}

}  // namespace l2l::itest

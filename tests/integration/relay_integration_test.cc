// The real system end to end: build/bin/l2l-eps on 127.0.0.1:0 and l2l-worker processes
// (tests/integration/harness.h), trained for a few steps on a tokens file, checked against
// the reference trainer (worker/reference_trainer.h) on the same data, initialisation and
// micro-batching. Tolerances as in tests/worker/relay_test.cc: elementwise
// |eps - ref| <= 5e-6 + 1e-5 |ref| and per tensor ||eps - ref|| <= 1e-5 ||ref|| + 5e-6 sqrt(n).
#include <catch2/catch.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "common/model_io.h"
#include "tests/integration/harness.h"
#include "worker/data_loader.h"
#include "worker/reference_trainer.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;

constexpr double kRtol = 1e-5, kAtol = 5e-6;

JobConfig SmallJob(const std::string& tokens_path) {
  JobConfig job;
  job.model.vocab_size = 96;
  job.model.seq_len = 16;
  job.model.d_model = 32;
  job.model.n_layer = 3;
  job.model.n_head = 4;
  job.model.d_ff = 128;
  job.train.micro_batch_size = 2;
  job.train.micro_batches = 3;
  job.train.steps = 3;
  job.train.seed = 77;
  job.train.log_every = 1;
  job.optim.lr = 3e-3f;
  job.optim.warmup_steps = 2;
  job.optim.eps = 1e-6f;  // see tests/worker/relay_test.cc
  job.data.train_path = tokens_path;
  return job;
}

// A token stream with structure (a noisy walk), so loss can fall.
std::vector<int32_t> MakeTokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 12345;
  int64_t cur = 0;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t r = static_cast<int64_t>((x >> 33) % 8);
    cur = r < 7 ? (cur + 1) % vocab : static_cast<int64_t>((x >> 20) % vocab);
    v = static_cast<int32_t>(cur);
  }
  return t;
}

// The oracle's weights after job.train.steps steps on the union of `shards` shards.
std::vector<std::vector<float>> Reference(const JobConfig& job, int shards) {
  worker::ReferenceTrainerOptions o;
  o.num_threads = 1;
  auto ref = worker::ReferenceTrainer::Create(job, o);
  REQUIRE(ref.ok());
  std::vector<worker::DataLoader> loaders;
  for (int r = 0; r < shards; ++r) {
    worker::DataLoaderOptions d;
    d.B = job.train.micro_batch_size;
    d.T = job.seq_len();
    d.seed = job.train.seed;
    d.rank = r;
    d.world = shards;
    d.vocab_size = job.model.vocab_size;
    auto l = worker::DataLoader::Open(job.data.train_path, d);
    REQUIRE(l.ok());
    loaders.push_back(std::move(l).value());
  }
  for (int64_t s = 0; s < job.train.steps; ++s) {
    std::vector<worker::MicroBatch> batches;
    for (auto& l : loaders) {
      for (auto& mb : l.NextMany(job.train.micro_batches)) batches.push_back(std::move(mb));
    }
    REQUIRE((*ref)->Step(batches).ok());
  }
  return (*ref)->params();
}

void RequireClose(const JobConfig& job, const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& ref) {
  REQUIRE(got.size() == ref.size());
  const auto layouts = BuildLayout(job.model);
  double worst = 0, worst_norm = 0, moved = 0;
  std::string worst_name;
  for (size_t l = 0; l < ref.size(); ++l) {
    REQUIRE(got[l].size() == ref[l].size());
    std::vector<float> init(layouts[l].numel);
    InitLayerParams(job.model, layouts[l], job.train.seed, init.data());
    for (const ParamInfo& p : layouts[l].params) {
      double d2 = 0, r2 = 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double d = std::fabs(double(got[l][i]) - ref[l][i]);
        d2 += d * d;
        r2 += double(ref[l][i]) * ref[l][i];
        worst = std::max(worst, d / (kAtol + kRtol * std::fabs(ref[l][i])));
        moved = std::max(moved, std::fabs(double(ref[l][i]) - init[i]));
      }
      const double norm_ratio =
          std::sqrt(d2) / (kRtol * std::sqrt(r2) + kAtol * std::sqrt(static_cast<double>(p.numel)));
      if (norm_ratio > worst_norm) {
        worst_norm = norm_ratio;
        worst_name = p.name;
      }
    }
  }
  INFO("worst elementwise ratio " << worst << ", worst per-tensor norm ratio " << worst_norm << " ("
                                   << worst_name << ")");
  CHECK(worst <= 1.0);
  CHECK(worst_norm <= 1.0);
  CHECK(moved > 1e-3);  // training really changed the weights
}

struct Run {
  std::unique_ptr<TempDir> dir;
  JobConfig job;
};

Run Prepare(const std::string& name) {
  auto dir = TempDir::Create("l2l-itest-" + name);
  REQUIRE(dir.ok());
  Run r{std::move(dir).value(), {}};
  const std::string tokens = r.dir->File("train.bin");
  r.job = SmallJob(tokens);
  REQUIRE(WriteTokens(tokens, MakeTokens(20000, r.job.model.vocab_size)).ok());
  return r;
}

// Starts `n` workers, waits for all to exit 0, returns their logs.
std::vector<std::string> RunWorkers(EpsDaemon& eps, const TempDir& dir, int n,
                                    const std::vector<std::string>& extra = {},
                                    std::chrono::seconds timeout = 180s) {
  std::vector<std::unique_ptr<Process>> ws;
  for (int i = 0; i < n; ++i) {
    auto w = StartWorker(eps.address(), "w" + std::to_string(i), dir.File("worker" + std::to_string(i) + ".log"),
                         extra);
    REQUIRE(w.ok());
    ws.push_back(std::move(w).value());
  }
  std::vector<std::string> logs;
  for (auto& w : ws) {
    auto code = w->Wait(timeout);
    INFO(w->LogTail());
    REQUIRE(code.ok());
    CHECK(*code == 0);
    logs.push_back(w->Log());
  }
  return logs;
}

std::vector<std::vector<float>> Exported(EpsDaemon& eps, const ModelSpec& spec) {
  const std::string path = eps.state_dir() + "/export.safetensors";
  Status st = eps.Export(path);
  INFO(st.ToString());
  REQUIRE(st.ok());
  auto m = LoadModel(path, spec);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return m->layers;
}

}  // namespace

TEST_CASE("l2l-eps + l2l-worker processes train like the reference trainer",
          "[integration][relay]") {
  Run r = Prepare("equiv");
  std::string transport = GENERATE(std::string("auto"), std::string("grpc"));
  int workers = GENERATE(1, 2);
  INFO("transport " << transport << ", " << workers << " worker(s)");
  DaemonOptions o;
  o.workers = workers;
  o.transport = transport;
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
  std::map<std::string, std::map<int, std::map<std::string, int64_t>>> got;  // stash -> L -> summary
  for (std::string stash : {"device", "host"}) {
    for (int layers : {4, 32}) {
      JobConfig job = r.job;
      job.model.n_layer = layers;
      job.train.stash = stash;
      DaemonOptions o;
      o.transport = "grpc";
      auto eps = EpsDaemon::Start(job, o, *r.dir);
      REQUIRE(eps.ok());
      auto logs = RunWorkers(**eps, *r.dir, 1);
      got[stash][layers] = ParseSummary(logs[0]);
      REQUIRE(got[stash][layers].count("peak_rss_kb"));
      REQUIRE((*eps)->Shutdown().ok());
    }
  }
  const int64_t stash_growth = 28 * per_layer;
  for (std::string stash : {"device", "host"}) {
    const auto& a = got[stash][4];
    const auto& b = got[stash][32];
    const int64_t rss = (b.at("peak_rss_kb") - a.at("peak_rss_kb")) * 1024;
    const int64_t dev = b.at("device_bytes") - a.at("device_bytes");
    WARN("stash " << stash << ": peak RSS 4 layers " << a.at("peak_rss_kb") << " KiB, 32 layers "
                  << b.at("peak_rss_kb") << " KiB (+" << rss / 1024 << " KiB); device bytes +" << dev
                  << "; stash of 28 layers = " << stash_growth / 1024 << " KiB");
    // Backend ("device") memory: grows by exactly the stash, or not at all when it is on the host.
    CHECK(dev == (stash == "device" ? stash_growth : 0));
    // Process memory: on the CPU backend both placements are host memory, so RSS grows by
    // the stash and by nothing else that scales with depth (margin: 4 MiB + 10%).
    CHECK(rss >= stash_growth * 9 / 10 - (4 << 20));
    CHECK(rss <= stash_growth * 11 / 10 + (4 << 20));
  }
}

namespace {
void RunLockFree(int workers) {
  Run r = Prepare("lockfree");
  r.job.train.mode = "lockfree";
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
  o.on_worker_loss = "pause";
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

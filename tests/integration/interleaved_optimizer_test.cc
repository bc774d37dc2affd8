// The interleaved optimizer through real processes: l2l-eps with optim.gpu_fraction
// 0, 0.33 and 1 and CPU-backend l2l-worker processes that take layer updates over the
// shm exchange (worker/device_updater.h, eps_server/worker_updater.h). Oracle: the same
// job run daemon-only (workers with --device-updates off, the daemon's fused AdamW): the
// final checkpoint's masters, m and v must be bit-identical. The workers must really
// have run updates (their summary's device_updates), and the daemon's log says which
// layers went to the devices. Fault case: a worker whose update thread stops answering
// (L2L_TEST_UPDATE_FAULT=hang:N) with a short update deadline: the daemon updates the
// layer itself, says why, and the run's result is still bit-identical. Kill case: a worker
// killed with kill -9 while its device holds an update (and the deadline is far away):
// the loss makes the daemon update the layer itself at once, the step is undone or
// dropped as for any lost worker, a restarted worker rejoins, and the final state is
// still bit-identical to the uninterrupted daemon-only run.
#include <catch2/catch.hpp>

#include <signal.h>
#include <stdlib.h>

#include <cstring>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "eps_server/checkpoint.h"
#include "eps_server/param_store.h"
#include "tests/integration/harness.h"
#include "tests/integration/relay_util.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
using namespace relay;  // tests/integration/relay_util.h

struct Final {
  std::vector<std::vector<float>> p, m, v;
};

// The state of the checkpoint the daemon writes now (after training).
Final CheckpointState(EpsDaemon& eps, const JobConfig& job) {
  auto dir = eps.Checkpoint();
  INFO(dir.status().ToString());
  REQUIRE(dir.ok());
  auto manifest = eps::ReadCheckpointManifest(*dir);
  INFO(manifest.status().ToString());
  REQUIRE(manifest.ok());
  auto store = eps::ParamStore::Create(job.model, {});
  REQUIRE(store.ok());
  Status st = eps::LoadCheckpointState(*manifest, store->get());
  INFO(st.ToString());
  REQUIRE(st.ok());
  Final f;
  for (int64_t l = 0; l < (*store)->num_layers(); ++l) {
    const size_t n = (*store)->layout(l).numel;
    for (int which = 0; which < 3; ++which) {
      std::vector<float> buf(n);
      REQUIRE((*store)->ReadState(l, which, buf.data()).ok());
      (which == 0 ? f.p : which == 1 ? f.m : f.v).push_back(std::move(buf));
    }
  }
  return f;
}

void CheckBitIdentical(const Final& a, const Final& b) {
  REQUIRE(a.p.size() == b.p.size());
  for (size_t l = 0; l < a.p.size(); ++l) {
    CAPTURE(l);
    REQUIRE(a.p[l].size() == b.p[l].size());
    CHECK(std::memcmp(a.p[l].data(), b.p[l].data(), a.p[l].size() * 4) == 0);
    CHECK(std::memcmp(a.m[l].data(), b.m[l].data(), a.m[l].size() * 4) == 0);
    CHECK(std::memcmp(a.v[l].data(), b.v[l].data(), a.v[l].size() * 4) == 0);
  }
}

struct Outcome {
  Final state;
  std::vector<std::string> worker_logs;
  std::string daemon_log;
};

Outcome Train(Run& r, std::optional<double> fraction, const std::vector<std::string>& worker_args, int workers = 2,
              const std::string& daemon_yaml = "", Transport transport = Transport::kAuto) {
  JobConfig job = r.job;
  job.optim.gpu_fraction = fraction ? GpuFraction{false, *fraction} : GpuFraction{true, 0};  // nullopt: auto
  DaemonOptions o;
  o.workers = workers;
  o.extra_yaml = daemon_yaml;
  o.transport = transport;
  auto eps = EpsDaemon::Start(job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  Outcome out;
  auto logs = TempDir::Create("l2l-itest-interleave-logs");  // fresh logs per run (they append)
  REQUIRE(logs.ok());
  out.worker_logs = RunWorkers(**eps, **logs, workers, worker_args);
  for (const std::string& log : out.worker_logs) {
    REQUIRE(ParseProgress(log).size() == static_cast<size_t>(job.train.steps));
  }
  out.state = CheckpointState(**eps, job);
  REQUIRE((*eps)->Shutdown().ok());
  out.daemon_log = (*eps)->process().Log();
  CHECK((*eps)->ShmSegments().empty());
  return out;
}

int64_t DeviceUpdates(const Outcome& o) {
  int64_t n = 0;
  for (const std::string& log : o.worker_logs) n += ParseSummary(log).at("device_updates");
  return n;
}

}  // namespace

TEST_CASE("interleaved optimizer: workers' updates at gpu_fraction 0, 0.33, 1 are bit-identical to daemon-only",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave");
  r.job.train.steps = 3;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"});
  CHECK(DeviceUpdates(daemon) == 0);
  const int64_t layers = r.job.model.n_layer + 2;
  for (double f : {0.0, 0.33, 1.0}) {
    CAPTURE(f);
    const Outcome run = Train(r, f, {"--device-updates", "on"});
    CheckBitIdentical(run.state, daemon.state);
    INFO(run.daemon_log);
    if (f == 0.0) {
      CHECK(DeviceUpdates(run) == 0);
    } else {
      // Updates ran on the workers: some with 0.33, every layer of every step with 1.
      CHECK(DeviceUpdates(run) > 0);
      if (f == 1.0) CHECK(DeviceUpdates(run) == layers * r.job.train.steps);
      if (f < 1.0) CHECK(DeviceUpdates(run) < layers * r.job.train.steps);
      CHECK_THAT(run.daemon_log, Catch::Contains("are updated on the workers' devices"));
      CHECK_THAT(run.daemon_log, Catch::Contains("takers: worker"));
      CHECK_THAT(run.daemon_log, Catch::Contains("params/s"));
      CHECK_THAT(run.daemon_log, !Catch::Contains("interleaved optimizer: the daemon updates layer"));  // no fallback
    }
  }
}

TEST_CASE("interleaved optimizer: gpu_fraction auto plans with the rates the workers measured and reported",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-auto");
  r.job.train.steps = 2;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"}, 1);
  const Outcome run = Train(r, std::nullopt, {"--device-updates", "on"}, 1);
  CheckBitIdentical(run.state, daemon.state);
  INFO(run.daemon_log);
  // At job start no worker has reported; once one registers the split is re-chosen with
  // its measured AdamW rate (a CPU backend, no faster than the daemon: auto keeps 0).
  CHECK_THAT(run.daemon_log, Catch::Contains("optimizer (job start): optim.gpu_fraction=auto (no worker reports a "
                                             "device update rate)"));
  CHECK_THAT(run.daemon_log, Catch::Contains("optimizer (worker 0 offers cpu"));
  CHECK(std::regex_search(run.daemon_log, std::regex(R"(gpu_update=[1-9][0-9.e+]* params/s)")));
  CHECK_THAT(run.worker_logs[0], Catch::Contains("device updates on cpu"));
}

TEST_CASE("interleaved optimizer: workers over gRPC take no updates: the daemon says so and updates every layer",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-grpc");
  r.job.train.steps = 2;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"}, 1);
  const Outcome run = Train(r, 1.0, {"--device-updates", "on"}, 1, "", Transport::kGrpc);
  CheckBitIdentical(run.state, daemon.state);
  INFO(run.daemon_log);
  CHECK(DeviceUpdates(run) == 0);
  CHECK_THAT(run.daemon_log, Catch::Contains("offers its device for updates over the grpc transport: not used"));
  CHECK_THAT(run.daemon_log, Catch::Contains("no worker takes updates"));
  CHECK_THAT(run.worker_logs[0], Catch::Contains("the update exchange needs the shm transport"));
}

TEST_CASE("interleaved optimizer: a worker whose device stops answering mid-run: the daemon takes over, bit-identical",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-fault");
  r.job.train.steps = 3;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"}, 1);
  ::setenv("L2L_TEST_UPDATE_FAULT", "hang:5", 1);
  const Outcome run = Train(r, 1.0, {"--device-updates", "on"}, 1, "update_deadline_ms: 1000\n");
  ::unsetenv("L2L_TEST_UPDATE_FAULT");
  CheckBitIdentical(run.state, daemon.state);
  INFO(run.daemon_log);
  CHECK(DeviceUpdates(run) == 5);
  CHECK_THAT(run.daemon_log, Catch::Contains("did not finish it within 1000 ms"));
  CHECK_THAT(run.daemon_log, Catch::Contains("interleaved optimizer: the daemon updates layer"));
}

TEST_CASE("interleaved optimizer: a worker that sends a malformed UpdateDone: a clear error, the daemon takes over, "
          "bit-identical",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-baddone");
  r.job.train.steps = 3;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"}, 1);
  ::setenv("L2L_TEST_UPDATE_FAULT", "bad-done:4", 1);  // the 5th answer claims numel + 1
  const Outcome run = Train(r, 1.0, {"--device-updates", "on"}, 1);
  ::unsetenv("L2L_TEST_UPDATE_FAULT");
  CheckBitIdentical(run.state, daemon.state);
  INFO(run.daemon_log);
  INFO(run.worker_logs[0]);
  CHECK(DeviceUpdates(run) == 4);
  CHECK_THAT(run.daemon_log, Catch::Contains("does not match the task it holds"));
  CHECK_THAT(run.daemon_log, Catch::Contains("interleaved optimizer: the daemon updates layer"));
  // The worker is told why, and stops asking once it is given no more updates.
  CHECK_THAT(run.worker_logs[0], Catch::Contains("INVALID_ARGUMENT"));
  CHECK_THAT(run.worker_logs[0], Catch::Contains("device updates stop"));
}

// --device-updates defaults to auto: a GPU offers itself, the CPU backend (the daemon's
// own cores) does not; asking for `on` still offers a CPU backend.
TEST_CASE("interleaved optimizer: a CPU worker with default flags does not offer its device",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-default");
  r.job.train.steps = 2;
  const Outcome run = Train(r, 1.0, {}, 1);
  CHECK(DeviceUpdates(run) == 0);
  CHECK(run.worker_logs[0].find("device updates on") == std::string::npos);
  const Outcome on = Train(r, 1.0, {"--device-updates", "on"}, 1);
  CHECK(on.worker_logs[0].find("device updates on cpu") != std::string::npos);
  CHECK(DeviceUpdates(on) > 0);
}

TEST_CASE("interleaved optimizer: a worker killed while its device holds an update: the daemon takes over, bit-identical",
          "[integration][optim][offload]") {
  Run r = Prepare("interleave-kill");
  r.job.train.steps = 3;
  const Outcome daemon = Train(r, 0.0, {"--device-updates", "off"}, 2);
  JobConfig job = r.job;
  job.optim.gpu_fraction = GpuFraction{false, 1.0};
  DaemonOptions o;
  o.workers = 2;
  o.heartbeat_timeout_ms = 1500;
  o.on_worker_loss = OnWorkerLoss::kPause;
  o.extra_yaml = "update_deadline_ms: 120000\n";  // only the loss can end the held update
  auto eps = EpsDaemon::Start(job, o, *r.dir);
  REQUIRE(eps.ok());
  auto logs = TempDir::Create("l2l-itest-interleave-kill-logs");
  REQUIRE(logs.ok());
  auto w0 = StartWorker((*eps)->address(), "w0", (*logs)->File("w0.log"), {"--device-updates", "off"});
  ::setenv("L2L_TEST_UPDATE_FAULT", "hang:2", 1);
  auto w1 = StartWorker((*eps)->address(), "w1", (*logs)->File("w1.log"), {"--device-updates", "on"});
  ::unsetenv("L2L_TEST_UPDATE_FAULT");
  REQUIRE(w0.ok());
  REQUIRE(w1.ok());
  // Wait until worker 1's device holds an update, then kill -9 it.
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((*w1)->Log().find("holding update task") == std::string::npos) {
    INFO((*w1)->LogTail());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
  (*w1)->Signal(SIGKILL);
  REQUIRE((*w1)->Wait(5s).ok());
  // w1's id: the two workers register in either order.
  const std::string eps_log = (*eps)->process().Log();
  const size_t named = eps_log.find(" 'w1' registered");
  REQUIRE(named != std::string::npos);
  const size_t id_at = eps_log.rfind("worker ", named);
  REQUIRE(id_at != std::string::npos);
  const std::string w1_id = eps_log.substr(id_at + 7, named - id_at - 7);
  // The loss (heartbeat timeout) hands the held update back at once, long before the
  // 120 s deadline.
  deadline = std::chrono::steady_clock::now() + 30s;
  while ((*eps)->process().Log().find("itself: worker " + w1_id + " is lost") == std::string::npos) {
    INFO((*eps)->process().LogTail());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(50ms);
  }
  auto w1b = StartWorker((*eps)->address(), "w1", (*logs)->File("w1b.log"), {"--device-updates", "off"});
  REQUIRE(w1b.ok());
  auto c0 = (*w0)->Wait(120s);
  auto c1 = (*w1b)->Wait(120s);
  INFO("w0: " << (*w0)->LogTail() << "\nw1b: " << (*w1b)->LogTail() << "\neps: " << (*eps)->process().LogTail());
  REQUIRE(c0.ok());
  REQUIRE(c1.ok());
  CHECK(*c0 == 0);
  CHECK(*c1 == 0);
  const Final state = CheckpointState(**eps, job);
  REQUIRE((*eps)->Shutdown().ok());
  CheckBitIdentical(state, daemon.state);
}

}  // namespace l2l::itest

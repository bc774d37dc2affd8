// The relay's asynchronous copy path against a real EPS (EpsCore + its gRPC server in
// this process) over the shared-memory transport: the relay page-locks the weight segment
// (read-only) and its gradient segment through the backend's PinHostRange, the prefetcher
// copies layers straight out of the published weight slots, and the pusher copies each
// gradient straight into a claimed gradient slot before publishing it. Run on the CPU
// through EmulatedAsyncBackend (tests/worker/emulated_async_backend.h: copies poison
// their destination and land late), once with pinning working and once with pinning
// failing (the bounce-buffer / staging fallback).
//
// Oracle: the plain CPU relay (direct path, PushGradient) against a fresh EPS with the
// same job: the per-step losses must be bit-identical (the copies move bytes exactly;
// step t's loss depends on every gradient of steps < t through the EPS's updates).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "tests/integration/eps_test_util.h"
#include "tests/testing/batches.h"
#include "tests/testing/in_process_eps.h"
#include "tests/worker/emulated_async_backend.h"
#include "worker/eps_client.h"
#include "worker/relay.h"

namespace l2l {
namespace {

using namespace std::chrono_literals;

using testing::InProcessEps;

JobConfig Job(DType dt, const std::string& stash) {
  JobConfig job = epstest::TinyJob(dt, 3);
  job.train.micro_batch_size = 2;
  job.train.micro_batches = 2;
  job.train.seq_len = 16;
  job.train.stash = ParseStashPlacement(stash).value();
  job.optim.grad_clip = 1.0f;
  job.optim.lr = 3e-3f;
  return job;
}

std::vector<worker::MicroBatch> Batches(const JobConfig& job, int64_t step) {
  return testing::LcgBatches(job, 99 + static_cast<uint64_t>(step) * 104729, 3, 1);
}

struct Run {
  std::vector<double> losses;
  Transport transport = Transport::kAuto;
  int64_t pinned = 0, bounced = 0, slot_pushes = 0, staged_pushes = 0;
  std::vector<worker::HostRegionPinner::Attempt> pin_attempts;
};

Run Train(const JobConfig& job, kernels::Backend* backend, int steps) {
  InProcessEps eps(job, "asyncshm", 8192);
  worker::ClientOptions co;
  co.transport = l2l::Transport::kShm;
  co.connect_timeout = 5000ms;
  auto client = worker::ConnectEps(eps.address, co);
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  Run run;
  run.transport = (*client)->registration().transport;
  auto opts = worker::RelayOptions::FromJob(job);
  REQUIRE(opts.ok());
  auto relay = worker::Relay::Create(client->get(), backend, job, *opts);
  INFO(relay.status().ToString());
  REQUIRE(relay.ok());
  for (int s = 0; s < steps; ++s) {
    auto report = (*relay)->RunStep(s, Batches(job, s));
    INFO("step " << s << ": " << report.status().ToString());
    REQUIRE(report.ok());
    run.losses.push_back(report->loss);
    Status st = (*client)->StepDone(*report);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  run.pinned = (*relay)->prefetcher().pinned_fetches();
  run.bounced = (*relay)->prefetcher().bounced_fetches();
  run.slot_pushes = (*relay)->pusher().slot_pushes();
  run.staged_pushes = (*relay)->pusher().staged_pushes();
  if ((*relay)->pinner() != nullptr) run.pin_attempts = (*relay)->pinner()->attempts();
  relay->reset();  // detaches the pinner from the client before the client goes
  return run;
}

TEST_CASE("Relay with copy queues over shm DMAs from the pinned weight segment into gradient slots",
          "[integration][relay][async]") {
  const DType dt = GENERATE(DType::kF32, DType::kBF16);
  const std::string stash = GENERATE(std::string("device"), std::string("host"));
  CAPTURE(DTypeName(dt), stash);
  const JobConfig job = Job(dt, stash);
  REQUIRE(job.Validate().ok());
  const int steps = 3;
  const int64_t fetches = steps * (2 * job.model.n_layer + 2);
  const int64_t pushes = steps * (job.model.n_layer + 2);

  auto cpu = kernels::CreateCpuBackend(1);
  Run plain = Train(job, cpu.get(), steps);
  REQUIRE(plain.transport == l2l::Transport::kShm);
  CHECK(plain.pin_attempts.empty());  // the direct path pins nothing

  SECTION("segments page-locked: zero-copy both ways") {
    testing::EmulatedAsyncBackend emu(1, {});
    Run async = Train(job, &emu, steps);
    REQUIRE(async.transport == l2l::Transport::kShm);
    CHECK(async.losses == plain.losses);
    CHECK(async.pinned == fetches);
    CHECK(async.bounced == 0);
    CHECK(async.slot_pushes == pushes);
    CHECK(async.staged_pushes == 0);
    // Two regions pinned (the weight segment read-only, the gradient segment writable),
    // both unpinned again when the relay went.
    REQUIRE(async.pin_attempts.size() == 2);
    std::lock_guard<std::mutex> lk(emu.stats().mu);
    REQUIRE(emu.stats().pins.size() == 2);
    int read_only = 0;
    for (const auto& p : emu.stats().pins) {
      read_only += p.read_only ? 1 : 0;
      CHECK_FALSE(p.active);
    }
    CHECK(read_only == 1);
  }
  SECTION("pinning fails: bounce buffer in, pinned staging out") {
    testing::EmulatedAsyncBackend::Options o;
    o.fail_pins = true;
    testing::EmulatedAsyncBackend emu(1, o);
    Run async = Train(job, &emu, steps);
    CHECK(async.losses == plain.losses);
    CHECK(async.pinned == 0);
    CHECK(async.bounced == fetches);
    CHECK(async.slot_pushes == 0);
    CHECK(async.staged_pushes == pushes);
    REQUIRE(async.pin_attempts.size() == 2);
    for (const auto& a : async.pin_attempts) {
      CHECK_FALSE(a.pinned);
      CHECK(a.error.find("cannot page-lock") != std::string::npos);
    }
  }
}

}  // namespace
}  // namespace l2l

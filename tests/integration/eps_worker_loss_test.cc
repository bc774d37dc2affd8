// Worker liveness on a real EPS (EpsCore + gRPC server on 127.0.0.1:0, in this
// process) with two scripted fake workers that talk the raw Data protocol, so the test
// decides exactly when each one pushes and when it stops heartbeating. Checks: a
// silent worker is declared lost and shown in GetStatus; no layer is ever updated from
// a partial set of a step's gradients (every layer's fp32 master always equals the
// test's own AdamW reference of some whole step); on_worker_loss pause waits for the
// worker and continue goes on without it; a restarted worker takes its id back; a step
// already partially applied is rolled back to the last checkpoint and redone.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/control.grpc.pb.h"
#include "proto/data.grpc.pb.h"
#include "tests/integration/eps_test_util.h"
#include "tests/integration/harness.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

namespace data = ::l2l::data::v1;
namespace ctl = ::l2l::control::v1;
using namespace std::chrono_literals;
using epstest::Grad;
using epstest::Reference;
using epstest::TinyJob;

constexpr int64_t kHeartbeatTimeoutMs = 400;

struct Daemon {
  // clip "none": every layer updates as soon as its gradients are in (with "global"
  // all updates of a step wait for the last gradient, so no step is ever partial).
  Daemon(const std::string& on_loss, const std::string& state_dir, const std::string& transport = "grpc",
         const JobConfig& job = Job())
      : core(Opts(on_loss, state_dir, transport)) {
    L2L_CHECK(core.CreateJob(job).ok());
    auto s = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
    L2L_CHECK(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    address = "127.0.0.1:" + std::to_string(server->port());
    control = ctl::Control::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  ~Daemon() {
    server->Shutdown();
    core.Stop();
  }
  static JobConfig Job() {
    JobConfig j = TinyJob(DType::kF32, 6);
    j.train.clip = l2l::ClipMode::kNone;
    return j;
  }
  static eps::CoreOptions Opts(const std::string& on_loss, const std::string& state_dir, const std::string& transport) {
    static int n = 0;
    eps::CoreOptions o;
    o.job_id = "loss" + std::to_string(getpid()) + "x" + std::to_string(n++);
    o.expected_workers = 2;
    o.transport = ParseTransport(transport).value();
    o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
    o.on_worker_loss = ParseOnWorkerLoss(on_loss).value();
    o.state_dir = state_dir;
    return o;
  }
  ctl::GetStatusReply Status() {
    grpc::ClientContext c;
    ctl::GetStatusReply rep;
    L2L_CHECK(control->GetStatus(&c, ctl::GetStatusRequest(), &rep).ok());
    return rep;
  }
  std::string WorkerState(int id) {
    const ctl::GetStatusReply st = Status();
    for (const auto& w : st.workers()) {
      if (w.worker_id() == id) return w.state();
    }
    return "?";
  }
  // Waits until worker `id` shows `state`.
  bool WaitState(int id, const std::string& state) {
    for (int i = 0; i < 300; ++i) {
      if (WorkerState(id) == state) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  eps::EpsCore core;
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::string address;
  std::unique_ptr<ctl::Control::Stub> control;
};

// A fake worker on the raw Data protocol with a heartbeat thread the test can stop.
class RawWorker {
 public:
  RawWorker(const std::string& address, int32_t previous_id = -1) {
    stub_ = data::Data::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    Register(previous_id);
    beat_ = std::thread([this] {
      while (!quit_) {
        if (beating_) {
          grpc::ClientContext c;
          data::HeartbeatRequest req;
          req.set_worker_id(id_);
          data::HeartbeatReply rep;
          if (stub_->Heartbeat(&c, req, &rep).ok() && rep.rejoin()) rejoin_ = true;
        }
        std::this_thread::sleep_for(50ms);
      }
    });
  }
  ~RawWorker() {
    quit_ = true;
    beat_.join();
  }
  grpc::Status Register(int32_t previous_id) {
    grpc::ClientContext c;
    data::RegisterRequest req;
    req.set_worker_name("fake");
    req.set_transport("grpc");
    req.set_previous_worker_id(previous_id);
    grpc::Status s = stub_->Register(&c, req, &reg_);
    L2L_CHECK(s.ok()) << s.error_message();
    id_ = reg_.worker_id();
    rejoin_ = false;
    return s;
  }
  void StopHeartbeats() { beating_ = false; }
  int id() const { return id_; }
  const data::RegisterReply& reg() const { return reg_; }
  bool rejoin() const { return rejoin_; }

  grpc::Status Push(int64_t layer, int64_t step, int64_t mb = 1) {
    const auto layouts = BuildLayout(TinyJob().model);
    auto g = Grad(step, id_, layer, layouts[layer].numel);
    grpc::ClientContext c;
    data::PushGradientReply rep;
    auto w = stub_->PushGradient(&c, &rep);
    data::GradientChunk chunk;
    chunk.set_worker_id(id_);
    chunk.set_layer(layer);
    chunk.set_step(step);
    chunk.set_micro_batches(mb);
    chunk.set_numel(static_cast<int64_t>(g.size()));
    chunk.set_data(g.data(), g.size() * sizeof(float));
    w->Write(chunk);
    w->WritesDone();
    return w->Finish();
  }
  grpc::Status PushAll(int64_t step) {
    for (int64_t l = TinyJob().model.NumLayers() - 1; l >= 0; --l) {
      grpc::Status s = Push(l, step);
      if (!s.ok()) return s;
    }
    return grpc::Status::OK;
  }
  grpc::Status StepDone(int64_t step) {
    grpc::ClientContext c;
    data::StepDoneRequest req;
    req.set_worker_id(id_);
    req.set_step(step);
    req.set_loss(1.0);
    req.set_data_position("w" + std::to_string(id_) + "-after-" + std::to_string(step));
    data::StepDoneReply rep;
    return stub_->StepDone(&c, req, &rep);
  }
  grpc::Status FullStep(int64_t step) {
    grpc::Status s = PushAll(step);
    return s.ok() ? StepDone(step) : s;
  }
  // Deregister of this worker's id naming `registration_id` (wait_final_ms: see proto).
  grpc::Status Deregister(uint64_t registration_id, int64_t wait_final_ms = 0) {
    grpc::ClientContext c;
    data::DeregisterRequest req;
    req.set_worker_id(id_);
    req.set_registration_id(registration_id);
    req.set_wait_final_ms(wait_final_ms);
    data::DeregisterReply rep;
    return stub_->Deregister(&c, req, &rep);
  }

 private:
  std::unique_ptr<data::Data::Stub> stub_;
  data::RegisterReply reg_;
  int32_t id_ = -1;
  std::atomic<bool> beating_{true}, quit_{false}, rejoin_{false};
  std::thread beat_;
};

// The EPS's fp32 master of every layer.
std::vector<std::vector<float>> Master(eps::EpsCore& core) {
  std::vector<std::vector<float>> out;
  for (int64_t l = 0; l < core.store()->num_layers(); ++l) {
    out.emplace_back(core.store()->layout(l).numel);
    REQUIRE(core.store()->ReadState(l, 0, out.back().data()).ok());
  }
  return out;
}

bool WaitStep(Daemon& d, int64_t step) { return d.core.pipeline()->WaitForStep(step, 10s); }

}  // namespace

TEST_CASE("EPS pause: a silent worker is lost, nothing is applied without it, a restart takes its id back",
          "[integration][eps][worker_loss]") {
  Daemon d("pause", "");
  RawWorker a(d.address), b(d.address);
  REQUIRE(a.id() == 0);
  REQUIRE(b.id() == 1);
  Reference ref(Daemon::Job());
  std::thread ta([&] { CHECK(a.FullStep(0).ok()); });
  CHECK(b.FullStep(0).ok());
  ta.join();
  REQUIRE(WaitStep(d, 1));
  ref.Step(0, {0, 1}, {1, 1});
  CHECK(Master(d.core) == ref.p);

  // Step 1: b pushes everything, a pushes nothing and falls silent.
  REQUIRE(b.FullStep(1).ok());
  a.StopHeartbeats();
  REQUIRE(d.WaitState(0, "lost"));
  const auto st = d.Status();
  CHECK(st.state() == "paused");
  CHECK(st.workers(1).state() == "active");
  CHECK(st.step() == 1);
  for (int64_t v : st.layer_version()) CHECK(v == 1);  // no partial update
  std::this_thread::sleep_for(200ms);
  CHECK(Master(d.core) == ref.p);
  // The silent worker's calls are refused with a typed rejoin reason (the status detail
  // clients decide on) and a hint for people.
  grpc::Status refused = a.Push(3, 1);
  CHECK(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(refused.error_message().find("re-register to rejoin") != std::string::npos);
  ::l2l::data::v1::RejoinDetail detail;
  REQUIRE(detail.ParseFromString(refused.error_details()));
  CHECK(detail.reason() == ::l2l::data::v1::REJOIN_REASON_DECLARED_LOST);

  // A restarted process registers fresh and takes over id 0 at step 1 with its data.
  RawWorker a2(d.address);
  CHECK(a2.id() == 0);
  CHECK(a2.reg().start_step() == 1);
  CHECK(a2.reg().data_position() == "w0-after-0");
  CHECK(a2.reg().data_rank() == 0);
  CHECK(a2.reg().data_world() == 2);
  CHECK(d.Status().state() == "running");
  REQUIRE(a2.FullStep(1).ok());
  REQUIRE(WaitStep(d, 2));
  ref.Step(1, {0, 1}, {1, 1});  // both workers' gradients of step 1
  CHECK(Master(d.core) == ref.p);
}

TEST_CASE("EPS continue: a lost worker's unapplied gradients are dropped and the step completes without it",
          "[integration][eps][worker_loss]") {
  Daemon d("continue", "");
  RawWorker a(d.address), b(d.address);
  Reference ref(Daemon::Job());
  std::thread ta([&] { CHECK(a.FullStep(0).ok()); });
  CHECK(b.FullStep(0).ok());
  ta.join();
  REQUIRE(WaitStep(d, 1));
  ref.Step(0, {0, 1}, {1, 1});

  // Step 1: a pushes only layer 1 (which b has not pushed yet) and falls silent.
  REQUIRE(a.Push(1, 1).ok());
  a.StopHeartbeats();
  REQUIRE(d.WaitState(0, "lost"));
  CHECK(d.Status().step_workers() == 1);
  CHECK(d.Status().state() == "running");
  // b finishes step 1 alone: the update uses b's gradients only (a's layer 1 dropped).
  REQUIRE(b.FullStep(1).ok());
  REQUIRE(WaitStep(d, 2));
  ref.Step(1, {1}, {1});
  CHECK(Master(d.core) == ref.p);

  // a comes back (previous id): it starts at the next boundary, step 2, with its data.
  RawWorker a2(d.address, /*previous_id=*/0);
  CHECK(a2.id() == 0);
  CHECK(a2.reg().start_step() == 2);
  CHECK(a2.reg().data_position() == "w0-after-0");
  CHECK(d.Status().step_workers() == 2);
  std::thread t2([&] { CHECK(a2.FullStep(2).ok()); });
  CHECK(b.FullStep(2).ok());
  t2.join();
  REQUIRE(WaitStep(d, 3));
  ref.Step(2, {0, 1}, {1, 1});
  CHECK(Master(d.core) == ref.p);
}

TEST_CASE("EPS continue in lock-free mode: a worker lost after finishing steps ahead keeps them and they commit",
          "[integration][eps][worker_loss]") {
  // Lock-free mode (staleness 1): a finishes steps 0 and 1 while step 0 still waits for
  // b, then falls silent. Its gradients of both steps are in and stay in (it finished
  // them); b completes steps 0 and 1 with them and step 2 alone. (Dropping a's step 1,
  // as the loss handling did before 2026-11-28, left step 1 waiting for it for ever.)
  JobConfig job = Daemon::Job();
  job.train.mode = l2l::TrainMode::kLockfree;
  job.train.staleness = 1;
  REQUIRE(job.Validate().ok());
  Daemon d("continue", "", "grpc", job);
  RawWorker a(d.address), b(d.address);
  Reference ref(job);
  REQUIRE(a.FullStep(0).ok());
  REQUIRE(a.FullStep(1).ok());
  a.StopHeartbeats();
  REQUIRE(d.WaitState(0, "lost"));
  CHECK_FALSE(d.core.pipeline()->WaitForStep(1, 100ms));  // step 0 still waits for b
  REQUIRE(b.FullStep(0).ok());
  REQUIRE(b.FullStep(1).ok());
  REQUIRE(WaitStep(d, 2));
  ref.Step(0, {0, 1}, {1, 1});
  ref.Step(1, {0, 1}, {1, 1});
  CHECK(Master(d.core) == ref.p);
  REQUIRE(b.FullStep(2).ok());
  REQUIRE(WaitStep(d, 3));
  ref.Step(2, {1}, {1});
  CHECK(Master(d.core) == ref.p);
}

// A worker process that exits after its daemon was replaced on the same address, or after
// a replacement took its id, sends its Deregister to whoever holds that id now (the stop
// 22 chaos_shm failures: a healthy worker was removed and the job went on with one data
// shard). The registration nonce makes that Deregister a no-op with a clear error.
TEST_CASE("A Deregister naming an earlier registration is refused and removes nobody",
          "[integration][eps][worker_loss]") {
  Daemon d("continue", "");
  RawWorker a(d.address), b(d.address);
  const uint64_t first = a.reg().registration_id();
  CHECK(first != 0);
  CHECK(first != b.reg().registration_id());
  a.StopHeartbeats();
  REQUIRE(d.WaitState(0, "lost"));
  RawWorker a2(d.address, /*previous_id=*/0);
  REQUIRE(a2.id() == 0);
  CHECK(a2.reg().registration_id() != first);
  CHECK(a2.reg().registration_id() != 0);
  const grpc::Status stale = a2.Deregister(first);
  CHECK(stale.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(stale.error_message().find("stale client") != std::string::npos);
  const grpc::Status zero = a2.Deregister(0);  // a client that sends none
  CHECK(zero.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(d.WorkerState(0) == "active");
  CHECK(d.Status().step_workers() == 2);
  // The holder of the id leaves with its own registration.
  CHECK(a2.Deregister(a2.reg().registration_id()).ok());
  CHECK(d.WorkerState(0) == "left");
  CHECK(d.Status().step_workers() == 1);
}

// The worker's exit after the job's last step (worker_main: LeaveAfterLastStep). Layer 0's
// last version is visible a moment before the pipeline counts the step committed, so an
// early ask must be "ask again", never an error (which would make the worker exit 1).
TEST_CASE("Deregister after the last step asks again until that step commits, then leaves",
          "[integration][eps][worker_loss]") {
  Daemon d("pause", "");
  RawWorker a(d.address), b(d.address);
  const auto t0 = std::chrono::steady_clock::now();
  const grpc::Status early = a.Deregister(a.reg().registration_id(), 60000);
  CHECK(early.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(early.error_message().find("ask again") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // bounded, not the 60 s asked for
  CHECK(d.WorkerState(a.id()) == "active");
  const int64_t steps = Daemon::Job().train.steps;
  for (int64_t s = 0; s < steps; ++s) {
    grpc::Status sa;
    std::thread ta([&] { sa = a.FullStep(s); });
    const grpc::Status sb = b.FullStep(s);
    ta.join();
    INFO("step " << s << ": a: " << sa.error_message() << "; b: " << sb.error_message());
    REQUIRE(sa.ok());
    REQUIRE(sb.ok());
    REQUIRE(WaitStep(d, s + 1));  // raw workers fetch nothing: the next step's pushes wait here
  }
  // No periodic checkpoints in this job: nothing to wait for once the step committed.
  CHECK(a.Deregister(a.reg().registration_id(), 60000).ok());
  CHECK(b.Deregister(b.reg().registration_id(), 60000).ok());
  CHECK(d.WorkerState(a.id()) == "left");
  CHECK(d.WorkerState(b.id()) == "left");
}

TEST_CASE("EPS undoes a partially applied step when a worker is lost - every worker redoes it",
          "[integration][eps][worker_loss]") {
  const std::string mode = GENERATE(std::string("pause"), std::string("continue"));
  auto tmp = itest::TempDir::Create("eps-loss");
  REQUIRE(tmp.ok());
  Daemon d(mode, (*tmp)->path());
  auto a = std::make_unique<RawWorker>(d.address);
  RawWorker b(d.address);
  Reference ref(Daemon::Job());
  std::thread ta([&] { CHECK(a->FullStep(0).ok()); });
  CHECK(b.FullStep(0).ok());
  ta.join();
  REQUIRE(WaitStep(d, 1));
  ref.Step(0, {0, 1}, {1, 1});
  auto ck = d.core.Checkpoint("");
  REQUIRE(ck.ok());
  CHECK(ck->step == 1);
  const auto at1 = ref.p;

  // Step 1: both push the top layer (it is applied at once, published only with the
  // whole step), then a falls silent.
  const int64_t top = TinyJob().model.NumLayers() - 1;
  REQUIRE(a->Push(top, 1).ok());
  REQUIRE(b.Push(top, 1).ok());
  for (int i = 0; i < 200 && Master(d.core) == at1; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(Master(d.core) != at1);
  CHECK(d.core.store()->published_version(top) == 1);
  a->StopHeartbeats();
  REQUIRE(d.WaitState(0, "lost"));
  // Undone: every layer at version 1 with the state of step 1 again, bit for bit.
  const auto st = d.Status();
  for (int64_t v : st.layer_version()) CHECK(v == 1);
  CHECK(Master(d.core) == at1);
  CHECK(st.workers(1).state() == "rejoin");
  // b's pushes are refused until it re-registers.
  grpc::Status refused = b.PushAll(1);
  CHECK(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(refused.error_message().find("re-register") != std::string::npos);
  for (int i = 0; i < 100 && !b.rejoin(); ++i) std::this_thread::sleep_for(10ms);
  CHECK(b.rejoin());
  REQUIRE(b.Register(1).ok());
  CHECK(b.reg().start_step() == 1);
  CHECK(b.reg().data_position() == "w1-after-0");
  if (mode == "continue") {
    CHECK(d.Status().step_workers() == 1);
    REQUIRE(b.FullStep(1).ok());
    REQUIRE(WaitStep(d, 2));
    ref.Step(1, {1}, {1});
  } else {
    CHECK(d.Status().state() == "paused");
    REQUIRE(b.FullStep(1).ok());
    std::this_thread::sleep_for(200ms);
    CHECK(Master(d.core) == at1);  // waits for worker 0
    a = std::make_unique<RawWorker>(d.address, 0);
    CHECK(a->reg().start_step() == 1);
    CHECK(a->reg().data_position() == "w0-after-0");
    REQUIRE(a->FullStep(1).ok());
    REQUIRE(WaitStep(d, 2));
    ref.Step(1, {0, 1}, {1, 1});
  }
  CHECK(Master(d.core) == ref.p);
}

// A daemon (on_worker_loss continue, transport auto), an EpsClient on shared memory
// (worker 0) and a raw worker (1): both push step 0's top-layer gradient, so that layer
// is updated at once (published only with the whole step); then the raw worker stops
// heartbeating and is declared lost, so step 0 is abandoned after one layer was applied.
// Each step REQUIREs, so a test that holds one starts from exactly that state.
struct AbandonedStep {
  explicit AbandonedStep(const std::string& tmp_name) {
    auto t = itest::TempDir::Create(tmp_name);
    REQUIRE(t.ok());
    tmp = std::move(t).value();
    d = std::make_unique<Daemon>("continue", tmp->path(), "auto");
    worker::ClientOptions o;
    o.transport = l2l::Transport::kShm;
    o.heartbeat_interval = 50ms;
    auto c = worker::ConnectEps(d->address, o);
    REQUIRE(c.ok());
    client = std::move(c).value();
    lost = std::make_unique<RawWorker>(d->address);
    std::vector<float> init(layouts[top].numel), now(layouts[top].numel);
    REQUIRE(d->core.store()->ReadState(top, 0, init.data()).ok());
    auto g = Grad(0, client->registration().worker_id, top, layouts[top].numel);
    REQUIRE(client->PushGradient(top, 0, 1, g.data(), g.size()).ok());
    REQUIRE(lost->Push(top, 0).ok());
    for (int i = 0; i < 200; ++i) {
      REQUIRE(d->core.store()->ReadState(top, 0, now.data()).ok());
      if (now != init) break;
      std::this_thread::sleep_for(10ms);
    }
    REQUIRE(now != init);
    lost->StopHeartbeats();
    REQUIRE(d->WaitState(1, "lost"));
  }
  const int64_t top = TinyJob().model.NumLayers() - 1;
  const std::vector<LayerLayout> layouts = BuildLayout(TinyJob().model);
  std::unique_ptr<itest::TempDir> tmp;
  std::unique_ptr<Daemon> d;
  std::unique_ptr<worker::EpsClient> client;
  std::unique_ptr<RawWorker> lost;
};

TEST_CASE("EpsClient rejoins after a rollback and redoes the step", "[integration][eps][worker_loss]") {
  AbandonedStep a("eps-rejoin");
  Daemon& d = *a.d;
  auto& client = *a.client;
  const int64_t top = a.top;
  const auto& layouts = a.layouts;
  // The step is abandoned: the top layer's update is undone (step 0 again).
  auto w = client.AcquireLayer(top, 1, 2s);
  CHECK(w.status().code() == StatusCode::kFailedPrecondition);
  CHECK(worker::NeedsRejoin(w.status()));
  CHECK(client.rejoin_requested());
  REQUIRE(client.Rejoin().ok());
  CHECK(!client.rejoin_requested());
  CHECK(client.registration().start_step == 0);
  auto w0 = client.AcquireLayer(top, 0, 2s);
  REQUIRE(w0.ok());
  CHECK(w0->version == 0);
  client.ReleaseLayer(top);
  Reference ref(Daemon::Job());
  for (int64_t l = top; l >= 0; --l) {
    auto gl = Grad(0, client.registration().worker_id, l, layouts[l].numel);
    REQUIRE(client.PushGradient(l, 0, 1, gl.data(), gl.size()).ok());
  }
  worker::StepReport r;
  r.step = 0;
  REQUIRE(client.StepDone(r).ok());
  REQUIRE(WaitStep(d, 1));
  ref.Step(0, {client.registration().worker_id}, {1});
  CHECK(Master(d.core) == ref.p);
}

// Over shared memory a refused gradient surfaces at the worker's next claim or drain: the
// refusal must still say "re-register" (its rejoin reason), or the worker exits instead.
TEST_CASE("A gradient refused through shared memory after an abandoned step asks the worker to re-register",
          "[integration][eps][worker_loss]") {
  AbandonedStep a("eps-shm-refused");  // step 0 abandoned: the shm worker must redo it
  auto& client = *a.client;
  const int64_t top = a.top;
  const auto& layouts = a.layouts;
  // Its next gradient of step 0 goes into a slot; the daemon refuses it there.
  auto g2 = Grad(0, client.registration().worker_id, top - 1, layouts[top - 1].numel);
  REQUIRE(client.PushGradient(top - 1, 0, 1, g2.data(), g2.size()).ok());
  worker::StepReport r;
  r.step = 0;
  const Status st = client.StepDone(r);  // drains the slots: the refusal comes back here
  INFO(st.ToString());
  REQUIRE(!st.ok());
  CHECK(st.message().find("shared memory") != std::string::npos);
  CHECK(worker::NeedsRejoin(st));
  REQUIRE(client.Rejoin().ok());
  CHECK(client.registration().start_step == 0);
}

}  // namespace l2l

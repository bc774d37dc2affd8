// A scripted fake worker against a real EPS (EpsCore + gRPC server on 127.0.0.1:0, in
// this process): two workers register over gRPC, one moves bytes through shared
// memory and one through gRPC streams; they fetch every layer, push known gradients
// for several steps, and the published weights must equal AdamW applied by this test
// with common/adamw.h. Also: bad input over the API, each in its own test case, gets
// the right gRPC code and message while the daemon keeps serving the other workers.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/lora.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"
#include "proto/data.grpc.pb.h"
#include "tests/integration/eps_test_util.h"
#include "tests/testing/temp_dir.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

using namespace std::chrono_literals;

JobConfig TinyJob(DType dt) { return epstest::TinyJob(dt, 3); }

struct Daemon {
  explicit Daemon(const JobConfig& job, int workers, const std::string& transport = "auto")
      : Daemon(job, MakeOpts(workers, transport)) {}
  Daemon(const JobConfig& job, const eps::CoreOptions& opts) : core(opts) {
    const Status created = core.CreateJob(job);
    L2L_CHECK(created.ok()) << created.ToString();
    eps::ServerOptions so;
    auto s = eps::EpsGrpcServer::Start(&core, so);
    L2L_CHECK(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    address = "127.0.0.1:" + std::to_string(server->port());
  }
  ~Daemon() {
    server->Shutdown();
    core.Stop();
  }
  static eps::CoreOptions MakeOpts(int workers, const std::string& transport) {
    eps::CoreOptions o;
    static int counter = 0;
    o.job_id = "test" + std::to_string(getpid()) + "x" + std::to_string(counter++);
    o.expected_workers = workers;
    o.page_bytes = 8192;
    o.transport = ParseTransport(transport).value();
    return o;
  }
  eps::EpsCore core;
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::string address;
};

std::unique_ptr<worker::EpsClient> Connect(const std::string& address, const std::string& transport) {
  worker::ClientOptions o;
  o.transport = ParseTransport(transport).value();
  o.connect_timeout = 5000ms;
  auto c = worker::ConnectEps(address, o);
  L2L_CHECK(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

using epstest::Grad;

// The test's own reference (AdamW over plain vectors): workers 0..n-1 with these
// micro-batch counts.
struct Reference : epstest::Reference {
  using epstest::Reference::Reference;
  void Step(int64_t step, const std::vector<int64_t>& mbs) {
    std::vector<int> ids(mbs.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
    epstest::Reference::Step(step, ids, mbs);
  }
};

std::vector<float> ToFloat(const worker::LayerWeights& w) {
  std::vector<float> out(w.numel);
  ConvertToFloat(w.data, w.dtype, out.data(), w.numel);
  return out;
}

// One worker's steps: fetch every layer at version `step` and check it against the
// reference, push its gradients in backward order, StepDone.
void RunWorker(worker::EpsClient* c, int id, int64_t steps, int64_t mb,
               const std::vector<std::vector<std::vector<float>>>* expect, DType dt, std::atomic<int>* bad) {
  const auto& reg = c->registration();
  const int64_t L = reg.job.model.NumLayers();
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t l = 0; l < L; ++l) {
      auto w = c->AcquireLayer(l, step, 20s);
      if (!w.ok() || w->version != step) {
        ++*bad;
        continue;
      }
      auto got = ToFloat(*w);
      c->ReleaseLayer(l);
      const auto& want = (*expect)[step][l];
      for (size_t i = 0; i < want.size(); ++i) {
        const float e = dt == DType::kF32 ? want[i] : Bf16ToFloat(FloatToBf16(want[i]));
        if (got[i] != e) {
          ++*bad;
          break;
        }
      }
    }
    for (int64_t l = L - 1; l >= 0; --l) {
      auto g = Grad(step, id, l, reg.job.model.NumLayers() > 0 ? BuildLayout(reg.job.model)[l].numel : 0);
      Status s = c->PushGradient(l, step, mb, g.data(), g.size());
      if (!s.ok()) ++*bad;
    }
    worker::StepReport r;
    r.step = step;
    r.loss = 1.0;
    r.tokens = 100;
    if (!c->StepDone(r).ok()) ++*bad;
  }
}

}  // namespace

TEST_CASE("EPS with a shm worker and a gRPC worker publishes AdamW of their gradients",
          "[integration][eps]") {
  const DType dt = GENERATE(DType::kF32, DType::kBF16);
  const JobConfig job = TinyJob(dt);
  Daemon d(job, 2);
  auto a = Connect(d.address, "auto");
  auto b = Connect(d.address, "grpc");
  REQUIRE(a->registration().transport == l2l::Transport::kShm);
  REQUIRE(b->registration().transport == l2l::Transport::kGrpc);
  CHECK(a->registration().job.model == job.model);
  CHECK(a->registration().num_workers == 2);
  // Expected weights at every version, computed by the reference.
  Reference ref(job);
  const std::vector<int64_t> mbs = {a->registration().worker_id == 0 ? int64_t{2} : int64_t{3},
                                    a->registration().worker_id == 0 ? int64_t{3} : int64_t{2}};
  std::vector<std::vector<std::vector<float>>> expect;
  for (int64_t s = 0; s <= job.train.steps; ++s) {
    expect.push_back(ref.p);
    if (s < job.train.steps) ref.Step(s, mbs);
  }
  std::atomic<int> bad{0};
  std::thread ta([&] { RunWorker(a.get(), a->registration().worker_id, job.train.steps, mbs[a->registration().worker_id], &expect, dt, &bad); });
  std::thread tb([&] { RunWorker(b.get(), b->registration().worker_id, job.train.steps, mbs[b->registration().worker_id], &expect, dt, &bad); });
  ta.join();
  tb.join();
  CHECK(bad.load() == 0);
  // The final version through both transports, and the fp32 master, equal the reference.
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) {
    for (auto* c : {a.get(), b.get()}) {
      auto w = c->AcquireLayer(l, job.train.steps, 10s);
      REQUIRE(w.ok());
      CHECK(w->version == job.train.steps);
      auto got = ToFloat(*w);
      c->ReleaseLayer(l);
      for (size_t i = 0; i < got.size(); ++i) {
        const float e = dt == DType::kF32 ? expect.back()[l][i] : Bf16ToFloat(FloatToBf16(expect.back()[l][i]));
        if (got[i] != e) {
          FAIL("layer " << l << " element " << i << ": got " << got[i] << " want " << e);
        }
      }
    }
    std::vector<float> master(ref.p[l].size());
    REQUIRE(d.core.store()->ReadState(l, 0, master.data()).ok());
    CHECK(master == ref.p[l]);
  }
  CHECK(d.core.GetStatus().step == job.train.steps);
}

// ---- bad input, each in its own test: a raw stub sends it, then the healthy workers
// still complete a step. --------------------------------------------------------------

namespace {

struct BadInputFixture {
  BadInputFixture() : d(TinyJob(DType::kF32), 2, "grpc") {
    a = Connect(d.address, "grpc");
    b = Connect(d.address, "grpc");
    channel = grpc::CreateChannel(d.address, grpc::InsecureChannelCredentials());
    stub = data::v1::Data::NewStub(channel);
  }
  // Sends one PushGradient stream of the given chunks with the given header.
  grpc::Status Push(int32_t worker, int64_t layer, int64_t step, int64_t numel,
                    const std::vector<size_t>& chunk_bytes) {
    grpc::ClientContext ctx;
    data::v1::PushGradientReply rep;
    auto w = stub->PushGradient(&ctx, &rep);
    for (size_t n : chunk_bytes) {
      data::v1::GradientChunk c;
      c.set_worker_id(worker);
      c.set_layer(layer);
      c.set_step(step);
      c.set_micro_batches(1);
      c.set_numel(numel);
      c.set_data(std::string(n, '\0'));
      if (!w->Write(c)) break;
    }
    w->WritesDone();
    return w->Finish();
  }
  size_t numel(int64_t layer) const { return BuildLayout(a->registration().job.model)[layer].numel; }
  // Both healthy workers run one full step; the daemon must still publish version 1.
  void HealthyStepStillWorks() {
    const int64_t L = a->registration().job.model.NumLayers();
    auto run = [&](worker::EpsClient* c) {
      for (int64_t l = L - 1; l >= 0; --l) {
        std::vector<float> g(numel(l), 0.01f);
        Status s = c->PushGradient(l, 0, 1, g.data(), g.size());
        if (!s.ok() && s.code() != StatusCode::kAlreadyExists) FAIL(s.ToString());
      }
      worker::StepReport r;  // the step publishes once every worker's loss is in too
      r.step = 0;
      r.loss = 1.0;
      Status s = c->StepDone(r);
      if (!s.ok()) FAIL(s.ToString());
    };
    std::thread t1([&] { run(a.get()); });
    std::thread t2([&] { run(b.get()); });
    t1.join();
    t2.join();
    for (int64_t l = 0; l < L; ++l) {
      auto w = a->AcquireLayer(l, 1, 10s);
      REQUIRE(w.ok());
      CHECK(w->version == 1);
      a->ReleaseLayer(l);
    }
  }
  Daemon d;
  std::unique_ptr<worker::EpsClient> a, b;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<data::v1::Data::Stub> stub;
};

}  // namespace

TEST_CASE("EPS API: gradient for an unknown layer is NOT_FOUND", "[integration][eps][bad_input]") {
  BadInputFixture f;
  auto s = f.Push(f.a->registration().worker_id, 99, 0, 10, {40});
  CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(s.error_message().find("layer 99") != std::string::npos);
  // FetchLayer of an unknown layer too.
  auto w = f.a->AcquireLayer(42, 0, 1s);
  CHECK(w.status().code() == StatusCode::kNotFound);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: gradient with the wrong byte count is INVALID_ARGUMENT", "[integration][eps][bad_input]") {
  BadInputFixture f;
  const size_t n = f.numel(1);
  auto short_stream = f.Push(f.a->registration().worker_id, 1, 0, static_cast<int64_t>(n), {n * 4 - 4});
  CHECK(short_stream.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(short_stream.error_message().find("expected numel*4") != std::string::npos);
  auto wrong_numel = f.Push(f.a->registration().worker_id, 1, 0, static_cast<int64_t>(n + 1), {(n + 1) * 4});
  CHECK(wrong_numel.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(wrong_numel.error_message().find("parameters") != std::string::npos);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: gradient for the wrong step is FAILED_PRECONDITION", "[integration][eps][bad_input]") {
  BadInputFixture f;
  const size_t n = f.numel(2);
  auto s = f.Push(f.a->registration().worker_id, 2, 5, static_cast<int64_t>(n), {n * 4});
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("expects step 0") != std::string::npos);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: a duplicate gradient is ALREADY_EXISTS", "[integration][eps][bad_input]") {
  BadInputFixture f;
  const size_t n = f.numel(3);
  std::vector<float> g(n, 0.01f);
  REQUIRE(f.a->PushGradient(3, 0, 1, g.data(), n).ok());
  Status dup = f.a->PushGradient(3, 0, 1, g.data(), n);
  CHECK(dup.code() == StatusCode::kAlreadyExists);
  CHECK(dup.message().find("already pushed") != std::string::npos);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: a chunk over 4 MiB is INVALID_ARGUMENT", "[integration][eps][bad_input]") {
  BadInputFixture f;
  // Layer 0 (wte+wpe) is small; claim the right numel but send one oversized chunk.
  const size_t n = f.numel(0);
  auto s = f.Push(f.a->registration().worker_id, 0, 0, static_cast<int64_t>(n), {(size_t{4} << 20) + 4});
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.error_message().find("4 MiB") != std::string::npos);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: calls from an unregistered worker are NOT_FOUND", "[integration][eps][bad_input]") {
  BadInputFixture f;
  const size_t n = f.numel(1);
  auto s = f.Push(17, 1, 0, static_cast<int64_t>(n), {n * 4});
  CHECK(s.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(s.error_message().find("worker id 17") != std::string::npos);
  grpc::ClientContext ctx;
  data::v1::FetchLayerRequest req;
  req.set_worker_id(-3);
  req.set_layer(0);
  auto r = f.stub->FetchLayer(&ctx, req);
  data::v1::LayerChunk c;
  while (r->Read(&c)) {}
  CHECK(r->Finish().error_code() == grpc::StatusCode::NOT_FOUND);
  // Heartbeat from ids never registered (found by the rpc fuzzer: it read workers_[17]).
  for (int32_t id : {17, -3, 1 << 30}) {
    grpc::ClientContext hc;
    data::v1::HeartbeatRequest hreq;
    data::v1::HeartbeatReply hrep;
    hreq.set_worker_id(id);
    grpc::Status hs = f.stub->Heartbeat(&hc, hreq, &hrep);
    CHECK(hs.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(hs.error_message().find("worker id " + std::to_string(id)) != std::string::npos);
    CHECK_FALSE(hrep.rejoin());
  }
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: a shm gradient for the wrong step surfaces at StepDone", "[integration][eps][bad_input]") {
  Daemon d(TinyJob(DType::kF32), 1);
  auto a = Connect(d.address, "shm");
  REQUIRE(a->registration().transport == l2l::Transport::kShm);
  const size_t n = BuildLayout(a->registration().job.model)[1].numel;
  std::vector<float> g(n, 0.01f);
  REQUIRE(a->PushGradient(1, 4, 1, g.data(), n).ok());  // handed over; the EPS rejects it
  worker::StepReport r;
  Status s = a->StepDone(r);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.message().find("expects step 0") != std::string::npos);
}

namespace {

// Every layer's master, m and v as the daemon holds them.
std::vector<float> StateOf(eps::EpsCore& core) {
  std::vector<float> out;
  for (int64_t l = 0; l < core.store()->num_layers(); ++l) {
    std::vector<float> buf(core.store()->layout(l).numel);
    for (int which = 0; which < 3; ++which) {
      REQUIRE(core.store()->ReadState(l, which, buf.data()).ok());
      out.insert(out.end(), buf.begin(), buf.end());
    }
  }
  return out;
}

// One full step of worker c: fetch every layer at `step`, push gradients (`poison`:
// one NaN in the middle layer's), StepDone with `loss`.
void FakeStep(worker::EpsClient* c, int64_t step, bool poison, double loss) {
  const auto& reg = c->registration();
  const auto layouts = BuildLayout(reg.job.model);
  const int64_t L = reg.job.model.NumLayers();
  for (int64_t l = 0; l < L; ++l) {
    auto w = c->AcquireLayer(l, step, 20s);
    REQUIRE(w.ok());
    CHECK(w->version == step);
    c->ReleaseLayer(l);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    auto g = Grad(step, reg.worker_id, l, layouts[l].numel);
    if (poison && l == L / 2) g[g.size() / 3] = std::nanf("");
    REQUIRE(c->PushGradient(l, step, 1, g.data(), g.size()).ok());
  }
  worker::StepReport r;
  r.step = step;
  r.loss = loss;
  r.tokens = 10;
  REQUIRE(c->StepDone(r).ok());
}

}  // namespace

TEST_CASE("EPS skips a step with a NaN gradient or a NaN loss: masters bit-identical, counted, paused after K",
          "[integration][eps][nonfinite]") {
  const std::string transport = GENERATE(std::string("shm"), std::string("grpc"));
  INFO("transport " << transport);
  JobConfig job = TinyJob(DType::kF32);
  job.train.steps = 10;
  job.train.skip_pause_after = 2;
  Daemon d(job, 2);
  auto a = Connect(d.address, "grpc");
  auto b = Connect(d.address, transport);
  auto both = [&](int64_t step, bool poison_b, double loss_b) {
    std::thread ta([&] { FakeStep(a.get(), step, false, 2.0); });
    FakeStep(b.get(), step, poison_b, loss_b);
    ta.join();
  };
  both(0, false, 2.0);
  REQUIRE(d.core.pipeline()->WaitForStep(1, 10s));
  const auto at1 = StateOf(d.core);
  // A NaN gradient from worker b: the step is skipped for every layer.
  both(1, true, 2.0);
  REQUIRE(d.core.pipeline()->WaitForStep(2, 10s));
  CHECK(StateOf(d.core) == at1);
  auto st = d.core.GetStatus();
  CHECK(st.pipeline.skipped_steps == 1);
  CHECK(st.pipeline.consecutive_skips == 1);
  CHECK(st.pipeline.last_skip_reason.find("non-finite gradient in layer") != std::string::npos);
  CHECK(st.state == "running");
  // A NaN loss (finite gradients): skipped too; two in a row pause the job.
  both(2, false, std::nan(""));
  REQUIRE(d.core.pipeline()->WaitForStep(3, 10s));
  CHECK(StateOf(d.core) == at1);
  st = d.core.GetStatus();
  CHECK(st.pipeline.skipped_steps == 2);
  CHECK(st.pipeline.last_skip_reason.find("reported loss nan") != std::string::npos);
  CHECK(st.state == "paused");
  CHECK(st.pause_reason.find("2 steps in a row skipped") != std::string::npos);
  // Paused: a good step's gradients wait; resume applies it.
  std::thread tb([&] { both(3, false, 2.0); });
  CHECK_FALSE(d.core.pipeline()->WaitForStep(4, 500ms));
  CHECK(StateOf(d.core) == at1);
  REQUIRE(d.core.Resume().ok());
  tb.join();
  REQUIRE(d.core.pipeline()->WaitForStep(4, 10s));
  CHECK(StateOf(d.core) != at1);
  st = d.core.GetStatus();
  CHECK(st.state == "running");
  CHECK(st.pipeline.consecutive_skips == 0);
  for (float x : StateOf(d.core)) REQUIRE(std::isfinite(x));
}

TEST_CASE("With its state on SSD and a bounded guard the EPS equals an unspilled run bit for bit, NaN steps included",
          "[integration][eps][nonfinite][spill]") {
  // The daemon under test keeps ~1/4 of the state's pages in RAM (the rest in the spill
  // file), and memory.guard_bytes gives an undo copy to the head only: every other
  // layer is deferred (update_pipeline.h). The reference daemon has neither. A NaN
  // gradient (step 1) and a NaN loss (step 2) must leave both states exactly where they
  // were, and the good steps around them must agree bit for bit.
  const std::string clip = GENERATE(std::string("global"), std::string("none"));
  INFO("clip " << clip);
  JobConfig job = TinyJob(DType::kBF16);
  job.train.clip = ParseClipMode(clip).value();
  job.train.steps = 10;
  job.train.skip_pause_after = 0;
  const auto layouts = BuildLayout(job.model);
  std::vector<size_t> numel;
  for (const auto& l : layouts) numel.push_back(l.numel);
  const size_t page = 8192;
  size_t pages = 0, max_pages = 0;
  for (size_t n : numel) {
    pages += (n * 4 + page - 1) / page;
    max_pages = std::max(max_pages, (n * 4 + page - 1) / page);
  }
  const size_t state = 3 * pages * page;
  eps::ParamStoreOptions po;
  po.page_bytes = page;
  po.publish_dtype = DType::kBF16;
  const size_t published = eps::ParamStore::RequiredHostBytes(job.model, po) - state;
  const size_t guard = eps::UpdatePipeline::MinGuardBytes(numel) + 12 * numel.back();  // (8 + 4 global clip)
  const size_t pool = 3 * max_pages * page;  // the least: one layer's master + m + v
  auto dir = testing::TempDir::Create("l2l-guard-spill");
  REQUIRE(dir.ok());
  eps::CoreOptions o = Daemon::MakeOpts(1, "grpc");
  o.page_bytes = page;
  o.guard_bytes = guard;
  o.host_bytes = published + guard + pool + state / 4;
  o.spill.dir = (*dir)->path();
  o.spill.block_bytes = 4096;
  o.spill.queue_depth = 8;
  o.spill.prefetch_layers = 1;
  o.spill.pool_bytes = pool;
  Daemon spilled(job, o);
  Daemon plain(job, Daemon::MakeOpts(1, "grpc"));
  INFO("state " << state << " B, ssd " << spilled.core.store()->ssd_bytes() << " B");
  CHECK(spilled.core.store()->ssd_bytes() * 2 >= state);  // >= half the state on SSD
  CHECK(plain.core.store()->ssd_bytes() == 0);
  auto a = Connect(spilled.address, "grpc");
  auto b = Connect(plain.address, "grpc");
  auto step = [&](int64_t s, bool poison, double loss) {
    FakeStep(a.get(), s, poison, loss);
    FakeStep(b.get(), s, poison, loss);
    REQUIRE(spilled.core.pipeline()->WaitForStep(s + 1, 10s));
    REQUIRE(plain.core.pipeline()->WaitForStep(s + 1, 10s));
  };
  step(0, false, 2.0);
  const auto at1 = StateOf(plain.core);
  CHECK(StateOf(spilled.core) == at1);
  step(1, true, 2.0);  // NaN gradient in the middle layer: skipped
  CHECK(StateOf(plain.core) == at1);
  CHECK(StateOf(spilled.core) == at1);
  step(2, false, std::nan(""));  // NaN loss: skipped
  CHECK(StateOf(spilled.core) == at1);
  CHECK(spilled.core.GetStatus().pipeline.skipped_steps == 2);
  step(3, false, 2.0);
  step(4, false, 2.0);
  const auto at5 = StateOf(plain.core);
  CHECK(at5 != at1);
  CHECK(StateOf(spilled.core) == at5);
  CHECK(spilled.core.store()->tier() != nullptr);
}

TEST_CASE("EPS refuses initial weights that are not finite, naming layer and tensor", "[integration][eps][nonfinite]") {
  const JobConfig job = TinyJob(DType::kF32);
  const auto layouts = BuildLayout(job.model);
  std::vector<std::vector<float>> init;
  for (const auto& lay : layouts) init.emplace_back(lay.numel, 0.02f);
  init[1][5] = std::numeric_limits<float>::infinity();
  eps::EpsCore core(Daemon::MakeOpts(1, "grpc"));
  Status s = core.CreateJob(job, &init);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("layer 1 master weights") != std::string::npos);
  CHECK(s.message().find("not finite") != std::string::npos);
  CHECK_FALSE(core.has_job());
}

TEST_CASE("EPS keeps a LoRA job's adapters as its state and refuses a plain export of it", "[integration][eps][lora]") {
  JobConfig job = TinyJob(DType::kF32);
  job.lora.enabled = true;
  job.lora.r = 2;
  REQUIRE(job.Validate().ok());
  eps::EpsCore core(Daemon::MakeOpts(1, "grpc"));
  Status s = core.CreateJob(job);
  INFO(s.ToString());
  REQUIRE(s.ok());
  const std::vector<LayerLayout> layouts = BuildLoraLayout(job.model, job.lora);
  for (size_t l = 0; l < layouts.size(); ++l) {
    CHECK(core.store()->layout(static_cast<int64_t>(l)).numel == TrainableNumel(layouts[l]));
  }
  CHECK(core.store()->layout(1).numel < BuildLayout(job.model)[1].numel);  // the base has no state
  auto e = core.Export(core.ResolveUserPath("plain.safetensors").value(), DType::kF32);
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().code() == StatusCode::kFailedPrecondition);
  CHECK(e.status().message().find("--format peft") != std::string::npos);
  core.Stop();
}

TEST_CASE("EPS API: every gradient header field is validated before its bytes are allocated",
          "[integration][eps][bad_input]") {
  BadInputFixture f;
  const int32_t a = f.a->registration().worker_id;
  // 2^40 floats would be 4 TiB: refused for what it is, not as "must be positive".
  auto huge = f.Push(a, 1, 0, int64_t{1} << 40, {8});
  CHECK(huge.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(huge.error_message().find("numel=1099511627776 but layer 1 has " + std::to_string(f.numel(1))) !=
        std::string::npos);
  // An unknown worker claiming 2^34 floats: refused before any allocation.
  auto stranger = f.Push(77, 1, 0, int64_t{1} << 34, {8});
  CHECK(stranger.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(stranger.error_message().find("worker id 77") != std::string::npos);
  auto negative = f.Push(a, 1, 0, -5, {8});
  CHECK(negative.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(negative.error_message().find("numel=-5 but layer 1 has") != std::string::npos);
  f.HealthyStepStillWorks();
}

TEST_CASE("EPS API: a gradient pushed before any job exists is refused before allocation",
          "[integration][eps][bad_input]") {
  eps::EpsCore core(Daemon::MakeOpts(1, "grpc"));
  auto srv = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(srv.ok());
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*srv)->port()), grpc::InsecureChannelCredentials());
  auto stub = data::v1::Data::NewStub(channel);
  grpc::ClientContext ctx;
  data::v1::PushGradientReply rep;
  auto w = stub->PushGradient(&ctx, &rep);
  data::v1::GradientChunk c;
  c.set_worker_id(0);
  c.set_layer(0);
  c.set_numel(int64_t{1} << 34);
  c.set_micro_batches(1);
  c.set_data(std::string(8, '\0'));
  w->Write(c);
  w->WritesDone();
  const grpc::Status s = w->Finish();
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("no job") != std::string::npos);
  (*srv)->Shutdown();
  core.Stop();
}

TEST_CASE("EPS step summaries carry the learning rate of the job it runs", "[integration][eps]") {
  JobConfig job = TinyJob(DType::kF32);
  job.optim.lr = 0.0123f;
  job.optim.warmup_steps = 0;
  eps::CoreOptions o = Daemon::MakeOpts(1, "grpc");
  std::vector<double> lrs;
  o.on_step = [&lrs](const eps::StepSummary& s) { lrs.push_back(s.lr); };
  eps::EpsCore core(o);
  REQUIRE(core.CreateJob(job).ok());
  auto srv = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(srv.ok());
  auto c = Connect("127.0.0.1:" + std::to_string((*srv)->port()), "grpc");
  FakeStep(c.get(), 0, false, 2.0);
  FakeStep(c.get(), 1, false, 2.0);
  REQUIRE(lrs.size() == 2);
  CHECK(lrs[0] == Approx(LearningRate(job.optim, 0)));
  CHECK(lrs[1] == Approx(LearningRate(job.optim, 1)));
  CHECK(lrs[0] > 0.01);  // the job's 0.0123 schedule, not a default
  c.reset();
  (*srv)->Shutdown();
  core.Stop();
}

}  // namespace l2l

// A mixture-of-experts job on the real EPS (EpsCore + gRPC server on 127.0.0.1:0, in this
// process) driven by a scripted gRPC worker (worker/eps_client.h): ReportExperts travels
// over the wire and decides which experts the daemon updates (an expert nobody reported
// keeps its weights bit for bit although its pushed gradient is not zero); the per-expert
// step counts go into the checkpoint, and a daemon resumed from it (FromCheckpoint) holds
// them; bad reports are refused with codes.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "eps_server/job_start.h"
#include "tests/integration/eps_test_util.h"
#include "tests/testing/jobs.h"
#include "tests/testing/temp_dir.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

using namespace std::chrono_literals;

JobConfig MoeJob() {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 24}, {.lr = 1e-2f, .weight_decay = 0.1f});
  j.model.family = ModelFamily::kLlama;
  j.model.tied_embeddings = false;
  // Explicit: a checkpoint's job_yaml writes n_kv_heads' effective value, its model_spec
  // the stored one, and ReadCheckpointManifest compares them (0 would differ from 4).
  j.model.n_kv_heads = 2;
  j.model.num_experts = 4;
  j.model.experts_per_token = 1;
  j.publish_dtype = DType::kF32;
  REQUIRE(j.Validate().ok());
  return j;
}

eps::CoreOptions Opts(const std::string& state_dir) {
  eps::CoreOptions o;
  static int counter = 0;
  o.job_id = "moe" + std::to_string(getpid()) + "x" + std::to_string(counter++);
  o.expected_workers = 1;
  o.page_bytes = 8192;
  o.transport = Transport::kGrpc;
  o.state_dir = state_dir;
  return o;
}

struct Server {
  explicit Server(eps::EpsCore* core) {
    auto s = eps::EpsGrpcServer::Start(core, eps::ServerOptions{});
    REQUIRE(s.ok());
    server = std::move(s).value();
    address = "127.0.0.1:" + std::to_string(server->port());
  }
  ~Server() { server->Shutdown(); }
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::string address;
};

std::unique_ptr<worker::EpsClient> Connect(const std::string& address) {
  worker::ClientOptions o;
  o.transport = Transport::kGrpc;
  o.connect_timeout = 5000ms;
  auto c = worker::ConnectEps(address, o);
  REQUIRE(c.ok());
  return std::move(c).value();
}

std::vector<float> Master(eps::EpsCore& core, int64_t layer) {
  std::vector<float> m(core.store()->layout(layer).numel);
  REQUIRE(core.store()->ReadState(layer, 0, m.data()).ok());
  return m;
}

}  // namespace

TEST_CASE("EPS updates only reported experts, checkpoints their step counts and resumes with them",
          "[integration][eps][moe]") {
  auto tmp = testing::TempDir::Create("l2l-eps-moe");
  REQUIRE(tmp.ok());
  const JobConfig job = MoeJob();
  const int64_t L = job.model.NumLayers();
  // Step 0: block 0 experts 0, 1 and block 1 expert 3; step 1: block 0 expert 1.
  const std::vector<std::vector<uint8_t>> touched = {{1, 1, 0, 0, 0, 0, 0, 1}, {0, 1, 0, 0, 0, 0, 0, 0}};
  const std::vector<int64_t> counts = {1, 2, 0, 0, 0, 0, 0, 1};
  std::string ckpt;
  std::vector<std::vector<float>> trained;
  {
    eps::EpsCore core(Opts((*tmp)->path()));
    REQUIRE(core.CreateJob(job).ok());
    Server srv(&core);
    auto c = Connect(srv.address);
    const auto layouts = BuildLayout(job.model);
    const std::vector<float> block0_init = Master(core, 1);
    for (int64_t step = 0; step < 2; ++step) {
      CHECK(c->ReportExperts(step, std::vector<uint8_t>(3, 1)).code() == StatusCode::kInvalidArgument);
      REQUIRE(c->ReportExperts(step, touched[static_cast<size_t>(step)]).ok());
      for (int64_t l = L - 1; l >= 0; --l) {
        const auto g = epstest::Grad(step, 0, l, layouts[static_cast<size_t>(l)].numel);  // non-zero everywhere
        REQUIRE(c->PushGradient(l, step, 1, g.data(), g.size()).ok());
      }
      worker::StepReport r;
      r.step = step;
      r.loss = 1.0;
      r.tokens = 16;
      REQUIRE(c->StepDone(r).ok());
      REQUIRE(core.pipeline()->WaitForStep(step + 1, 30s));
    }
    CHECK(c->ReportExperts(0, touched[0]).code() == StatusCode::kFailedPrecondition);  // a committed step
    CHECK(core.pipeline()->expert_steps() == counts);
    // Block 0's experts 2 and 3 were never reported: bit-identical; expert 0 moved.
    const std::vector<float> block0 = Master(core, 1);
    const std::vector<ExpertRange> ranges = ExpertRanges(job.model, layouts[1]);
    for (size_t e : {size_t{2}, size_t{3}}) {
      CHECK(std::equal(block0.begin() + ranges[e].begin, block0.begin() + ranges[e].end,
                       block0_init.begin() + ranges[e].begin));
    }
    CHECK_FALSE(std::equal(block0.begin() + ranges[0].begin, block0.begin() + ranges[0].end,
                           block0_init.begin() + ranges[0].begin));
    auto ck = core.Checkpoint("");
    INFO(ck.status().ToString());
    REQUIRE(ck.ok());
    CHECK(ck->step == 2);
    ckpt = ck->dir;
    for (int64_t l = 0; l < L; ++l) trained.push_back(Master(core, l));
    c.reset();  // deregisters while the core runs
  }
  auto manifest = eps::ReadCheckpointManifest(ckpt);
  REQUIRE(manifest.ok());
  CHECK(manifest->meta.expert_steps == counts);
  eps::EpsCore resumed(Opts((*tmp)->path()));
  REQUIRE(resumed.CreateJob(job, eps::FromCheckpoint(std::move(manifest).value())).ok());
  CHECK(resumed.pipeline()->expert_steps() == counts);
  for (int64_t l = 0; l < L; ++l) CHECK(Master(resumed, l) == trained[static_cast<size_t>(l)]);
  resumed.Stop();
}

}  // namespace l2l

// gRPC FetchLayer on the wire (eps_server/grpc_server.cc sends hand-framed LayerChunk
// messages whose data points into the pinned published slot; worker/eps_client_grpc.cc
// reads them without protobuf's copies): the worker's client and the generated protobuf
// stub (what grpcurl or any other gRPC client uses) must both reassemble the published
// layer bit for bit, from chunks of at most 4 MiB that fit gRPC's default 4 MiB message
// limit (a client with default settings reads them). The oracle is the test's own copy of
// the initial weights (InitLayerParams, the seed's definition), cast to the publish
// dtype by common/dtype.h. And a client that stops reading mid-layer (its fetch keeps
// the slot pinned) is cancelled once the EPS declares its worker lost.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/model_spec.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/data.grpc.pb.h"
#include "tests/integration/eps_test_util.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

using namespace std::chrono_literals;

// One block of 3.1M parameters: 4 chunks in fp32, 2 in bf16.
JobConfig WideJob(DType dt) {
  JobConfig j = epstest::TinyJob(dt, 1);
  j.model.d_model = 512;
  j.model.n_head = 8;
  j.model.d_ff = 2048;
  j.model.n_layer = 1;
  return j;
}

// The published bytes of every layer at version 0, computed by the test.
std::vector<std::vector<char>> ExpectedBytes(const JobConfig& job) {
  std::vector<std::vector<char>> out;
  for (const LayerLayout& l : BuildLayout(job.model)) {
    std::vector<float> p(l.numel);
    InitLayerParams(job.model, l, job.train.seed, p.data());
    std::vector<char> b(l.numel * DTypeSize(job.publish_dtype));
    if (job.publish_dtype == DType::kBF16) {
      for (size_t i = 0; i < p.size(); ++i) {
        const uint16_t h = FloatToBf16(p[i]);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
    } else {
      std::memcpy(b.data(), p.data(), b.size());
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace

TEST_CASE("gRPC FetchLayer: the worker client and a generated protobuf stub get the published layer bit for bit",
          "[integration][eps][grpc]") {
  const DType dt = GENERATE(DType::kF32, DType::kBF16);
  const JobConfig job = WideJob(dt);
  const auto expect = ExpectedBytes(job);
  eps::CoreOptions o;
  o.job_id = "fetch" + std::to_string(getpid()) + (dt == DType::kF32 ? "f" : "b");
  o.expected_workers = 1;
  o.transport = l2l::Transport::kGrpc;
  eps::EpsCore core(o);
  REQUIRE(core.CreateJob(job).ok());
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  worker::ClientOptions co;
  co.transport = l2l::Transport::kGrpc;
  co.connect_timeout = 5000ms;
  auto client = worker::ConnectEps(address, co);
  REQUIRE(client.ok());
  worker::EpsClient* c = client->get();
  const int64_t L = job.model.NumLayers();
  REQUIRE(expect[1].size() > (size_t{4} << 20));  // the block spans several chunks

  SECTION("the worker's client, twice over (the second fetches reuse released buffers)") {
    for (int round = 0; round < 2; ++round) {
      for (int64_t l = L - 1; l >= 0; --l) {
        auto w = c->AcquireLayer(l, 0, 10s);
        REQUIRE(w.ok());
        CHECK(w->version == 0);
        CHECK(w->dtype == dt);
        REQUIRE(w->numel * DTypeSize(w->dtype) == expect[l].size());
        CHECK(std::memcmp(w->data, expect[l].data(), expect[l].size()) == 0);
        c->ReleaseLayer(l);
      }
    }
  }

  SECTION("the generated stub with gRPC's default limits (as grpcurl) parses every chunk as a LayerChunk") {
    auto stub = data::v1::Data::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    for (int64_t l = 0; l < L; ++l) {
      grpc::ClientContext ctx;
      data::v1::FetchLayerRequest req;
      req.set_worker_id(c->registration().worker_id);
      req.set_layer(l);
      auto r = stub->FetchLayer(&ctx, req);
      data::v1::LayerChunk chunk;
      std::vector<char> got;
      int chunks = 0;
      while (r->Read(&chunk)) {
        ++chunks;
        CHECK(chunk.layer() == l);
        CHECK(chunk.version() == 0);
        CHECK(chunk.dtype() == (dt == DType::kBF16 ? data::v1::DTYPE_BF16 : data::v1::DTYPE_F32));
        CHECK(static_cast<size_t>(chunk.numel()) * DTypeSize(dt) == expect[l].size());
        CHECK(chunk.data().size() <= eps::kMaxChunkBytes);
        REQUIRE(static_cast<size_t>(chunk.offset()) == got.size());  // in order, no gaps
        got.insert(got.end(), chunk.data().begin(), chunk.data().end());
      }
      const grpc::Status st = r->Finish();
      INFO(st.error_message());
      REQUIRE(st.ok());
      CHECK(chunks >= static_cast<int>((expect[l].size() + eps::kMaxChunkBytes - 1) / eps::kMaxChunkBytes));
      CHECK(got == expect[l]);
    }
  }
  client->reset();
  (*server)->Shutdown();
  core.Stop();
}

TEST_CASE("gRPC FetchLayer: a client that stops reading is cancelled once the EPS declares its worker lost",
          "[integration][eps][grpc]") {
  // The fetch pins the layer's published slot until its bytes are in the socket; a
  // client that stops reading must not keep it pinned (that would stall the layer's
  // publish of version+2) for longer than the EPS takes to drop the worker.
  JobConfig job = WideJob(DType::kF32);
  job.model.d_model = 1024;  // a 50 MB block: more than gRPC and the sockets buffer
  job.model.n_head = 16;
  job.model.d_ff = 4096;
  eps::CoreOptions o;
  o.job_id = "stall" + std::to_string(getpid());
  o.expected_workers = 1;
  o.transport = l2l::Transport::kGrpc;
  o.heartbeat_timeout_ms = 300;
  eps::EpsCore core(o);
  REQUIRE(core.CreateJob(job).ok());
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  REQUIRE(server.ok());
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  auto stub = data::v1::Data::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  data::v1::RegisterReply reg;
  {
    grpc::ClientContext ctx;
    data::v1::RegisterRequest req;
    req.set_transport("grpc");
    REQUIRE(stub->Register(&ctx, req, &reg).ok());  // and no heartbeats from here on
  }
  const size_t total = BuildLayout(job.model)[1].numel * sizeof(float);
  const auto t0 = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  data::v1::FetchLayerRequest req;
  req.set_worker_id(reg.worker_id());
  req.set_layer(1);
  auto r = stub->FetchLayer(&ctx, req);
  data::v1::LayerChunk chunk;
  REQUIRE(r->Read(&chunk));  // the fetch started (and pinned the slot)
  size_t got = chunk.data().size();
  std::this_thread::sleep_for(3s);  // lost after 0.3 s; the server checks every second
  while (r->Read(&chunk)) got += chunk.data().size();
  const grpc::Status st = r->Finish();
  INFO("received " << got << " of " << total << " bytes; " << st.error_message());
  CHECK(st.error_code() == grpc::StatusCode::CANCELLED);
  CHECK(got < total);
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
  (*server)->Shutdown();
  core.Stop();
}

}  // namespace l2l

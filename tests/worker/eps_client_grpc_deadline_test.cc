// The gRPC client's PushGradient deadline against a fake Data service on 127.0.0.1 whose
// PushGradient never reads the stream nor answers (a hung daemon whose connection stays
// up, so keepalive sees nothing wrong): the push must fail with DEADLINE_EXCEEDED within
// PushGradientDeadline (floor + bytes at the minimum rate) and name the layer and step;
// without a deadline it would wait forever (the test gives up after 20 s and says so).
// Also PushGradientDeadline's arithmetic, and that the push succeeds (under the default
// deadline) when the daemon reads it.
//
// Thread-safety: the fake service's handlers run on gRPC's threads; its flags are atomic.
#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "proto/data.grpc.pb.h"
#include "tests/testing/jobs.h"
#include "worker/eps_client.h"

namespace l2l {
namespace {

namespace data = ::l2l::data::v1;
using namespace std::chrono_literals;

// Registers every worker as worker 0 of 1 (transport grpc) with a tiny GPT job; Heartbeat
// and Deregister succeed; PushGradient either drains the stream and answers (stall false)
// or holds the call without reading until the client gives up (stall true).
class FakeData final : public data::Data::Service {
 public:
  std::atomic<bool> stall{true};
  std::atomic<int> pushes_seen{0};

  grpc::Status Register(grpc::ServerContext*, const data::RegisterRequest*, data::RegisterReply* rep) override {
    rep->set_worker_id(0);
    rep->set_num_workers(1);
    rep->set_job_yaml(JobConfigToYaml(testing::GptJob(testing::kTinyGpt)));
    rep->set_data_rank(0);
    rep->set_data_world(1);
    rep->set_transport("grpc");
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const data::HeartbeatRequest*, data::HeartbeatReply*) override {
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const data::DeregisterRequest*, data::DeregisterReply*) override {
    return grpc::Status::OK;
  }
  grpc::Status PushGradient(grpc::ServerContext* ctx, grpc::ServerReader<data::GradientChunk>* reader,
                            data::PushGradientReply* rep) override {
    pushes_seen.fetch_add(1);
    if (stall.load()) {
      // Hung: neither reads nor answers; ends only when the client cancels (its deadline)
      // or the server shuts down.
      while (!ctx->IsCancelled()) std::this_thread::sleep_for(5ms);
      return grpc::Status(grpc::StatusCode::CANCELLED, "client gave up");
    }
    data::GradientChunk c;
    int64_t bytes = 0;
    while (reader->Read(&c)) bytes += static_cast<int64_t>(c.data().size());
    rep->set_bytes_received(bytes);
    return grpc::Status::OK;
  }
};

struct FakeDaemon {
  FakeDaemon() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    b.SetMaxReceiveMessageSize(16 << 20);  // the client's 4 MiB chunks plus their headers
    server = b.BuildAndStart();
    REQUIRE(server != nullptr);
    REQUIRE(port > 0);
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeDaemon() { server->Shutdown(std::chrono::system_clock::now() + 1s); }
  FakeData service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST_CASE("PushGradientDeadline is the floor plus the bytes at the minimum rate", "[worker][grpc]") {
  worker::ClientOptions o;
  CHECK(worker::PushGradientDeadline(o, 0) == 60s);  // the defaults: 60 s + 1 s per 8 MiB
  CHECK(worker::PushGradientDeadline(o, size_t{8} << 20) == 61s);
  CHECK(worker::PushGradientDeadline(o, size_t{800} << 20) == 160s);
  o.push_deadline_floor = 250ms;
  o.push_min_bytes_per_s = 1e6;
  CHECK(worker::PushGradientDeadline(o, 1000) == 251ms);
  CHECK(worker::PushGradientDeadline(o, 1001) == 252ms);  // rounded up to whole ms
  o.push_min_bytes_per_s = 0;  // no rate: the floor alone
  CHECK(worker::PushGradientDeadline(o, size_t{1} << 30) == 250ms);
}

TEST_CASE("A gRPC gradient push to a daemon that stops reading fails with DEADLINE_EXCEEDED naming layer and step",
          "[worker][grpc]") {
  FakeDaemon d;
  worker::ClientOptions o;
  o.transport = Transport::kGrpc;
  o.connect_timeout = 5s;
  o.push_deadline_floor = 300ms;
  o.push_min_bytes_per_s = 64.0 * 1024 * 1024;
  auto c = worker::ConnectEps(d.address, o);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  worker::EpsClient& client = **c;
  // 16 MiB: more than gRPC's flow-control windows, so the client blocks in Write (not only
  // in Finish) once the daemon stops reading.
  const std::vector<float> grad(size_t{4} << 20, 0.5f);
  const auto bound = worker::PushGradientDeadline(o, grad.size() * sizeof(float));
  REQUIRE(bound == 550ms);

  SECTION("the daemon hangs: the push fails within the bound") {
    const auto t0 = std::chrono::steady_clock::now();
    auto push = std::async(std::launch::async,
                           [&] { return client.PushGradient(3, 7, 2, grad.data(), grad.size()); });
    if (push.wait_for(20s) != std::future_status::ready) {
      // Without a deadline the push never returns: say so, then free it by shutting the
      // server down (the call fails) so the test process can end.
      d.server->Shutdown(std::chrono::system_clock::now());
      push.wait();
      FAIL("PushGradient to a daemon that stopped reading did not return within 20 s (no deadline)");
    }
    const Status st = push.get();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(st.ToString() << " after " << secs << " s");
    CHECK(d.service.pushes_seen.load() == 1);
    REQUIRE(st.code() == StatusCode::kDeadlineExceeded);
    CHECK(secs >= 0.5);  // not before the deadline (550 ms, less scheduling slack)
    CHECK(secs < 5.0);   // and not long after it
    CHECK(st.message().find("PushGradient(layer 3, step 7)") != std::string::npos);
    CHECK(st.message().find("within 550 ms") != std::string::npos);
    CHECK(st.message().find(d.address) != std::string::npos);
    CHECK_FALSE(worker::NeedsRejoin(st));  // a hung daemon is an error, not a rejoin
  }

  SECTION("a daemon that reads takes the same push under the default deadline") {
    d.service.stall = false;
    worker::ClientOptions defaults;
    defaults.transport = Transport::kGrpc;
    auto c2 = worker::ConnectEps(d.address, defaults);
    REQUIRE(c2.ok());
    const Status st = (*c2)->PushGradient(3, 7, 2, grad.data(), grad.size());
    INFO(st.ToString());
    CHECK(st.ok());
    CHECK(d.service.pushes_seen.load() == 1);
  }
}

}  // namespace
}  // namespace l2l

// libFuzzer target: the daemon's RPC handlers (eps_server/grpc_server.cc over EpsCore)
// fed decoded protobufs. An in-process daemon (EpsCore + EpsGrpcServer on 127.0.0.1, a
// tiny 2-worker job, one worker registered over gRPC transport) serves every input
// through a real channel, so the bytes go through the same protobuf decoding and
// handlers as a remote worker's. Input layout: byte 0 picks the rpc, the rest is the
// serialized request:
//   0 Register, 1 Heartbeat, 2 FetchLayer, 4 StepDone, 5 Deregister: one request;
//   3 PushGradient: GradientChunk messages, each preceded by its length (u16 LE);
//   6 CreateJob: against a second daemon with no job (replaced once a job was created).
// FetchLayer's timeout_ms is clamped to 1..5 ms so that an unreachable version costs
// nothing; every call has a 5 s deadline. The daemon's state carries over between inputs
// (workers join and leave, steps advance) as it would in a real daemon.
//
// Ownership: the daemons live for the whole process (static). Thread-safety: libFuzzer's
// single input thread; the daemons' own threads are theirs.
#include <google/protobuf/stubs/common.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <unistd.h>

#include "common/config.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/control.grpc.pb.h"
#include "proto/data.grpc.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace data = ::l2l::data::v1;
namespace control = ::l2l::control::v1;
using l2l::eps::CoreOptions;
using l2l::eps::EpsCore;
using l2l::eps::EpsGrpcServer;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "rpc_fuzz setup: %s\n", what.c_str());
  std::abort();
}

// The job every input talks to: as the integration tests' tiny job.
l2l::JobConfig TinyJob() {
  l2l::JobConfig j;
  j.model.vocab_size = 64;
  j.model.seq_len = 16;
  j.model.d_model = 32;
  j.model.n_layer = 2;
  j.model.n_head = 4;
  j.model.d_ff = 128;
  j.train.steps = 1000000;
  return j;
}

struct Daemon {
  std::unique_ptr<EpsCore> core;
  std::unique_ptr<EpsGrpcServer> server;
  std::unique_ptr<data::Data::Stub> data;
  std::unique_ptr<control::Control::Stub> control;

  static std::unique_ptr<Daemon> Start(bool with_job) {
    auto d = std::make_unique<Daemon>();
    CoreOptions o;
    static int serial = 0;  // shm segment names are per job id: one per daemon
    o.job_id = "fuzz" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
    o.expected_workers = 2;
    o.transport = l2l::Transport::kGrpc;
    o.host_bytes = size_t{256} << 20;  // a fuzzed CreateJob's model must fit this
    o.state_dir = l2l::fuzz::ScratchDir();
    d->core = std::make_unique<EpsCore>(o);
    if (with_job) {
      if (auto s = d->core->CreateJob(TinyJob()); !s.ok()) Die("CreateJob: " + s.ToString());
      l2l::eps::RegisterInfo w;
      w.name = "fuzz-worker-0";
      w.transport = l2l::Transport::kGrpc;
      if (auto r = d->core->Register(w); !r.ok()) Die("Register: " + r.status().ToString());
    }
    l2l::eps::ServerOptions so;
    so.listen = "127.0.0.1:0";
    auto srv = EpsGrpcServer::Start(d->core.get(), so);
    if (!srv.ok()) Die("server: " + srv.status().ToString());
    d->server = std::move(*srv);
    auto ch = grpc::CreateChannel("127.0.0.1:" + std::to_string(d->server->port()),
                                  grpc::InsecureChannelCredentials());
    d->data = data::Data::NewStub(ch);
    d->control = control::Control::NewStub(ch);
    return d;
  }
  ~Daemon() {
    if (server) server->Shutdown();
    if (core) core->Stop();
  }
};

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

template <typename Req>
bool Parse(const uint8_t* p, size_t n, Req* req) {
  return req->ParseFromArray(p, static_cast<int>(n));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* in, size_t size) {
  l2l::fuzz::QuietLogs();
  // protobuf logs every string field that is not UTF-8: fuzzed input, not news.
  static const bool silenced = (google::protobuf::SetLogHandler(nullptr), true);
  (void)silenced;
  static std::unique_ptr<Daemon> job_daemon = Daemon::Start(true);
  static std::unique_ptr<Daemon> empty_daemon = Daemon::Start(false);
  if (size < 1) return 0;
  const uint8_t* p = in + 1;
  const size_t n = size - 1;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  switch (in[0] % 7) {
    case 0: {
      data::RegisterRequest req;
      data::RegisterReply rep;
      if (Parse(p, n, &req)) (void)job_daemon->data->Register(&ctx, req, &rep);
      break;
    }
    case 1: {
      data::HeartbeatRequest req;
      data::HeartbeatReply rep;
      if (Parse(p, n, &req)) (void)job_daemon->data->Heartbeat(&ctx, req, &rep);
      break;
    }
    case 2: {
      data::FetchLayerRequest req;
      if (!Parse(p, n, &req)) break;
      req.set_timeout_ms(1 + (req.timeout_ms() < 0 ? -(req.timeout_ms() + 1) : req.timeout_ms()) % 5);
      auto reader = job_daemon->data->FetchLayer(&ctx, req);
      data::LayerChunk chunk;
      while (reader->Read(&chunk)) {
      }
      (void)reader->Finish();
      break;
    }
    case 3: {
      data::PushGradientReply rep;
      auto writer = job_daemon->data->PushGradient(&ctx, &rep);
      size_t off = 0;
      while (off + 2 <= n) {
        const size_t len = p[off] | (size_t{p[off + 1]} << 8);
        off += 2;
        if (len > n - off) break;
        data::GradientChunk c;
        if (!Parse(p + off, len, &c)) break;
        off += len;
        if (!writer->Write(c)) break;
      }
      writer->WritesDone();
      (void)writer->Finish();
      break;
    }
    case 4: {
      data::StepDoneRequest req;
      data::StepDoneReply rep;
      if (Parse(p, n, &req)) (void)job_daemon->data->StepDone(&ctx, req, &rep);
      break;
    }
    case 5: {
      data::DeregisterRequest req;
      data::DeregisterReply rep;
      if (Parse(p, n, &req)) (void)job_daemon->data->Deregister(&ctx, req, &rep);
      break;
    }
    case 6: {
      control::CreateJobRequest req;
      control::CreateJobReply rep;
      if (!Parse(p, n, &req)) break;
      const grpc::Status s = empty_daemon->control->CreateJob(&ctx, req, &rep);
      if (s.ok()) empty_daemon = Daemon::Start(false);  // a job exists now: start afresh
      break;
    }
  }
  return 0;
}

// InProcessEps: an EpsCore with one job and its gRPC server on 127.0.0.1 (any free
// port), inside the test process, for tests that run a worker's relay against a real EPS
// without spawning l2l-eps. Header-only: only test binaries that link l2l_eps include it
// (tests/testing's library does not depend on eps_server/).
//
// Ownership: owns the core and the server; the destructor stops both. Thread-safety:
// construct and destroy on one thread; `core` and `address` are what the test uses.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <memory>
#include <string>

#include "common/config.h"
#include "common/logging.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"

namespace l2l::testing {

struct InProcessEps {
  // `id_prefix` names the job (plus the pid and a counter, so runs never share /dev/shm
  // segments); page_bytes 0 keeps CoreOptions' default. One expected worker.
  explicit InProcessEps(const JobConfig& job, const std::string& id_prefix, size_t page_bytes = 0)
      : core(MakeOpts(id_prefix, page_bytes)) {
    const Status st = core.CreateJob(job);
    L2L_CHECK(st.ok()) << st.ToString();
    auto s = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
    L2L_CHECK(s.ok()) << s.status().ToString();
    server = std::move(s).value();
    address = "127.0.0.1:" + std::to_string(server->port());
  }
  ~InProcessEps() {
    server->Shutdown();
    core.Stop();
  }
  InProcessEps(const InProcessEps&) = delete;
  InProcessEps& operator=(const InProcessEps&) = delete;

  static eps::CoreOptions MakeOpts(const std::string& id_prefix, size_t page_bytes) {
    eps::CoreOptions o;
    static int counter = 0;
    o.job_id = id_prefix + std::to_string(getpid()) + "x" + std::to_string(counter++);
    o.expected_workers = 1;
    if (page_bytes != 0) o.page_bytes = page_bytes;
    o.transport = l2l::Transport::kAuto;
    return o;
  }

  eps::EpsCore core;
  std::unique_ptr<eps::EpsGrpcServer> server;
  std::string address;
};

}  // namespace l2l::testing

// EpsGrpcServer: the gRPC face of the EPS. Serves l2l.data.v1.Data (workers) and
// l2l.control.v1.Control (operators) over one listening port, plus the standard
// grpc.health.v1 health service and server reflection. The only place where protobuf
// types meet EpsCore; l2l::Status <-> grpc::Status conversion lives here.
//
// Ownership: borrows the EpsCore (must outlive the server); owns the grpc::Server.
// Thread-safety: gRPC's thread pool calls the services concurrently; EpsCore is
// thread-safe. Shutdown/Wait may be called from any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "eps_server/eps_core.h"
#include "eps_server/server_security.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace l2l::eps {

inline constexpr size_t kMaxChunkBytes = size_t{4} << 20;  // data bytes per stream message

struct ServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 = any free port
  // TLS (mutual with a client CA) and/or the bearer token (eps_server/server_security.h).
  // A non-loopback `listen` without client authentication (token or mutual TLS) is
  // refused unless security.insecure.
  ServerSecurity security;
  // Shard 0 of a sharded job: serve l2l.shard.v1.Shards for the other shards (borrowed).
  ShardHub* shard_hub = nullptr;
};

class EpsGrpcServer {
 public:
  static Result<std::unique_ptr<EpsGrpcServer>> Start(EpsCore* core, const ServerOptions& opts);
  ~EpsGrpcServer();

  int port() const { return port_; }
  // Blocks until a Shutdown rpc arrived (or RequestShutdown was called).
  void WaitForShutdownRequest();
  // prepared: the final checkpoint was already written (by the Shutdown rpc).
  void RequestShutdown(bool abort_step, bool skip_checkpoint, bool prepared = false);
  bool skip_checkpoint() const EXCLUDES(mu_) {
    std::lock_guard<std::mutex> lock(mu_);
    return skip_checkpoint_;
  }
  bool abort_step() const EXCLUDES(mu_) {
    std::lock_guard<std::mutex> lock(mu_);
    return abort_step_;
  }
  bool prepared() const EXCLUDES(mu_) {
    std::lock_guard<std::mutex> lock(mu_);
    return prepared_;
  }
  // After a failed final checkpoint the daemon keeps serving: forget the request.
  void ClearShutdownRequest();
  // Runs before a Shutdown rpc returns (the final checkpoint): an error goes back to the
  // caller (l2lctl stop exits non-zero with it) and the daemon does not stop. Unset: the
  // rpc only requests the shutdown. Set before clients can call.
  void set_prepare_shutdown(std::function<Status(bool abort_step, bool skip_checkpoint)> f) {
    prepare_shutdown_ = std::move(f);
  }
  const std::function<Status(bool, bool)>& prepare_shutdown() const { return prepare_shutdown_; }
  // Stops accepting calls and finishes running ones (bounded by a deadline).
  void Shutdown();

 private:
  EpsGrpcServer() = default;
  std::unique_ptr<grpc::Service> data_, control_, shards_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool shutdown_requested_ GUARDED_BY(mu_) = false;
  bool skip_checkpoint_ GUARDED_BY(mu_) = false;
  bool abort_step_ GUARDED_BY(mu_) = false;
  bool prepared_ GUARDED_BY(mu_) = false;
  bool shut_down_ = false;
  std::function<Status(bool, bool)> prepare_shutdown_;
};

}  // namespace l2l::eps

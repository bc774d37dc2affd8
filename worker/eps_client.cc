// ConnectEps: registers over gRPC and returns the client for the transport the EPS
// chose (shm on the same host unless options.transport says grpc). See eps_client.h.
#include "worker/eps_client.h"

#include <cmath>

#include "worker/eps_client_grpc.h"
#include "worker/eps_client_sharded.h"
#include "worker/eps_client_shm.h"

namespace l2l::worker {

bool NeedsRejoin(const Status& s) { return s.rejoin_reason() != RejoinReason::kNone; }

std::chrono::milliseconds PushGradientDeadline(const ClientOptions& options, size_t bytes) {
  const double rate = options.push_min_bytes_per_s;
  const double transfer_ms = rate > 0 ? std::ceil(1000.0 * static_cast<double>(bytes) / rate) : 0.0;
  return options.push_deadline_floor + std::chrono::milliseconds(static_cast<int64_t>(transfer_ms));
}

// One daemon (a shard's, or the only one).
Result<std::unique_ptr<EpsClient>> ConnectEpsOne(const std::string& address, const ClientOptions& options) {
  WorkerRegistration reg;
  GrpcEpsClient::ShmInfo shm;
  L2L_ASSIGN_OR_RETURN(auto impl, GrpcEpsClient::Connect(address, options, &reg, &shm));
  if (reg.transport == Transport::kShm) {
    L2L_ASSIGN_OR_RETURN(auto c, ShmEpsClient::Create(std::move(impl), reg, options, shm));
    return std::unique_ptr<EpsClient>(std::move(c));
  }
  return std::unique_ptr<EpsClient>(std::make_unique<GrpcEpsClient>(std::move(impl), reg, options));
}

Result<std::unique_ptr<EpsClient>> ConnectEps(const std::string& address, const ClientOptions& options) {
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<EpsClient> c, ConnectEpsOne(address, options));
  if (c->registration().shards.empty()) return c;
  return ShardedEpsClient::Create(std::move(c), options);
}

}  // namespace l2l::worker

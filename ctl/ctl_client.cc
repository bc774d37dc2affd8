// CtlClient: Control-service client (the only place it meets protobuf). See ctl_client.h.
#include "ctl/ctl_client.h"

#include <grpcpp/grpcpp.h>

#include "proto/client_channel.h"
#include "proto/control.grpc.pb.h"

namespace l2l::eps {
namespace {

namespace pb = l2l::control::v1;

// grpc::Status -> Status, naming the rpc and the address.
Status FromGrpc(const grpc::Status& s, const std::string& rpc, const std::string& address) {
  if (s.ok()) return Status::Ok();
  const std::string msg = rpc + " on " + address + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: return InvalidArgument(msg);
    case grpc::StatusCode::NOT_FOUND: return NotFound(msg);
    case grpc::StatusCode::ALREADY_EXISTS: return AlreadyExists(msg);
    case grpc::StatusCode::FAILED_PRECONDITION: return FailedPrecondition(msg);
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return ResourceExhausted(msg);
    case grpc::StatusCode::UNAVAILABLE: return Unavailable(msg);
    case grpc::StatusCode::DATA_LOSS: return DataLoss(msg);
    case grpc::StatusCode::UNIMPLEMENTED: return Unimplemented(msg);
    case grpc::StatusCode::ABORTED: return Aborted(msg);
    case grpc::StatusCode::PERMISSION_DENIED: return PermissionDenied(msg);
    case grpc::StatusCode::UNAUTHENTICATED:
      return PermissionDenied("the daemon at " + address +
                              " requires a token: pass --token-file FILE (or set $L2L_TOKEN_FILE) holding the "
                              "token of its --token-file (" + msg + ")");
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Status(StatusCode::kDeadlineExceeded, msg);
    default: return Internal(msg);
  }
}

}  // namespace

struct CtlClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Control::Stub> stub;
};

CtlClient::CtlClient(std::string address, CtlClientOptions options, std::unique_ptr<Impl> impl)
    : address_(std::move(address)), opts_(options), impl_(std::move(impl)) {}

CtlClient::~CtlClient() = default;

Result<std::unique_ptr<CtlClient>> CtlClient::Connect(const std::string& address,
                                                      const CtlClientOptions& options) {
  if (address.empty() || address.find(':') == std::string::npos) {
    return InvalidArgument("daemon address '" + address + "' is not host:port");
  }
  auto impl = std::make_unique<Impl>();
  grpc::ChannelArguments args;
  // Fail fast instead of backing off for a minute while the daemon is down.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = MakeEpsChannel(address, options.tls_ca_pem, options.token, args,  // proto/client_channel.h
                                 options.tls_server_name, options.tls_cert_pem, options.tls_key_pem);
  if (!impl->channel->WaitForConnected(std::chrono::system_clock::now() + options.connect_timeout)) {
    return Unavailable("cannot reach l2l-eps at " + address + " within " +
                       std::to_string(options.connect_timeout.count()) + " ms" +
                       (options.tls_ca_pem.empty() ? "" : " (TLS: is the daemon's certificate signed by --tls-ca "
                                                          "and valid for this host?)") +
                       ClientCertificateHint(!options.tls_ca_pem.empty(), !options.tls_cert_pem.empty()));
  }
  impl->stub = pb::Control::NewStub(impl->channel);
  return std::unique_ptr<CtlClient>(new CtlClient(address, options, std::move(impl)));
}

namespace {
void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds t) {
  ctx->set_deadline(std::chrono::system_clock::now() + t);
}
}  // namespace

Result<CtlHealth> CtlClient::Health() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.rpc_timeout);
  pb::HealthRequest req;
  pb::HealthReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(impl_->stub->Health(&ctx, req, &rep), "Health", address_));
  return CtlHealth{rep.state(), rep.uptime_ms()};
}

Result<CtlStatus> CtlClient::GetStatus() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.rpc_timeout);
  pb::GetStatusRequest req;
  pb::GetStatusReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(impl_->stub->GetStatus(&ctx, req, &rep), "GetStatus", address_));
  CtlStatus s;
  s.state = rep.state();
  s.job_id = rep.job_id();
  s.step = rep.step();
  s.total_steps = rep.total_steps();
  s.num_params = rep.num_params();
  s.layer_version.assign(rep.layer_version().begin(), rep.layer_version().end());
  s.last_loss = rep.last_loss();
  s.val_loss = rep.val_loss();
  s.val_step = rep.val_step();
  s.shard = rep.shard();
  s.shards = rep.shards() > 0 ? rep.shards() : 1;
  s.first_layer = rep.first_layer();
  for (const auto& m : rep.shard_map()) s.shard_map.push_back({m.index(), m.address(), {m.first_layer(), m.num_layers()}});
  s.tokens_per_s = rep.tokens_per_s();
  s.step_time_s = rep.step_time_s();
  s.update_busy_s = rep.update_busy_s();
  s.update_exposed_s = rep.update_exposed_s();
  s.last_checkpoint = rep.last_checkpoint();
  for (const auto& m : rep.memory()) s.memory.push_back({m.tier(), m.used_bytes(), m.budget_bytes()});
  s.error = rep.error();
  s.has_spill = rep.has_spill();
  s.spill_bytes_read = rep.spill().bytes_read();
  s.spill_bytes_written = rep.spill().bytes_written();
  s.lease_hits = rep.spill().lease_hits();
  s.lease_misses = rep.spill().lease_misses();
  s.lease_wait_s = rep.spill().lease_wait_s();
  s.staleness_bound = rep.staleness_bound();
  s.max_version_lag = rep.max_version_lag();
  s.skipped_steps = rep.skipped_steps();
  s.consecutive_skips = rep.consecutive_skips();
  s.last_skip_reason = rep.last_skip_reason();
  s.pause_reason = rep.pause_reason();
  for (const auto& w : rep.workers()) {
    s.workers.push_back({w.worker_id(), w.name(), w.transport(), w.state(), w.step(),
                         w.last_heartbeat_ms_ago(), w.last_loss()});
  }
  return s;
}

Status CtlClient::Pause() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.rpc_timeout);
  pb::PauseRequest req;
  pb::PauseReply rep;
  return FromGrpc(impl_->stub->Pause(&ctx, req, &rep), "Pause", address_);
}

Status CtlClient::Resume() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.rpc_timeout);
  pb::ResumeRequest req;
  pb::ResumeReply rep;
  return FromGrpc(impl_->stub->Resume(&ctx, req, &rep), "Resume", address_);
}

Result<CtlWritten> CtlClient::Checkpoint(const std::string& dir) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.write_timeout);
  pb::CheckpointRequest req;
  req.set_dir(dir);
  pb::CheckpointReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(impl_->stub->Checkpoint(&ctx, req, &rep), "Checkpoint", address_));
  return CtlWritten{rep.dir(), rep.step(), rep.bytes()};
}

Result<CtlWritten> CtlClient::Export(const std::string& path) { return Export(path, "", ""); }

Result<CtlWritten> CtlClient::Export(const std::string& path, const std::string& format, const std::string& dtype,
                                     int64_t max_shard_bytes, bool merge) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.write_timeout);
  pb::ExportRequest req;
  req.set_path(path);
  req.set_format(format);
  req.set_dtype(dtype);
  req.set_max_shard_bytes(max_shard_bytes);
  req.set_merge(merge);
  pb::ExportReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(impl_->stub->Export(&ctx, req, &rep), "Export", address_));
  return CtlWritten{rep.path(), 0, rep.bytes()};
}

Status CtlClient::Shutdown(bool abort_step, bool skip_checkpoint) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, opts_.write_timeout);  // a final checkpoint may run first
  pb::ShutdownRequest req;
  req.set_abort_step(abort_step);
  req.set_skip_checkpoint(skip_checkpoint);
  pb::ShutdownReply rep;
  const grpc::Status s = impl_->stub->Shutdown(&ctx, req, &rep);
  // The daemon may close the connection while exiting: that is the goal, not an error.
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::CANCELLED) {
    return Status::Ok();
  }
  return FromGrpc(s, "Shutdown", address_);
}

}  // namespace l2l::eps

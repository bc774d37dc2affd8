// EpsClient over gRPC. See eps_client_grpc.h.
#include "worker/eps_client_grpc.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "common/fault_point.h"
#include "common/logging.h"
#include "common/shm.h"
#include "proto/adamw_proto.h"
#include "proto/client_channel.h"
#include "proto/data.grpc.pb.h"
#include "worker/layer_chunk_reader.h"

namespace l2l::worker {
namespace {

namespace data = ::l2l::data::v1;
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr size_t kSpareBuffers = 4;  // released layer buffers kept for reuse

// The one place grpc::Status becomes l2l::Status.
Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  StatusCode c = StatusCode::kInternal;
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: c = StatusCode::kInvalidArgument; break;
    case grpc::StatusCode::NOT_FOUND: c = StatusCode::kNotFound; break;
    case grpc::StatusCode::ALREADY_EXISTS: c = StatusCode::kAlreadyExists; break;
    case grpc::StatusCode::OUT_OF_RANGE: c = StatusCode::kOutOfRange; break;
    case grpc::StatusCode::FAILED_PRECONDITION: c = StatusCode::kFailedPrecondition; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: c = StatusCode::kResourceExhausted; break;
    case grpc::StatusCode::UNAVAILABLE: c = StatusCode::kUnavailable; break;
    case grpc::StatusCode::DATA_LOSS: c = StatusCode::kDataLoss; break;
    case grpc::StatusCode::UNIMPLEMENTED: c = StatusCode::kUnimplemented; break;
    case grpc::StatusCode::ABORTED: c = StatusCode::kAborted; break;
    case grpc::StatusCode::CANCELLED: c = StatusCode::kAborted; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: c = StatusCode::kDeadlineExceeded; break;
    case grpc::StatusCode::PERMISSION_DENIED: c = StatusCode::kPermissionDenied; break;
    case grpc::StatusCode::UNAUTHENTICATED: c = StatusCode::kPermissionDenied; break;
    default: break;
  }
  Status out(c, what + ": " + s.error_message());
  data::RejoinDetail detail;
  if (!s.error_details().empty() && detail.ParseFromString(s.error_details()) &&
      detail.reason() != data::REJOIN_REASON_NONE) {
    out = out.WithRejoinReason(static_cast<RejoinReason>(detail.reason()));
  }
  return out;
}

}  // namespace

struct GrpcEpsClient::Impl {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<data::Data::Stub> stub;
};

Result<GrpcEpsClient::ImplPtr> GrpcEpsClient::Connect(const std::string& address,
                                                                    const ClientOptions& options,
                                                                    WorkerRegistration* reg, ShmInfo* shm) {
  ImplPtr impl(new Impl());
  impl->address = address;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(2 * kChunkBytes + 4096));
  args.SetMaxSendMessageSize(static_cast<int>(2 * kChunkBytes + 4096));
  // Keepalive: a daemon on another host that vanishes without closing the connection
  // (power loss, cut link) fails every call in flight within ~20 s instead of never.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A daemon restarted on the same address (a sharded job's shard: the workers wait for
  // it) is found within a second, not after gRPC's default backoff of up to 2 minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl->channel = MakeEpsChannel(address, options.tls_ca_pem, options.token, args,  // proto/client_channel.h
                                 options.tls_server_name, options.tls_cert_pem, options.tls_key_pem);
  impl->stub = data::Data::NewStub(impl->channel);
  L2L_RETURN_IF_ERROR(Register(impl.get(), options, -1, reg, shm));
  return impl;
}

Status GrpcEpsClient::Register(Impl* impl, const ClientOptions& options, int32_t previous_worker_id,
                               WorkerRegistration* reg, ShmInfo* shm) {
  const std::string& address = impl->address;
  data::RegisterRequest req;
  req.set_worker_name(options.worker_name);
  req.set_hostname(HostName());
  req.set_boot_id(BootId());
  req.set_transport(ToString(options.transport));
  req.set_pid(static_cast<int32_t>(getpid()));
  req.set_previous_worker_id(previous_worker_id);
  if (options.shard_worker_id >= 0) req.set_shard_worker_id(options.shard_worker_id);
  if (options.optimizer.takes_updates) {
    auto* o = req.mutable_optimizer();
    o->set_takes_updates(true);
    o->set_device(options.optimizer.device);
    o->set_update_params_per_s(options.optimizer.update_params_per_s);
    o->set_h2d_bytes_per_s(options.optimizer.h2d_bytes_per_s);
    o->set_d2h_bytes_per_s(options.optimizer.d2h_bytes_per_s);
  }
  const auto deadline = std::chrono::system_clock::now() + options.connect_timeout;
  data::RegisterReply rep;
  grpc::Status st, full;  // full: the last "job full" refusal, if any
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    ctx.set_wait_for_ready(true);  // bounded retry while the EPS is not up yet
    st = impl->stub->Register(&ctx, req, &rep);
    // UNAVAILABLE: the EPS is not up yet (or, sharded, a shard still holds the id shard 0
    // gave this process as active until shard 0's rollback reaches it). RESOURCE_EXHAUSTED:
    // the job has all its workers; one may be declared lost (heartbeat timeout) or leave
    // meanwhile, and then this process takes its place. Both are retried until the
    // connect timeout.
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) full = st;
    const bool retry = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    if (st.ok() || !retry || std::chrono::system_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(st.error_code() == grpc::StatusCode::UNAVAILABLE ? 100 : 250));
  }
  if (!st.ok() && !full.ok() &&
      (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
       st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
    return ResourceExhausted("the job at " + address + " stayed full for " +
                             std::to_string(options.connect_timeout.count()) + " ms: " + full.error_message() +
                             " (a replacement for a killed worker gets its place once the daemon declares it "
                             "lost: raise --connect-timeout-ms above the daemon's heartbeat timeout)");
  }
  if (!st.ok()) {
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || st.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return Unavailable("EPS at " + address + " unreachable for " +
                         std::to_string(options.connect_timeout.count()) + " ms: " + st.error_message() +
                         (options.tls_ca_pem.empty() ? " (if the EPS serves TLS, pass --tls-ca CA.pem)" : "") +
                         ClientCertificateHint(!options.tls_ca_pem.empty(), !options.tls_cert_pem.empty()));
    }
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return PermissionDenied("the daemon at " + address +
                              " requires a token: pass --token-file FILE (or set $L2L_TOKEN_FILE) holding the "
                              "token of its --token-file (" + st.error_message() + ")");
    }
    return FromGrpc(st, "Register with EPS at " + address);
  }
  auto job = ParseJobConfig(rep.job_yaml(), "<Register reply from " + address + ">");
  if (!job.ok()) return job.status();
  if (previous_worker_id < 0) reg->worker_id = rep.worker_id();  // a rejoin keeps its id
  reg->num_workers = rep.num_workers();
  reg->job = *job;
  reg->start_step = rep.start_step();
  reg->registration_id = rep.registration_id();
  reg->data_rank = rep.data_rank();
  reg->data_world = rep.data_world();
  reg->data_position = rep.data_position();
  reg->data_roots.assign(rep.data_roots().begin(), rep.data_roots().end());
  reg->first_layer = rep.first_layer();
  reg->recovery_epoch = rep.recovery_epoch();
  reg->shards.clear();
  for (const auto& e : rep.shards()) {
    reg->shards.push_back({e.index(), e.address(), {e.first_layer(), e.num_layers()}});
  }
  Result<Transport> transport = ParseTransport(rep.transport());
  if (!transport.ok() || *transport == Transport::kAuto) {
    return Internal("Register reply from " + address + ": transport '" + rep.transport() + "' is not shm or grpc");
  }
  reg->transport = *transport;
  shm->weight_segment = rep.weight_segment();
  shm->gradient_segment = rep.gradient_segment();
  shm->layer_numel.assign(rep.layer_numel().begin(), rep.layer_numel().end());
  return Status::Ok();
}

Result<UpdateAssignment> GrpcEpsClient::TakeUpdate(std::chrono::milliseconds wait) {
  data::TakeUpdateRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.set_worker_id(reg_.worker_id);
  }
  req.set_wait_ms(wait.count());
  data::TakeUpdateReply rep;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + wait + std::chrono::seconds(30));
  L2L_RETURN_IF_ERROR(FromGrpc(impl_->stub->TakeUpdate(&ctx, req, &rep), "TakeUpdate"));
  UpdateAssignment a;
  a.has_task = rep.has_task();
  if (!a.has_task) return a;
  a.task_id = rep.task_id();
  a.layer = rep.layer();
  a.step = rep.step();
  a.numel = rep.numel();
  a.segment = rep.segment();
  a.p_offset = rep.p_offset();
  a.m_offset = rep.m_offset();
  a.v_offset = rep.v_offset();
  a.g_offset = rep.g_offset();
  // A daemon from before AdamWStep (its fields 11-17): no arguments to run the update with.
  if (!rep.has_adamw()) {
    return InvalidArgument("TakeUpdate: task " + std::to_string(a.task_id) +
                           " carries no AdamW arguments (a daemon of another version?)");
  }
  a.adamw = FromProto(rep.adamw());
  for (const auto& r : rep.ranges()) a.ranges.push_back({r.begin(), r.end(), r.decay()});
  return a;
}

Status GrpcEpsClient::UpdateDone(uint64_t task_id, int64_t layer, int64_t numel, const std::string& error) {
  data::UpdateDoneRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.set_worker_id(reg_.worker_id);
  }
  req.set_task_id(task_id);
  req.set_layer(layer);
  req.set_numel(numel);
  req.set_error(error);
  data::UpdateDoneReply rep;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return FromGrpc(impl_->stub->UpdateDone(&ctx, req, &rep), "UpdateDone(task " + std::to_string(task_id) + ")");
}

Status GrpcEpsClient::RegisterAgain(ShmInfo* shm) {
  std::lock_guard<std::mutex> lock(mu_);
  held_.clear();
  ClientOptions o = options_;
  o.transport = reg_.transport;  // keep the transport the worker runs with
  L2L_RETURN_IF_ERROR(Register(impl_.get(), o, reg_.worker_id, &reg_, shm));
  current_step_ = reg_.start_step;
  rejoin_requested_ = false;
  L2L_LOG_INFO("worker {} rejoined: restart at step {}", reg_.worker_id, reg_.start_step);
  return Status::Ok();
}

Status GrpcEpsClient::Rejoin() {
  ShmInfo shm;
  return RegisterAgain(&shm);
}

void GrpcEpsClient::ImplDeleter::operator()(Impl* p) const { delete p; }

GrpcEpsClient::GrpcEpsClient(ImplPtr impl, WorkerRegistration reg, const ClientOptions& options)
    : impl_(std::move(impl)), reg_(std::move(reg)), options_(options) {
  current_step_ = reg_.start_step;
  heartbeat_ = std::thread([this, iv = options.heartbeat_interval] { HeartbeatLoop(iv); });
}

GrpcEpsClient::~GrpcEpsClient() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  if (!deregistered_) Deregister().IgnoreError();
}

void GrpcEpsClient::HeartbeatLoop(std::chrono::milliseconds interval) {
  const auto tick = std::chrono::milliseconds(20);
  auto next = std::chrono::steady_clock::now() + interval;
  int64_t failures = 0;
  while (!stop_.load()) {
    std::this_thread::sleep_for(tick);
    if (std::chrono::steady_clock::now() < next) continue;
    next += interval;
    data::HeartbeatRequest req;
    req.set_worker_id(reg_.worker_id);
    req.set_step(current_step_.load());
    data::HeartbeatReply rep;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + interval * 2);
    grpc::Status st = impl_->stub->Heartbeat(&ctx, req, &rep);
    if (!st.ok()) {
      // Warn on the first failure of a run of them and every 10th after (not per tick).
      if (++failures == 1 || failures % 10 == 0) {
        L2L_LOG_WARN("heartbeat to {} failed ({} in a row): {}", impl_->address, failures, st.error_message());
      }
      // NOT_FOUND: the daemon does not know this worker (it restarted: a sharded job's
      // shard, which the worker registers with again).
      if (NeedsRejoin(FromGrpc(st, "Heartbeat")) || st.error_code() == grpc::StatusCode::NOT_FOUND) {
        rejoin_requested_ = true;
      }
    } else {
      if (failures > 0) L2L_LOG_INFO("heartbeat to {} works again after {} failures", impl_->address, failures);
      failures = 0;
      if (rep.rejoin()) rejoin_requested_ = true;
    }
  }
}

Result<LayerWeights> GrpcEpsClient::AcquireLayer(int64_t layer, int64_t min_version,
                                                 std::chrono::milliseconds timeout) {
  data::FetchLayerRequest req;
  req.set_worker_id(reg_.worker_id);
  req.set_layer(layer);
  req.set_min_version(min_version);
  req.set_timeout_ms(std::max<int64_t>(1, timeout.count()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(30));
  // The stream is read as raw messages (ReadLayerChunk: one copy, into buf) rather than
  // through the generated stub's LayerChunk (two: parse, then copy out).
  static const std::string method = std::string("/") + data::Data::service_full_name() + "/FetchLayer";
  const grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(impl_->channel.get(), rpc, &ctx, req));
  std::vector<char> buf;
  {
    std::lock_guard<std::mutex> lock(mu_);  // a released buffer, if any
    if (!spare_.empty()) {
      buf = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  LayerWeights w;
  size_t total = 0, received = 0;
  bool first = true;
  int64_t bad_offset = -1;
  grpc::ByteBuffer msg;
  while (reader->Read(&msg)) {
    auto place = [&](const data::LayerChunk& c, size_t n) -> char* {
      if (first) {
        first = false;
        w.dtype = c.dtype() == data::DTYPE_BF16 ? DType::kBF16 : DType::kF32;
        w.numel = static_cast<size_t>(c.numel());
        w.version = c.version();
        if (c.numel() < 0 || c.numel() > (int64_t{1} << 36)) return nullptr;
        if (c.frozen_bytes() < 0 || c.frozen_bytes() > (int64_t{1} << 36) || c.frozen_bytes() % 64 != 0) return nullptr;
        w.frozen_bytes = static_cast<size_t>(c.frozen_bytes());
        total = w.frozen_bytes + w.numel * DTypeSize(w.dtype);
        buf.resize(total);  // a reused buffer: no zero-fill, no page faults
      }
      if (static_cast<size_t>(c.frozen_bytes()) != w.frozen_bytes) return nullptr;
      if (c.version() != w.version || c.offset() < 0 || static_cast<size_t>(c.offset()) + n > total) return nullptr;
      received += n;
      return buf.data() + c.offset();
    };
    if (!ReadLayerChunk(&msg, place, &bad_offset)) {
      ctx.TryCancel();
      reader->Finish().IgnoreError();
      return DataLoss("FetchLayer(layer " + std::to_string(layer) + "): inconsistent or malformed chunk at offset " +
                      std::to_string(bad_offset));
    }
  }
  L2L_RETURN_IF_ERROR(FromGrpc(reader->Finish(), "FetchLayer(layer " + std::to_string(layer) + ")"));
  if (received != total) {
    return DataLoss("FetchLayer(layer " + std::to_string(layer) + "): the chunks held " + std::to_string(received) +
                    " bytes, the layer has " + std::to_string(total));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = held_[layer];
  slot = std::move(buf);
  // [frozen record][layer or trainable span]; the record's size is a multiple of 64.
  w.data = slot.data() + w.frozen_bytes;
  if (w.frozen_bytes > 0) w.frozen = slot.data();
  return w;
}

void GrpcEpsClient::ReleaseLayer(int64_t layer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(layer);
  if (it == held_.end()) return;
  if (spare_.size() < kSpareBuffers) spare_.push_back(std::move(it->second));
  held_.erase(it);
}

Status GrpcEpsClient::PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                                   size_t numel) {
  const size_t total = numel * sizeof(float);
  const std::chrono::milliseconds limit = PushGradientDeadline(options_, total);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + limit);
  data::PushGradientReply rep;
  auto writer = impl_->stub->PushGradient(&ctx, &rep);
  data::GradientChunk c;
  c.set_worker_id(reg_.worker_id);
  c.set_layer(layer);
  c.set_step(step);
  c.set_micro_batches(micro_batches);
  c.set_numel(static_cast<int64_t>(numel));
  const char* bytes = reinterpret_cast<const char*>(grad);
  size_t off = 0;
  do {
    const size_t n = std::min(kChunkBytes, total - off);
    c.set_data(bytes + off, n);
    if (!writer->Write(c)) break;  // the server ended the call: Finish has the reason
    FaultPoint("worker.push");  // tests: die with a chunk sent, the stream open
    off += n;
  } while (off < total);
  writer->WritesDone();
  const grpc::Status st = writer->Finish();
  const std::string what = "PushGradient(layer " + std::to_string(layer) + ", step " + std::to_string(step) + ")";
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Status(StatusCode::kDeadlineExceeded,
                  what + ": the daemon at " + impl_->address + " did not take the " + std::to_string(total) +
                      " bytes within " + std::to_string(limit.count()) + " ms (" +
                      std::to_string(off) + " sent; the deadline is " +
                      std::to_string(options_.push_deadline_floor.count()) + " ms plus the bytes at " +
                      std::to_string(static_cast<int64_t>(options_.push_min_bytes_per_s)) +
                      " bytes/s): is the daemon hung?");
  }
  return FromGrpc(st, what);
}

Status GrpcEpsClient::StepDone(const StepReport& r) {
  data::StepDoneRequest req;
  req.set_worker_id(reg_.worker_id);
  req.set_step(r.step);
  req.set_loss(r.loss);
  req.set_tokens(r.tokens);
  req.set_data_position(r.data_position);
  req.set_forward_s(r.forward_s);
  req.set_backward_s(r.backward_s);
  req.set_recompute_s(r.recompute_s);
  req.set_wait_layer_s(r.wait_layer_s);
  req.set_wait_push_s(r.wait_push_s);
  req.set_compute_s(r.compute_s);
  req.set_wait_first_layer_s(r.wait_first_layer_s);
  req.set_step_s(r.step_s);
  req.set_between_s(r.between_s);
  req.set_eval_loss(r.eval_loss);
  req.set_eval_tokens(r.eval_tokens);
  data::StepDoneReply rep;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  current_step_ = r.step + 1;
  return FromGrpc(impl_->stub->StepDone(&ctx, req, &rep), "StepDone(step " + std::to_string(r.step) + ")");
}

Status GrpcEpsClient::ReportExperts(int64_t step, const std::vector<uint8_t>& touched) {
  data::ReportExpertsRequest req;
  req.set_worker_id(reg_.worker_id);
  req.set_step(step);
  req.set_touched(std::string(touched.begin(), touched.end()));
  data::ReportExpertsReply rep;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return FromGrpc(impl_->stub->ReportExperts(&ctx, req, &rep), "ReportExperts(step " + std::to_string(step) + ")");
}

// One Deregister rpc naming this registration; wait: DeregisterRequest.wait_final_ms.
Status GrpcEpsClient::SendDeregister(std::chrono::milliseconds wait, std::chrono::milliseconds deadline) {
  data::DeregisterRequest req;
  req.set_worker_id(reg_.worker_id);
  req.set_registration_id(reg_.registration_id);
  req.set_wait_final_ms(wait.count());
  data::DeregisterReply rep;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  return FromGrpc(impl_->stub->Deregister(&ctx, req, &rep), wait.count() > 0 ? "Deregister after the last step"
                                                                                : "Deregister");
}

Status GrpcEpsClient::Deregister() {
  deregistered_ = true;
  return SendDeregister(std::chrono::milliseconds(0), std::chrono::seconds(2));
}

Status GrpcEpsClient::LeaveAfterLastStep(std::chrono::milliseconds wait) {
  Status s = SendDeregister(wait, wait + std::chrono::seconds(5));
  if (s.ok()) deregistered_ = true;
  return s;
}

}  // namespace l2l::worker

// gRPC adapters for the Data and Control services. See grpc_server.h.
#include "eps_server/grpc_server.h"

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "common/formats/gguf_lora.h"
#include "common/formats/lora_export.h"
#include "common/formats/model_io.h"
#include "common/formats/peft_adapter.h"
#include "common/name_table.h"
#include "common/logging.h"
#include "common/pretrained/pretrained.h"
#include "eps_server/export_choice.h"
#include "eps_server/job_start.h"
#include "proto/adamw_proto.h"
#include "proto/control.grpc.pb.h"
#include "proto/data.grpc.pb.h"
#include "proto/shard.grpc.pb.h"
#include "tokenizer/load.h"

namespace l2l::eps {
namespace {

namespace data = ::l2l::data::v1;
namespace control = ::l2l::control::v1;
namespace shardpb = ::l2l::shard::v1;

static_assert(static_cast<int>(RejoinReason::kStepAbandoned) == data::REJOIN_REASON_STEP_ABANDONED &&
              static_cast<int>(RejoinReason::kDeclaredLost) == data::REJOIN_REASON_DECLARED_LOST &&
              static_cast<int>(RejoinReason::kRolledBack) == data::REJOIN_REASON_ROLLED_BACK);

// The one place l2l::Status becomes grpc::Status.
grpc::Status ToGrpc(const Status& s) {
  using grpc::StatusCode;
  if (s.ok()) return grpc::Status::OK;
  StatusCode c = StatusCode::UNKNOWN;
  switch (s.code()) {
    case l2l::StatusCode::kOk: c = StatusCode::OK; break;
    case l2l::StatusCode::kInvalidArgument: c = StatusCode::INVALID_ARGUMENT; break;
    case l2l::StatusCode::kNotFound: c = StatusCode::NOT_FOUND; break;
    case l2l::StatusCode::kAlreadyExists: c = StatusCode::ALREADY_EXISTS; break;
    case l2l::StatusCode::kOutOfRange: c = StatusCode::OUT_OF_RANGE; break;
    case l2l::StatusCode::kFailedPrecondition: c = StatusCode::FAILED_PRECONDITION; break;
    case l2l::StatusCode::kResourceExhausted: c = StatusCode::RESOURCE_EXHAUSTED; break;
    case l2l::StatusCode::kUnavailable: c = StatusCode::UNAVAILABLE; break;
    case l2l::StatusCode::kDataLoss: c = StatusCode::DATA_LOSS; break;
    case l2l::StatusCode::kIoError: c = StatusCode::INTERNAL; break;
    case l2l::StatusCode::kInternal: c = StatusCode::INTERNAL; break;
    case l2l::StatusCode::kUnimplemented: c = StatusCode::UNIMPLEMENTED; break;
    case l2l::StatusCode::kAborted: c = StatusCode::ABORTED; break;
    case l2l::StatusCode::kDeadlineExceeded: c = StatusCode::DEADLINE_EXCEEDED; break;
    case l2l::StatusCode::kPermissionDenied: c = StatusCode::PERMISSION_DENIED; break;
  }
  if (s.rejoin_reason() != RejoinReason::kNone) {
    data::RejoinDetail detail;
    detail.set_reason(static_cast<data::RejoinReason>(s.rejoin_reason()));
    return grpc::Status(c, s.message(), detail.SerializeAsString());
  }
  return grpc::Status(c, s.message());
}

data::DType ToProto(DType d) { return d == DType::kBF16 ? data::DTYPE_BF16 : data::DTYPE_F32; }

// FetchLayer's data bytes per message: the whole message (data + <= 64 bytes of header
// fields) stays within gRPC's default 4 MiB receive limit, so clients with default
// settings (grpcurl, a plain generated stub) can read every chunk.
constexpr size_t kFetchChunkBytes = kMaxChunkBytes - 64;

// The protobuf encoding of `header` (a LayerChunk without data) followed by data = `bytes`,
// as one message of two slices: fields 1-5 plus the data field's tag and length, then the
// bytes themselves, referenced, not copied. This is what protobuf writes (fields in
// number order, data = 6 last), so any gRPC client reads it as a LayerChunk.
grpc::ByteBuffer FrameLayerChunk(const data::LayerChunk& header, grpc::Slice bytes) {
  uint8_t head[128];  // 5 varint fields (<= 11 bytes each) + tag + 5-byte length
  const size_t n = header.ByteSizeLong();
  L2L_CHECK(n + 6 <= sizeof(head)) << "LayerChunk header of " << n << " bytes";
  uint8_t* p = header.SerializeWithCachedSizesToArray(head);
  *p++ = (data::LayerChunk::kDataFieldNumber << 3) | 2;  // wire type 2: length-delimited
  p = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(bytes.size()), p);
  grpc::Slice parts[2] = {grpc::Slice(head, static_cast<size_t>(p - head)), std::move(bytes)};
  return grpc::ByteBuffer(parts, 2);
}

// A published slot pinned while gRPC still references its bytes (zero-copy FetchLayer):
// one reference per data slice handed to gRPC plus one for the handler; the last one
// unpins. `live` counts the holders not yet released (EpsGrpcServer::Shutdown waits for 0).
class PinnedSlot {
 public:
  PinnedSlot(ParamStore::ReadPin pin, std::atomic<int>* live) : pin_(std::move(pin)), live_(live) {
    live_->fetch_add(1);
  }
  const char* data() const { return static_cast<const char*>(pin_.data()); }
  size_t bytes() const { return pin_.bytes(); }
  int64_t version() const { return pin_.version(); }
  // A LoRA layer's frozen record (sent before the slot's bytes); 0 bytes otherwise.
  const char* frozen() const { return static_cast<const char*>(pin_.frozen_data()); }
  size_t frozen_bytes() const { return pin_.frozen_bytes(); }
  // A slice of [off, off+n) of the stream (the frozen record, then the slot) that keeps
  // the slot pinned until gRPC drops it. REQUIRES: it does not cross the two.
  grpc::Slice SliceOf(size_t off, size_t n) {
    refs_.fetch_add(1);
    const char* p = off < frozen_bytes() ? frozen() + off : data() + (off - frozen_bytes());
    return grpc::Slice(const_cast<char*>(p), n, &PinnedSlot::Unref, this);
  }
  static void Unref(void* p) {
    auto* s = static_cast<PinnedSlot*>(p);
    if (s->refs_.fetch_sub(1) == 1) {
      std::atomic<int>* live = s->live_;
      delete s;  // unpins
      live->fetch_sub(1);
    }
  }

 private:
  ~PinnedSlot() = default;
  ParamStore::ReadPin pin_;
  std::atomic<int>* live_;
  std::atomic<int> refs_{1};
};

class DataService final : public data::Data::Service {
 public:
  explicit DataService(EpsCore* core) : core_(core), reaper_([this] { ReapFetches(); }) {
    // FetchLayer answers with pre-framed messages (grpc::ByteBuffer) instead of LayerChunk
    // objects, so the layer's bytes go from the pinned slot to the socket without a copy.
    // The generated WithSplitStreamingMethod_FetchLayer swaps the handler the same way.
    const int index = data::FetchLayerRequest::descriptor()->file()->FindServiceByName("Data")
                          ->FindMethodByName("FetchLayer")->index();
    MarkMethodStreamed(index, new grpc::internal::SplitServerStreamingHandler<data::FetchLayerRequest, grpc::ByteBuffer>(
                                  [this](grpc::ServerContext* ctx, FetchStream* stream) { return FetchLayerRaw(ctx, stream); }));
  }

  ~DataService() override {
    {
      std::lock_guard<std::mutex> lock(fetch_mu_);
      stopping_ = true;
    }
    fetch_cv_.notify_all();
    reaper_.join();
  }

  // Blocks until gRPC released every pinned slot (after the server shut down: its calls
  // are cancelled, so this is prompt), before the EPS may free the weight segment.
  void WaitForPinsReleased() {
    for (int i = 1; pinned_.load() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (i % 5000 == 0) L2L_LOG_WARN("shutdown: gRPC still holds {} pinned layer(s)", pinned_.load());
    }
  }

  grpc::Status Register(grpc::ServerContext*, const data::RegisterRequest* req,
                        data::RegisterReply* rep) override {
    RegisterInfo info;
    info.name = req->worker_name();
    info.hostname = req->hostname();
    info.boot_id = req->boot_id();
    if (!req->transport().empty()) {  // absent: auto
      Result<Transport> t = ParseTransport(req->transport());
      if (!t.ok()) return ToGrpc(t.status().WithContext("RegisterRequest.transport"));
      info.transport = *t;
    }
    info.pid = req->pid();
    info.previous_worker_id = req->has_previous_worker_id() ? req->previous_worker_id() : -1;
    info.shard_worker_id = req->has_shard_worker_id() ? req->shard_worker_id() : -1;
    if (req->has_optimizer() && req->optimizer().takes_updates()) {
      const data::OptimizerDevice& o = req->optimizer();
      const double rates[] = {o.update_params_per_s(), o.h2d_bytes_per_s(), o.d2h_bytes_per_s()};
      const char* names[] = {"update_params_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s"};
      for (int i = 0; i < 3; ++i) {
        if (!std::isfinite(rates[i]) || rates[i] < 0 || (i == 0 && rates[i] <= 0)) {
          return ToGrpc(InvalidArgument("RegisterRequest.optimizer." + std::string(names[i]) + " = " +
                                        std::to_string(rates[i]) + ": must be finite and " +
                                        (i == 0 ? "> 0 when takes_updates" : ">= 0 (0 = no link)")));
        }
      }
      info.optimizer.takes_updates = true;
      info.optimizer.device = o.device().empty() ? "an unnamed device" : o.device();
      info.optimizer.update_params_per_s = o.update_params_per_s();
      info.optimizer.h2d_bytes_per_s = o.h2d_bytes_per_s();
      info.optimizer.d2h_bytes_per_s = o.d2h_bytes_per_s();
    }
    auto r = core_->Register(info);
    if (!r.ok()) return ToGrpc(r.status());
    rep->set_worker_id(r->worker_id);
    rep->set_num_workers(r->num_workers);
    rep->set_job_yaml(JobConfigToYaml(r->job));
    rep->set_start_step(r->start_step);
    rep->set_registration_id(r->registration_id);
    rep->set_data_rank(r->worker_id);
    rep->set_data_world(r->data_world);
    rep->set_data_position(r->data_position);
    rep->set_transport(ToString(r->transport));
    rep->set_weight_segment(r->weight_segment);
    rep->set_gradient_segment(r->gradient_segment);
    rep->set_publish_dtype(ToProto(r->job.publish_dtype));
    for (int64_t n : r->layer_numel) rep->add_layer_numel(n);
    for (const std::string& root : r->data_roots) rep->add_data_roots(root);
    rep->set_first_layer(r->first_layer);
    rep->set_recovery_epoch(r->recovery_epoch);
    for (const ShardEndpoint& e : r->shards) {
      auto* out = rep->add_shards();
      out->set_index(e.index);
      out->set_address(e.address);
      out->set_first_layer(e.layers.first);
      out->set_num_layers(e.layers.count);
    }
    return grpc::Status::OK;
  }

  grpc::Status TakeUpdate(grpc::ServerContext*, const data::TakeUpdateRequest* req,
                          data::TakeUpdateReply* rep) override {
    int64_t wait_ms = req->wait_ms() <= 0 ? 1000 : std::min<int64_t>(req->wait_ms(), 10000);
    Result<UpdateTask> t = core_->TakeUpdate(req->worker_id(), std::chrono::milliseconds(wait_ms));
    if (!t.ok()) return ToGrpc(t.status().WithContext("TakeUpdate"));
    if (t->id == 0) return grpc::Status::OK;  // has_task false
    rep->set_has_task(true);
    rep->set_task_id(t->id);
    rep->set_layer(t->layer);
    rep->set_step(t->step);
    rep->set_numel(static_cast<int64_t>(t->numel));
    rep->set_segment(t->segment);
    rep->set_p_offset(t->p_offset);
    rep->set_m_offset(t->m_offset);
    rep->set_v_offset(t->v_offset);
    rep->set_g_offset(t->g_offset);
    l2l::ToProto(t->args, rep->mutable_adamw());
    for (const DecayRange& r : t->ranges) {
      auto* d = rep->add_ranges();
      d->set_begin(static_cast<int64_t>(r.begin));
      d->set_end(static_cast<int64_t>(r.end));
      d->set_decay(r.decay);
    }
    return grpc::Status::OK;
  }

  grpc::Status UpdateDone(grpc::ServerContext*, const data::UpdateDoneRequest* req,
                          data::UpdateDoneReply*) override {
    return ToGrpc(core_->UpdateDone(req->worker_id(), req->task_id(), req->layer(), req->numel(), req->error())
                      .WithContext("UpdateDone"));
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const data::HeartbeatRequest* req,
                         data::HeartbeatReply* rep) override {
    bool stop = false, paused = false, rejoin = false;
    Status s = core_->Heartbeat(req->worker_id(), req->step(), &stop, &paused, &rejoin);
    rep->set_stop(stop);
    rep->set_paused(paused);
    rep->set_rejoin(rejoin);
    return ToGrpc(s);
  }

  // FetchLayer: LayerChunk messages whose data slices point into the pinned published
  // slot (FrameLayerChunk, PinnedSlot); gRPC drops them once the bytes are in the socket
  // or the call ended. A client that stops reading keeps the slot pinned, which would
  // hold back the layer's publish of version+2 until the call's deadline, so ReapFetches
  // cancels the fetches of workers that are no longer active (the EPS drops silent
  // workers), as the EPS drops a lost shm worker's pins.
  using FetchStream = grpc::ServerSplitStreamer<data::FetchLayerRequest, grpc::ByteBuffer>;
  grpc::Status FetchLayerRaw(grpc::ServerContext* ctx, FetchStream* stream) {
    data::FetchLayerRequest req;
    if (!stream->Read(&req)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "FetchLayer: no request");
    const int64_t timeout_ms = req.timeout_ms() > 0 ? req.timeout_ms() : 60000;
    DType dt = DType::kF32;
    auto pin = core_->PinLayer(req.worker_id(), req.layer(), req.min_version(),
                               std::chrono::milliseconds(timeout_ms), &dt);
    if (!pin.ok()) return ToGrpc(pin.status());
    auto* slot = new PinnedSlot(std::move(*pin), &pinned_);
    {
      std::lock_guard<std::mutex> lock(fetch_mu_);
      fetches_[ctx] = req.worker_id();
    }
    data::LayerChunk header;
    header.set_layer(req.layer());
    header.set_version(slot->version());
    header.set_dtype(ToProto(dt));
    header.set_numel(static_cast<int64_t>(slot->bytes() / DTypeSize(dt)));
    header.set_frozen_bytes(static_cast<int64_t>(slot->frozen_bytes()));
    grpc::Status result = grpc::Status::OK;
    const size_t total = slot->frozen_bytes() + slot->bytes();
    size_t off = 0;
    do {
      // Chunks end at the boundary between the frozen record and the slot.
      const size_t end = off < slot->frozen_bytes() ? slot->frozen_bytes() : total;
      const size_t n = std::min(kFetchChunkBytes, end - off);
      header.set_offset(static_cast<int64_t>(off));
      if (ctx->IsCancelled() || !stream->Write(FrameLayerChunk(header, slot->SliceOf(off, n)))) {
        result = grpc::Status(grpc::StatusCode::CANCELLED, "client went away during FetchLayer");
        break;
      }
      off += n;
    } while (off < total);
    {
      std::lock_guard<std::mutex> lock(fetch_mu_);
      fetches_.erase(ctx);
    }
    PinnedSlot::Unref(slot);
    return result;
  }

  // Once a second: cancels the fetches in flight of workers that are no longer active.
  void ReapFetches() {
    UniqueLock lock(fetch_mu_);
    while (!fetch_cv_.wait_for(lock.native(), std::chrono::seconds(1), [&]() REQUIRES(fetch_mu_) { return stopping_; })) {
      for (const auto& [ctx, worker] : fetches_) {
        if (Status s = core_->CheckActive(worker); !s.ok()) {
          L2L_LOG_WARN("cancelling FetchLayer of worker {}: {}", worker, s.ToString());
          ctx->TryCancel();
        }
      }
    }
  }

  grpc::Status PushGradient(grpc::ServerContext*, grpc::ServerReader<data::GradientChunk>* reader,
                            data::PushGradientReply* rep) override {
    data::GradientChunk c;
    if (!reader->Read(&c)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "PushGradient: empty stream");
    const int32_t worker = c.worker_id();
    const int64_t layer = c.layer(), step = c.step(), mb = c.micro_batches(), numel = c.numel();
    const std::string where = "PushGradient(worker " + std::to_string(worker) + ", layer " +
                              std::to_string(layer) + ", step " + std::to_string(step) + ")";
    // Every header field is checked (job, worker, layer, numel against the layer's size,
    // micro-batches) before numel*4 bytes are taken: a claimed 2^40 floats costs nothing.
    if (Status v = core_->ValidateGradient(worker, layer, mb, numel); !v.ok()) return ToGrpc(v.WithContext(where));
    std::vector<float> grad(static_cast<size_t>(numel));
    const size_t want = static_cast<size_t>(numel) * sizeof(float);
    size_t got = 0;
    do {
      if (c.data().size() > kMaxChunkBytes) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            where + ": chunk of " + std::to_string(c.data().size()) +
                                " bytes exceeds the 4 MiB limit (" + std::to_string(kMaxChunkBytes) + ")");
      }
      if ((c.worker_id() != worker && c.worker_id() != 0) || (c.layer() != layer && c.layer() != 0) ||
          (c.step() != step && c.step() != 0)) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, where + ": a later chunk names another gradient");
      }
      if (got + c.data().size() > want) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            where + ": received more than numel*4 = " + std::to_string(want) + " bytes");
      }
      // (A LoRA job's frozen layer pushes 0 floats: grad.data() may be null.)
      if (!c.data().empty()) std::memcpy(reinterpret_cast<char*>(grad.data()) + got, c.data().data(), c.data().size());
      got += c.data().size();
    } while (reader->Read(&c));
    if (got != want) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          where + ": received " + std::to_string(got) + " bytes, expected numel*4 = " +
                              std::to_string(want));
    }
    Status s = core_->SubmitGradient(worker, layer, step, mb, std::move(grad));
    if (!s.ok()) return ToGrpc(s.WithContext(where));
    rep->set_bytes_received(static_cast<int64_t>(got));
    return grpc::Status::OK;
  }

  grpc::Status StepDone(grpc::ServerContext*, const data::StepDoneRequest* req,
                        data::StepDoneReply* rep) override {
    bool stop = false;
    eps::StepTimes times;
    times.forward_s = req->forward_s();
    times.backward_s = req->backward_s();
    times.recompute_s = req->recompute_s();
    times.wait_layer_s = req->wait_layer_s();
    times.wait_push_s = req->wait_push_s();
    if (req->has_compute_s()) {
      times.compute_s = req->compute_s();
      times.wait_first_layer_s = req->wait_first_layer_s();
      times.worker_step_s = req->step_s();
      times.between_s = req->between_s();
    }
    Status s = core_->StepDone(req->worker_id(), req->step(), req->loss(), req->tokens(),
                               req->data_position(), &stop, times, eps::StepEval{req->eval_loss(), req->eval_tokens()});
    rep->set_stop(stop);
    return ToGrpc(s);
  }

  grpc::Status ReportExperts(grpc::ServerContext*, const data::ReportExpertsRequest* req,
                             data::ReportExpertsReply*) override {
    const std::string& t = req->touched();
    return ToGrpc(core_->ReportExperts(req->worker_id(), req->step(), std::vector<uint8_t>(t.begin(), t.end())));
  }

  grpc::Status Deregister(grpc::ServerContext*, const data::DeregisterRequest* req,
                          data::DeregisterReply*) override {
    return ToGrpc(core_->Deregister(req->worker_id(), req->registration_id(),
                                    std::chrono::milliseconds(req->wait_final_ms())));
  }

 private:
  EpsCore* core_;
  std::atomic<int> pinned_{0};  // PinnedSlots alive
  std::mutex fetch_mu_;
  std::condition_variable fetch_cv_;
  std::map<grpc::ServerContext*, int32_t> fetches_ GUARDED_BY(fetch_mu_);  // in flight -> worker
  bool stopping_ GUARDED_BY(fetch_mu_) = false;
  std::thread reaper_;                               // ReapFetches; last: starts in the constructor
};

class ControlService final : public control::Control::Service {
 public:
  ControlService(EpsCore* core, EpsGrpcServer* server, const ServerOptions& opts)
      : core_(core), server_(server), opts_(opts), start_(std::chrono::steady_clock::now()) {}

  grpc::Status Health(grpc::ServerContext*, const control::HealthRequest*,
                      control::HealthReply* rep) override {
    rep->set_state(core_->GetStatus().state);
    rep->set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start_).count());
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const control::GetStatusRequest*,
                         control::GetStatusReply* rep) override {
    const CoreStatus s = core_->GetStatus();
    rep->set_state(s.state);
    rep->set_shard(s.shard.index);
    rep->set_shards(s.shard.count);
    rep->set_first_layer(s.first_layer);
    for (const ShardEndpoint& e : s.shard_map) {
      auto* m = rep->add_shard_map();
      m->set_index(e.index);
      m->set_address(e.address);
      m->set_first_layer(e.layers.first);
      m->set_num_layers(e.layers.count);
    }
    rep->set_job_id(s.job_id);
    rep->set_step(s.step);
    rep->set_total_steps(s.total_steps);
    for (int64_t v : s.layer_version) rep->add_layer_version(v);
    rep->set_last_loss(s.last_loss);
    rep->set_val_loss(s.val_loss);
    rep->set_val_step(s.val_step);
    rep->set_tokens_per_s(s.tokens_per_s);
    rep->set_step_time_s(s.pipeline.last_step_wall_s);
    auto* ram = rep->add_memory();
    ram->set_tier("ram");
    ram->set_used_bytes(static_cast<int64_t>(s.state_bytes));
    ram->set_budget_bytes(static_cast<int64_t>(s.host_budget));
    auto* shm = rep->add_memory();
    shm->set_tier("shm");
    shm->set_used_bytes(static_cast<int64_t>(s.shm_bytes));
    if (s.spill) {
      auto* pool = rep->add_memory();
      pool->set_tier("pool");
      pool->set_used_bytes(s.tier.pool_bytes);
      auto* ssd = rep->add_memory();
      ssd->set_tier("ssd");
      ssd->set_used_bytes(s.tier.ssd_bytes);
      auto* sp = rep->mutable_spill();
      sp->set_ssd_bytes(s.tier.ssd_bytes);
      sp->set_pool_bytes(s.tier.pool_bytes);
      sp->set_bytes_read(static_cast<int64_t>(s.tier.io.bytes_read));
      sp->set_bytes_written(static_cast<int64_t>(s.tier.io.bytes_written));
      sp->set_lease_hits(s.tier.lease_hits);
      sp->set_lease_misses(s.tier.lease_misses);
      sp->set_lease_wait_s(s.tier.lease_wait_s);
      sp->set_read_busy_s(s.tier.io.read_busy_s);
      sp->set_write_busy_s(s.tier.io.write_busy_s);
    }
    rep->set_error(s.error);
    rep->set_staleness_bound(s.staleness_bound);
    rep->set_max_version_lag(s.max_version_lag);
    rep->set_skipped_steps(s.pipeline.skipped_steps);
    rep->set_consecutive_skips(s.pipeline.consecutive_skips);
    rep->set_last_skip_reason(s.pipeline.last_skip_reason);
    rep->set_pause_reason(s.pause_reason);
    const auto now = std::chrono::steady_clock::now();
    for (const WorkerInfo& w : s.workers) {
      auto* ws = rep->add_workers();
      ws->set_worker_id(w.id);
      ws->set_name(w.name);
      ws->set_transport(ToString(w.transport));
      ws->set_state(ToString(w.state));
      ws->set_step(w.step);
      ws->set_last_heartbeat_ms_ago(
          std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_seen).count());
      ws->set_last_loss(w.last_loss);
    }
    rep->set_num_params(s.num_params);
    rep->set_update_busy_s(s.pipeline.last_step_busy_s);
    rep->set_update_exposed_s(s.pipeline.last_step_exposed_s);
    rep->set_last_checkpoint(s.last_checkpoint);
    rep->set_step_workers(s.members);
    return grpc::Status::OK;
  }

  grpc::Status CreateJob(grpc::ServerContext*, const control::CreateJobRequest* req,
                         control::CreateJobReply* rep) override {
    // The job and its start; every path it names is confined to the daemon's paths.*
    // roots (the state dir among them), relative ones resolved against the state dir.
    JobSource source;
    source.job_yaml = req->config_yaml();
    source.init_safetensors = req->init_safetensors();
    const PathRoots roots = core_->job_path_roots();
    source.roots = &roots;
    source.base_dir = core_->user_base_dir();
    auto plan = ChooseJobStart(source);
    if (!plan.ok()) return ToGrpc(plan.status());
    Status s = core_->CreateJob(plan->job, plan->start);
    if (!s.ok()) return ToGrpc(s);
    const CoreStatus st = core_->GetStatus();
    rep->set_job_id(st.job_id);
    rep->set_num_params(st.num_params);
    rep->set_host_bytes_needed(static_cast<int64_t>(st.state_bytes + st.shm_bytes));
    return grpc::Status::OK;
  }

  grpc::Status Pause(grpc::ServerContext*, const control::PauseRequest*, control::PauseReply*) override {
    return ToGrpc(core_->Pause());
  }

  grpc::Status Resume(grpc::ServerContext*, const control::ResumeRequest*, control::ResumeReply*) override {
    return ToGrpc(core_->Resume());
  }

  grpc::Status Checkpoint(grpc::ServerContext*, const control::CheckpointRequest* req,
                          control::CheckpointReply* rep) override {
    auto r = core_->Checkpoint(req->dir());
    if (!r.ok()) return ToGrpc(r.status().WithContext("Checkpoint"));
    rep->set_dir(r->dir);
    rep->set_bytes(r->bytes);
    rep->set_step(r->step);
    return grpc::Status::OK;
  }

  grpc::Status Export(grpc::ServerContext*, const control::ExportRequest* req,
                      control::ExportReply* rep) override {
    // Whether the job is a LoRA job decides what may be exported (eps_server/export_choice.h).
    const bool lora = core_->has_job() && core_->job_config().lora.enabled;
    const Result<ExportChoice> choice =
        ParseExportChoice({req->format(), req->dtype(), req->max_shard_bytes(), req->merge()}, lora);
    if (!choice.ok()) return ToGrpc(choice.status().WithContext("Export"));
    if (choice->format != ExportFormat::kSafetensors || choice->merge) return ExportWithChoice(req, *choice, rep);
    auto path = core_->ResolveUserPath(req->path(), "Export path");
    if (!path.ok()) return ToGrpc(path.status().WithContext("Export"));
    auto bytes = core_->Export(req->path(), choice->dtype());
    if (!bytes.ok()) return ToGrpc(bytes.status().WithContext("Export"));
    rep->set_path(*path);
    rep->set_bytes(*bytes);
    return grpc::Status::OK;
  }

  // The size of a written file, or of the files of a written directory (not recursive).
  static int64_t WrittenBytes(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::is_directory(path, ec)) {
      const auto n = std::filesystem::file_size(path, ec);
      return ec ? 0 : static_cast<int64_t>(n);
    }
    int64_t total = 0;
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.is_regular_file(ec)) total += static_cast<int64_t>(e.file_size(ec));
    }
    return total;
  }

  // Export --format hf | gguf (common/pretrained/pretrained.h), a LoRA job's adapter
  // (peft | gguf-lora: common/formats/lora_export.h AdapterFromLayers) or its merged model
  // (--merge: MergedLayerSource under hf | gguf | safetensors), streamed at a step boundary.
  grpc::Status ExportWithChoice(const control::ExportRequest* req, const ExportChoice& choice,
                                control::ExportReply* rep) {
    auto path = core_->ResolveUserPath(req->path(), "Export path");
    if (!path.ok()) return ToGrpc(path.status().WithContext("Export"));
    if (!core_->has_job()) return ToGrpc(FailedPrecondition("Export: no job to export (CreateJob first)"));
    const JobConfig job = core_->job_config();
    tok::GgufMetadata tokenizer_md;
    if (choice.format == ExportFormat::kGguf && !job.imported_from.empty() &&
        std::filesystem::is_directory(job.imported_from)) {
      // An HF import's tokenizer goes into the GGUF's metadata, so llama.cpp-based tools
      // tokenize as the model was trained. One GGUF cannot hold (not byte-level BPE, ...)
      // leaves the file without a tokenizer, said in the daemon's log.
      auto md = tok::GgufTokenizerMetadataFromHf(job.imported_from, job.model.vocab_size);
      if (md.ok()) {
        tokenizer_md = std::move(*md);
      } else if (md.status().code() == l2l::StatusCode::kUnimplemented) {
        L2L_LOG_WARN("GGUF export {}: written without tokenizer metadata: {}", *path, md.status().ToString());
      } else {
        return ToGrpc(md.status().WithContext("Export: the tokenizer of " + job.imported_from));
      }
    }
    auto bytes = core_->ExportWith(
        req->path(), [&](const std::string& p, int64_t step, const LayerSource& read) -> Result<int64_t> {
          if (choice.format == ExportFormat::kPeft || choice.format == ExportFormat::kGgufLora) {
            // read gives a LoRA job's whole layers (BuildLoraLayout): base + adapters.
            L2L_ASSIGN_OR_RETURN(formats::LoraAdapter adapter, formats::AdapterFromLayers(job.model, job.lora, read));
            if (choice.format == ExportFormat::kPeft) {
              adapter.base_model = job.imported_from;
              L2L_RETURN_IF_ERROR(formats::WritePeftAdapter(p, adapter));
            } else {
              formats::GgufLoraOptions o;
              o.type = choice.type;
              o.name = "l2l step " + std::to_string(step);
              L2L_RETURN_IF_ERROR(formats::WriteGgufLora(p, job.model, adapter, o));
            }
            return WrittenBytes(p);
          }
          // A LoRA job's merged model; any other job's weights as they are.
          const LayerSource source = choice.merge ? formats::MergedLayerSource(job.model, job.lora, read) : read;
          if (choice.format == ExportFormat::kSafetensors) {
            L2L_RETURN_IF_ERROR(SaveModelStreamed(p, job.model, source, choice.dtype(),
                                                  {{"l2l.step", std::to_string(step)}}));
            return WrittenBytes(p);
          }
          if (choice.format == ExportFormat::kHf) {
            HfExportOptions o;
            o.dtype = choice.dtype();
            o.imported_from = job.imported_from;
            if (choice.max_shard_bytes > 0) o.max_shard_bytes = static_cast<uint64_t>(choice.max_shard_bytes);
            L2L_ASSIGN_OR_RETURN(int64_t written, ExportHf(p, job.model, source, o));
            if (!job.imported_from.empty() && tok::IsGgufFile(job.imported_from)) {
              // A GGUF import carries its tokenizer in metadata: write it as HF files.
              L2L_RETURN_IF_ERROR(tok::WriteHfTokenizerFromGguf(job.imported_from, p).WithContext(
                  "the tokenizer of " + job.imported_from));
            }
            return written;
          }
          GgufExportOptions o;
          o.type = choice.type;
          o.q4_k_m = choice.q4_k_m;
          o.imported_from = job.imported_from;
          o.name = "l2l step " + std::to_string(step);
          o.metadata = tokenizer_md;
          return ExportGguf(p, job.model, source, o);
        });
    if (!bytes.ok()) return ToGrpc(bytes.status().WithContext("Export"));
    rep->set_path(*path);
    rep->set_bytes(*bytes);
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext*, const control::ShutdownRequest* req,
                        control::ShutdownReply*) override {
    if (const auto& prepare = server_->prepare_shutdown(); prepare) {
      // The final checkpoint runs before the reply, so a failure reaches the caller and
      // the daemon keeps its state (paused) instead of exiting without it.
      if (Status s = prepare(req->abort_step(), req->skip_checkpoint()); !s.ok()) {
        return ToGrpc(s.WithContext("stop refused: the final checkpoint failed; the daemon keeps running, paused, "
                                    "with its state in memory (free space or fix the checkpoint dir and stop "
                                    "again, or `l2lctl checkpoint --dir OTHER` then `l2lctl stop "
                                    "--skip-checkpoint`)"));
      }
      server_->RequestShutdown(req->abort_step(), req->skip_checkpoint(), /*prepared=*/true);
      return grpc::Status::OK;
    }
    server_->RequestShutdown(req->abort_step(), req->skip_checkpoint());
    return grpc::Status::OK;
  }

 private:
  EpsCore* core_;
  EpsGrpcServer* server_;
  ServerOptions opts_;
  std::chrono::steady_clock::time_point start_;
};

// l2l.shard.v1.Shards (proto/shard.proto): shard 0 of a sharded job serves the others.
class ShardsService final : public shardpb::Shards::Service {
 public:
  explicit ShardsService(ShardHub* hub) : hub_(hub) {}

  grpc::Status Join(grpc::ServerContext*, const shardpb::JoinRequest* req, shardpb::JoinReply* rep) override {
    ShardHub::JoinInfo j;
    j.shard = req->shard();
    j.shards = req->shards();
    j.layers = {req->first_layer(), req->num_layers()};
    j.address = req->address();
    j.job_hash = req->job_hash();
    j.start_step = req->start_step();
    j.instance = req->instance();
    j.running = req->running();
    j.epoch = req->epoch();
    if (j.address.empty() || j.address.size() > 512) {
      return ToGrpc(InvalidArgument("JoinRequest.address: expected host:port, got " +
                                    std::to_string(j.address.size()) + " bytes"));
    }
    Result<ShardPeers::Epoch> e = hub_->Join(j);
    if (!e.ok()) return ToGrpc(e.status().WithContext("Join"));
    rep->set_epoch(e->epoch);
    rep->set_rollback_step(e->step);
    rep->set_coordinator(hub_->instance());
    return grpc::Status::OK;
  }

  grpc::Status Watch(grpc::ServerContext*, const shardpb::WatchRequest* req, shardpb::WatchReply* rep) override {
    const int64_t wait_ms = std::clamp<int64_t>(req->wait_ms(), 0, 10000);
    Result<ShardPeers::Epoch> e =
        hub_->Watch(req->shard(), req->instance(), req->epoch(), std::chrono::milliseconds(wait_ms));
    if (!e.ok()) return ToGrpc(e.status().WithContext("Watch"));
    rep->set_epoch(e->epoch);
    rep->set_rollback_step(e->step);
    rep->set_reason(e->reason);
    rep->set_coordinator(hub_->instance());
    return grpc::Status::OK;
  }

  grpc::Status StepFacts(grpc::ServerContext*, const shardpb::StepFactsRequest* req,
                         shardpb::StepFactsReply* rep) override {
    if (req->kind() == shardpb::FACT_FAILED) {
      if (req->shard() <= 0 || req->skip_reason().size() > 65536) {
        return ToGrpc(InvalidArgument("StepFactsRequest: a failure report from shard " +
                                      std::to_string(req->shard())));
      }
      hub_->ShardFailed(req->shard(), req->skip_reason());
      return grpc::Status::OK;
    }
    if (req->kind() == shardpb::FACT_ROLLBACK) {
      if (req->skip_reason().size() > 65536) {
        return ToGrpc(InvalidArgument("StepFactsRequest: a rollback request's reason is too long"));
      }
      return ToGrpc(hub_->ShardRollback(req->shard(), req->instance(), req->epoch(), req->skip_reason()).WithContext("StepFacts"));
    }
    if (req->kind() == shardpb::FACT_CHECKPOINT) {
      CheckpointPart part;
      part.shard = req->shard();
      part.step = req->step();
      part.dir = req->part_dir();
      if (req->files_size() > (1 << 20)) return ToGrpc(InvalidArgument("StepFactsRequest.files: too many"));
      for (const auto& f : req->files()) {
        part.model_layers.push_back(f.layer());
        part.files.push_back({f.file(), f.numel(), f.bytes(), f.crc32()});
        part.bytes += static_cast<int64_t>(f.bytes());
      }
      // The names are checked again where they are used (AssembleCheckpoint), inside the root.
      if (part.dir != CheckpointPartDirName(part.step, part.shard)) {
        return ToGrpc(InvalidArgument("StepFactsRequest.part_dir '" + part.dir + "': expected " +
                                      CheckpointPartDirName(part.step, part.shard)));
      }
      return ToGrpc(hub_->SubmitPart(part, req->epoch(), std::chrono::milliseconds(0)).WithContext("StepFacts"));
    }
    if (req->norm2_size() > (1 << 20)) return ToGrpc(InvalidArgument("StepFactsRequest.norm2: too many"));
    const std::vector<double> norm2(req->norm2().begin(), req->norm2().end());
    const int64_t wait_ms = std::clamp<int64_t>(req->wait_ms(), 0, 10000);
    const auto kind = req->kind() == shardpb::FACT_NORMS ? ShardHub::Kind::kNorms : ShardHub::Kind::kVerdict;
    Result<ShardHub::Decision> d = hub_->Facts(req->shard(), req->epoch(), req->step(), kind, norm2,
                                               req->skip_reason(), std::chrono::milliseconds(wait_ms));
    if (!d.ok()) return ToGrpc(d.status().WithContext("StepFacts"));
    rep->set_ready(d->ready);
    rep->set_total_norm2(d->total_norm2);
    rep->set_skip_reason(d->skip_reason);
    return grpc::Status::OK;
  }

 private:
  ShardHub* hub_;
};

}  // namespace

Result<std::unique_ptr<EpsGrpcServer>> EpsGrpcServer::Start(EpsCore* core, const ServerOptions& opts) {
  // Refuses an unprotected non-loopback address (l2l-eps checked already, before binding
  // anything; this guards other callers).
  L2L_RETURN_IF_ERROR(CheckExposure(ExposedApi::kGrpc, opts.listen, opts.security));
  std::unique_ptr<EpsGrpcServer> s(new EpsGrpcServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  s->data_ = std::make_unique<DataService>(core);
  s->control_ = std::make_unique<ControlService>(core, s.get(), opts);
  grpc::ServerBuilder b;
  b.AddListeningPort(opts.listen, MakeServerCredentials(opts.security), &s->port_);
  b.RegisterService(s->data_.get());
  b.RegisterService(s->control_.get());
  if (opts.shard_hub != nullptr) {
    s->shards_ = std::make_unique<ShardsService>(opts.shard_hub);
    b.RegisterService(s->shards_.get());
  }
  // A 4 MiB chunk plus its header fields exceeds gRPC's default 4 MiB message limit;
  // chunks above kMaxChunkBytes are rejected by the service with a clear message.
  b.SetMaxReceiveMessageSize(static_cast<int>(2 * kMaxChunkBytes + 4096));
  // Workers send keepalive pings (worker/eps_client_grpc.cc) so a dead peer on another
  // host is noticed; accept them every 5 s even between calls.
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  b.SetMaxSendMessageSize(static_cast<int>(2 * kMaxChunkBytes + 4096));
  s->server_ = b.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return Unavailable("could not listen on " + opts.listen +
                       (opts.security.tls() ? " (TLS: check that --tls-key is the key of --tls-cert)" : ""));
  }
  return s;
}

EpsGrpcServer::~EpsGrpcServer() { Shutdown(); }

void EpsGrpcServer::WaitForShutdownRequest() {
  UniqueLock lock(mu_);
  cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return shutdown_requested_; });
}

void EpsGrpcServer::ClearShutdownRequest() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_requested_ = false;
  prepared_ = false;
}

void EpsGrpcServer::RequestShutdown(bool abort_step, bool skip_checkpoint, bool prepared) {
  std::lock_guard<std::mutex> lock(mu_);
  prepared_ = prepared;
  shutdown_requested_ = true;
  skip_checkpoint_ = skip_checkpoint;
  abort_step_ = abort_step;
  cv_.notify_all();
}

void EpsGrpcServer::Shutdown() {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Zero-copy fetches point into the weight segment: none may outlive the server.
  static_cast<DataService*>(data_.get())->WaitForPinsReleased();
}

}  // namespace l2l::eps

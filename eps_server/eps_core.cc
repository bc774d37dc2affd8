// EpsCore: job, workers, shm gradient consumers. See eps_core.h.
#include "eps_server/eps_core.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace l2l::eps {

struct EpsCore::ShmWorker {
  int32_t id = -1;
  ShmSegment seg;
  std::vector<uint64_t> slot_offset;
  std::thread consumer;
};

EpsCore::EpsCore(CoreOptions opts) : opts_(std::move(opts)) {}

EpsCore::~EpsCore() { Stop(); }

bool EpsCore::has_job() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_job_;
}

Status EpsCore::CreateJob(const JobConfig& job, const std::vector<std::vector<float>>* initial,
                          int64_t start_step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (has_job_) return FailedPrecondition("the daemon already runs job '" + opts_.job_id + "'");
  if (stopped_) return Aborted("the daemon is stopping");
  L2L_RETURN_IF_ERROR(job.model.Validate());
  if (job.train.clip != "none" && job.train.clip != "per_layer" && job.train.clip != "global") {
    return InvalidArgument("training.clip='" + job.train.clip + "' must be none, per_layer or global");
  }
  const std::string prefix = "l2l-" + opts_.job_id + "-";
  auto removed = RemoveSegmentsWithPrefix(prefix);
  if (removed.ok() && *removed > 0) {
    L2L_LOG_WARN("removed {} stale shared-memory segment(s) /{}* left by an earlier run", *removed, prefix);
  }
  ParamStoreOptions po;
  po.page_bytes = opts_.page_bytes;
  po.host_bytes = opts_.host_bytes;
  po.publish_dtype = job.publish_dtype;
  if (opts_.transport != "grpc") po.shm_name = "/" + prefix + "w";
  L2L_ASSIGN_OR_RETURN(store_, ParamStore::Create(job.model, po));
  if (initial != nullptr) {
    if (static_cast<int64_t>(initial->size()) != store_->num_layers()) {
      return InvalidArgument("initial weights have " + std::to_string(initial->size()) +
                             " layers, the model has " + std::to_string(store_->num_layers()));
    }
    for (int64_t l = 0; l < store_->num_layers(); ++l) {
      if ((*initial)[l].size() != store_->layout(l).numel) {
        return InvalidArgument("initial weights of layer " + std::to_string(l) + " have " +
                               std::to_string((*initial)[l].size()) + " floats, expected " +
                               std::to_string(store_->layout(l).numel));
      }
      store_->WriteState(l, 0, (*initial)[l].data());
    }
  } else {
    store_->InitFromSeed(job.train.seed);
  }
  for (int64_t l = 0; l < store_->num_layers(); ++l) store_->PublishMaster(l, start_step);
  pipeline_ = std::make_unique<UpdatePipeline>(store_.get(), job, opts_.expected_workers, start_step);
  job_ = job;
  start_step_ = start_step;
  has_job_ = true;
  step_start_ = std::chrono::steady_clock::now();
  L2L_LOG_INFO("job '{}': {} parameters in {} layers, {} worker(s), publish {}, start step {}",
               opts_.job_id, job.model.NumParams(), store_->num_layers(), opts_.expected_workers,
               DTypeName(job.publish_dtype), start_step);
  return Status::Ok();
}

Status EpsCore::CheckWorker(int32_t worker_id) const {
  if (!has_job_) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
  if (worker_id < 0 || worker_id >= static_cast<int32_t>(workers_.size())) {
    return NotFound("worker id " + std::to_string(worker_id) + " is not registered (" +
                    std::to_string(workers_.size()) + " workers registered); call Register first");
  }
  if (workers_[worker_id].state != "active") {
    return FailedPrecondition("worker " + std::to_string(worker_id) + " is " + workers_[worker_id].state);
  }
  return Status::Ok();
}

Result<Registration> EpsCore::Register(const RegisterInfo& info) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!has_job_) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
  if (stopped_) return Aborted("the daemon is stopping");
  if (static_cast<int32_t>(workers_.size()) >= opts_.expected_workers) {
    return ResourceExhausted("the job already has its " + std::to_string(opts_.expected_workers) +
                             " worker(s)");
  }
  const std::string want = info.transport.empty() ? "auto" : info.transport;
  if (want != "auto" && want != "shm" && want != "grpc") {
    return InvalidArgument("transport '" + want + "' must be auto, shm or grpc");
  }
  const bool same_host = !info.boot_id.empty() && info.boot_id == BootId() && info.hostname == HostName();
  const bool shm_possible = same_host && opts_.transport != "grpc";
  if (want == "shm" && !shm_possible) {
    return FailedPrecondition(std::string("transport shm requested but ") +
                              (same_host ? "the daemon is configured for grpc only"
                                         : "the worker is not on the daemon's host (boot id/hostname differ)"));
  }
  Registration r;
  r.worker_id = static_cast<int32_t>(workers_.size());
  r.num_workers = opts_.expected_workers;
  r.job = job_;
  r.start_step = start_step_;
  r.transport = (want != "grpc" && shm_possible) ? "shm" : "grpc";
  for (int64_t l = 0; l < store_->num_layers(); ++l) r.layer_numel.push_back(store_->layout(l).numel);
  if (r.transport == "shm") {
    auto w = std::make_unique<ShmWorker>();
    w->id = r.worker_id;
    const size_t L = static_cast<size_t>(store_->num_layers());
    const size_t slot_bytes = RoundUpTo(store_->max_layer_numel() * sizeof(float), kShmAlign);
    const int slots = std::clamp(opts_.grad_slots, 1, kMaxGradSlots);
    const size_t bytes = GradHeaderBytes(L) + slots * slot_bytes;
    r.gradient_segment = "/l2l-" + opts_.job_id + "-g" + std::to_string(r.worker_id);
    L2L_ASSIGN_OR_RETURN(w->seg, ShmSegment::Create(r.gradient_segment, bytes));
    auto* h = new (w->seg.data()) GradSegmentHeader();
    h->magic = kGradMagic;
    h->layout_version = kShmLayoutVersion;
    h->num_slots = static_cast<uint32_t>(slots);
    h->slot_bytes = slot_bytes;
    h->num_layers = static_cast<uint32_t>(L);
    h->worker_id = r.worker_id;
    std::atomic<int64_t>* pins = GradPins(w->seg.data());
    for (size_t l = 0; l < L; ++l) new (&pins[l]) std::atomic<int64_t>(-1);
    for (int s = 0; s < slots; ++s) {
      h->slots[s].data_offset = GradHeaderBytes(L) + s * slot_bytes;
      w->slot_offset.push_back(h->slots[s].data_offset);
    }
    r.weight_segment = store_->shm_name();
    store_->AddPinSource(r.worker_id, pins, &h->pin_seq);
    ShmWorker* raw = w.get();
    w->consumer = std::thread([this, raw] { ConsumeLoop(raw); });
    shm_workers_.push_back(std::move(w));
  }
  WorkerInfo wi;
  wi.id = r.worker_id;
  wi.name = info.name.empty() ? info.hostname + ":" + std::to_string(info.pid) : info.name;
  wi.transport = r.transport;
  wi.state = "active";
  wi.step = start_step_;
  wi.last_seen = std::chrono::steady_clock::now();
  workers_.push_back(wi);
  L2L_LOG_INFO("worker {} '{}' registered ({})", r.worker_id, wi.name, r.transport);
  return r;
}

void EpsCore::ConsumeLoop(ShmWorker* w) {
  auto* h = static_cast<GradSegmentHeader*>(w->seg.data());
  char* base = static_cast<char*>(w->seg.data());
  while (!stopped_.load()) {
    const uint32_t seen = h->ready_seq.load(std::memory_order_acquire);
    bool any = false;
    for (uint32_t s = 0; s < h->num_slots; ++s) {
      GradSlotHeader& slot = h->slots[s];
      if (slot.state.load(std::memory_order_acquire) != kSlotReady) continue;
      any = true;
      slot.state.store(kSlotHeld, std::memory_order_relaxed);
      const int64_t layer = slot.layer, step = slot.step, numel = slot.numel;
      // The slot is freed exactly once, after any error about it was recorded: by the
      // pipeline's release (after the update) or below when Submit already released it.
      auto free_slot = [h, &slot] {
        slot.state.store(kSlotFree, std::memory_order_release);
        h->free_seq.fetch_add(1, std::memory_order_release);
        FutexWake(&h->free_seq);
      };
      auto phase = std::make_shared<std::atomic<int>>(0);  // 0 in Submit, 1 after, 2 released
      GradientRef ref;
      ref.worker_id = w->id;
      ref.micro_batches = slot.micro_batches;
      ref.release = [phase, free_slot] {
        if (phase->exchange(2) == 1) free_slot();
      };
      Status st;
      if (numel < 0 || static_cast<uint64_t>(numel) * sizeof(float) > h->slot_bytes) {
        st = InvalidArgument("gradient slot " + std::to_string(s) + " claims " + std::to_string(numel) +
                             " floats, more than the slot's " + std::to_string(h->slot_bytes / 4));
        ref.release();
      } else {
        ref.data = reinterpret_cast<const float*>(base + w->slot_offset[s]);
        ref.numel = static_cast<size_t>(numel);
        st = pipeline_->Submit(layer, step, std::move(ref));
      }
      if (!st.ok()) {
        L2L_LOG_WARN("worker {} shm gradient rejected: {}", w->id, st.ToString());
        if (h->error_code.load() == 0) {
          std::snprintf(h->error_message, sizeof(h->error_message), "%s", st.message().c_str());
          h->error_code.store(static_cast<uint32_t>(st.code()), std::memory_order_release);
        }
      }
      if (phase->exchange(1) == 2) free_slot();
    }
    if (!any) FutexWait(&h->ready_seq, seen, std::chrono::milliseconds(200));
  }
}

Status EpsCore::Heartbeat(int32_t worker_id, int64_t step, bool* stop) {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  workers_[worker_id].last_seen = std::chrono::steady_clock::now();
  workers_[worker_id].step = step;
  *stop = stopped_.load();
  return Status::Ok();
}

Result<int64_t> EpsCore::CopyLayer(int32_t worker_id, int64_t layer, int64_t min_version,
                                   std::chrono::milliseconds timeout, std::vector<char>* out,
                                   DType* dtype) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  }
  if (min_version < 0) return InvalidArgument("min_version=" + std::to_string(min_version) + " must be >= 0");
  L2L_ASSIGN_OR_RETURN(auto pin, store_->Acquire(layer, min_version, timeout));
  out->resize(pin.bytes());
  std::memcpy(out->data(), pin.data(), pin.bytes());
  *dtype = store_->publish_dtype();
  return pin.version();
}

Status EpsCore::SubmitGradient(int32_t worker_id, int64_t layer, int64_t step, int64_t micro_batches,
                               std::vector<float> grad) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  }
  auto owned = std::make_shared<std::vector<float>>(std::move(grad));
  GradientRef ref;
  ref.worker_id = worker_id;
  ref.data = owned->data();
  ref.numel = owned->size();
  ref.micro_batches = micro_batches;
  ref.release = [owned]() mutable { owned.reset(); };
  return pipeline_->Submit(layer, step, std::move(ref));
}

Status EpsCore::StepDone(int32_t worker_id, int64_t step, double loss, int64_t tokens,
                         const std::string& data_position, bool* stop) {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  WorkerInfo& w = workers_[worker_id];
  w.step = step + 1;
  w.last_loss = loss;
  w.data_position = data_position;
  w.last_seen = std::chrono::steady_clock::now();
  last_loss_sum_ += loss;
  last_tokens_ += tokens;
  if (++reported_in_step_ >= static_cast<int64_t>(workers_.size())) {
    const auto now = std::chrono::steady_clock::now();
    const double secs = std::chrono::duration<double>(now - step_start_).count();
    last_loss_ = last_loss_sum_ / static_cast<double>(reported_in_step_);
    tokens_per_s_ = secs > 0 ? static_cast<double>(last_tokens_) / secs : 0;
    L2L_LOG_INFO("step {} loss {:.4f} {:.0f} tokens/s", step, last_loss_, tokens_per_s_);
    last_loss_sum_ = 0;
    last_tokens_ = 0;
    reported_in_step_ = 0;
    step_start_ = now;
  }
  *stop = stopped_.load() || step + 1 >= job_.train.steps;
  return Status::Ok();
}

Status EpsCore::Deregister(int32_t worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  workers_[worker_id].state = "left";
  return Status::Ok();
}

void EpsCore::Stop() {
  if (stopped_.exchange(true)) return;
  if (store_) store_->Stop();
  std::vector<std::unique_ptr<ShmWorker>> shm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shm = std::move(shm_workers_);
  }
  for (auto& w : shm) {
    auto* h = static_cast<GradSegmentHeader*>(w->seg.data());
    h->closed.store(1);
    h->ready_seq.fetch_add(1);
    FutexWake(&h->ready_seq);
    h->free_seq.fetch_add(1);
    FutexWake(&h->free_seq);
    if (w->consumer.joinable()) w->consumer.join();
  }
  // The pipeline releases slots into the segments: destroy it while they still exist.
  pipeline_.reset();
  for (auto& w : shm) store_->RemovePinSource(w->id);
  shm.clear();   // unlinks the gradient segments
  store_.reset();  // unlinks the weight segment
}

CoreStatus EpsCore::GetStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  CoreStatus s;
  s.job_id = opts_.job_id;
  s.workers = workers_;
  if (stopped_) {
    s.state = "stopping";
  } else if (!has_job_) {
    s.state = "idle";
  } else {
    s.state = static_cast<int32_t>(workers_.size()) < opts_.expected_workers ? "waiting_workers" : "running";
  }
  if (has_job_ && store_) {
    s.total_steps = job_.train.steps;
    s.num_params = job_.model.NumParams();
    for (int64_t l = 0; l < store_->num_layers(); ++l) s.layer_version.push_back(store_->published_version(l));
    s.pipeline = pipeline_ ? pipeline_->stats() : PipelineStats{};
    s.step = s.pipeline.completed_step;
    s.state_bytes = store_->state_bytes();
    s.shm_bytes = store_->weight_segment_bytes();
  }
  s.host_budget = opts_.host_bytes;
  s.last_loss = last_loss_;
  s.tokens_per_s = tokens_per_s_;
  return s;
}

}  // namespace l2l::eps

// EpsClient over shared memory (same host). See eps_client_shm.h and the layouts in
// common/shm.h.
#include "worker/eps_client_shm.h"

#include <cstring>
#include <thread>

#include "common/fault_point.h"

namespace l2l::worker {
namespace {

WeightLayerEntry& Entry(const ShmSegment& seg, int64_t layer) {
  return WeightLayers(seg.data())[layer];
}

}  // namespace

Result<std::unique_ptr<ShmEpsClient>> ShmEpsClient::Create(ImplPtr impl, WorkerRegistration reg,
                                                           const ClientOptions& options, const ShmInfo& shm) {
  std::unique_ptr<ShmEpsClient> c(new ShmEpsClient(std::move(impl), std::move(reg), options));
  L2L_RETURN_IF_ERROR(c->MapSegments(shm));
  return c;
}

Status ShmEpsClient::MapSegments(const ShmInfo& shm) {
  L2L_ASSIGN_OR_RETURN(ShmSegment weights, ShmSegment::Open(shm.weight_segment, /*writable=*/false));
  L2L_ASSIGN_OR_RETURN(ShmSegment grads, ShmSegment::Open(shm.gradient_segment, /*writable=*/true));
  const auto* wh = static_cast<const WeightSegmentHeader*>(weights.data());
  const auto* gh = static_cast<const GradSegmentHeader*>(grads.data());
  if (wh->magic != kWeightMagic || wh->layout_version != kShmLayoutVersion ||
      wh->num_layers != shm.layer_numel.size() || wh->total_bytes > weights.size()) {
    return DataLoss("shm segment " + shm.weight_segment + " does not hold the expected weight layout");
  }
  if (gh->magic != kGradMagic || gh->layout_version != kShmLayoutVersion ||
      gh->num_layers != shm.layer_numel.size() || gh->num_slots > kMaxGradSlots) {
    return DataLoss("shm segment " + shm.gradient_segment + " does not hold the expected gradient layout");
  }
  std::lock_guard<std::mutex> lock(observer_mu_);
  // A page-locked range must be unlocked before it is unmapped (the old mappings go when
  // the new ones are moved in).
  if (observer_ != nullptr) {
    for (const HostRegion& r : Regions()) observer_->Unmapping(r);
  }
  weights_ = std::move(weights);
  grads_ = std::move(grads);
  layer_numel_ = shm.layer_numel;
  epoch_ = wh->epoch.load(std::memory_order_acquire);
  // The daemon just answered Register, so a pid that looks gone lives in another pid
  // namespace: then its death is noticed through the gRPC connection only.
  daemon_pid_ = ProcessGone(wh->owner_pid) ? 0 : wh->owner_pid;
  if (observer_ != nullptr) {
    for (const HostRegion& r : Regions()) observer_->Mapped(r);
  }
  return Status::Ok();
}

std::vector<HostRegion> ShmEpsClient::Regions() const {
  std::vector<HostRegion> out;
  if (weights_.data() != nullptr) {
    out.push_back(HostRegion{weights_.data(), weights_.size(), /*read_only=*/true, weights_.name()});
  }
  if (grads_.data() != nullptr) {
    out.push_back(HostRegion{grads_.data(), grads_.size(), /*read_only=*/false, grads_.name()});
  }
  return out;
}

ShmEpsClient::~ShmEpsClient() {
  std::lock_guard<std::mutex> lock(observer_mu_);
  if (observer_ != nullptr) {
    for (const HostRegion& r : Regions()) observer_->Unmapping(r);
  }
}

void ShmEpsClient::SetHostRegionObserver(HostRegionObserver* observer) {
  std::lock_guard<std::mutex> lock(observer_mu_);
  observer_ = observer;
  if (observer_ != nullptr) {
    for (const HostRegion& r : Regions()) observer_->Mapped(r);
  }
}

Status ShmEpsClient::Rejoin() {
  std::lock_guard<std::mutex> lock(push_mu_);
  ShmInfo shm;
  L2L_RETURN_IF_ERROR(RegisterAgain(&shm));
  if (reg_.transport != Transport::kShm) return Internal("rejoin: the EPS moved this worker off shared memory");
  return MapSegments(shm);
}

Result<LayerWeights> ShmEpsClient::AcquireLayer(int64_t layer, int64_t min_version,
                                                std::chrono::milliseconds timeout) {
  if (layer < 0 || layer >= static_cast<int64_t>(layer_numel_.size())) {
    return NotFound("layer " + std::to_string(layer) + " does not exist (model has " +
                    std::to_string(layer_numel_.size()) + " layers)");
  }
  auto* hdr = static_cast<WeightSegmentHeader*>(weights_.data());
  WeightLayerEntry& e = Entry(weights_, layer);
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  std::atomic<int64_t>& pin = GradPins(grads_.data())[layer];
  const DType dt = static_cast<DType>(hdr->dtype);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint32_t wake = hdr->wake_seq.load(std::memory_order_acquire);
    if (const uint32_t st = hdr->stopped.load(std::memory_order_acquire); st != 0) return StoppedStatus(st);
    if (hdr->epoch.load(std::memory_order_acquire) != epoch_) {
      rejoin_requested_ = true;
      return RejoinRequired(RejoinReason::kRolledBack,
                            "the EPS rolled the state back (a worker was lost mid-step); re-register to rejoin");
    }
    const uint32_t s = e.current.load(std::memory_order_acquire);
    const uint32_t q = e.seq[s].load(std::memory_order_acquire);
    const int64_t v = e.version[s].load(std::memory_order_acquire);
    if ((q & 1) == 0 && v >= min_version) {
      pin.store((v << 1) | s, std::memory_order_seq_cst);
      if (e.seq[s].load(std::memory_order_seq_cst) == q) {
        LayerWeights w;
        w.data = static_cast<const char*>(weights_.data()) + e.slot_offset[s];
        w.dtype = dt;
        w.numel = e.numel;
        w.version = v;
        if (e.frozen_bytes > 0) {  // written before the first publish, never again: no pin
          if (e.frozen_offset + e.frozen_bytes > weights_.size()) {
            ReleaseLayer(layer);
            return DataLoss("shm segment: layer " + std::to_string(layer) + "'s frozen record lies outside it");
          }
          w.frozen = static_cast<const char*>(weights_.data()) + e.frozen_offset;
          w.frozen_bytes = e.frozen_bytes;
        }
        return w;
      }
      pin.store(-1, std::memory_order_release);
      gh->pin_seq.fetch_add(1, std::memory_order_release);
      FutexWake(&gh->pin_seq);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    "layer " + std::to_string(layer) + " version " + std::to_string(min_version) +
                        " not published within " + std::to_string(timeout.count()) + " ms (newest " +
                        std::to_string(v) + ")");
    }
    L2L_RETURN_IF_ERROR(DaemonGone());
    FutexWait(&hdr->wake_seq, wake,
              std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(100)));
  }
}

void ShmEpsClient::ReleaseLayer(int64_t layer) {
  if (layer < 0 || layer >= static_cast<int64_t>(layer_numel_.size())) return;
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  GradPins(grads_.data())[layer].store(-1, std::memory_order_release);
  gh->pin_seq.fetch_add(1, std::memory_order_release);
  FutexWake(&gh->pin_seq);
}

Status ShmEpsClient::DaemonGone() const {
  if (!ProcessGone(daemon_pid_)) return Status::Ok();
  return Unavailable("the EPS daemon (pid " + std::to_string(daemon_pid_) +
                     ") is gone (killed or crashed) while this worker waited on it; restart the daemon "
                     "(l2l-eps --resume) and then the worker");
}

Status ShmEpsClient::SegmentClosed() {
  const auto* hdr = static_cast<const WeightSegmentHeader*>(weights_.data());
  if (const uint32_t st = hdr->stopped.load(std::memory_order_acquire); st != 0) return StoppedStatus(st);
  rejoin_requested_ = true;
  return RejoinRequired(RejoinReason::kDeclaredLost,
                        "the EPS closed this worker's gradient segment: it was declared lost (silent past the "
                        "heartbeat timeout) or replaced; re-register to rejoin");
}

Status ShmEpsClient::SlotError() const {
  const auto* gh = static_cast<const GradSegmentHeader*>(grads_.data());
  const uint32_t code = gh->error_code.load(std::memory_order_acquire);
  if (code == 0) return Status::Ok();
  const Status st(static_cast<StatusCode>(code),
                  "EPS rejected a gradient pushed through shared memory: " +
                      std::string(gh->error_message, strnlen(gh->error_message, sizeof(gh->error_message))));
  // A step abandoned or rolled back after another worker's loss: re-register and redo,
  // as over gRPC (the reason travels beside the message).
  const uint32_t why = gh->error_rejoin;
  return st.WithRejoinReason(why <= static_cast<uint32_t>(RejoinReason::kRolledBack) ? static_cast<RejoinReason>(why)
                                                                                  : RejoinReason::kNone);
}

Result<GradientSlot> ShmEpsClient::ClaimGradientSlot(int64_t layer, size_t numel) {
  std::lock_guard<std::mutex> lock(push_mu_);
  L2L_RETURN_IF_ERROR(SlotError());
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  if (numel * sizeof(float) > gh->slot_bytes) {
    return InvalidArgument("gradient of layer " + std::to_string(layer) + " has " + std::to_string(numel) +
                           " floats, more than a gradient slot holds (" + std::to_string(gh->slot_bytes / 4) +
                           ")");
  }
  for (;;) {
    if (gh->closed.load(std::memory_order_acquire)) return SegmentClosed();
    const uint32_t seen = gh->free_seq.load(std::memory_order_acquire);
    for (uint32_t s = 0; s < gh->num_slots; ++s) {
      GradSlotHeader& slot = gh->slots[s];
      if (slot.state.load(std::memory_order_acquire) != kSlotFree) continue;
      slot.state.store(kSlotFilling, std::memory_order_relaxed);
      GradientSlot out;
      out.data = static_cast<char*>(grads_.data()) + slot.data_offset;
      out.capacity = gh->slot_bytes;
      out.index = static_cast<int32_t>(s);
      return out;
    }
    L2L_RETURN_IF_ERROR(DaemonGone());
    FutexWait(&gh->free_seq, seen, std::chrono::milliseconds(200));
  }
}

Status ShmEpsClient::PublishGradientSlot(const GradientSlot& claimed, int64_t layer, int64_t step,
                                         int64_t micro_batches, size_t numel) {
  std::lock_guard<std::mutex> lock(push_mu_);
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  if (claimed.index < 0 || static_cast<uint32_t>(claimed.index) >= gh->num_slots ||
      gh->slots[claimed.index].state.load(std::memory_order_acquire) != kSlotFilling) {
    return FailedPrecondition("publishing gradient slot " + std::to_string(claimed.index) +
                              " of layer " + std::to_string(layer) + ", which was not claimed");
  }
  if (numel * sizeof(float) > claimed.capacity) {
    return InvalidArgument("gradient of layer " + std::to_string(layer) + " has " + std::to_string(numel) +
                           " floats, more than its slot holds (" + std::to_string(claimed.capacity / 4) + ")");
  }
  GradSlotHeader& slot = gh->slots[claimed.index];
  slot.layer = layer;
  slot.step = step;
  slot.micro_batches = micro_batches;
  slot.numel = static_cast<int64_t>(numel);
  slot.push_seq = ++push_seq_;
  // Release: the slot's bytes (written by memcpy or by a DMA the caller waited for) and
  // the fields above are visible to the EPS once it sees kReady.
  slot.state.store(kSlotReady, std::memory_order_release);
  gh->ready_seq.fetch_add(1, std::memory_order_release);
  FutexWake(&gh->ready_seq);
  return Status::Ok();
}

void ShmEpsClient::AbandonGradientSlot(const GradientSlot& claimed) {
  std::lock_guard<std::mutex> lock(push_mu_);
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  if (claimed.index < 0 || static_cast<uint32_t>(claimed.index) >= gh->num_slots) return;
  GradSlotHeader& slot = gh->slots[claimed.index];
  uint32_t filling = kSlotFilling;
  if (slot.state.compare_exchange_strong(filling, kSlotFree, std::memory_order_release)) {
    gh->free_seq.fetch_add(1, std::memory_order_release);  // wakes our own waiting claimers
    FutexWake(&gh->free_seq);
  }
}

Status ShmEpsClient::PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                                  size_t numel) {
  L2L_ASSIGN_OR_RETURN(GradientSlot slot, ClaimGradientSlot(layer, numel));
  const size_t half = numel / 2;
  std::memcpy(slot.data, grad, half * sizeof(float));
  FaultPoint("worker.push");  // tests: die with the slot claimed and half written
  std::memcpy(static_cast<float*>(slot.data) + half, grad + half, (numel - half) * sizeof(float));
  return PublishGradientSlot(slot, layer, step, micro_batches, numel);
}

Status ShmEpsClient::Drain(std::chrono::milliseconds timeout) {
  auto* gh = static_cast<GradSegmentHeader*>(grads_.data());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const uint32_t seen = gh->free_seq.load(std::memory_order_acquire);
    bool busy = false;
    for (uint32_t s = 0; s < gh->num_slots; ++s) {
      const uint32_t st = gh->slots[s].state.load(std::memory_order_acquire);
      // Held slots count too: a slot is freed only after its layer's update (or after its
      // error was recorded). In synchronous mode this costs nothing: the next step needs
      // layer 0's new version, which needs every held gradient consumed anyway.
      if (st != kSlotFree) busy = true;
    }
    if (!busy) return SlotError();
    if (gh->closed.load(std::memory_order_acquire)) return SegmentClosed();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return Status(StatusCode::kDeadlineExceeded, "EPS did not consume pushed gradients");
    L2L_RETURN_IF_ERROR(DaemonGone());
    FutexWait(&gh->free_seq, seen, std::chrono::milliseconds(20));
  }
}

Status ShmEpsClient::StepDone(const StepReport& report) {
  L2L_RETURN_IF_ERROR(Drain(std::chrono::seconds(60)));
  return GrpcEpsClient::StepDone(report);
}

}  // namespace l2l::worker

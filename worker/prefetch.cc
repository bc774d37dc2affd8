// LayerPrefetcher and GradientPusher: the relay's background copy engines. See prefetch.h.
#include "worker/prefetch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/fault_point.h"

namespace l2l::worker {
namespace {

using Clock = std::chrono::steady_clock;

// The mode a backend gets: direct on the CPU, async when it has copy queues, else staged.
CopyMode ModeFor(const kernels::Backend& backend) {
  if (backend.kind() == kernels::DeviceKind::kCpu && !backend.HasAsyncTransfers()) {
    return CopyMode::kDirect;
  }
  return backend.HasAsyncTransfers() ? CopyMode::kAsync : CopyMode::kStaged;
}

}  // namespace

const char* CopyModeName(CopyMode m) {
  switch (m) {
    case CopyMode::kDirect: return "direct";
    case CopyMode::kAsync: return "async";
    case CopyMode::kStaged: return "staged";
  }
  return "?";
}

// ---- LayerPrefetcher ------------------------------------------------------------------

Result<std::unique_ptr<LayerPrefetcher>> LayerPrefetcher::Create(EpsClient* client,
                                                                 kernels::Backend* backend,
                                                                 std::vector<size_t> layer_numel,
                                                                 int ring_slots, DType fetch_dtype,
                                                                 const HostRegionPinner* pinner,
                                                                 GroupRank group,
                                                                 std::vector<FrozenPlan> frozen) {
  if (layer_numel.size() < 2) return InvalidArgument("prefetcher needs at least 2 layers");
  if (ring_slots < 1) return InvalidArgument("prefetcher needs at least 1 ring slot");
  if (!frozen.empty() && frozen.size() != layer_numel.size()) {
    return InvalidArgument("prefetcher: " + std::to_string(frozen.size()) + " frozen plans for " +
                           std::to_string(layer_numel.size()) + " layers");
  }
  if (!frozen.empty() && group.active()) {
    return FailedPrecondition("prefetcher: a LoRA job's frozen base is not gathered across a device group");
  }
  std::unique_ptr<LayerPrefetcher> p(
      new LayerPrefetcher(client, backend, std::move(layer_numel), fetch_dtype, pinner, group));
  p->frozen_ = std::move(frozen);
  p->mode_ = ModeFor(*backend);
  p->direct_ = p->mode_ == CopyMode::kDirect;
  if (group.active() && p->mode_ != CopyMode::kAsync) {
    return FailedPrecondition("a device group needs a backend with copy queues (CUDA), got " +
                              backend->name());
  }
  // In a group a slot holds the padded layer (size * shard elements): the all-gather's.
  const int gsize = group.active() ? group.size : 1;
  size_t ring_capacity = 0;
  for (size_t l = 1; l < p->layer_numel_.size(); ++l)
    ring_capacity = std::max(ring_capacity, GroupPaddedNumel(p->layer_numel_[l], gsize));
  p->slots_.resize(static_cast<size_t>(ring_slots) + 1);
  for (size_t s = 0; s < p->slots_.size(); ++s) {
    Slot& slot = p->slots_[s];
    slot.capacity = s == 0 ? GroupPaddedNumel(p->layer_numel_[0], gsize) : ring_capacity;
    L2L_ASSIGN_OR_RETURN(slot.device,
                         kernels::DeviceBuffer::Create(backend, slot.capacity * sizeof(float)));
    if (p->mode_ == CopyMode::kStaged) slot.staging.resize(slot.capacity);
    if (p->mode_ == CopyMode::kDirect && fetch_dtype == DType::kBF16 && backend->TakesBf16Copies()) {
      slot.bits.resize(slot.capacity);
    }
    if (p->mode_ == CopyMode::kAsync) {
      if (DTypeSize(fetch_dtype) < sizeof(float)) {
        L2L_ASSIGN_OR_RETURN(slot.narrow, kernels::DeviceBuffer::Create(
                                              backend, slot.capacity * DTypeSize(fetch_dtype)));
      }
      L2L_ASSIGN_OR_RETURN(slot.ready, backend->CreateEvent());
      L2L_ASSIGN_OR_RETURN(slot.freed, backend->CreateEvent());
      size_t record = 0;  // the largest frozen record this slot receives
      for (size_t l = 0; l < p->frozen_.size(); ++l) {
        if ((l == 0) == (s == 0)) record = std::max(record, p->frozen_[l].bytes);
      }
      if (record > 0) {
        L2L_ASSIGN_OR_RETURN(slot.frozen, kernels::DeviceBuffer::Create(backend, record));
      }
    }
  }
  if (p->mode_ == CopyMode::kAsync) {
    size_t bounce = std::max(ring_capacity, p->slots_[0].capacity) * sizeof(float);
    for (size_t l = 0; l < p->frozen_.size(); ++l) {  // a record, then the trainable span in fp32
      const FrozenPlan& f = p->frozen_[l];
      if (f.bytes > 0) bounce = std::max(bounce, f.bytes + f.trainable.numel * sizeof(float));
    }
    L2L_ASSIGN_OR_RETURN(p->bounce_, backend->AllocHost(bounce));
    L2L_ASSIGN_OR_RETURN(p->copy_, backend->CreateCopyQueue());
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

LayerPrefetcher::~LayerPrefetcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

size_t LayerPrefetcher::device_bytes() const {
  size_t b = 0;
  for (const Slot& s : slots_) b += s.device.bytes() + s.narrow.bytes() + s.frozen.bytes();
  return b;
}

int LayerPrefetcher::FreeSlotFor(int64_t layer) const {
  if (layer == 0) return slots_[0].free ? 0 : -1;
  for (size_t s = 1; s < slots_.size(); ++s) {
    if (slots_[s].free) return static_cast<int>(s);
  }
  return -1;
}

void LayerPrefetcher::Begin(std::vector<int64_t> schedule, int64_t min_version,
                            std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    L2L_CHECK(take_idx_ == items_.size()) << "Begin() before the previous schedule was consumed";
    items_.clear();
    for (int64_t layer : schedule) {
      L2L_CHECK(layer >= 0 && layer < static_cast<int64_t>(layer_numel_.size())) << "layer " << layer;
      Item it;
      it.layer = layer;
      items_.push_back(std::move(it));
    }
    fetch_idx_ = 0;
    take_idx_ = 0;
    min_version_ = min_version;
    timeout_ = timeout;
  }
  cv_.notify_all();
}

void LayerPrefetcher::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] {
      return stop_ || (fetch_idx_ < items_.size() && FreeSlotFor(items_[fetch_idx_].layer) >= 0);
    });
    if (stop_) return;
    const size_t i = fetch_idx_++;
    const int slot = FreeSlotFor(items_[i].layer);
    slots_[slot].free = false;
    const int64_t layer = items_[i].layer, min_version = min_version_;
    const auto timeout = timeout_;
    in_flight_ = true;
    lk.unlock();
    Result<int64_t> version = Fetch(layer, min_version, timeout, slot);
    lk.lock();
    in_flight_ = false;
    Item& it = items_[i];
    if (version.ok()) {
      it.state = ItemState::kReady;
      it.slot = slot;
      it.version = *version;
    } else {
      it.state = ItemState::kFailed;
      it.status = version.status();
      slots_[slot].free = true;
      fetch_idx_ = items_.size();  // nothing after a failure
    }
    cv_.notify_all();
  }
}

Result<int64_t> LayerPrefetcher::Fetch(int64_t layer, int64_t min_version,
                                       std::chrono::milliseconds timeout, int slot) {
  L2L_ASSIGN_OR_RETURN(LayerWeights w, client_->AcquireLayer(layer, min_version, timeout));
  FaultPoint("worker.fetch");  // tests: die holding the layer
  const size_t want = layer_numel_[static_cast<size_t>(layer)];
  if (!frozen_.empty() && frozen_[static_cast<size_t>(layer)].bytes > 0) {
    const FrozenPlan& plan = frozen_[static_cast<size_t>(layer)];
    if (w.frozen == nullptr || w.frozen_bytes != plan.bytes || w.numel != plan.trainable.numel ||
        (w.data == nullptr && w.numel > 0)) {
      client_->ReleaseLayer(layer);
      return DataLoss("EPS sent layer " + std::to_string(layer) + " with a frozen record of " +
                      std::to_string(w.frozen_bytes) + " bytes and " + std::to_string(w.numel) +
                      " trainable elements; the job's LoRA layout says " + std::to_string(plan.bytes) + " and " +
                      std::to_string(plan.trainable.numel));
    }
    Slot& s = slots_[static_cast<size_t>(slot)];
    if (mode_ == CopyMode::kAsync) {
      L2L_RETURN_IF_ERROR(FetchAsyncFrozen(layer, w, plan, s));  // releases the layer
      return w.version;
    }
    float* dst = direct_ ? s.device.f32() : s.staging.data();
    s.narrow_is_bf16_layer = false;  // a frozen record: no bf16 copy of the whole layer
    DecodeFrozen(plan, static_cast<const uint8_t*>(w.frozen), dst);
    if (plan.trainable.numel > 0) ConvertToFloat(w.data, w.dtype, dst + plan.trainable.offset, plan.trainable.numel);
    client_->ReleaseLayer(layer);
    return w.version;
  }
  if (w.numel != want || w.data == nullptr) {
    client_->ReleaseLayer(layer);
    return DataLoss("EPS sent layer " + std::to_string(layer) + " with " + std::to_string(w.numel) +
                    " elements, the model spec says " + std::to_string(want));
  }
  Slot& s = slots_[static_cast<size_t>(slot)];  // this slot is ours until the item is released
  if (mode_ == CopyMode::kAsync) {
    L2L_RETURN_IF_ERROR(FetchAsync(layer, w, s));  // releases the layer
    return w.version;
  }
  ConvertToFloat(w.data, w.dtype, direct_ ? s.device.f32() : s.staging.data(), want);
  // Direct mode, published bf16: keep the bits for the backend's bf16 GEMMs (one copy of
  // half the layer's fp32 bytes, instead of a cast per use).
  s.narrow_is_bf16_layer = !s.bits.empty() && w.dtype == DType::kBF16;
  if (s.narrow_is_bf16_layer) std::memcpy(s.bits.data(), w.data, want * sizeof(uint16_t));
  client_->ReleaseLayer(layer);
  return w.version;
}

Status LayerPrefetcher::FetchAsync(int64_t layer, const LayerWeights& w, Slot& s) {
  const size_t n = w.numel;
  const size_t bytes = n * DTypeSize(w.dtype);
  // This device's part [b, e) of the layer: all of it alone, its shard in a group.
  const size_t shard = group_.active() ? GroupShardNumel(n, group_.size) : n;
  const size_t b = group_.active() ? std::min(n, static_cast<size_t>(group_.rank) * shard) : 0;
  const size_t e = std::min(n, b + shard);
  const size_t es = DTypeSize(w.dtype);
  const char* mine = static_cast<const char*>(w.data) + b * es;  // as published
  // Widen on the device when the slot has a buffer for this dtype (the publish dtype);
  // an unexpected narrow dtype is widened on the host into the bounce buffer instead.
  const bool device_widen = w.dtype != DType::kF32 && w.dtype == fetch_dtype_ &&
                            s.narrow.data() != nullptr;
  const bool pinned = (w.dtype == DType::kF32 || device_widen) && pinner_ != nullptr &&
                      pinner_->Covers(w.data, bytes);
  // What is copied from the host: this device's part, as published (narrow) or fp32.
  const size_t up_es = device_widen ? es : sizeof(float);
  // The compute stream may still read this slot's previous layer: copies into it start
  // after the compute work queued before its Release().
  copy_->WaitFor(s.freed.get());
  const void* src = w.data;
  bool held = true;  // the EPS's view is still read by a queued copy
  if (!pinned) {
    // Bounce: one host copy into pinned memory, then the DMA reads that; the EPS's view
    // can go at once. The previous fetch's DMA out of the bounce buffer was waited for.
    // The bounce buffer is laid out as the whole layer; only [b, e) is filled.
    char* bounce_mine = static_cast<char*>(bounce_.data()) + b * up_es;
    if (device_widen) {
      std::memcpy(bounce_mine, mine, (e - b) * es);
    } else {
      ConvertToFloat(mine, w.dtype, reinterpret_cast<float*>(bounce_mine), e - b);
    }
    client_->ReleaseLayer(layer);
    held = false;
    src = bounce_.data();
    bounced_fetches_.fetch_add(1);
  } else {
    pinned_fetches_.fetch_add(1);
  }
  const char* src_mine = static_cast<const char*>(src) + b * up_es;
  Status st;
  char* dst = static_cast<char*>(device_widen ? s.narrow.data() : s.device.data());
  copy_->CopyToDevice(dst + b * up_es, src_mine, (e - b) * up_es);
  if (group_.active()) {
    // The other devices' parts, over the device links, in place (padded to size * shard).
    st = group_.collective->AllGather(dst, shard, device_widen ? w.dtype : DType::kF32, copy_.get());
  }
  if (device_widen && st.ok()) {
    st = copy_->WidenToF32(s.device.f32(), s.narrow.data(), w.dtype, static_cast<int64_t>(n));
  }
  s.narrow_is_bf16_layer = device_widen && w.dtype == DType::kBF16 && st.ok();
  return CompleteFetch(layer, s, held, st, "widening or gathering");
}

Status LayerPrefetcher::CompleteFetch(int64_t layer, Slot& s, bool held, const Status& queued, const char* what) {
  copy_->Record(s.ready.get());
  // Wait here, on the prefetch thread, so the EPS's view (or the bounce buffer) is free
  // again before the next fetch; the compute thread never blocks on a copy.
  Status done = s.ready->Wait();
  if (held) client_->ReleaseLayer(layer);
  L2L_RETURN_IF_ERROR(queued.WithContext(std::string(what) + " layer " + std::to_string(layer) + " on the device"));
  return done.WithContext("copying layer " + std::to_string(layer) + " to the device");
}

Status LayerPrefetcher::FetchAsyncFrozen(int64_t layer, const LayerWeights& w, const FrozenPlan& plan, Slot& s) {
  const size_t tn = plan.trainable.numel, es = DTypeSize(w.dtype);
  const bool device_widen = w.dtype != DType::kF32 && w.dtype == fetch_dtype_ && s.narrow.data() != nullptr;
  s.narrow_is_bf16_layer = false;  // narrow holds the trainable span only
  const bool pinned = pinner_ != nullptr && pinner_->Covers(w.frozen, w.frozen_bytes) &&
                      (tn == 0 || ((w.dtype == DType::kF32 || device_widen) && pinner_->Covers(w.data, tn * es)));
  const size_t up_es = device_widen ? es : sizeof(float);  // the trainable span as copied up
  copy_->WaitFor(s.freed.get());
  const void* record = w.frozen;
  const void* trainable = w.data;
  bool held = true;
  if (!pinned) {
    // Bounce: [record][trainable span, as published or fp32], then the DMA reads that.
    char* b = static_cast<char*>(bounce_.data());
    std::memcpy(b, w.frozen, w.frozen_bytes);
    if (tn == 0) {  // nothing of the layer trains (w.data may be null)
    } else if (device_widen) {
      std::memcpy(b + plan.bytes, w.data, tn * es);
    } else {
      ConvertToFloat(w.data, w.dtype, reinterpret_cast<float*>(b + plan.bytes), tn);
    }
    client_->ReleaseLayer(layer);
    held = false;
    record = b;
    trainable = b + plan.bytes;
    bounced_fetches_.fetch_add(1);
  } else {
    pinned_fetches_.fetch_add(1);
  }
  float* out = s.device.f32();
  copy_->CopyToDevice(s.frozen.data(), record, plan.bytes);
  Status st;
  if (tn > 0) {
    if (device_widen) {
      copy_->CopyToDevice(s.narrow.data(), trainable, tn * up_es);
      st = copy_->WidenToF32(out + plan.trainable.offset, s.narrow.data(), w.dtype, static_cast<int64_t>(tn));
    } else {
      copy_->CopyToDevice(out + plan.trainable.offset, trainable, tn * sizeof(float));
    }
  }
  const char* dev_record = static_cast<const char*>(s.frozen.data());
  for (const FrozenPiece& p : plan.pieces) {
    if (!st.ok()) break;
    const void* src = dev_record + p.byte_offset;
    const int64_t n = static_cast<int64_t>(p.numel);
    switch (p.enc) {
      case FrozenEncoding::kF32: st = copy_->WidenToF32(out + p.offset, src, DType::kF32, n); break;
      case FrozenEncoding::kBF16: st = copy_->WidenToF32(out + p.offset, src, DType::kBF16, n); break;
      case FrozenEncoding::kNf4: st = copy_->DequantizeBlocks(out + p.offset, src, QuantFormat::kNf4, n); break;
      case FrozenEncoding::kQ8_0: st = copy_->DequantizeBlocks(out + p.offset, src, QuantFormat::kQ8_0, n); break;
    }
  }
  return CompleteFetch(layer, s, held, st, "decoding the frozen base of");
}

Result<ResidentLayer> LayerPrefetcher::Next(double* waited_s) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  L2L_CHECK(take_idx_ < items_.size()) << "Next() past the end of the schedule";
  cv_.wait(lk, [&] { return items_[take_idx_].state != ItemState::kPending; });
  Item& it = items_[take_idx_];
  if (it.state == ItemState::kFailed) {
    Status st = it.status.WithContext("fetching layer " + std::to_string(it.layer));
    take_idx_ = items_.size();
    fetch_idx_ = items_.size();
    lk.unlock();
    if (waited_s) *waited_s += Seconds(t0, Clock::now());
    return st;
  }
  ++take_idx_;
  ResidentLayer r;
  r.layer = it.layer;
  r.slot = it.slot;
  r.version = it.version;
  r.numel = layer_numel_[static_cast<size_t>(it.layer)];
  Slot& s = slots_[static_cast<size_t>(it.slot)];
  r.params = s.device.f32();
  lk.unlock();
  if (waited_s) *waited_s += Seconds(t0, Clock::now());
  if (mode_ == CopyMode::kStaged) {
    backend_->CopyToDevice(s.device.data(), s.staging.data(), r.numel * sizeof(float));
  } else if (mode_ == CopyMode::kAsync) {
    // The fill is complete (the prefetch thread waited for it); the stream wait keeps the
    // order explicit on the device as well and costs nothing.
    backend_->WaitEvent(s.ready.get());
    // The bits stay put until Release(): the next fill of this slot waits for "freed".
    if (s.narrow_is_bf16_layer) {
      backend_->NoteBf16Copy(r.params, static_cast<const uint16_t*>(s.narrow.data()), static_cast<int64_t>(r.numel));
    }
  } else if (direct_ && s.narrow_is_bf16_layer) {
    backend_->NoteBf16Copy(r.params, s.bits.data(), static_cast<int64_t>(r.numel));  // kept until Release()
  }
  return r;
}

void LayerPrefetcher::Release(const ResidentLayer& r) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    L2L_CHECK(r.slot >= 0 && r.slot < static_cast<int>(slots_.size()) && !slots_[r.slot].free)
        << "Release of slot " << r.slot << " that is not held";
    // Async: the next copy into this slot waits for the compute work queued so far (the
    // last kernels reading it). Recorded before the slot is marked free, under mu_, so the
    // prefetch thread's WaitFor sees this record.
    backend_->ForgetBf16Copy(r.params);
    if (mode_ == CopyMode::kAsync) backend_->RecordEvent(slots_[r.slot].freed.get());
    slots_[r.slot].free = true;
  }
  cv_.notify_all();
}

void LayerPrefetcher::Cancel() {
  std::unique_lock<std::mutex> lk(mu_);
  fetch_idx_ = items_.size();
  cv_.wait(lk, [&] { return !in_flight_; });
  take_idx_ = items_.size();
  for (Slot& s : slots_) {
    // A slot the relay still held may be read by queued compute work: later copies into
    // it wait for everything queued so far.
    if (!s.free) backend_->ForgetBf16Copy(s.device.f32());
    if (mode_ == CopyMode::kAsync && !s.free) backend_->RecordEvent(s.freed.get());
    s.free = true;
  }
  cv_.notify_all();
}

// ---- GradientPusher -------------------------------------------------------------------

Result<std::unique_ptr<GradientPusher>> GradientPusher::Create(EpsClient* client,
                                                               kernels::Backend* backend,
                                                               size_t max_numel,
                                                               const HostRegionPinner* pinner,
                                                               GroupRank group) {
  std::unique_ptr<GradientPusher> p(new GradientPusher(client, backend, pinner, group));
  p->mode_ = ModeFor(*backend);
  p->direct_ = p->mode_ == CopyMode::kDirect;
  if (group.active() && (p->mode_ != CopyMode::kAsync || group.sink == nullptr)) {
    return FailedPrecondition("a device group's pusher needs a backend with copy queues (CUDA) "
                              "and a shard sink, got " + backend->name());
  }
  if (p->mode_ == CopyMode::kStaged) p->staging_.assign(2, std::vector<float>(max_numel));
  if (p->mode_ == CopyMode::kAsync) {
    L2L_ASSIGN_OR_RETURN(p->pinned_staging_, backend->AllocHost(max_numel * sizeof(float)));
    L2L_ASSIGN_OR_RETURN(p->copied_, backend->CreateEvent());
    L2L_ASSIGN_OR_RETURN(p->copy_, backend->CreateCopyQueue());
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

GradientPusher::~GradientPusher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

// L2L_TEST_NAN_GRADIENT=LAYER:STEP (common/env.h): the pushed gradient of that layer at
// that step gets a NaN in its first element, so tests can make the non-finite guard fire
// on one layer (one shard of a sharded job) only. Read once.
bool PoisonedPush(int64_t layer, int64_t step) {
  static const std::pair<int64_t, int64_t> at = [] {
    const std::string v = EnvString(EnvVar::kTestNanGradient);
    long long l = -1, s = -1;
    if (!v.empty() && std::sscanf(v.c_str(), "%lld:%lld", &l, &s) != 2) {
      L2L_LOG_WARN("L2L_TEST_NAN_GRADIENT='{}': expected LAYER:STEP; ignored", v);
      l = s = -1;
    }
    return std::make_pair(static_cast<int64_t>(l), static_cast<int64_t>(s));
  }();
  if (at.first < 0 || layer != at.first || step != at.second) return false;
  L2L_LOG_WARN("L2L_TEST_NAN_GRADIENT: a NaN in the gradient of layer {} at step {}", layer, step);
  return true;
}

}  // namespace

void GradientPusher::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left to push
    Job job = queue_.front();
    // After an error the rest is skipped; but a group's device still joins every
    // reduce-scatter (its peers wait for it there), and the group drops the shards.
    const bool skip = !first_error_.ok() && !group_.active();
    lk.unlock();
    Status st;
    if (!skip && mode_ != CopyMode::kAsync && job.numel > 0 && PoisonedPush(job.layer, job.step)) {
      std::vector<float> poisoned(job.grad, job.grad + job.numel);
      poisoned[0] = std::numeric_limits<float>::quiet_NaN();
      st = client_->PushGradient(job.layer, job.step, job.micro_batches, poisoned.data(), job.numel);
    } else if (!skip) {
      st = mode_ == CopyMode::kAsync
               ? PushAsync(job)
               : client_->PushGradient(job.layer, job.step, job.micro_batches, job.grad, job.numel);
    }
    lk.lock();
    queue_.pop_front();
    if (job.ready != nullptr) free_events_.push_back(job.ready);
    if (!st.ok() && first_error_.ok()) {
      first_error_ = st.WithContext("pushing the gradient of layer " + std::to_string(job.layer) +
                                    " for step " + std::to_string(job.step));
    }
    done_ = job.ticket + 1;
    cv_.notify_all();
  }
}

Status GradientPusher::PushGroupShard(const Job& job) {
  const size_t shard = GroupShardNumel(job.numel, group_.size);
  const size_t b = std::min(job.numel, static_cast<size_t>(group_.rank) * shard);
  const size_t e = std::min(job.numel, b + shard);
  const size_t bytes = (e - b) * sizeof(float);
  copy_->WaitFor(job.ready);  // the compute work that wrote the gradient
  // Sum every device's gradient into this device's shard, in place (the relay does not
  // touch the buffer before Wait(ticket)).
  Status st = group_.collective->ReduceScatterSum(const_cast<float*>(job.grad), shard, copy_.get())
                  .WithContext("reduce-scattering the gradient of layer " + std::to_string(job.layer));
  Result<float*> whole = group_.sink->ShardBuffer(job.layer, job.step, job.numel);
  if (!whole.ok()) {
    // The collective was queued: let it finish before the error goes up.
    copy_->Record(copied_.get());
    copied_->Wait().IgnoreError();
    return whole.status();
  }
  float* dst = *whole + b;
  // Straight into the EPS's slot when it is page-locked; else through pinned staging.
  const bool direct = pinner_ != nullptr && bytes > 0 && pinner_->Covers(dst, bytes);
  if (st.ok() && bytes > 0) copy_->CopyToHost(direct ? static_cast<void*>(dst) : pinned_staging_.data(), job.grad + b, bytes);
  copy_->Record(copied_.get());
  if (st.ok()) st = copied_->Wait().WithContext("reduce-scattering and copying the gradient of layer " +
                                                std::to_string(job.layer) + " to the host");
  else copied_->Wait().IgnoreError();
  if (st.ok() && !direct && bytes > 0) std::memcpy(dst, pinned_staging_.data(), bytes);
  if (st.ok()) (direct ? slot_pushes_ : staged_pushes_).fetch_add(1);
  Status done = group_.sink->ShardDone(job.layer, job.step, job.micro_batches, st.ok());
  return st.ok() ? done : st;
}

Status GradientPusher::PushAsync(const Job& job) {
  if (group_.active()) return PushGroupShard(job);
  const size_t bytes = job.numel * sizeof(float);
  GradientSlot slot;
  if (client_->HasGradientSlots()) {
    L2L_ASSIGN_OR_RETURN(slot, client_->ClaimGradientSlot(job.layer, job.numel));
  }
  // Straight into the shm slot when it is page-locked; else into pinned staging.
  const bool into_slot = slot.data != nullptr && pinner_ != nullptr && pinner_->Covers(slot.data, bytes);
  void* dst = into_slot ? slot.data : pinned_staging_.data();  // Submit checked the size
  copy_->WaitFor(job.ready);  // the compute work that wrote the gradient
  copy_->CopyToHost(dst, job.grad, bytes);
  copy_->Record(copied_.get());
  // The completion wait: the EPS is told only after the bytes landed.
  Status st = copied_->Wait();
  if (!st.ok()) {
    if (slot.data != nullptr) client_->AbandonGradientSlot(slot);
    return st.WithContext("copying the gradient of layer " + std::to_string(job.layer) + " to the host");
  }
  if (bytes > 0 && PoisonedPush(job.layer, job.step)) static_cast<float*>(dst)[0] = std::numeric_limits<float>::quiet_NaN();
  if (slot.data != nullptr) {
    if (!into_slot) std::memcpy(slot.data, dst, bytes);
    (into_slot ? slot_pushes_ : staged_pushes_).fetch_add(1);
    return client_->PublishGradientSlot(slot, job.layer, job.step, job.micro_batches, job.numel);
  }
  staged_pushes_.fetch_add(1);
  return client_->PushGradient(job.layer, job.step, job.micro_batches,
                               static_cast<const float*>(dst), job.numel);
}

Result<int64_t> GradientPusher::Submit(int64_t layer, int64_t step, int64_t micro_batches,
                                       const float* grad, size_t numel, double* waited_s) {
  int64_t ticket;
  kernels::Event* ready = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = next_ticket_++;
    if (mode_ == CopyMode::kAsync && !free_events_.empty()) {
      ready = free_events_.back();
      free_events_.pop_back();
    }
  }
  const float* host = grad;
  if (mode_ == CopyMode::kAsync) {
    L2L_CHECK(numel * sizeof(float) <= pinned_staging_.bytes())
        << "gradient of " << numel << " floats > pinned staging " << pinned_staging_.bytes() << " bytes";
    if (ready == nullptr) {  // all in use: one more (a handful per relay at most)
      Result<std::unique_ptr<kernels::Event>> e = backend_->CreateEvent();
      if (!e.ok()) return e.status().WithContext("gradient pusher");
      events_.push_back(std::move(e).value());
      ready = events_.back().get();
    }
    backend_->RecordEvent(ready);  // after the compute work that writes `grad`
  } else if (!direct_) {
    // Staging buffer ticket%2 was last used by ticket-2: wait for that push to finish.
    if (ticket >= 2) {
      Status st = Wait(ticket - 2, waited_s);
      if (!st.ok()) return st;
    }
    std::vector<float>& buf = staging_[static_cast<size_t>(ticket % 2)];
    L2L_CHECK(numel <= buf.size()) << "gradient of " << numel << " floats > staging " << buf.size();
    backend_->CopyToHost(buf.data(), grad, numel * sizeof(float));
    host = buf.data();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(Job{ticket, layer, step, micro_batches, host, numel, ready});
  }
  cv_.notify_all();
  return ticket;
}

void GradientPusher::ClearError() {
  std::lock_guard<std::mutex> lk(mu_);
  first_error_ = Status::Ok();
}

Status GradientPusher::Wait(int64_t ticket, double* waited_s) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_ > ticket; });
  Status st = first_error_;
  lk.unlock();
  if (waited_s) *waited_s += Seconds(t0, Clock::now());
  return st;
}

Status GradientPusher::WaitAll(double* waited_s) {
  int64_t last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = next_ticket_ - 1;
  }
  if (last < 0) return Status::Ok();
  return Wait(last, waited_s);
}

}  // namespace l2l::worker

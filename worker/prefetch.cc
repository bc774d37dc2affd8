// LayerPrefetcher and GradientPusher: the relay's background copy engines. See prefetch.h.
#include "worker/prefetch.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/dtype.h"

namespace l2l::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// ---- LayerPrefetcher ------------------------------------------------------------------

Result<std::unique_ptr<LayerPrefetcher>> LayerPrefetcher::Create(EpsClient* client,
                                                                 kernels::Backend* backend,
                                                                 std::vector<size_t> layer_numel,
                                                                 int ring_slots) {
  if (layer_numel.size() < 2) return InvalidArgument("prefetcher needs at least 2 layers");
  if (ring_slots < 1) return InvalidArgument("prefetcher needs at least 1 ring slot");
  std::unique_ptr<LayerPrefetcher> p(new LayerPrefetcher(client, backend, std::move(layer_numel)));
  p->direct_ = backend->kind() == kernels::DeviceKind::kCpu;
  const size_t ring_capacity =
      *std::max_element(p->layer_numel_.begin() + 1, p->layer_numel_.end());
  p->slots_.resize(static_cast<size_t>(ring_slots) + 1);
  for (size_t s = 0; s < p->slots_.size(); ++s) {
    Slot& slot = p->slots_[s];
    slot.capacity = s == 0 ? p->layer_numel_[0] : ring_capacity;
    L2L_ASSIGN_OR_RETURN(slot.device,
                         kernels::DeviceBuffer::Create(backend, slot.capacity * sizeof(float)));
    if (!p->direct_) slot.staging.resize(slot.capacity);
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
  for (const Slot& s : slots_) b += s.device.bytes();
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
  const size_t want = layer_numel_[static_cast<size_t>(layer)];
  if (w.numel != want || w.data == nullptr) {
    client_->ReleaseLayer(layer);
    return DataLoss("EPS sent layer " + std::to_string(layer) + " with " + std::to_string(w.numel) +
                    " elements, the model spec says " + std::to_string(want));
  }
  Slot& s = slots_[static_cast<size_t>(slot)];  // this slot is ours until the item is released
  ConvertToFloat(w.data, w.dtype, direct_ ? s.device.f32() : s.staging.data(), want);
  client_->ReleaseLayer(layer);
  return w.version;
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
  if (!direct_) backend_->CopyToDevice(s.device.data(), s.staging.data(), r.numel * sizeof(float));
  return r;
}

void LayerPrefetcher::Release(const ResidentLayer& r) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    L2L_CHECK(r.slot >= 0 && r.slot < static_cast<int>(slots_.size()) && !slots_[r.slot].free)
        << "Release of slot " << r.slot << " that is not held";
    slots_[r.slot].free = true;
  }
  cv_.notify_all();
}

void LayerPrefetcher::Cancel() {
  std::unique_lock<std::mutex> lk(mu_);
  fetch_idx_ = items_.size();
  cv_.wait(lk, [&] { return !in_flight_; });
  take_idx_ = items_.size();
  for (Slot& s : slots_) s.free = true;
  cv_.notify_all();
}

// ---- GradientPusher -------------------------------------------------------------------

Result<std::unique_ptr<GradientPusher>> GradientPusher::Create(EpsClient* client,
                                                               kernels::Backend* backend,
                                                               size_t max_numel) {
  std::unique_ptr<GradientPusher> p(new GradientPusher(client, backend));
  p->direct_ = backend->kind() == kernels::DeviceKind::kCpu;
  if (!p->direct_) p->staging_.assign(2, std::vector<float>(max_numel));
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

void GradientPusher::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left to push
    Job job = queue_.front();
    const bool skip = !first_error_.ok();
    lk.unlock();
    Status st = skip ? Status::Ok()
                     : client_->PushGradient(job.layer, job.step, job.micro_batches, job.host_grad,
                                             job.numel);
    lk.lock();
    queue_.pop_front();
    if (!st.ok() && first_error_.ok()) {
      first_error_ = st.WithContext("pushing the gradient of layer " + std::to_string(job.layer) +
                                    " for step " + std::to_string(job.step));
    }
    done_ = job.ticket + 1;
    cv_.notify_all();
  }
}

Result<int64_t> GradientPusher::Submit(int64_t layer, int64_t step, int64_t micro_batches,
                                       const float* grad, size_t numel, double* waited_s) {
  int64_t ticket;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = next_ticket_++;
  }
  const float* host = grad;
  if (!direct_) {
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
    queue_.push_back(Job{ticket, layer, step, micro_batches, host, numel});
  }
  cv_.notify_all();
  return ticket;
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

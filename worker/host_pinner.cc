// HostRegionPinner: page-locks shared EPS regions on the worker's backend. See host_pinner.h.
#include "worker/host_pinner.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/logging.h"

namespace l2l::worker {

HostRegionPinner::~HostRegionPinner() {
  std::vector<Pinned> pinned;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pinned.swap(pinned_);
  }
  pinned.clear();  // unpins, outside the lock
}

void HostRegionPinner::Mapped(const HostRegion& region) {
  Attempt a;
  a.name = region.name;
  a.bytes = region.bytes;
  a.read_only = region.read_only;
  const auto t0 = std::chrono::steady_clock::now();
  Result<std::unique_ptr<kernels::HostPin>> pin =
      region.data == nullptr || region.bytes == 0
          ? Result<std::unique_ptr<kernels::HostPin>>(InvalidArgument("empty region"))
          : backend_->PinHostRange(region.data, region.bytes, region.read_only);
  a.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (pin.ok()) {
    a.pinned = true;
    L2L_LOG_INFO("page-locked shm segment {} ({:.1f} MiB{}) on {} in {:.3f} s: copies run by DMA "
                 "straight {} it",
                 region.name, static_cast<double>(region.bytes) / (1 << 20),
                 region.read_only ? ", read-only" : "", backend_->name(), a.seconds,
                 region.read_only ? "out of" : "into");
  } else {
    a.error = pin.status().ToString();
    L2L_LOG_WARN("cannot page-lock shm segment {} ({:.1f} MiB{}) on {}: {}; its copies go "
                 "through a pinned bounce buffer instead (one extra host memcpy per {})",
                 region.name, static_cast<double>(region.bytes) / (1 << 20),
                 region.read_only ? ", read-only" : "", backend_->name(), a.error,
                 region.read_only ? "layer fetch" : "gradient push");
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (pin.ok()) {
    const char* b = static_cast<const char*>(region.data);
    pinned_.push_back(Pinned{b, b + region.bytes, std::move(pin).value()});
  }
  attempts_.push_back(std::move(a));
}

void HostRegionPinner::Unmapping(const HostRegion& region) {
  std::unique_ptr<kernels::HostPin> gone;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const char* b = static_cast<const char*>(region.data);
    auto it = std::find_if(pinned_.begin(), pinned_.end(), [&](const Pinned& p) {
      return p.begin == b && p.end == b + region.bytes;
    });
    if (it == pinned_.end()) return;  // it was never pinned (the failure was logged)
    gone = std::move(it->pin);
    pinned_.erase(it);
  }
  gone.reset();  // unpins before the caller unmaps
}

bool HostRegionPinner::Covers(const void* p, size_t bytes) const {
  const char* b = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lk(mu_);
  for (const Pinned& r : pinned_) {
    if (b >= r.begin && b <= r.end && bytes <= static_cast<size_t>(r.end - b)) return true;
  }
  return false;
}

std::vector<HostRegionPinner::Attempt> HostRegionPinner::attempts() const {
  std::lock_guard<std::mutex> lk(mu_);
  return attempts_;
}

}  // namespace l2l::worker

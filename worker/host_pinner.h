// HostRegionPinner: page-locks the host memory an EPS transport shares with this worker
// (the shm client's weight and gradient segments, worker/eps_client.h HostRegion) on the
// worker's backend, so the relay's copy queues DMA straight out of the published weights
// and straight into the gradient slots. It is the EpsClient's HostRegionObserver: pins a
// region when it is mapped, unpins it before it is unmapped (Rejoin maps new segments).
//
// Pinning may fail (the device cannot register read-only mappings, memlock limits, a
// backend with nothing to pin): the region then stays unpinned, a warning says why, and
// the prefetcher / pusher stage such copies through a pinned bounce buffer instead
// (Covers() tells them which case they are in).
//
// Ownership: borrows the Backend (must outlive it); owns the pins (HostPin) and unpins
// whatever is still pinned when destroyed. The caller detaches it from the client
// (SetHostRegionObserver(nullptr)) before destroying it.
// Thread-safety: Mapped/Unmapping run on the thread that drives the client's mapping
// changes (the relay's compute thread, which also owns the Backend); Covers() and
// attempts() may be called from any thread (one mutex).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "worker/eps_client.h"

namespace l2l::worker {

class HostRegionPinner final : public HostRegionObserver {
 public:
  explicit HostRegionPinner(kernels::Backend* backend) : backend_(backend) {}
  ~HostRegionPinner() override;
  HostRegionPinner(const HostRegionPinner&) = delete;
  HostRegionPinner& operator=(const HostRegionPinner&) = delete;

  void Mapped(const HostRegion& region) override;
  void Unmapping(const HostRegion& region) override;

  // True when [p, p + bytes) lies inside one pinned region.
  bool Covers(const void* p, size_t bytes) const;

  // One line per Mapped() call, for logs and tests.
  struct Attempt {
    std::string name;
    size_t bytes = 0;
    bool read_only = false;
    bool pinned = false;
    std::string error;  // why not, when !pinned
    double seconds = 0;  // how long the pin took
  };
  std::vector<Attempt> attempts() const;

 private:
  struct Pinned {
    const char* begin;
    const char* end;
    std::unique_ptr<kernels::HostPin> pin;
  };
  kernels::Backend* backend_;
  mutable std::mutex mu_;
  std::vector<Pinned> pinned_;      // GUARDED_BY(mu_)
  std::vector<Attempt> attempts_;   // GUARDED_BY(mu_)
};

}  // namespace l2l::worker

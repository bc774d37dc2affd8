// ShmEpsClient: the EpsClient for a worker on the EPS's host. Layers are read in place
// from the EPS's weight segment (mapped read-only; page-aligned slots, so a CUDA worker
// can cudaHostRegister the mapping), pinned in this worker's gradient segment while
// held (the pin protocol of eps_server/param_store.h); gradients are copied into a free
// slot of this worker's gradient segment and announced with a futex wake. Control
// (register, heartbeat, StepDone) stays on gRPC (GrpcEpsClient).
//
// Errors the EPS finds in a pushed slot (wrong step, duplicate, unknown layer) are
// reported by the next PushGradient or by StepDone, which first waits until the EPS
// consumed every slot.
//
// A GPU worker page-locks both mappings through SetHostRegionObserver (the weight segment
// as a read-only region) and pushes gradients zero-copy: ClaimGradientSlot hands out a
// slot of the gradient segment, the worker DMAs the gradient into it, then
// PublishGradientSlot marks it ready and wakes the EPS (PushGradient is claim + memcpy +
// publish).
//
// Ownership: owns both mappings (never unlinks: the EPS owns the segments).
// Thread-safety: as EpsClient; slot claiming and publishing are serialised internally.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/shm.h"
#include "worker/eps_client_grpc.h"

namespace l2l::worker {

class ShmEpsClient : public GrpcEpsClient {
 public:
  static Result<std::unique_ptr<ShmEpsClient>> Create(ImplPtr impl, WorkerRegistration reg,
                                                      const ClientOptions& options, const ShmInfo& shm);

  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version,
                                    std::chrono::milliseconds timeout) override;
  void ReleaseLayer(int64_t layer) override;
  Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                      size_t numel) override;
  Status StepDone(const StepReport& report) override;
  // Re-registers and maps the (new) gradient segment.
  Status Rejoin() override;
  ~ShmEpsClient() override;

  void SetHostRegionObserver(HostRegionObserver* observer) override;
  bool HasGradientSlots() const override { return true; }
  Result<GradientSlot> ClaimGradientSlot(int64_t layer, size_t numel) override;
  Status PublishGradientSlot(const GradientSlot& slot, int64_t layer, int64_t step,
                             int64_t micro_batches, size_t numel) override;
  void AbandonGradientSlot(const GradientSlot& slot) override;

  // Waits until the EPS consumed every pushed slot; returns the first error it found.
  Status Drain(std::chrono::milliseconds timeout);
  const void* weight_base() const { return weights_.data(); }

 private:
  ShmEpsClient(ImplPtr impl, WorkerRegistration reg, const ClientOptions& options)
      : GrpcEpsClient(std::move(impl), std::move(reg), options) {}
  Status SlotError() const;
  // UNAVAILABLE once the EPS process that owns the weight segment no longer exists
  // (killed: it could not mark the segments closed). Checked in every wait loop.
  Status DaemonGone() const;
  // The EPS closes a worker's gradient segment when it stops the job (the weight segment
  // says so first: ABORTED) and when it removes this worker while it runs (declared lost
  // after a stall longer than the heartbeat timeout, or its id taken over): a rejoin,
  // not the job's end.
  Status SegmentClosed();
  Status MapSegments(const ShmInfo& shm);
  std::vector<HostRegion> Regions() const;  // REQUIRES: observer_mu_ held

  std::mutex observer_mu_;  // guards the mappings' replacement against observer calls
  HostRegionObserver* observer_ = nullptr;  // GUARDED_BY(observer_mu_)
  ShmSegment weights_;  // read-only
  ShmSegment grads_;    // read-write
  std::vector<int64_t> layer_numel_;
  std::mutex push_mu_;  // one pusher at a time claims slots
  uint64_t push_seq_ = 0;
  uint32_t epoch_ = 0;  // weight segment epoch at (re)registration
  int32_t daemon_pid_ = 0;  // the EPS's pid when visible from here (else 0: not watched)
};

}  // namespace l2l::worker

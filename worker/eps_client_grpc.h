// GrpcEpsClient: the EpsClient over gRPC only (a worker on another host, or transport
// "grpc"). Registration, heartbeats (a background thread) and StepDone go over gRPC for
// every transport; ShmEpsClient (eps_client_shm.h) derives from this class and moves
// only the layer and gradient bytes into shared memory.
//
// AcquireLayer streams the layer (FetchLayer, chunks <= 4 MiB) into a buffer this
// client owns until ReleaseLayer; PushGradient streams the gradient (PushGradient).
//
// Ownership: owns the channel, the heartbeat thread and fetched layer buffers.
// Thread-safety: as EpsClient (worker/eps_client.h): different layers from different
// threads concurrently.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/eps_client.h"

namespace l2l::worker {

class GrpcEpsClient : public EpsClient {
 public:
  struct Impl;  // the gRPC channel and stubs (eps_client_grpc.cc)
  struct ImplDeleter {
    void operator()(Impl* p) const;
  };
  using ImplPtr = std::unique_ptr<Impl, ImplDeleter>;

  // Registers with the EPS at `address` (retrying until options.connect_timeout).
  // Extra reply fields the shm client needs are returned through *segments.
  struct ShmInfo {
    std::string weight_segment, gradient_segment;
    std::vector<int64_t> layer_numel;
  };
  static Result<ImplPtr> Connect(const std::string& address, const ClientOptions& options,
                                               WorkerRegistration* reg, ShmInfo* shm);
  // Register rpc on an existing channel (previous_worker_id -1: a new worker).
  static Status Register(Impl* impl, const ClientOptions& options, int32_t previous_worker_id,
                         WorkerRegistration* reg, ShmInfo* shm);

  GrpcEpsClient(ImplPtr impl, WorkerRegistration reg, const ClientOptions& options);
  ~GrpcEpsClient() override;

  const WorkerRegistration& registration() const override { return reg_; }
  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version,
                                    std::chrono::milliseconds timeout) override;
  void ReleaseLayer(int64_t layer) override;
  Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                      size_t numel) override;
  Status StepDone(const StepReport& report) override;
  Status ReportExperts(int64_t step, const std::vector<uint8_t>& touched) override;
  // Tells the EPS this worker leaves (also done by the destructor, best effort).
  Status Deregister();
  Status LeaveAfterLastStep(std::chrono::milliseconds wait) override;
  Status Rejoin() override;
  bool rejoin_requested() const override { return rejoin_requested_.load(); }
  Result<UpdateAssignment> TakeUpdate(std::chrono::milliseconds wait) override;
  Status UpdateDone(uint64_t task_id, int64_t layer, int64_t numel, const std::string& error) override;

 protected:
  ImplPtr impl_;
  WorkerRegistration reg_;
  const ClientOptions options_;
  std::atomic<bool> rejoin_requested_{false};
  // Re-registers and updates reg_; *shm gets the (new) segment names.
  Status RegisterAgain(ShmInfo* shm);
  Status SendDeregister(std::chrono::milliseconds wait, std::chrono::milliseconds deadline);

 private:
  void HeartbeatLoop(std::chrono::milliseconds interval);
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> current_step_{0};
  std::thread heartbeat_;
  std::mutex mu_;
  std::map<int64_t, std::vector<char>> held_;  // GUARDED_BY(mu_): layer -> fetched bytes
  std::vector<std::vector<char>> spare_;       // GUARDED_BY(mu_): released buffers, reused
  bool deregistered_ = false;
};

}  // namespace l2l::worker

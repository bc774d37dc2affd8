// EpsCore: the eager param-server's state machine, independent of gRPC. It owns the
// job (ParamStore + UpdatePipeline), the registered workers and, for same-host workers,
// their gradient segments and the threads that consume them. The gRPC services
// (eps_server/grpc_services.h) translate protobuf messages to these calls; protobuf
// types stop there.
//
// Life cycle: Create (no job) -> CreateJob (allocates, initialises, publishes version
// start_step of every layer, creates the shm weight segment) -> workers Register (ids
// 0..expected_workers-1) -> gradients flow -> Stop (wakes every waiter with ABORTED,
// joins threads, removes the segments).
//
// Ownership: owns everything above; GradientRefs point into gradient segments or
// heap buffers the core keeps alive until the pipeline releases them.
// Thread-safety: every public method is thread-safe (the gRPC server calls them from
// its thread pool).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/shm.h"
#include "common/status.h"
#include "eps_server/param_store.h"
#include "eps_server/update_pipeline.h"

namespace l2l::eps {

struct CoreOptions {
  std::string job_id = "job";        // names the shm segments: /l2l-<job_id>-...
  int32_t expected_workers = 1;      // workers every update waits for
  size_t host_bytes = 0;             // memory budget (0 = unlimited)
  size_t page_bytes = kDefaultPageBytes;
  std::string transport = "auto";    // auto | grpc: "grpc" never offers shm
  int grad_slots = 4;                // gradient ring slots per shm worker (<= kMaxGradSlots)
};

struct RegisterInfo {
  std::string name, hostname, boot_id, transport;  // transport: auto | shm | grpc
  int32_t pid = 0;
};

struct Registration {
  int32_t worker_id = -1;
  int32_t num_workers = 0;
  JobConfig job;
  int64_t start_step = 0;
  std::string data_position;
  std::string transport;                // shm | grpc
  std::string weight_segment, gradient_segment;
  std::vector<int64_t> layer_numel;
};

struct WorkerInfo {
  int32_t id = -1;
  std::string name, transport, state;   // state: active | left
  int64_t step = 0;
  double last_loss = 0;
  std::string data_position;
  std::chrono::steady_clock::time_point last_seen;
};

struct CoreStatus {
  std::string state;                    // idle | waiting_workers | running | stopping
  std::string job_id;
  int64_t step = 0, total_steps = 0, num_params = 0;
  std::vector<int64_t> layer_version;
  double last_loss = 0, tokens_per_s = 0;
  PipelineStats pipeline;
  size_t state_bytes = 0, shm_bytes = 0, host_budget = 0;
  std::vector<WorkerInfo> workers;
};

class EpsCore {
 public:
  explicit EpsCore(CoreOptions opts);
  ~EpsCore();  // Stop()

  // Creates the job: state initialised from job.train.seed (or `initial` when given: one
  // fp32 buffer per layer), published at start_step. FAILED_PRECONDITION if one exists.
  Status CreateJob(const JobConfig& job, const std::vector<std::vector<float>>* initial = nullptr,
                   int64_t start_step = 0);
  bool has_job() const;

  Result<Registration> Register(const RegisterInfo& info);
  Status Heartbeat(int32_t worker_id, int64_t step, bool* stop);
  // Copies layer `layer` at version >= min_version into *out (bytes of the published
  // dtype) under the store's pin; returns the version.
  Result<int64_t> CopyLayer(int32_t worker_id, int64_t layer, int64_t min_version,
                            std::chrono::milliseconds timeout, std::vector<char>* out,
                            DType* dtype);
  // Takes ownership of a received gradient buffer.
  Status SubmitGradient(int32_t worker_id, int64_t layer, int64_t step, int64_t micro_batches,
                        std::vector<float> grad);
  Status StepDone(int32_t worker_id, int64_t step, double loss, int64_t tokens,
                  const std::string& data_position, bool* stop);
  Status Deregister(int32_t worker_id);

  // Wakes all waiters (ABORTED), stops shm consumers, removes segments. Idempotent.
  void Stop();
  bool stopped() const { return stopped_.load(); }

  CoreStatus GetStatus() const;
  ParamStore* store() { return store_.get(); }
  UpdatePipeline* pipeline() { return pipeline_.get(); }
  const JobConfig& job() const { return job_; }

 private:
  struct ShmWorker;
  Status CheckWorker(int32_t worker_id) const;  // REQUIRES: mu_ held
  void ConsumeLoop(ShmWorker* w);

  const CoreOptions opts_;
  std::atomic<bool> stopped_{false};
  mutable std::mutex mu_;
  JobConfig job_;                                   // GUARDED_BY(mu_) once set
  bool has_job_ = false;
  int64_t start_step_ = 0;
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<UpdatePipeline> pipeline_;
  std::vector<WorkerInfo> workers_;                 // GUARDED_BY(mu_), index = id
  std::vector<std::unique_ptr<ShmWorker>> shm_workers_;  // GUARDED_BY(mu_)
  double last_loss_sum_ = 0;
  int64_t last_tokens_ = 0, reported_in_step_ = 0;
  double last_loss_ = 0, tokens_per_s_ = 0;
  std::chrono::steady_clock::time_point step_start_ = std::chrono::steady_clock::now();
};

}  // namespace l2l::eps

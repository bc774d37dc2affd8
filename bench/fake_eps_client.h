// FakeEps: an in-process eager param-server for unit tests and benchmarks of the relay.
// It holds every layer's fp32 master weights and AdamW moments, initialised exactly as
// the real EPS and the reference trainer do (InitLayerParams with job.train.seed), and
// hands out EpsClient objects, one per simulated worker, that talk to it by function
// call. When every worker has pushed its step-t gradient of a layer it reduces them (sum,
// divide by the total micro-batch count), clips per train.clip ("global" waits for every
// layer of the step), applies common/adamw.h's AdamWStep and publishes version t+1 in
// job.publish_dtype (f32 or bf16). Mixture-of-experts jobs: the experts the workers
// reported (ReportExperts, ORed) are updated, the others skipped, each expert with its
// own AdamW step count (as the real EPS and torch.optim.AdamW with .grad None).
//
// lazy_updates = true makes it the stalest EPS the contract allows: a version is
// published only when an AcquireLayer needs it, so a lock-free worker receives exactly
// the oldest version its bound admits (tests use it to prove the bound is respected).
//
// Ownership: FakeEps owns all state; clients hold a raw pointer to it and must not
// outlive it. A published copy a client acquired stays alive until ReleaseLayer.
// Thread-safety: every method is thread-safe (one mutex); clients may be used from
// several threads as EpsClient allows.
//
// Where: a test double, not part of l2l-worker. It sits in bench/ (library l2l_fake_eps)
// because l2l-bench-relay uses it and bench/ is built in every configuration, while
// tests/ (whose relay tests in tests/worker and tests/gpu also link it) is built only
// with BUILD_TESTING.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "common/config.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "worker/eps_client.h"

namespace l2l::worker {

struct FakeEpsOptions {
  int32_t num_workers = 1;
  bool lazy_updates = false;  // see the header comment
};

class FakeEps {
 public:
  // REQUIRES: job.Validate().ok() (the model is checked again here).
  static Result<std::unique_ptr<FakeEps>> Create(const JobConfig& job, const FakeEpsOptions& options);
  ~FakeEps();

  // A client for worker `worker_id` in [0, num_workers): data shard worker_id of num_workers.
  Result<std::unique_ptr<EpsClient>> Connect(int32_t worker_id);

  // Fails every blocked and future AcquireLayer with ABORTED.
  void Stop();
  // Applies every update whose gradients are all in (with lazy_updates, the ones no
  // acquire has forced yet), so Master() shows the trained weights.
  void Flush();

  // Inspection (copies, taken under the lock).
  std::vector<float> Master(int64_t layer) const;  // (layout numel) fp32 master weights
  int64_t Version(int64_t layer) const;
  // The reduced gradient of the last update applied to `layer`: sum over workers divided
  // by the total micro-batch count, before clipping. Empty before the first update.
  // A LoRA job (common/lora.h): the gradient of the layer's trainable span only; its
  // master and moments exist only for that span, the frozen base is never updated.
  std::vector<float> LastGradient(int64_t layer) const;
  // The master weights that update started from (the version the gradient was computed at).
  std::vector<float> WeightsBeforeLastUpdate(int64_t layer) const;
  struct AcquireRecord {
    int32_t worker;
    int64_t layer, min_version, version;
  };
  std::vector<AcquireRecord> acquires() const;
  std::vector<StepReport> reports(int32_t worker) const;
  double optimizer_seconds() const;  // time spent reducing + AdamW + publishing
  // Mixture-of-experts jobs: updates each expert has had (n_layer x num_experts).
  std::vector<int64_t> expert_steps() const;
  const JobConfig& job() const { return job_; }

 private:
  friend class FakeEpsClient;
  struct Pending {                 // one (step, layer) being reduced
    std::vector<float> sum;        // (numel) sum over workers
    std::set<int32_t> pushed;      // workers that pushed
    int64_t micro_batches = 0;     // total over workers
  };
  struct Layer {
    std::vector<float> master, m, v;  // (numel)
    int64_t version = 0;
    // numel * DTypeSize bytes; a LoRA layer with a frozen base: its trainable span only,
    // the base being `record` (common/lora_frozen.h), encoded once at Create.
    std::shared_ptr<const std::vector<uint8_t>> published;
    std::shared_ptr<const std::vector<uint8_t>> record;
    FrozenPlan plan;
    std::vector<float> last_grad;     // (numel) see LastGradient()
    std::vector<float> prev_master;   // (numel) see WeightsBeforeLastUpdate()
  };

  FakeEps(const JobConfig& job, const FakeEpsOptions& o)
      : job_(job), opt_(o), layouts_(BuildLoraLayout(job.model, job.lora)) {}
  void Publish(Layer* layer) const;  // REQUIRES: mu_ held
  bool Complete(int64_t step, int64_t layer) const;  // REQUIRES: mu_ held
  // Applies step `step` to `layer` (and, with global clipping, to every layer) when all its
  // gradients are in and the versions line up. Returns whether it did.
  bool TryApply(int64_t step, int64_t layer);  // REQUIRES: mu_ held
  void ApplyReady();                            // REQUIRES: mu_ held
  void Apply(int64_t step, const std::vector<int64_t>& layers);  // REQUIRES: mu_ held

  Result<LayerWeights> Acquire(int32_t worker, int64_t layer, int64_t min_version,
                               std::chrono::milliseconds timeout);
  void Release(int32_t worker, int64_t layer);
  Status Push(int32_t worker, int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
              size_t numel);
  Status Done(int32_t worker, const StepReport& report);
  Status Experts(int64_t step, const std::vector<uint8_t>& touched);

  const JobConfig job_;
  const FakeEpsOptions opt_;
  const std::vector<LayerLayout> layouts_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Layer> layers_;                                   // GUARDED_BY(mu_)
  std::map<std::pair<int64_t, int64_t>, Pending> pending_;      // GUARDED_BY(mu_) (step, layer)
  // (worker, layer) -> the copy that worker holds.
  std::map<std::pair<int32_t, int64_t>, std::shared_ptr<const std::vector<uint8_t>>> held_;  // GUARDED_BY(mu_)
  std::vector<AcquireRecord> acquires_;                         // GUARDED_BY(mu_)
  std::map<int32_t, std::vector<StepReport>> reports_;          // GUARDED_BY(mu_)
  double optimizer_s_ = 0;                                      // GUARDED_BY(mu_)
  std::map<int64_t, std::vector<uint8_t>> touched_;             // GUARDED_BY(mu_) step -> OR of reports
  std::vector<int64_t> expert_steps_;                           // GUARDED_BY(mu_)
  bool stopped_ = false;                                        // GUARDED_BY(mu_)
};

}  // namespace l2l::worker

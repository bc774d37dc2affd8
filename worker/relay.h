// Relay: one worker's layer-to-layer execution of a training step against the EPS: only
// one layer's weights need be on the device at a time. For step t with micro-batches
// u1..uM:
//   forward   for each layer l = 0..L (embedding, blocks): run u1..uM through it, stash
//             each output (worker/stash.h); layer l+1 is prefetched meanwhile.
//   head      per micro-batch: loss and its input-gradient (loss_scale 1: the EPS divides
//             by the total micro-batch count). With tied embeddings the head reads wte
//             from layer 0, which stays resident from the embedding forward, and its dwte
//             is summed into layer 0's gradient.
//   backward  for l = L..1: re-fetch the block, recompute it from the stashed input
//             (or take the intermediates its forward kept: train.recompute),
//             accumulate its weight gradient over u1..uM in one buffer, push it once (in
//             the background while l-1 computes), hand the input-gradient down; then the
//             embedding's gradient (plus the head's dwte) is pushed.
// Versions: synchronous mode uses every layer at exactly version t (and checks it);
// lock-free mode (train.mode=lockfree, staleness s) asks for any version >= t - s and
// never waits for a newer one. Every acquired version is counted in VersionStats.
//
// On a backend with copy queues (CUDA; kernels/backend.h) the relay first page-locks the
// transport's shared memory (HostRegionPinner as the client's HostRegionObserver: the
// shm weight segment read-only, the gradient segment), so the prefetcher DMAs layers
// straight out of the EPS's published weights on its copy stream into the slot the next
// layer will use while the current one computes, and the pusher DMAs each fp32 gradient
// straight into a gradient slot before waking the EPS; the stash's host placement
// offloads over its own copy stream (worker/prefetch.h, worker/stash.h). The compute
// thread still synchronises the compute stream at the end of each layer (the step
// timings); it never waits for a copy it did not need.
//
// Ownership: the Relay borrows the EpsClient and Backend (they must outlive it) and owns
// every device buffer it computes in: one LayerWorkspace, the stash, two gradient buffers
// for blocks/head plus one for the embedding, M+1 activation-gradient tensors, the
// prefetcher's weight slots; and the pinner, detached from the client in the destructor.
// Thread-safety: RunStep from one thread; the prefetcher and pusher run their own threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "kernels/layers/moe.h"
#include "worker/data_loader.h"  // MicroBatch
#include "worker/eps_client.h"
#include "worker/host_pinner.h"
#include "worker/prefetch.h"
#include "worker/stash.h"
#include "worker/step_runner.h"  // StepRunner, VersionStats, RelayTimes

namespace l2l::worker {

struct RelayOptions {
  StashPlacement stash = StashPlacement::kDevice;  // train.stash
  DType stash_dtype = DType::kF32;                 // train.stash_dtype (f32 | bf16)
  bool lockfree = false;                           // train.mode is lockfree
  int64_t staleness = 1;                           // train.staleness (lock-free only)
  // Longest wait for one layer version before the step fails with DEADLINE_EXCEEDED.
  std::chrono::milliseconds layer_timeout{std::chrono::minutes(10)};
  int ring_slots = 2;  // weight slots for blocks/head (2 = current + prefetch)
  // train.recompute / train.activation_budget_mb: which blocks keep their forward
  // intermediates for the backward (worker/stash.h's PlanActivations).
  RecomputeMode recompute = RecomputeMode::kAlways;
  size_t activation_budget_bytes = 0;  // 0: the default (ActivationBudgetBytes)
  // Device group (worker/device_group.h sets these; inactive by default): this relay's
  // rank with the prefetcher's and the pusher's own communicators, and the group's one
  // pinner of the transport's shared memory (null: the relay pins for itself).
  GroupRank fetch_group, push_group;
  const HostRegionPinner* shared_pinner = nullptr;

  // Validates the job (JobConfig::Validate) and reads train.stash / mode / staleness.
  static Result<RelayOptions> FromJob(const JobConfig& job);
};

// One device's StepRunner (worker/step_runner.h); DeviceGroup runs one per device.
class Relay final : public StepRunner {
 public:
  static Result<std::unique_ptr<Relay>> Create(EpsClient* client, kernels::Backend* backend,
                                               const JobConfig& job, const RelayOptions& options);
  ~Relay() override;
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Runs step `step` over exactly job.train.micro_batches micro-batches of
  // (micro_batch_size, seq_len) and pushes every layer's gradient. Returns the report
  // (loss = mean of the micro-batches' mean losses; data_position left empty for the
  // caller). On failure nothing is left acquired or in flight.
  // `eval` (in-job validation, worker/eval_set.h): extra forward-only micro-batches of the
  // same shape, run through every layer right after the training micro-batches (same
  // layer versions: the weights this step's loss is computed at) with no stash and no
  // backward; the head scores them and the report carries eval_loss (mean over their
  // scored targets) and eval_tokens. Their activations take |eval|+1 buffers of (B,T,C)
  // on the device, allocated on the first step that has them.
  Result<StepReport> RunStep(int64_t step, const std::vector<MicroBatch>& micro_batches,
                             const std::vector<MicroBatch>& eval = {}) override;

  // The checks RunStep makes on its micro-batches (shapes, token ids, sequence inputs),
  // naming the first bad one by its index; expected: their count, -1 for any.
  Status ValidateBatch(const std::vector<MicroBatch>& mbs, int64_t expected, const char* what) const;

  const VersionStats& versions() const override { return versions_; }
  const RelayTimes& last_times() const override { return times_; }
  // Backend bytes this relay holds (weights slots, stash, activations, gradients, scratch).
  size_t device_bytes() const override;
  size_t stash_host_bytes() const override { return stash_->host_bytes(); }
  const Stash& stash() const { return *stash_; }
  const ActivationPlan& activation_plan() const { return plan_; }
  const LayerPrefetcher& prefetcher() const { return *prefetcher_; }
  const GradientPusher& pusher() const { return *pusher_; }
  // Null unless the backend has copy queues.
  const HostRegionPinner* pinner() const { return pin_; }

 private:
  Relay(EpsClient* client, kernels::Backend* backend, const JobConfig& job, const RelayOptions& o);
  Status Init();
  Status RunStepImpl(int64_t step, const std::vector<MicroBatch>& mbs, double* loss_sum);
  Status UploadEval(const std::vector<MicroBatch>& eval);
  Status Forward(int64_t step, ResidentLayer* emb);
  Status HeadAndBackward(int64_t step, ResidentLayer* emb, double* loss_sum);
  // Next layer from the prefetcher, checked against the step's version rule.
  Result<ResidentLayer> NextLayer(int64_t step, int64_t layer);
  Status Push(int64_t layer, int64_t step, const float* grad, size_t numel, int64_t* ticket);
  const int32_t* Inputs(int64_t u) const;   // (B,T) device
  const int32_t* Targets(int64_t u) const;  // (B,T) device
  // Micro-batch u's token types / attention mask on the device (null where it has none).
  // SeqInputs + the MoE stats of u + its LoRA dropout key (training micro-batches only).
  layers::SequenceInputs Seq(int64_t u) const;
  layers::SequenceInputs SeqInputs(int64_t u) const;  // token types and mask of u
  // Block `layer`'s kept intermediates for micro-batch u; null where the plan recomputes.
  layers::SavedActivations* Kept(int64_t layer, int64_t u);

  EpsClient* client_;
  kernels::Backend* be_;
  const JobConfig job_;
  const ModelSpec spec_;
  const RelayOptions opt_;
  const std::vector<LayerLayout> layouts_;
  const int64_t B_, T_, M_;

  // Declared before the prefetcher and pusher: destroyed after them (they check it).
  std::unique_ptr<HostRegionPinner> pinner_;
  const HostRegionPinner* pin_ = nullptr;  // pinner_, or the group's shared pinner
  std::unique_ptr<layers::LayerWorkspace> ws_;
  std::unique_ptr<Stash> stash_;
  ActivationPlan plan_;
  std::vector<layers::SavedActivations> kept_;  // (kept blocks x M), latest blocks
  std::vector<int64_t> forward_version_;        // per layer: the version its forward used
  std::unique_ptr<LayerPrefetcher> prefetcher_;
  std::unique_ptr<GradientPusher> pusher_;
  kernels::DeviceBuffer tokens_;    // (M, 2, B,T) int32: inputs then targets per micro-batch
  // (M, 2, B,T) int32: token types then attention mask per micro-batch; allocated on the
  // first step whose micro-batches carry them (encoder families).
  kernels::DeviceBuffer seq_buf_;
  std::vector<std::pair<bool, bool>> seq_present_;  // per micro-batch: types, mask given
  // Mixture-of-experts models: per micro-batch routing statistics of this step (reset at
  // its forward; kernels/layers/moe.h), mutable because Seq() hands out pointers to them.
  mutable std::vector<layers::MoeStats> moe_stats_;
  // In-job validation: (E, 2, B,T) int32 inputs then targets per eval micro-batch, and
  // (E+1, B,T,C) activations (eval_act_[j] holds micro-batch j's output of the layer
  // last run; eval_spare_ is the block output buffer swapped in). Sized for the largest
  // E seen; eval_n_ micro-batches in this step (0: none).
  kernels::DeviceBuffer eval_tokens_, eval_buf_;
  std::vector<float*> eval_act_;
  float* eval_spare_ = nullptr;
  int64_t eval_n_ = 0, eval_capacity_ = 0;
  std::vector<int64_t> eval_scored_;  // per eval micro-batch: targets that count
  double eval_weighted_ = 0;          // sum over eval micro-batches of loss * scored

  kernels::DeviceBuffer dact_buf_;  // (M+1, B,T,C) activation gradients
  std::vector<float*> dact_;        // M pointers into dact_buf_, plus spare_
  float* spare_ = nullptr;
  kernels::DeviceBuffer emb_grad_;  // (layer 0 numel) embedding gradient (+ head's dwte)
  kernels::DeviceBuffer ring_grad_[2];  // (max block/head numel) alternating gradients
  int64_t ring_ticket_[2] = {-1, -1};   // push still reading each ring buffer

  VersionStats versions_;
  RelayTimes times_;
  int64_t versions_acquired_in_step_ = 0;  // layers taken from the prefetcher this step
  int64_t dropout_step_ = 0;  // the step in progress (the LoRA dropout mask's key)
  double block_forward_s_ = 0;  // this step's blocks forward (the recompute estimate)
};

}  // namespace l2l::worker

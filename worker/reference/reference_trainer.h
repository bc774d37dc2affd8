// ReferenceTrainer: ordinary (non-relay) mini-batch training of the whole model in one
// process and one Backend. It is the oracle every relay and EPS equivalence test
// compares against, so it is written for obviousness, not speed:
//   for each micro-batch: Embedding -> Blocks -> Head (loss, dL/dhidden) -> Blocks
//   backward (recomputing from the kept block inputs, or from the intermediates the
//   forward kept: train.recompute, planned for one micro-batch at a time) -> Embedding
//   backward, with
//   parameter gradients accumulated over the M micro-batches (loss_scale = 1/M, so the
//   gradient is that of the mini-batch mean loss); then clipping (train.clip:
//   none | per_layer | global), then AdamW per tensor (weight decay only on
//   ParamInfo::decay tensors) at lr = LearningRate(optim, step).
//
// State: fp32 master weights and AdamW moments live on the host (std::vector per layer),
// as in the EPS; the backend holds a copy of the weights (refreshed after every update),
// the gradients and the activations of one micro-batch (L+1 hidden states (B,T,C)).
// Tied embeddings: the head reads wte from layer 0's buffer and its wte gradient is
// added into layer 0's gradient (one tensor, two readers).
//
// Deterministic: the same config, seed and batches give bit-identical weights (every
// kernel of the CPU backend is deterministic for a fixed thread count).
// Ownership: owns its backend unless one is passed in. Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "worker/data_loader.h"  // MicroBatch
#include "worker/stash.h"        // ActivationPlan

namespace l2l::worker {

struct ReferenceTrainerOptions {
  std::string device = "cpu";  // kernels::CreateBackend name
  int num_threads = 0;         // CPU backend threads; <= 0: all cores
  // CPU backend matrix products: fp32, or bf16 with fp32 accumulation (masters, gradients
  // and AdamW stay fp32 either way). L2L_CPU_GEMM in the environment wins.
  kernels::CpuGemmPrecision cpu_gemm = kernels::CpuGemmPrecision::kFp32;
  // Overrides train.activation_budget_mb when > 0 (budgets below 1 MiB, for tests).
  size_t activation_budget_bytes = 0;
};

class ReferenceTrainer {
 public:
  // Initialises every layer with InitLayerParams(model, layout, train.seed); a LoRA job
  // (cfg.lora) then gets its adapters (InitLoraAdapters) and its base rounded to
  // lora.base_dtype. LoRA: only the adapters and modules_to_save train (clip norms and
  // AdamW over the trainable tensors; the frozen base never changes).
  // Fails on an invalid config or when the backend cannot be created.
  static Result<std::unique_ptr<ReferenceTrainer>> Create(const JobConfig& cfg,
                                                          const ReferenceTrainerOptions& opts = {});
  // Starts from the given weights: one flat fp32 buffer per layer in model order, each
  // of BuildLayout(cfg.model)[l].numel floats; a LoRA job also takes full LoRA buffers
  // (BuildLoraLayout sizes: the adapters as given).
  static Result<std::unique_ptr<ReferenceTrainer>> Create(const JobConfig& cfg,
                                                          std::vector<std::vector<float>> params,
                                                          const ReferenceTrainerOptions& opts = {});
  ~ReferenceTrainer();

  // One optimizer step over `batches` (the M micro-batches of the mini-batch; M may
  // differ from train.micro_batches). Returns the mean loss over the micro-batches
  // (before the update). Errors: empty batches, shape mismatches, token ids out of range.
  // LoRA dropout (lora.dropout > 0): batches[u] is micro-batch u of step step() in the
  // mask's key (common/lora.h LoraDropoutStream); to match W relay workers, pass worker
  // 0's micro-batches, then worker 1's, ... (data_rank order). ComputeGradients applies
  // the same masks; Evaluate, Probs and Hidden none.
  Result<float> Step(const std::vector<MicroBatch>& batches);

  // Forward + backward only: leaves the mini-batch-mean gradient (unclipped) in
  // grads() and returns the mean loss. Does not change weights or the step counter.
  Result<float> ComputeGradients(const std::vector<MicroBatch>& batches);

  // Mean loss over `batches` without touching gradients or weights.
  Result<float> Evaluate(const std::vector<MicroBatch>& batches);

  // probs (B,T,V) host memory: softmax of the logits for tokens (B,T).
  Status Probs(const int32_t* tokens, int64_t B, int64_t T, float* probs);
  // The same for a micro-batch with token types / attention mask (its targets unused).
  Status Probs(const MicroBatch& mb, float* probs);
  // hidden (B,T,C) host memory: the last block's output (BERT: the last hidden state of
  // BertModel) for the micro-batch's inputs, token types and attention mask.
  Status Hidden(const MicroBatch& mb, float* hidden);

  // Host fp32 state, one flat buffer per layer (layout order: BuildLoraLayout, which is
  // BuildLayout without LoRA). Valid until the next Step. m and v cover what trains:
  // the whole layer, or a LoRA layer's trainable span (common/lora.h TrainableRange).
  const std::vector<std::vector<float>>& params() const { return params_; }
  const std::vector<std::vector<float>>& m() const { return m_; }
  const std::vector<std::vector<float>>& v() const { return v_; }
  // Gradients of the last ComputeGradients/Step (before clipping), copied to the host.
  std::vector<std::vector<float>> grads() const;

  // Optimizer steps taken so far (the next step's 0-based index).
  int64_t step() const { return step_; }
  // Mixture-of-experts models (empty otherwise), (n_layer x E) each: whether expert e of
  // block b got a token in the last ComputeGradients/Step (its gradient is "not None";
  // Step updates only those, as torch.optim.AdamW skips a parameter whose .grad is None),
  // and how many updates each expert has had (its AdamW bias-correction count).
  const std::vector<uint8_t>& experts_touched() const { return touched_; }
  const std::vector<int64_t>& expert_steps() const { return expert_steps_; }
  // Clip coefficient and global gradient norm of the last Step (1 / norm with clip=none).
  float last_clip_coefficient() const { return last_clip_; }
  double last_grad_norm() const { return last_norm_; }

  const JobConfig& config() const { return cfg_; }
  const ModelSpec& spec() const { return cfg_.model; }
  const std::vector<LayerLayout>& layouts() const { return layouts_; }
  kernels::Backend* backend() const { return backend_.get(); }
  // The backend's copy of each layer's weights (layout order), valid until the next
  // Step (which refreshes them in place) and for the trainer's life.
  std::vector<const float*> device_params() const;
  // Which blocks keep their forward intermediates (for the current micro-batch shape).
  const ActivationPlan& activation_plan() const { return plan_; }

  // Writes the weights as Hugging Face GPT-2 safetensors (common/formats/model_io.h).
  // A LoRA job: the base only (its frozen tensors and its modules_to_save as trained).
  Status SaveSafetensors(const std::string& path) const;
  // A LoRA job: its adapters (and modules_to_save) as a PEFT adapter directory
  // (common/formats/lora_export.h AdapterFromLayers + peft_adapter.h WritePeftAdapter);
  // an error without a lora section.
  Status SavePeftAdapter(const std::string& dir) const;

 private:
  ReferenceTrainer() = default;
  Status Init(const JobConfig& cfg, std::vector<std::vector<float>> params,
              const ReferenceTrainerOptions& opts);
  Status CheckBatch(const MicroBatch& mb, size_t index) const;
  Status EnsureWorkspace(int64_t B, int64_t T);
  // Forward (and backward when `backward`) of one micro-batch; returns its mean loss.
  // index: its position in the step's batches (the LoRA dropout mask's micro-batch key,
  // common/lora.h; with dropout > 0 it applies when `backward` only).
  float RunMicroBatch(const MicroBatch& mb, int64_t index, float loss_scale, bool backward);
  Result<float> ForwardBackward(const std::vector<MicroBatch>& batches, bool backward);
  void ApplyUpdate();
  // Embedding and blocks of `mb` (checked; targets may be anything) into acts_.
  Status ForwardBlocks(const MicroBatch& mb);
  // Copies mb's inputs (and token types, attention mask when given) to the device and
  // runs the embedding into acts_[0]; returns the sequence inputs the blocks read.
  layers::SequenceInputs EmbedInputs(const MicroBatch& mb);
  void UploadParams();

  JobConfig cfg_;
  std::vector<LayerLayout> layouts_;
  std::unique_ptr<kernels::Backend> backend_;

  std::vector<std::vector<float>> params_, m_, v_;  // host fp32, per layer (numel)
  std::vector<kernels::DeviceBuffer> d_params_;     // per layer (numel)
  std::vector<kernels::DeviceBuffer> d_grads_;      // per layer (numel)

  // Per-micro-batch buffers, sized for (ws_B_, ws_T_).
  int64_t ws_B_ = 0, ws_T_ = 0;
  std::unique_ptr<layers::LayerWorkspace> ws_;
  kernels::DeviceBuffer d_tokens_, d_targets_;  // (B,T) int32
  kernels::DeviceBuffer d_types_, d_mask_;      // (B,T) int32, when a micro-batch has them
  std::vector<kernels::DeviceBuffer> acts_;     // n_layer+1 hidden states (B,T,C)
  kernels::DeviceBuffer d_dact_a_, d_dact_b_;   // (B,T,C) gradient ping-pong
  size_t budget_bytes_ = 0;  // for the kept intermediates; 0: the default
  ActivationPlan plan_;
  std::vector<layers::SavedActivations> kept_;  // blocks plan_.first_kept..n_layer

  int64_t step_ = 0;
  std::vector<uint8_t> touched_;        // see experts_touched()
  std::vector<int64_t> expert_steps_;   // see expert_steps()
  float last_clip_ = 1.0f;
  double last_norm_ = 0.0;
};

}  // namespace l2l::worker

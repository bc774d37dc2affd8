// AdamW (decoupled weight decay, bias-corrected, as torch.optim.AdamW), the learning-rate
// schedule (linear warmup then cosine decay to min_lr), and global-norm gradient
// clipping (as torch.nn.utils.clip_grad_norm_). Scalar reference implementation: the
// EPS's vectorised update (kernels/cpu/adamw_simd.h) and the device kernel
// (kernels/cuda/adamw.cu) are tested bitwise against it.
//
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/modes.h"

namespace l2l {

struct OptimizerConfig {
  float lr = 1e-3f;            // peak learning rate
  float min_lr_ratio = 0.1f;   // cosine decays to lr * min_lr_ratio at total_steps
  int64_t warmup_steps = 0;    // linear warmup from lr/warmup_steps to lr
  int64_t total_steps = 0;     // 0: constant lr after warmup (no cosine)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;   // applied to ParamInfo::decay tensors only
  float grad_clip = 1.0f;      // max global L2 norm; <= 0 disables clipping
  // Share of the update the workers' devices run (interleaved optimizer): "auto" lets the
  // performance model (common/optimizer_model.h) pick it at job start; a number in [0, 1]
  // fixes it. On the CPU backend there is no device and auto means 0.
  GpuFraction gpu_fraction;
};

// Learning rate for optimizer step `step` (0-based).
float LearningRate(const OptimizerConfig& cfg, int64_t step);

// The arguments of one AdamW step over one tensor range: the one description of AdamW's
// seven scalars on every layer of the update path (the daemon's pipeline and its
// vectorised pass, kernels/cpu/adamw_simd.h; the offloaded updater and its task; the
// proto, data.proto AdamWStep, through proto/adamw_proto.h; the worker's
// UpdateAssignment; Backend::AdamW and the device kernel). The job's configuration is
// OptimizerConfig above; AdamWStepArgsAt derives a step's arguments from it.
struct AdamWStepArgs {
  float lr = 0;              // learning rate of this step (LearningRate)
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;    // 0 for tensors without decay (WithDecay)
  int64_t t = 1;             // 1-based step count (bias correction)
  float grad_scale = 1;      // multiplies each gradient element: 1/micro-batches times the clip coefficient
};

// The arguments of optimizer step `step` (0-based) of a job: lr = LearningRate(cfg, step),
// cfg's betas, eps and weight_decay, t = step + 1, and `grad_scale`.
AdamWStepArgs AdamWStepArgsAt(const OptimizerConfig& cfg, int64_t step, float grad_scale);

// `a` for a tensor with (decay true: a.weight_decay) or without (0) weight decay.
AdamWStepArgs WithDecay(AdamWStepArgs a, bool decay);

// One AdamW step over n parameters, in place, exactly in torch.optim.AdamW's order:
//   p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//   p -= (lr / (1-b1^t)) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// with g = grad[i] * a.grad_scale (grad_scale folds in 1/micro-batches and clipping).
void AdamWStep(float* param, const float* grad, float* m, float* v, size_t n, const AdamWStepArgs& a);

// The per-call scalars of AdamWStepArgs, formed exactly as AdamWStep forms them (in
// double, rounded to fp32 once): the one derivation every implementation of the update
// uses (AdamWStep, the vectorised pass kernels/cpu/adamw_simd.h, the device kernel).
struct AdamWScalars {
  float decay_mul = 1;      // 1 - lr*wd
  float one_minus_b1 = 0, beta2 = 0, one_minus_b2 = 0;
  float bc2_sqrt = 1;       // sqrt(1 - beta2^t)
  float inv_bc2_sqrt = 1;   // 1 / sqrt(1 - beta2^t): the fast arithmetic's multiply (adamw_simd.h)
  float neg_step_size = 0;  // -lr / (1 - beta1^t)
  float eps = 0;
  float grad_scale = 1;     // as in AdamWStepArgs
};
AdamWScalars MakeAdamWScalars(const AdamWStepArgs& a);

// Sum of squares in double (for the global gradient norm).
double SumSquares(const float* x, size_t n);

// Multiplier that clips a gradient of global norm `norm` to `max_norm`
// (torch: max_norm / (norm + 1e-6), at most 1). Returns 1 when max_norm <= 0.
float ClipCoefficient(double norm, float max_norm);

}  // namespace l2l

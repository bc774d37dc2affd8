// Scalar AdamW, learning-rate schedule and clip coefficient. See common/adamw.h.
//
// AdamWStep follows torch.optim.AdamW's single-tensor (foreach=False) path operation by
// operation in fp32 so that a float32 torch run and ours agree to rounding:
//   param.mul_(1 - lr*wd)
//   exp_avg.lerp_(grad, 1-beta1)            (== m + (1-b1)*(g-m))
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1-beta2)
//   bias_correction1 = 1 - beta1**t ; bias_correction2 = 1 - beta2**t
//   step_size = lr / bias_correction1
//   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// torch computes the scalar factors (bias corrections, step size) in double Python
// floats; we do the same.
//
// Thread-safety: pure functions over caller-owned buffers.
#include "common/adamw.h"

#include <cmath>

namespace l2l {

float LearningRate(const OptimizerConfig& cfg, int64_t step) {
  const double lr = cfg.lr;
  if (cfg.warmup_steps > 0 && step < cfg.warmup_steps) {
    return static_cast<float>(lr * static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps));
  }
  if (cfg.total_steps <= 0) return cfg.lr;
  const double min_lr = lr * cfg.min_lr_ratio;
  const int64_t decay_steps = cfg.total_steps - cfg.warmup_steps;
  if (decay_steps <= 0 || step >= cfg.total_steps) return static_cast<float>(min_lr);
  const double ratio = static_cast<double>(step - cfg.warmup_steps) / static_cast<double>(decay_steps);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));  // 1 -> 0
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

AdamWStepArgs AdamWStepArgsAt(const OptimizerConfig& cfg, int64_t step, float grad_scale) {
  AdamWStepArgs a;
  a.lr = LearningRate(cfg, step);
  a.beta1 = cfg.beta1;
  a.beta2 = cfg.beta2;
  a.eps = cfg.eps;
  a.weight_decay = cfg.weight_decay;
  a.t = step + 1;
  a.grad_scale = grad_scale;
  return a;
}

AdamWStepArgs WithDecay(AdamWStepArgs a, bool decay) {
  if (!decay) a.weight_decay = 0.0f;
  return a;
}

AdamWScalars MakeAdamWScalars(const AdamWStepArgs& a) {
  AdamWScalars s;
  s.decay_mul = static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.t));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.t));
  const float step_size = static_cast<float>(static_cast<double>(a.lr) / bias_correction1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.inv_bc2_sqrt = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  // torch forms 1-beta in double (Python float) and rounds it to fp32 once.
  s.one_minus_b1 = static_cast<float>(1.0 - static_cast<double>(a.beta1));
  s.one_minus_b2 = static_cast<float>(1.0 - static_cast<double>(a.beta2));
  s.beta2 = a.beta2;
  s.neg_step_size = -step_size;
  s.eps = a.eps;
  s.grad_scale = a.grad_scale;
  return s;
}

void AdamWStep(float* param, const float* grad, float* m, float* v, size_t n, const AdamWStepArgs& a) {
  const AdamWScalars s = MakeAdamWScalars(a);
  const float decay_mul = s.decay_mul, bc2_sqrt = s.bc2_sqrt, one_minus_b1 = s.one_minus_b1;
  const float one_minus_b2 = s.one_minus_b2, neg_step_size = s.neg_step_size;
  const float beta2 = s.beta2, eps = s.eps, grad_scale = s.grad_scale;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    float p = param[i] * decay_mul;
    const float mi = m[i] + one_minus_b1 * (g - m[i]);
    const float vi = v[i] * beta2 + one_minus_b2 * g * g;  // addcmul: v + (value*g)*g
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p = p + neg_step_size * mi / denom;                    // addcdiv: p + (value*m)/denom
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}

double SumSquares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

float ClipCoefficient(double norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace l2l

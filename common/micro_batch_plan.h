// The micro-batch planner behind `train.micro_batches: auto`: how many micro-batches
// one layer of the relay runs per step so that the layer's compute hides both its
// transfers (the published weights in, the gradient out) and the host's AdamW update of
// the layer (the relay never waits for either), while the stashed activations of every
// micro-batch still fit the device's activation budget.
//
// Per layer (the largest transformer block; the blocks are the bulk of every model):
//   compute(M)  = M * flops_per_token * tokens_per_micro_batch / device_flops_per_s
//   transfer    = max(layer_params * h2d_bytes_per_param / h2d_bytes_per_s,
//                     layer_params * d2h_bytes_per_param / d2h_bytes_per_s)
//                 (H2D and D2H run on separate copy engines; a rate of 0 = no link: the
//                 CPU backend reads the published copy in place, so it costs nothing)
//   update      = layer_params / host_update_params_per_s
//   want        = ceil(max(transfer, update) / compute(1))     (compute(M) >= both)
//   memory cap  = floor(activation_budget_bytes / (stash_layers * activation_bytes_per_micro_batch))
//   M           = clamp(max(want, min_micro_batches), 1, min(memory cap, max_micro_batches))
// A cap below `want` is reported (binding "memory" or "max"): the relay will then wait
// for the slower of transfer/update on every layer, and the plan says by how much.
// FAILED_PRECONDITION when not even min_micro_batches fit the memory (the message has
// the arithmetic); INVALID_ARGUMENT for non-positive rates or sizes.
//
// Pure: no measurement, no I/O (the worker measures the rates, worker_main.cc).
// Thread-safety: a function of its arguments.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace l2l {

struct MicroBatchPlanInputs {
  int64_t layer_params = 0;              // parameters of the largest block
  double h2d_bytes_per_param = 2;        // published copy (bf16: 2, fp32: 4)
  double d2h_bytes_per_param = 4;        // fp32 gradient
  double flops_per_token = 0;            // one block, forward + backward (+ recompute)
  int64_t tokens_per_micro_batch = 0;    // B * T
  double device_flops_per_s = 0;         // measured (GEMM)
  double h2d_bytes_per_s = 0;            // measured; 0 = no link (reads in place)
  double d2h_bytes_per_s = 0;            // measured; 0 = no link
  double host_update_params_per_s = 0;   // the host's AdamW rate (params/s)
  // Device bytes one micro-batch of one block keeps until its backward (the stashed
  // block input, plus kept intermediates), times the layers that keep it.
  double activation_bytes_per_micro_batch = 0;
  int64_t stash_layers = 1;
  double activation_budget_bytes = 0;    // 0 = no memory cap
  int64_t min_micro_batches = 1;         // e.g. the devices of a group (one each at least)
  int64_t max_micro_batches = 64;
};

struct MicroBatchPlan {
  int64_t micro_batches = 1;
  // What decided M: "transfer" / "update" (M hides the slower of the two), "memory" /
  // "max" (capped below what hiding needs), "min" (everything is hidden at the minimum).
  std::string binding;
  double compute_s = 0;    // per layer at the chosen M
  double transfer_s = 0;   // per layer
  double update_s = 0;     // per layer
  int64_t wanted = 1;      // M that hides transfer and update (before the caps)
  int64_t memory_cap = 0;  // M the activation budget allows (INT64_MAX-like when uncapped)
  // One line with the inputs, the arithmetic and the choice (logged by the worker).
  std::string Describe() const;
};

Result<MicroBatchPlan> PlanMicroBatches(const MicroBatchPlanInputs& in);

}  // namespace l2l

// `train.micro_batches: auto` on the worker: measures what common/micro_batch_plan.h
// plans with, on this worker's first backend and this host, and sets
// job->train.micro_batches to the plan's choice:
//   device_flops_per_s   one fp32 GEMM of the block's shape (B*T x d_model x d_model,
//                        each side capped at 4096), after an untimed warm-up
//   h2d / d2h bytes/s    pageable copies of min(one block's bf16 weights, 64 MiB); the
//                        CPU backend has no link (0: it reads the shm copy in place)
//   host update rate     the daemon's fused AdamW kernel (kernels/cpu/adamw_simd.h) in
//                        parallel on this host's TBB threads, as the daemon runs it
//   activation budget    train.stash: device -> ActivationBudgetBytes (the stashed
//                        block inputs of every block and micro-batch must fit it);
//                        host -> no device cap
// The FLOPs per token of one block are 6 x its parameters + 12 x T x d_model
// (attention), x 4/3 with recompute always (the forward runs twice).
// Limits: the GEMM is fp32 (a bf16 GEMM path is faster, so on a GPU with
// L2L_CUDA_GEMM=bf16 the plan leans to more micro-batches than needed); the daemon's
// update shares this host's cores with a CPU-backend worker, which the plan ignores.
// Thread-safety: call once at start-up, before the relay is built.
#pragma once

#include <string>

#include "common/config.h"
#include "common/micro_batch_plan.h"
#include "common/status.h"
#include "kernels/backend.h"

namespace l2l::worker {

// The planner's inputs for `job` on `backend` (measured). min_micro_batches = devices.
Result<MicroBatchPlanInputs> MeasurePlanInputs(kernels::Backend* backend, const JobConfig& job,
                                               size_t activation_budget_bytes, int devices);

// When job->train.micro_batches_auto: measures, plans, sets job->train.micro_batches and
// returns the plan (its Describe() line plus the measured rates in *line). No-op
// (std::nullopt-like: micro_batches 0 in the result) otherwise.
Result<MicroBatchPlan> ResolveAutoMicroBatches(kernels::Backend* backend, size_t activation_budget_bytes,
                                               int devices, JobConfig* job, std::string* line);

}  // namespace l2l::worker

// train.micro_batches: auto on the worker (measure, plan, apply). See micro_batch_auto.h.
#include "worker/micro_batch_auto.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/model_spec.h"
#include "kernels/cpu/adamw_simd.h"
#include "worker/stash.h"

namespace l2l::worker {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The daemon's update as update_pipeline.cc runs it (parallel chunks, exact AdamW, bf16
// publish), over buffers beyond the caches; the second pass is timed.
double HostUpdateRate(size_t n) { return kernels::MeasureAdamWUpdateRate(n); }

}  // namespace

Result<MicroBatchPlanInputs> MeasurePlanInputs(kernels::Backend* be, const JobConfig& job,
                                               size_t activation_budget_bytes, int devices) {
  const ModelSpec& spec = job.model;
  const std::vector<LayerLayout> layouts = BuildLayout(spec);
  int64_t block = 0;
  for (int64_t l = 1; l <= spec.n_layer && l < static_cast<int64_t>(layouts.size()); ++l) {
    block = std::max<int64_t>(block, static_cast<int64_t>(layouts[l].numel));
  }
  if (block == 0) return InvalidArgument("micro_batches auto: the model has no transformer block");
  const int64_t B = job.train.micro_batch_size, T = job.seq_len(), C = spec.d_model;
  MicroBatchPlanInputs in;
  in.layer_params = block;
  in.h2d_bytes_per_param = static_cast<double>(DTypeSize(job.publish_dtype));
  in.d2h_bytes_per_param = sizeof(float);
  in.tokens_per_micro_batch = B * T;
  in.flops_per_token = 6.0 * static_cast<double>(block) + 12.0 * static_cast<double>(T) * static_cast<double>(C);
  if (job.train.recompute == RecomputeMode::kAlways) in.flops_per_token *= 4.0 / 3.0;
  in.min_micro_batches = std::max(1, devices);

  // GEMM rate: (m x k) @ (k x n), the block's projection shape, capped.
  const int64_t gm = std::clamp<int64_t>(B * T, 64, 4096), gk = std::clamp<int64_t>(C, 64, 4096), gn = gk;
  const size_t gemm_floats = static_cast<size_t>(gm * gk + gk * gn + gm * gn);
  L2L_ASSIGN_OR_RETURN(void* gmem, be->Alloc(gemm_floats * sizeof(float)));
  float* A = static_cast<float*>(gmem);
  float* Bm = A + gm * gk;
  float* Cm = Bm + gk * gn;
  be->Zero(gmem, gemm_floats * sizeof(float));
  be->Gemm(false, false, gm, gn, gk, 1.0f, A, gk, Bm, gn, 0.0f, Cm, gn);  // warm-up
  be->Synchronize();
  int reps = 0;
  const auto t0 = Clock::now();
  do {
    be->Gemm(false, false, gm, gn, gk, 1.0f, A, gk, Bm, gn, 0.0f, Cm, gn);
    be->Synchronize();
    ++reps;
  } while (Since(t0) < 0.05 && reps < 64);
  const double gs = Since(t0);
  be->Free(gmem);
  in.device_flops_per_s = gs > 0 ? 2.0 * static_cast<double>(gm * gn * gk) * reps / gs : 0;

  if (be->kind() != kernels::DeviceKind::kCpu) {
    const size_t bytes = std::clamp<size_t>(static_cast<size_t>(block) * 2, size_t{1} << 20, size_t{64} << 20);
    std::vector<char> host(bytes, 1);
    L2L_ASSIGN_OR_RETURN(void* d, be->Alloc(bytes));
    be->CopyToDevice(d, host.data(), bytes);  // warm-up
    be->Synchronize();
    auto c0 = Clock::now();
    be->CopyToDevice(d, host.data(), bytes);
    be->Synchronize();
    double s = Since(c0);
    in.h2d_bytes_per_s = s > 0 ? static_cast<double>(bytes) / s : 0;
    c0 = Clock::now();
    be->CopyToHost(host.data(), d, bytes);
    be->Synchronize();
    s = Since(c0);
    in.d2h_bytes_per_s = s > 0 ? static_cast<double>(bytes) / s : 0;
    be->Free(d);
  }
  in.host_update_params_per_s = HostUpdateRate(std::clamp<size_t>(static_cast<size_t>(block), size_t{1} << 16,
                                                                  size_t{1} << 23));
  // The stash keeps every block's input (B x T x C of train.stash_dtype: f32, or bf16 in
  // half the bytes) for every micro-batch until the backward reaches it; on the host
  // (train.stash: host) the device is not capped.
  in.activation_bytes_per_micro_batch =
      static_cast<double>(B * T * C) * static_cast<double>(DTypeSize(job.train.stash_dtype));
  in.stash_layers = std::max<int64_t>(1, spec.n_layer);
  in.activation_budget_bytes = job.train.stash == StashPlacement::kDevice
                                   ? static_cast<double>(ActivationBudgetBytes(*be, activation_budget_bytes))
                                   : 0;
  return in;
}

Result<MicroBatchPlan> ResolveAutoMicroBatches(kernels::Backend* backend, size_t activation_budget_bytes,
                                               int devices, JobConfig* job, std::string* line) {
  if (!job->train.micro_batches_auto) {
    MicroBatchPlan none;
    none.micro_batches = 0;
    return none;
  }
  L2L_ASSIGN_OR_RETURN(MicroBatchPlanInputs in, MeasurePlanInputs(backend, *job, activation_budget_bytes, devices));
  L2L_ASSIGN_OR_RETURN(MicroBatchPlan plan, PlanMicroBatches(in));
  job->train.micro_batches = plan.micro_batches;
  job->train.micro_batches_auto = false;  // resolved
  char rates[320];
  std::snprintf(rates, sizeof rates,
                "; measured on %s: GEMM %.3g FLOP/s, h2d %.3g B/s, d2h %.3g B/s (0 = no link), host AdamW %.3g "
                "params/s; block %lld params, %lld tokens per micro-batch, %.3g FLOPs/token, activation budget "
                "%.3g B",
                backend->name().c_str(), in.device_flops_per_s, in.h2d_bytes_per_s, in.d2h_bytes_per_s,
                in.host_update_params_per_s, static_cast<long long>(in.layer_params),
                static_cast<long long>(in.tokens_per_micro_batch), in.flops_per_token, in.activation_budget_bytes);
  if (line != nullptr) *line = plan.Describe() + rates;
  return plan;
}

}  // namespace l2l::worker

// The micro-batch planner (train.micro_batches: auto). See micro_batch_plan.h.
#include "common/micro_batch_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace l2l {
namespace {

constexpr int64_t kUncapped = std::numeric_limits<int64_t>::max();

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::string MicroBatchPlan::Describe() const {
  std::string s = "micro_batches auto: " + std::to_string(micro_batches) + " (binding: " + binding +
                  "); per layer: transfer " + Fmt("%.4g", transfer_s) + " s, host update " + Fmt("%.4g", update_s) +
                  " s, compute " + Fmt("%.4g", compute_s) + " s at " + std::to_string(micro_batches) +
                  " micro-batches; hiding both needs " + std::to_string(wanted) + ", memory allows " +
                  (memory_cap == kUncapped ? std::string("any") : std::to_string(memory_cap));
  const double exposed = std::max(transfer_s, update_s) - compute_s;
  if (exposed > 0) s += "; the relay waits ~" + Fmt("%.4g", exposed) + " s per layer";
  return s;
}

Result<MicroBatchPlan> PlanMicroBatches(const MicroBatchPlanInputs& in) {
  auto bad = [](const std::string& what) { return InvalidArgument("micro-batch planner: " + what); };
  if (in.layer_params <= 0) return bad("layer_params=" + std::to_string(in.layer_params) + " must be > 0");
  if (in.tokens_per_micro_batch <= 0) {
    return bad("tokens_per_micro_batch=" + std::to_string(in.tokens_per_micro_batch) + " must be > 0");
  }
  if (!(in.flops_per_token > 0) || !(in.device_flops_per_s > 0)) {
    return bad("flops_per_token and device_flops_per_s must be > 0 (got " + Fmt("%g", in.flops_per_token) + ", " +
               Fmt("%g", in.device_flops_per_s) + ")");
  }
  if (!(in.host_update_params_per_s > 0)) {
    return bad("host_update_params_per_s must be > 0 (got " + Fmt("%g", in.host_update_params_per_s) + ")");
  }
  if (in.h2d_bytes_per_s < 0 || in.d2h_bytes_per_s < 0 || in.activation_bytes_per_micro_batch < 0 ||
      in.activation_budget_bytes < 0 || in.stash_layers < 1) {
    return bad("rates, activation bytes and budget must be >= 0 and stash_layers >= 1");
  }
  if (in.min_micro_batches < 1 || in.max_micro_batches < in.min_micro_batches) {
    return bad("need 1 <= min_micro_batches (" + std::to_string(in.min_micro_batches) + ") <= max_micro_batches (" +
               std::to_string(in.max_micro_batches) + ")");
  }
  MicroBatchPlan p;
  const double params = static_cast<double>(in.layer_params);
  const double h2d = in.h2d_bytes_per_s > 0 ? params * in.h2d_bytes_per_param / in.h2d_bytes_per_s : 0;
  const double d2h = in.d2h_bytes_per_s > 0 ? params * in.d2h_bytes_per_param / in.d2h_bytes_per_s : 0;
  p.transfer_s = std::max(h2d, d2h);
  p.update_s = params / in.host_update_params_per_s;
  const double compute1 =
      in.flops_per_token * static_cast<double>(in.tokens_per_micro_batch) / in.device_flops_per_s;
  const double hide = std::max(p.transfer_s, p.update_s);
  // ceil with a relative tolerance, so an exact multiple is not rounded up by noise.
  const double ratio = hide / compute1;
  const double want = std::max(1.0, std::ceil(ratio * (1 - 1e-12)));
  p.wanted = want >= static_cast<double>(kUncapped) ? kUncapped : static_cast<int64_t>(want);
  p.memory_cap = kUncapped;
  if (in.activation_budget_bytes > 0 && in.activation_bytes_per_micro_batch > 0) {
    const double per_mb = in.activation_bytes_per_micro_batch * static_cast<double>(in.stash_layers);
    const double cap = std::floor(in.activation_budget_bytes / per_mb);
    p.memory_cap = cap >= static_cast<double>(kUncapped) ? kUncapped : static_cast<int64_t>(cap);
    if (p.memory_cap < in.min_micro_batches) {
      return FailedPrecondition(
          "micro_batches auto: " + std::to_string(in.min_micro_batches) + " micro-batch(es) of " +
          std::to_string(in.tokens_per_micro_batch) + " tokens keep " + Fmt("%.0f", per_mb) + " bytes each (" +
          Fmt("%.0f", in.activation_bytes_per_micro_batch) + " per layer x " + std::to_string(in.stash_layers) +
          " layers) but the activation budget is " + Fmt("%.0f", in.activation_budget_bytes) +
          " bytes; lower train.micro_batch_size or seq_len, or raise train.activation_budget_mb");
    }
  }
  const int64_t upper = std::min(p.memory_cap, in.max_micro_batches);
  const int64_t m = std::max(p.wanted, in.min_micro_batches);
  if (m > upper) {
    p.micro_batches = upper;
    p.binding = p.memory_cap <= in.max_micro_batches ? "memory" : "max";
  } else {
    p.micro_batches = m;
    if (p.wanted > in.min_micro_batches) {
      p.binding = p.transfer_s >= p.update_s ? "transfer" : "update";
    } else {
      p.binding = "min";
    }
  }
  p.compute_s = compute1 * static_cast<double>(p.micro_batches);
  return p;
}

}  // namespace l2l

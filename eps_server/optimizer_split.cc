// Job-start choice of the interleaved optimizer's split (see optimizer_split.h).
#include "eps_server/optimizer_split.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/dtype.h"
#include "kernels/cpu/adamw_simd.h"

namespace l2l::eps {

double MeasureCpuUpdateRate(size_t n) { return kernels::MeasureAdamWUpdateRate(n); }

double MeasureCopyBytesPerSecond(size_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);  // pages in
  const auto t0 = std::chrono::steady_clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s > 0 ? static_cast<double>(bytes) / s : 0;
}

Result<OptimizerSplit> ChooseOptimizerSplit(const OptimizerConfig& optim, const std::vector<int64_t>& layer_params,
                                            const OptimizerRates& rates, const std::vector<double>& backward_s) {
  OptimizerModelInput in;
  in.rates = rates;
  for (size_t l = 0; l < layer_params.size(); ++l) {
    in.layers.push_back({layer_params[l], l < backward_s.size() ? backward_s[l] : 0.0});
  }
  L2L_RETURN_IF_ERROR(ValidateOptimizerModelInput(in));
  OptimizerSplit split;
  const std::string setting = "optim.gpu_fraction=" + ToString(optim.gpu_fraction);
  if (optim.gpu_fraction.automatic) {
    L2L_ASSIGN_OR_RETURN(InterleavePlan plan, PlanAuto(in));
    split.on_gpu = plan.on_gpu;
    split.gpu_fraction = plan.gpu_fraction;
    split.description = setting + (rates.gpu_update_params_per_s > 0 ? "" : " (no worker reports a device update rate)") +
                        "; " + DescribePlan(in, plan);
  } else {
    // A fixed share needs no rates to pick its layers; a prediction needs a device rate.
    split.on_gpu = SpreadLayers(in.layers, optim.gpu_fraction.value);
    int64_t total = 0, gpu = 0;
    std::string layers;
    for (size_t l = 0; l < split.on_gpu.size(); ++l) {
      total += layer_params[l];
      if (!split.on_gpu[l]) continue;
      gpu += layer_params[l];
      layers += (layers.empty() ? "" : ",") + std::to_string(l);
    }
    split.gpu_fraction = total > 0 ? static_cast<double>(gpu) / static_cast<double>(total) : 0;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "; fixed share: %.3f of parameters in layers [%s] of %zu", split.gpu_fraction,
                  layers.c_str(), layer_params.size());
    split.description = setting + buf;
    if (rates.gpu_update_params_per_s > 0) {
      L2L_ASSIGN_OR_RETURN(InterleavePlan plan, PlanFixedFraction(in, optim.gpu_fraction.value));
      split.description += "; " + DescribePlan(in, plan);
    }
  }
  return split;
}

}  // namespace l2l::eps

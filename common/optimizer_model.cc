// Interleaved-optimizer performance model (see optimizer_model.h for the timeline).
#include "common/optimizer_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>


namespace l2l {
namespace {

constexpr double kStateBytesPerParam = 12;  // fp32 p, m, v

// Seconds for `amount` units at `rate` units/s; a rate of +infinity costs nothing.
double Cost(double amount, double rate) { return std::isinf(rate) ? 0.0 : amount / rate; }

bool DeviceUseful(const OptimizerRates& r) {
  return r.gpu_update_params_per_s > r.cpu_update_params_per_s;
}

double Fraction(const std::vector<LayerCost>& layers, const std::vector<bool>& on_gpu) {
  double total = 0, gpu = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    total += static_cast<double>(layers[i].params);
    if (on_gpu[i]) gpu += static_cast<double>(layers[i].params);
  }
  return total > 0 ? gpu / total : 0;
}

InterleavePlan MakePlan(const OptimizerModelInput& in, std::vector<bool> on_gpu) {
  InterleavePlan p;
  p.step_s = PredictStepTime(in, on_gpu, &p.tail_s);
  p.daemon_only_step_s = PredictStepTime(in, std::vector<bool>(in.layers.size(), false));
  p.gpu_fraction = Fraction(in.layers, on_gpu);
  p.on_gpu = std::move(on_gpu);
  return p;
}

}  // namespace

Status ValidateOptimizerModelInput(const OptimizerModelInput& in) {
  const OptimizerRates& r = in.rates;
  auto positive = [](double x) { return x > 0 && !std::isnan(x); };
  if (!positive(r.cpu_update_params_per_s)) return InvalidArgument("optimizer model: cpu_update_params_per_s must be > 0");
  if (!positive(r.cpu_cast_params_per_s)) return InvalidArgument("optimizer model: cpu_cast_params_per_s must be > 0");
  if (!(r.gpu_update_params_per_s >= 0)) return InvalidArgument("optimizer model: gpu_update_params_per_s must be >= 0");
  if (!positive(r.h2d_bytes_per_s)) return InvalidArgument("optimizer model: h2d_bytes_per_s must be > 0");
  if (!positive(r.d2h_bytes_per_s)) return InvalidArgument("optimizer model: d2h_bytes_per_s must be > 0");
  if (in.layers.empty()) return InvalidArgument("optimizer model: no layers");
  for (size_t i = 0; i < in.layers.size(); ++i) {
    if (in.layers[i].params <= 0) {
      return InvalidArgument("optimizer model: layer " + std::to_string(i) + " has params <= 0");
    }
    if (!(in.layers[i].backward_s >= 0) || std::isinf(in.layers[i].backward_s)) {
      return InvalidArgument("optimizer model: layer " + std::to_string(i) + " backward_s must be finite and >= 0");
    }
  }
  if (!(in.forward_s >= 0) || std::isinf(in.forward_s)) return InvalidArgument("optimizer model: forward_s must be finite and >= 0");
  return Status::Ok();
}

double PredictStepTime(const OptimizerModelInput& in, const std::vector<bool>& on_gpu, double* tail_s) {
  const OptimizerRates& r = in.rates;
  const size_t L = in.layers.size();
  L2L_CHECK(on_gpu.size() == L) << "on_gpu has " << on_gpu.size() << " entries for " << L << " layers";
  // Device timeline (independent of the CPU): backward, and the device-side updates.
  struct Job {
    double ready, work;
  };
  std::vector<Job> cpu_jobs;
  cpu_jobs.reserve(L);
  double dev = 0, h2d_free = 0, d2h_free = 0, pure_backward = 0, last_d2h = 0;
  for (size_t k = 0; k < L; ++k) {
    const size_t l = L - 1 - k;
    const LayerCost& layer = in.layers[l];
    const double n = static_cast<double>(layer.params);
    const double start = dev;
    dev += layer.backward_s;
    pure_backward += layer.backward_s;
    if (!on_gpu[l]) {
      cpu_jobs.push_back({dev, Cost(n, r.cpu_update_params_per_s) + Cost(n, r.cpu_cast_params_per_s)});
      continue;
    }
    L2L_CHECK(r.gpu_update_params_per_s > 0) << "layer " << l << " on a device that cannot update";
    const double h2d_start = std::max(h2d_free, start);
    h2d_free = h2d_start + Cost(kStateBytesPerParam * n, r.h2d_bytes_per_s);
    dev = std::max(dev, h2d_free) + Cost(n, r.gpu_update_params_per_s);
    const double d2h_start = std::max(d2h_free, dev);
    d2h_free = d2h_start + Cost(kStateBytesPerParam * n, r.d2h_bytes_per_s);
    last_d2h = d2h_free;
    cpu_jobs.push_back({d2h_free, Cost(n, r.cpu_cast_params_per_s)});
  }
  std::stable_sort(cpu_jobs.begin(), cpu_jobs.end(), [](const Job& a, const Job& b) { return a.ready < b.ready; });
  double cpu = 0;
  for (const Job& j : cpu_jobs) cpu = std::max(cpu, j.ready) + j.work;
  const double end = std::max({dev, cpu, last_d2h});
  if (tail_s != nullptr) *tail_s = end - pure_backward;
  return in.forward_s + end;
}

std::vector<bool> SpreadLayers(const std::vector<LayerCost>& layers, double fraction) {
  L2L_CHECK(fraction >= 0 && fraction <= 1) << "fraction " << fraction;
  std::vector<bool> on_gpu(layers.size(), false);
  double seen = 0, gpu = 0;
  for (size_t k = 0; k < layers.size(); ++k) {
    const size_t l = layers.size() - 1 - k;
    const double n = static_cast<double>(layers[l].params);
    seen += n;
    if (fraction > 0 && gpu + 0.5 * n <= fraction * seen + 1e-9 * seen) {
      on_gpu[l] = true;
      gpu += n;
    }
  }
  return on_gpu;
}

Result<InterleavePlan> PlanFixedFraction(const OptimizerModelInput& in, double fraction) {
  L2L_RETURN_IF_ERROR(ValidateOptimizerModelInput(in));
  if (!(fraction >= 0 && fraction <= 1)) {
    return InvalidArgument("optimizer model: fraction " + std::to_string(fraction) + " is not in [0, 1]");
  }
  std::vector<bool> on_gpu = SpreadLayers(in.layers, fraction);
  if (!(in.rates.gpu_update_params_per_s > 0) && std::count(on_gpu.begin(), on_gpu.end(), true) > 0) {
    return FailedPrecondition("optimizer model: fraction " + std::to_string(fraction) +
                              " hands layers to a device, but no device can update (gpu rate 0)");
  }
  return MakePlan(in, std::move(on_gpu));
}

Result<InterleavePlan> PlanAuto(const OptimizerModelInput& in) {
  L2L_RETURN_IF_ERROR(ValidateOptimizerModelInput(in));
  const size_t L = in.layers.size();
  std::vector<bool> best(L, false);
  double best_t = PredictStepTime(in, best), best_f = 0;
  if (!DeviceUseful(in.rates)) return MakePlan(in, std::move(best));
  auto consider = [&](std::vector<bool> cand) {
    const double t = PredictStepTime(in, cand);
    const double f = Fraction(in.layers, cand);
    const double tol = 1e-9 * std::max(t, best_t);
    if (t < best_t - tol || (t <= best_t + tol && f < best_f)) {
      best_t = t;
      best_f = f;
      best = std::move(cand);
    }
  };
  for (size_t m = 1; m <= L; ++m) {
    consider(SpreadLayers(in.layers, static_cast<double>(m) / static_cast<double>(L)));
    std::vector<bool> tail(L, false);  // the last m of the update order: layers 0 .. m-1
    for (size_t l = 0; l < m; ++l) tail[l] = true;
    consider(std::move(tail));
  }
  return MakePlan(in, std::move(best));
}

double SeedUpdateStride(double uc, double dc, double ug, double b) {
  const double num = 3.0 / b + 1.0 / ug;
  const double den = 1.0 / uc + 1.0 / dc - 1.0 / (2.0 * b);
  if (!(den > 0)) return std::numeric_limits<double>::infinity();
  return num / den;
}

std::string DescribePlan(const OptimizerModelInput& in, const InterleavePlan& plan) {
  const OptimizerRates& r = in.rates;
  int64_t n_gpu = 0;
  for (bool b : plan.on_gpu) n_gpu += b ? 1 : 0;
  std::string layers;
  for (size_t l = 0; l < plan.on_gpu.size(); ++l) {
    if (!plan.on_gpu[l]) continue;
    if (!layers.empty()) layers += ",";
    layers += std::to_string(l);
  }
  double backward = 0;
  for (const LayerCost& c : in.layers) backward += c.backward_s;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "inputs: cpu_update=%.3g params/s cpu_cast=%.3g params/s gpu_update=%.3g params/s "
                "h2d=%.3g B/s d2h=%.3g B/s backward=%.4g s over %zu layers; choice: gpu_fraction=%.3f "
                "(%lld of %zu layers) predicted step %.4g s (daemon only %.4g s)",
                r.cpu_update_params_per_s, r.cpu_cast_params_per_s, r.gpu_update_params_per_s,
                r.h2d_bytes_per_s, r.d2h_bytes_per_s, backward, in.layers.size(), plan.gpu_fraction,
                static_cast<long long>(n_gpu), plan.on_gpu.size(), plan.step_s, plan.daemon_only_step_s);
  return std::string(buf) + (layers.empty() ? "" : " device layers [" + layers + "]");
}

}  // namespace l2l

// The daemon's choice, at job start, of which layers' AdamW update the workers' devices
// run (the interleaved optimizer) and which it keeps: optim.gpu_fraction fixes the share,
// "auto" asks the performance model (common/optimizer_model.h) with the measured rates.
// The choice and its inputs are logged once per job.
//
// What runs: the daemon (EpsCore::ApplyOptimizerSplit) chooses the split at job start and
// again whenever a worker offers or withdraws its device; the chosen layers go through
// the worker updater (worker_updater.h: a worker's device runs their AdamW, the daemon's
// CPU takes over when it cannot) while at least one worker takes updates. Workers
// measure their device's AdamW rate and H2D/D2H bandwidth at start and report them at
// Register, so "auto" plans with real device rates; with no worker taking updates auto
// gives 0 and a fixed share > 0 is logged with a warning that the daemon updates those
// layers itself until a worker offers its device.
//
// Thread-safety: pure functions, except the Measure* functions (allocate and time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/optimizer_model.h"
#include "common/status.h"

namespace l2l::eps {

struct OptimizerSplit {
  std::vector<bool> on_gpu;   // per layer: the workers' devices update it
  double gpu_fraction = 0;    // share of parameters on the devices
  std::string description;    // the log line: setting, inputs, choice
};

// fp32 parameters per second the exact AdamW (kernels/cpu/adamw_simd.h) updates as the
// pipeline runs it (chunks in parallel on the TBB threads), timed over `n` parameters
// with one worker gradient and a bf16 published copy; n should be well beyond the caches.
double MeasureCpuUpdateRate(size_t n = size_t{1} << 23);

// Bytes per second one thread copies (memcpy of `bytes`, beyond the caches): the rate of
// the daemon's copies into and out of a worker's update exchange segment.
double MeasureCopyBytesPerSecond(size_t bytes = size_t{64} << 20);

// The split for a job whose layers have `layer_params` parameters (index order).
// device_rates: the rates the workers reported (gpu_update_params_per_s 0: no device).
// backward_s: the measured backward per layer, or empty when no step has run (the model
// then assumes no backward to hide the update in).
Result<OptimizerSplit> ChooseOptimizerSplit(const OptimizerConfig& optim, const std::vector<int64_t>& layer_params,
                                            const OptimizerRates& rates, const std::vector<double>& backward_s);

}  // namespace l2l::eps

// The daemon's choice, at job start, of which layers' AdamW update the workers' devices
// run (the interleaved optimizer) and which it keeps: optim.gpu_fraction fixes the share,
// "auto" asks the performance model (common/optimizer_model.h) with the measured rates.
// The choice and its inputs are logged once per job.
//
// What runs today: the daemon updates every layer. The pipeline can route layers through
// an OffloadedUpdater (update_pipeline.h set_offload), but no worker transport implements
// one yet, so a fixed share > 0 is logged with the layers it would hand over and a
// warning that the daemon keeps them, and "auto" resolves to 0 because no worker reports
// a device update rate.
//
// Thread-safety: pure functions, except MeasureCpuUpdateRate (allocates and times).
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
  bool device_path_available = false;  // whether the device update is implemented here
  std::string description;    // the log line: setting, inputs, choice
};

// fp32 parameters per second the exact AdamW (adamw_vec.h) updates on this thread, timed
// over `n` parameters with one worker gradient and a bf16 published copy.
double MeasureCpuUpdateRate(size_t n = size_t{1} << 20);

// The split for a job whose layers have `layer_params` parameters (index order).
// device_rates: the rates the workers reported (gpu_update_params_per_s 0: no device).
// backward_s: the measured backward per layer, or empty when no step has run (the model
// then assumes no backward to hide the update in).
Result<OptimizerSplit> ChooseOptimizerSplit(const OptimizerConfig& optim, const std::vector<int64_t>& layer_params,
                                            const OptimizerRates& rates, const std::vector<double>& backward_s);

}  // namespace l2l::eps

// `l2l-bench-relay --simulate`: the analytic multi-device relay model's table (see
// relay_simulate.cc). Thread-safety: single-threaded; prints to stdout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l::bench {

// Flags of --simulate. Rates <= 0 keep the hardware preset's value.
struct SimulateFlags {
  std::string hw = "h100";         // h100 (seed 003's testbed) | dgx2 (seed 004's)
  double pcie_gbps = 0;            // per device, each direction, GB/s
  double host_gbps = 0;            // all devices' PCIe traffic together, GB/s
  double nvlink_gbps = 0;          // device to device, GB/s
  double tflops = 0;               // achieved per device, TFLOP/s
  double cpu_update_g = 0;         // daemon AdamW, G params/s
  double cpu_cast_g = 0;           // daemon fp32 -> bf16, G params/s
  double gpu_update_g = 0;         // device AdamW, G params/s
  int64_t sequences = 8;           // global sequences per step
  std::string gpu_fraction = "auto";  // the interleaved columns: auto or a number in [0, 1]
  std::vector<int> devices = {1, 2, 4, 8};
};

Status RunSimulate(const SimulateFlags& f);

}  // namespace l2l::bench

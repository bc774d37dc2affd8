// `l2l-bench-relay --simulate`: the analytic multi-device relay model's table (see
// relay_simulate.cc), from a hardware preset, measured rates (--rates-json, written by
// scripts/bench_gpu.sh) and flags, in that order of precedence (flags last).
// Thread-safety: single-threaded; prints to stdout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/relay_model.h"
#include "common/status.h"

namespace l2l::bench {

// Flags of --simulate. Rates <= 0 keep the preset's (or the rates file's) value.
struct SimulateFlags {
  std::string hw = "h100";         // h100 (seed 003's testbed) | dgx2 (seed 004's)
  // A JSON object of measured rates over the preset (keys: RatesJsonKeys()); "" = none.
  std::string rates_json;
  double pcie_gbps = 0;            // per device, each direction, GB/s
  double host_gbps = 0;            // all devices' PCIe traffic together, GB/s
  double nvlink_gbps = 0;          // device to device, GB/s
  double tflops = 0;               // achieved per device, TFLOP/s (the matmuls)
  double attention_tflops = 0;     // the attention products, TFLOP/s (0: the matmul rate)
  double cpu_update_g = 0;         // daemon AdamW, G params/s
  double cpu_cast_g = 0;           // daemon fp32 -> bf16, G params/s
  double gpu_update_g = 0;         // device AdamW, G params/s
  int64_t sequences = 8;           // global sequences per step
  std::string gpu_fraction = "auto";  // the interleaved columns: auto or a number in [0, 1]
  std::vector<int> devices = {1, 2, 4, 8};
  std::vector<std::string> shapes = {"gpt2-xl", "llama-7b"};  // common/relay_model.h names
  int64_t seq_len = 0;             // tokens per sequence; 0 = each shape's own

  // Scale-out (common/cluster_model.h): a non-empty `shards` prints the cluster table
  // instead of the single-host one (see RunClusterSimulate).
  std::vector<int> shards;                       // S, state shard hosts (l2l-eps daemons)
  std::vector<int> workers = {8, 16, 32, 64};    // W, GPU workers (one GPU each)
  int gpus_per_host = 8;                         // G
  std::vector<double> link_gbps = {25, 100, 400};  // one NIC, each direction, Gb/s
  int worker_nics = 1;                           // NICs per worker host
  int shard_nics = 1;                            // NICs per shard host
  int64_t gpu_sequences = 4;                     // sequences per GPU per step
  double shard_ram_gb = 512;                     // RAM per shard host for state, GB; 0 = unlimited
  double shard_ram_gbps = 0;                     // shard memory bandwidth; 0 = the preset's host_gbps
  double ssd_gbps = 6;                           // SSD per shard host, GB/s (read + write)
  double shard_overhead_s = 0;                   // per step per extra shard (to be calibrated)
};

// The keys --rates-json reads, each a number > 0 (other keys, e.g. the device's name, are
// ignored): matmul_tflops, attention_tflops, h2d_gbps, d2h_gbps, host_gbps, nvlink_gbps,
// cpu_update_g, cpu_cast_g, gpu_update_g. At least one must be present.
std::vector<std::string> RatesJsonKeys();

// Applies the rates in the JSON file `path` (at most 1 MiB) to `hw`; returns the keys it
// applied. An unreadable file, bad JSON, a non-object, a known key that is not a number
// > 0, or no known key at all is an error naming the file and the key.
Result<std::vector<std::string>> ApplyRatesJson(const std::string& path, RelayHardware* hw);

Status RunSimulate(const SimulateFlags& f);

// The cluster table (bench/cluster_simulate.cc), called by RunSimulate when f.shards is
// set, with the GPU rates already resolved (preset, rates file, flags) and the shapes
// (seq_len applied); `rates_note` lists the keys the rates file set ("" = none). Errors
// name the flag.
Status RunClusterSimulate(const SimulateFlags& f, const RelayHardware& hw, const std::vector<RelayShape>& shapes,
                          const std::string& rates_note);

}  // namespace l2l::bench

// `l2l-bench-relay --simulate`: prints the analytic relay step model (common/relay_model.h)
// for GPT-2 XL and a 7B Llama on 1, 2, 4, 8 devices, with and without bandwidth-centric
// fetch and the interleaved optimizer, beside the figures seeds 003 and 004 publish.
// Nothing is measured here: the rates come from a hardware preset (the seeds' hardware),
// then from --rates-json (rates scripts/bench_gpu.sh measured on a GPU), then from flags.
// Output: a human-readable table, then one "json: {...}" line per configuration.
// With --shards, the scale-out table of bench/cluster_simulate.cc instead.
#include "bench/relay_simulate.h"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/relay_model.h"

namespace l2l::bench {
namespace {

struct Row {
  RelaySimResult r[2][2];  // [bandwidth_centric][interleave]
};

void PrintPublished(const std::string& hw) {
  std::printf("\npublished figures (not produced by this model):\n");
  std::printf("  seed 004 6.1 (DGX-2, 16xV100, PCIe Gen3): CPU->GPU bandwidth ~12 GB/s with broadcast even at\n"
              "    16-way data parallelism; ~48 GB/s aggregate (3.0 GB/s per GPU) with the all-gather-based\n"
              "    (bandwidth-centric) fetch. Fig. 6c: ~2x faster backward at 64 GPUs than ZeRO-Offload.\n");
  std::printf("  seed 003 5 (4xH100): 2-2.5x faster iterations than ZeRO-3 (20B model); update throughput\n"
              "    70%% higher; 50%% of updates on the GPU optimal (k = 2). 4xV100, 7B: Equation 1 gives k = 2\n"
              "    (measured 1.67 / 1.62 / 1.28 B params/s at k = 3 / 4 / 5).\n");
  std::printf("  (hardware preset: %s)\n", hw.c_str());
}

struct RateKey {
  const char* key;
  double scale;              // to the model's unit (bytes/s, FLOP/s, params/s)
  double RelayHardware::*field;
};

const std::vector<RateKey>& RateKeys() {
  static const std::vector<RateKey> keys = {
      {"matmul_tflops", 1e12, &RelayHardware::device_flops},
      {"attention_tflops", 1e12, &RelayHardware::attention_flops},
      {"h2d_gbps", 1e9, &RelayHardware::pcie_h2d},
      {"d2h_gbps", 1e9, &RelayHardware::pcie_d2h},
      {"host_gbps", 1e9, &RelayHardware::host_aggregate},
      {"nvlink_gbps", 1e9, &RelayHardware::nvlink},
      {"cpu_update_g", 1e9, &RelayHardware::cpu_update},
      {"cpu_cast_g", 1e9, &RelayHardware::cpu_cast},
      {"gpu_update_g", 1e9, &RelayHardware::device_update},
  };
  return keys;
}

}  // namespace

std::vector<std::string> RatesJsonKeys() {
  std::vector<std::string> out;
  for (const RateKey& k : RateKeys()) out.push_back(k.key);
  return out;
}

Result<std::vector<std::string>> ApplyRatesJson(const std::string& path, RelayHardware* hw) {
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, uint64_t{1} << 20));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("--rates-json " + path + ": not valid JSON");
  if (!j.is_object()) return InvalidArgument("--rates-json " + path + ": not a JSON object");
  std::vector<std::string> applied;
  for (const RateKey& k : RateKeys()) {
    auto it = j.find(k.key);
    if (it == j.end() || it->is_null()) continue;  // null: not measured (bench_gpu.sh writes it so)
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
      return InvalidArgument("--rates-json " + path + ": \"" + k.key + "\" must be a number > 0, not " + it->dump());
    }
    hw->*k.field = it->get<double>() * k.scale;
    applied.push_back(k.key);
  }
  if (applied.empty()) {
    std::string names;
    for (const RateKey& k : RateKeys()) names += (names.empty() ? "" : ", ") + std::string(k.key);
    return InvalidArgument("--rates-json " + path + ": none of the rate keys is set (" + names + ")");
  }
  return applied;
}

Status RunSimulate(const SimulateFlags& f) {
  RelayHardware hw;
  if (f.hw == "h100") {
    hw = H100TestbedHardware();
  } else if (f.hw == "dgx2") {
    hw = Dgx2Hardware();
  } else {
    return InvalidArgument("--hw '" + f.hw + "' is not one of: h100, dgx2");
  }
  std::string rates_note;
  if (!f.rates_json.empty()) {
    Result<std::vector<std::string>> applied = ApplyRatesJson(f.rates_json, &hw);
    if (!applied.ok()) return applied.status();
    for (const std::string& k : *applied) rates_note += (rates_note.empty() ? "" : ", ") + k;
  }
  if (f.pcie_gbps > 0) hw.pcie_h2d = hw.pcie_d2h = f.pcie_gbps * 1e9;
  if (f.host_gbps > 0) hw.host_aggregate = f.host_gbps * 1e9;
  if (f.nvlink_gbps > 0) hw.nvlink = f.nvlink_gbps * 1e9;
  if (f.tflops > 0) hw.device_flops = f.tflops * 1e12;
  if (f.attention_tflops > 0) hw.attention_flops = f.attention_tflops * 1e12;
  if (f.cpu_update_g > 0) hw.cpu_update = f.cpu_update_g * 1e9;
  if (f.cpu_cast_g > 0) hw.cpu_cast = f.cpu_cast_g * 1e9;
  if (f.gpu_update_g > 0) hw.device_update = f.gpu_update_g * 1e9;
  Result<GpuFraction> frac = ParseGpuFraction(f.gpu_fraction);
  if (!frac.ok()) return frac.status().WithContext("--gpu-fraction");
  if (f.sequences < 1) return InvalidArgument("--sequences must be >= 1");
  if (f.devices.empty()) return InvalidArgument("--devices is empty");
  for (int n : f.devices) {
    if (n < 1) return InvalidArgument("--devices: " + std::to_string(n) + " is < 1");
  }
  if (f.seq_len < 0) return InvalidArgument("--seq-len must be >= 0 (0 = each shape's own)");
  if (f.shapes.empty()) return InvalidArgument("--shapes is empty");
  std::vector<RelayShape> shapes;
  for (const std::string& name : f.shapes) {
    Result<RelayShape> shape = RelayShapeByName(name);
    if (!shape.ok()) return shape.status().WithContext("--shapes");
    if (f.seq_len > 0) shape->seq_len = f.seq_len;
    shapes.push_back(*shape);
  }

  if (!f.shards.empty()) return RunClusterSimulate(f, hw, shapes, rates_note);
  std::printf("MODEL, not a measurement: relay step time from common/relay_model.h\n");
  std::printf("hardware: PCIe %.0f GB/s per device H2D (%.0f D2H), host aggregate %.0f GB/s, NVLink %.0f GB/s,\n"
              "          %.0f TFLOP/s per device (matmuls), attention %.0f TFLOP/s,\n"
              "          CPU AdamW %.1f G params/s, cast %.1f G params/s, device AdamW %.1f G params/s; "
              "gpu_fraction %s\n",
              hw.pcie_h2d / 1e9, hw.pcie_d2h / 1e9, hw.host_aggregate / 1e9, hw.nvlink / 1e9, hw.device_flops / 1e12,
              (hw.attention_flops > 0 ? hw.attention_flops : hw.device_flops) / 1e12, hw.cpu_update / 1e9,
              hw.cpu_cast / 1e9, hw.device_update / 1e9, ToString(*frac).c_str());
  if (!f.rates_json.empty()) {
    std::printf("rates: preset %s, then %s from %s (measured), then flags\n", f.hw.c_str(), rates_note.c_str(),
                f.rates_json.c_str());
  }
  std::vector<nlohmann::json> lines;
  for (const RelayShape& shape : shapes) {
    RelayWorkload work;
    work.tokens_per_step = f.sequences * shape.seq_len;
    std::printf("\n%s, %lld sequences x %lld tokens per step (global)\n", shape.name.c_str(),
                static_cast<long long>(f.sequences), static_cast<long long>(shape.seq_len));
    std::printf("  %-4s | %-22s | %-22s | %-13s | %-13s | %s\n", "N", "per-device fetch", "bandwidth-centric",
                "+interleave", "bwc+interleave", "gpu_fraction (bwc)");
    std::printf("  %-4s | %10s %11s | %10s %11s | %13s | %13s |\n", "", "step s", "fetch GB/s", "step s", "fetch GB/s",
                "step s", "step s");
    for (int n : f.devices) {
      Row row;
      for (int b = 0; b < 2; ++b) {
        for (int i = 0; i < 2; ++i) {
          RelaySimOptions o;
          o.devices = n;
          o.bandwidth_centric = b == 1;
          o.interleave = i == 1;
          o.gpu_fraction = *frac;
          Result<RelaySimResult> r = SimulateRelayStep(shape, work, hw, o);
          if (!r.ok()) return r.status();
          row.r[b][i] = *r;
          lines.push_back({{"model", shape.name},
                           {"devices", n},
                           {"bandwidth_centric", b == 1},
                           {"interleave", i == 1},
                           {"seq_len", shape.seq_len},
                           {"tokens_per_step", work.tokens_per_step},
                           {"step_s", r->step_s},
                           {"forward_s", r->forward_s},
                           {"backward_s", r->backward_s},
                           {"update_tail_s", r->update_tail_s},
                           {"fetch_gbps", r->fetch_gbps},
                           {"gpu_fraction", r->gpu_fraction}});
        }
      }
      std::printf("  %-4d | %10.3f %11.1f | %10.3f %11.1f | %13.3f | %13.3f | %.2f\n", n, row.r[0][0].step_s,
                  row.r[0][0].fetch_gbps, row.r[1][0].step_s, row.r[1][0].fetch_gbps, row.r[0][1].step_s,
                  row.r[1][1].step_s, row.r[1][1].gpu_fraction);
    }
  }
  PrintPublished(f.hw);
  for (const nlohmann::json& j : lines) std::printf("json: %s\n", j.dump().c_str());
  return Status::Ok();
}

}  // namespace l2l::bench

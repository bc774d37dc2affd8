// `l2l-bench-relay --simulate --shards S,...`: the scale-out model's table
// (common/cluster_model.h): per model, per link speed, per (GPU workers W, shard hosts S),
// the step time, tokens/s and the bottleneck, for the layout issue 31 builds (contiguous
// layer ranges, every worker fetching for itself) and three alternatives (the host's GPUs
// fetching one copy between them; every layer striped over all shards). Nothing is
// measured: GPU rates from the preset / --rates-json / flags, host rates from flags.
// Output: human-readable tables, then one "json: {...}" line per configuration
// ("cluster": true).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/relay_simulate.h"
#include "common/cluster_model.h"

namespace l2l::bench {
namespace {

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

Status CheckFlags(const SimulateFlags& f, const std::vector<RelayShape>& shapes) {
  for (int s : f.shards) {
    if (s < 1) return InvalidArgument("--shards: " + std::to_string(s) + " is < 1 (a shard host count)");
    for (const RelayShape& shape : shapes) {
      const size_t layers = RelayLayers(shape).size();
      if (static_cast<size_t>(s) > layers) {
        return InvalidArgument("--shards: " + std::to_string(s) + " is more than the " + std::to_string(layers) +
                               " layers of " + shape.name + " (each shard owns at least one)");
      }
    }
  }
  if (f.workers.empty()) return InvalidArgument("--workers is empty");
  for (int w : f.workers) {
    if (w < 1) return InvalidArgument("--workers: " + std::to_string(w) + " is < 1 (a GPU worker count)");
  }
  if (f.gpus_per_host < 1) return InvalidArgument("--gpus-per-host: " + std::to_string(f.gpus_per_host) + " is < 1");
  if (f.link_gbps.empty()) return InvalidArgument("--link-gbps is empty");
  for (double g : f.link_gbps) {
    if (!(g > 0) || !std::isfinite(g)) {
      return InvalidArgument("--link-gbps: " + Num(g) + " must be a link speed > 0 in Gb/s");
    }
  }
  if (f.worker_nics < 1) return InvalidArgument("--worker-nics: " + std::to_string(f.worker_nics) + " is < 1");
  if (f.shard_nics < 1) return InvalidArgument("--shard-nics: " + std::to_string(f.shard_nics) + " is < 1");
  if (f.gpu_sequences < 1) return InvalidArgument("--gpu-sequences must be >= 1");
  if (!(f.shard_ram_gb >= 0) || !std::isfinite(f.shard_ram_gb)) {
    return InvalidArgument("--shard-ram-gb must be >= 0 (0 = unlimited)");
  }
  if (!(f.shard_ram_gbps >= 0) || !std::isfinite(f.shard_ram_gbps)) {
    return InvalidArgument("--shard-ram-gbps must be >= 0 (0 = the preset's host bandwidth)");
  }
  if (!(f.ssd_gbps > 0) || !std::isfinite(f.ssd_gbps)) return InvalidArgument("--ssd-gbps must be > 0");
  if (!(f.shard_overhead_s >= 0) || !std::isfinite(f.shard_overhead_s)) {
    return InvalidArgument("--shard-overhead-s must be >= 0 seconds");
  }
  return Status::Ok();
}

struct Variant {
  ShardLayout layout;
  bool host_bwc;
};
constexpr Variant kVariants[] = {{ShardLayout::kRange, false},
                                 {ShardLayout::kRange, true},
                                 {ShardLayout::kStripe, false},
                                 {ShardLayout::kStripe, true}};

std::string Cell(const ClusterResult& r) {
  char buf[64];
  if (!r.fits) return "  does not fit (shard RAM)";
  std::snprintf(buf, sizeof(buf), "%8.1f %-14s", r.step_s, r.bottleneck.c_str());
  return buf;
}

}  // namespace

Status RunClusterSimulate(const SimulateFlags& f, const RelayHardware& hw, const std::vector<RelayShape>& shapes,
                          const std::string& rates_note) {
  L2L_RETURN_IF_ERROR(CheckFlags(f, shapes));
  ClusterHardware host;
  host.worker_nics = f.worker_nics;
  host.shard_nics = f.shard_nics;
  host.shard_ram_bytes = f.shard_ram_gb * 1e9;
  host.shard_ram_bw = f.shard_ram_gbps > 0 ? f.shard_ram_gbps * 1e9 : hw.host_aggregate;
  host.ssd_bytes_per_s = f.ssd_gbps * 1e9;
  host.shard_overhead_s = f.shard_overhead_s;

  std::printf("MODEL, not a measurement: scale-out relay step time from common/cluster_model.h\n");
  std::printf("GPU (per worker): %.0f TFLOP/s matmuls, attention %.0f TFLOP/s, PCIe %.0f GB/s H2D (%.0f D2H), "
              "host %.0f GB/s, NVLink %.0f GB/s (preset %s)\n",
              hw.device_flops / 1e12, (hw.attention_flops > 0 ? hw.attention_flops : hw.device_flops) / 1e12,
              hw.pcie_h2d / 1e9, hw.pcie_d2h / 1e9, hw.host_aggregate / 1e9, hw.nvlink / 1e9, f.hw.c_str());
  std::printf("shard host: AdamW %.1f G params/s, cast %.1f G params/s, RAM %.0f GB at %.0f GB/s, SSD %.1f GB/s, "
              "%d NIC(s); worker host: %d GPUs, %d NIC(s); shard overhead %.3g s per extra shard per step\n",
              hw.cpu_update / 1e9, hw.cpu_cast / 1e9, f.shard_ram_gb, host.shard_ram_bw / 1e9, f.ssd_gbps,
              f.shard_nics, f.gpus_per_host, f.worker_nics, f.shard_overhead_s);
  if (!rates_note.empty()) {
    std::printf("rates: preset %s, then %s from %s (measured), then flags\n", f.hw.c_str(), rates_note.c_str(),
                f.rates_json.c_str());
  }
  std::printf("columns: range = contiguous layer ranges per shard (issue 31), stripe = every layer split over all\n"
              "shards; per-GPU = every worker fetches and pushes its own copy (today), host-bwc = a host's GPUs\n"
              "fetch one copy between them and all-gather it over NVLink (not built). Cell: step s, bottleneck.\n");
  std::vector<nlohmann::json> lines;
  for (const RelayShape& shape : shapes) {
    ClusterWorkload work;
    work.tokens_per_gpu = f.gpu_sequences * shape.seq_len;
    for (double gbps : f.link_gbps) {
      host.link_bytes_per_s = gbps * 1e9 / 8;
      std::printf("\n%s, %lld sequences x %lld tokens per GPU per step, link %g Gb/s\n", shape.name.c_str(),
                  static_cast<long long>(f.gpu_sequences), static_cast<long long>(shape.seq_len), gbps);
      std::printf("  %4s %5s %3s | %-10s | %-23s | %-23s | %-23s | %-23s\n", "W", "hosts", "S", "tokens/s",
                  "range, per-GPU", "range, host-bwc", "stripe, per-GPU", "stripe, host-bwc");
      for (int w : f.workers) {
        for (int s : f.shards) {
          ClusterOptions o;
          o.workers = w;
          o.gpus_per_host = f.gpus_per_host;
          o.shards = s;
          std::string cells;
          double first_tps = 0;
          int hosts = 0;
          for (const Variant& v : kVariants) {
            o.layout = v.layout;
            o.host_bandwidth_centric = v.host_bwc;
            Result<ClusterResult> r = SimulateClusterStep(shape, hw, host, o, work);
            if (!r.ok()) return r.status().WithContext("--shards " + std::to_string(s));
            if (cells.empty()) first_tps = r->fits ? r->tokens_per_s : 0;
            hosts = r->hosts;
            cells += " | " + Cell(*r);
            nlohmann::json by_res = nlohmann::json::object();
            for (const auto& [name, sec] : r->seconds_by_resource) by_res[name] = sec;
            std::vector<double> out, in, params, spilled, busy;
            for (const ClusterShard& sh : r->shards) {
              out.push_back(sh.nic_out_bytes);
              in.push_back(sh.nic_in_bytes);
              params.push_back(sh.params);
              spilled.push_back(sh.spilled_bytes);
              busy.push_back(sh.update_busy_s);
            }
            lines.push_back({{"cluster", true},
                             {"model", shape.name},
                             {"link_gbps", gbps},
                             {"workers", w},
                             {"gpus_per_host", f.gpus_per_host},
                             {"hosts", r->hosts},
                             {"shards", s},
                             {"layout", ToString(v.layout)},
                             {"host_bwc", v.host_bwc},
                             {"copies", r->copies},
                             {"tokens_per_gpu", work.tokens_per_gpu},
                             {"fits", r->fits},
                             {"step_s", r->step_s},
                             {"forward_s", r->forward_s},
                             {"backward_s", r->backward_s},
                             {"update_tail_s", r->update_tail_s},
                             {"overhead_s", r->overhead_s},
                             {"tokens_per_s", r->tokens_per_s},
                             {"tflops_per_gpu", r->tflops_per_gpu},
                             {"bottleneck", r->bottleneck},
                             {"seconds_by_resource", by_res},
                             {"params", r->params},
                             {"worker_host_nic_in_bytes", r->worker_host_nic_in_bytes},
                             {"worker_host_nic_out_bytes", r->worker_host_nic_out_bytes},
                             {"shard_params", params},
                             {"shard_nic_out_bytes", out},
                             {"shard_nic_in_bytes", in},
                             {"shard_spilled_bytes", spilled},
                             {"shard_update_busy_s", busy}});
          }
          std::printf("  %4d %5d %3d | %10.0f%s\n", w, hosts, s, first_tps, cells.c_str());
        }
      }
    }
  }
  std::printf("\n(tokens/s: the first column's, all workers together.) Published for comparison (seed 004,\n"
              "ZeRO-Infinity, DGX-2 nodes of 16 V100, 800 Gb/s between nodes): section 7.3 / Fig. 5b, a 1T model\n"
              "on 4 nodes (64 GPUs): over 2.8 PFLOP/s, 44 TFLOP/s per GPU; section 7.4 / Fig. 5c, 10B-100B models\n"
              "on one node (16 GPUs): over 40 TFLOP/s per GPU. docs/performance.md sets them beside this table.\n");
  for (const nlohmann::json& j : lines) std::printf("json: %s\n", j.dump().c_str());
  return Status::Ok();
}

}  // namespace l2l::bench

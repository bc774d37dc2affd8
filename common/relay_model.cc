// Analytic relay step model (see relay_model.h).
#include "common/relay_model.h"

#include <algorithm>
#include <cmath>

namespace l2l {

std::vector<RelayLayer> RelayLayers(const RelayShape& s) {
  const double d = static_cast<double>(s.d_model), ff = static_cast<double>(s.d_ff);
  const double table = static_cast<double>(s.vocab) * d;
  const double kv = static_cast<double>(s.kv_dim > 0 ? s.kv_dim : s.d_model);
  // q and o are d x d; k and v are d x kv (kv = d without grouped-query attention).
  const double block = 2 * d * d + 2 * d * kv + (s.gated_mlp ? 3 : 2) * d * ff;
  std::vector<RelayLayer> out;
  // Embedding: a lookup (no FLOPs to speak of). A tied table is updated by the head layer
  // (its gradients are summed there); the embedding layer then owns the position table.
  const int64_t pos = s.tied_embeddings ? s.seq_len * s.d_model : 0;
  out.push_back({0, 0, table + static_cast<double>(pos),
                 s.tied_embeddings ? std::max<int64_t>(pos, 1) : static_cast<int64_t>(table)});
  for (int64_t i = 0; i < s.n_layer; ++i) {
    // Matmuls 2 FLOPs per weight per token; attention scores and weighted sum 4*T*d.
    out.push_back({2 * block, 4 * static_cast<double>(s.seq_len) * d, block, static_cast<int64_t>(block)});
  }
  out.push_back({2 * table, 0, table, static_cast<int64_t>(table)});  // head (+ final norm, negligible)
  return out;
}

RelayShape Gpt2XlShape() { return {"gpt2-xl", 48, 1600, 6400, 50257, 1024, false, true}; }
RelayShape Llama7bShape() { return {"llama-7b", 32, 4096, 11008, 32000, 4096, true, false}; }
RelayShape Qwen25_1_5bShape() { return {"qwen2.5-1.5b", 28, 1536, 8960, 151936, 1024, true, true, 256}; }
RelayShape Llama70bShape() { return {"llama-70b", 80, 8192, 28672, 128256, 8192, true, false, 1024}; }

Result<RelayShape> RelayShapeByName(const std::string& name) {
  for (const RelayShape& s : {Gpt2XlShape(), Llama7bShape(), Qwen25_1_5bShape(), Llama70bShape()}) {
    if (s.name == name) return s;
  }
  return InvalidArgument("relay model: no shape '" + name + "' (gpt2-xl, llama-7b, qwen2.5-1.5b, llama-70b)");
}

RelayHardware H100TestbedHardware() {
  RelayHardware h;
  h.pcie_h2d = 55e9;         // seed 003: "~55 GB/s unidirectional D2H and H2D" (pinned)
  h.pcie_d2h = 55e9;
  h.host_aggregate = 200e9;  // assumption: 2-socket DDR5 host, no figure in the seed
  h.nvlink = 133e9;          // seed 003: "133 GB/s unidirectional D2D"
  h.device_flops = 400e12;   // assumption: ~40% of the H100's dense bf16 peak
  h.cpu_update = 8e9;        // seed 003: "the 192 CPUs update the model at ~8 Billion P/s"
  h.cpu_cast = 15.5e9;       // seed 003 Table 1: H32<->H16 at 62 GB/s = 15.5 G fp32 params/s
  h.device_update = 25e9;    // seed 003: "4xH100 GPUs update ~100 Billion P/s" (/ 4)
  return h;
}

RelayHardware Dgx2Hardware() {
  RelayHardware h;
  h.pcie_h2d = 12e9;         // seed 004: "about 12 GB/s with PCIe Gen 3"
  h.pcie_d2h = 12e9;
  h.host_aggregate = 48e9;   // seed 004: all-gather-based "increases to about 48 GB/s"
  h.nvlink = 70e9;           // seed 004 appendix: "measured bandwidth across GPUs is about 70GB/s"
  h.device_flops = 70e12;    // seed 004: peak_tp "average of 70 TFlops/GPU"
  h.cpu_update = 2e9;        // seed 003 (its V100 host): "CPU (U_c) ... 2 Billion P/s"
  h.cpu_cast = 8.7e9;        // seed 003 (its V100 host): "(D_c) on host at 8.7 Billion P/s"
  h.device_update = 35e9;    // seed 003 (its V100 host): "GPU (U_g) ... 35 Billion P/s"
  return h;
}

Result<RelaySimResult> SimulateRelayStep(const RelayShape& shape, const RelayWorkload& work,
                                         const RelayHardware& hw, const RelaySimOptions& opt) {
  if (shape.n_layer < 1 || shape.d_model < 1 || shape.d_ff < 1 || shape.vocab < 1 || shape.seq_len < 1) {
    return InvalidArgument("relay model: shape '" + shape.name + "' has a size < 1");
  }
  if (opt.devices < 1) return InvalidArgument("relay model: devices must be >= 1");
  if (work.tokens_per_step < 1) return InvalidArgument("relay model: tokens_per_step must be >= 1");
  for (double x : {hw.pcie_h2d, hw.pcie_d2h, hw.host_aggregate, hw.nvlink, hw.device_flops, hw.cpu_update,
                   hw.cpu_cast, hw.device_update}) {
    if (!(x > 0)) return InvalidArgument("relay model: every hardware rate must be > 0");
  }
  if (!(hw.attention_flops >= 0)) return InvalidArgument("relay model: attention_flops must be >= 0 (0 = device_flops)");
  if (shape.kv_dim < 0 || shape.kv_dim > shape.d_model) {
    return InvalidArgument("relay model: shape '" + shape.name + "' has kv_dim outside [0, d_model]");
  }

  const double n = opt.devices;
  const bool bwc = opt.bandwidth_centric && opt.devices > 1;
  const double tokens_per_device = static_cast<double>(work.tokens_per_step) / n;
  RelaySimResult r;
  OptimizerModelInput in;
  double fetched = 0, fetch_time = 0;
  for (const RelayLayer& l : RelayLayers(shape)) {
    // With no attention rate of its own the attention runs at the matmul rate (one sum,
    // as before the rate was split).
    const double compute_f =
        hw.attention_flops > 0
            ? l.fwd_flops_per_token * tokens_per_device / hw.device_flops +
                  l.fwd_attn_flops_per_token * tokens_per_device / hw.attention_flops
            : (l.fwd_flops_per_token + l.fwd_attn_flops_per_token) * tokens_per_device / hw.device_flops;
    const double compute_b = 3 * compute_f;  // backward (2x) + the recomputed forward
    const double w = l.fetch_params * work.publish_bytes;
    const double g = static_cast<double>(l.update_params) * work.grad_bytes;
    double fetch, push, nvl_f = 0, nvl_b = 0;
    if (bwc) {
      fetch = std::max(w / n / hw.pcie_h2d, w / hw.host_aggregate);
      push = std::max(g / n / hw.pcie_d2h, g / hw.host_aggregate);
      nvl_f = w * (n - 1) / n / hw.nvlink;                // all-gather
      nvl_b = nvl_f + g * (n - 1) / n / hw.nvlink;        // all-gather + reduce-scatter
    } else {
      fetch = std::max(w / hw.pcie_h2d, n * w / hw.host_aggregate);
      push = std::max(g / hw.pcie_d2h, n * g / hw.host_aggregate);
    }
    r.forward_s += std::max({compute_f, fetch, nvl_f});
    in.layers.push_back({l.update_params, std::max({compute_b, fetch, push, nvl_b})});
    fetched += w;
    fetch_time += std::max(fetch, nvl_f);
    r.params += l.update_params;
  }
  r.fetch_gbps = fetch_time > 0 ? fetched / fetch_time / 1e9 : 0;
  // The group's optimizer side: with bandwidth-centric fetch each device updates 1/N of a
  // layer with its own reduce-scattered gradient shard over its own link; without it one
  // device takes the layer and needs the reduced gradient sent back down when there are
  // several workers (16 instead of 12 bytes per parameter on H2D).
  in.rates.cpu_update_params_per_s = hw.cpu_update;
  in.rates.cpu_cast_params_per_s = hw.cpu_cast;
  in.rates.gpu_update_params_per_s = hw.device_update * (bwc ? n : 1);
  in.rates.h2d_bytes_per_s = bwc ? std::min(n * hw.pcie_h2d, hw.host_aggregate)
                                 : hw.pcie_h2d * (opt.devices > 1 ? 12.0 / 16.0 : 1.0);
  in.rates.d2h_bytes_per_s = bwc ? std::min(n * hw.pcie_d2h, hw.host_aggregate) : hw.pcie_d2h;
  in.forward_s = r.forward_s;
  Result<InterleavePlan> plan = !opt.interleave                ? PlanFixedFraction(in, 0)
                                : opt.gpu_fraction.automatic ? PlanAuto(in)
                                                             : PlanFixedFraction(in, opt.gpu_fraction.value);
  if (!plan.ok()) return plan.status();
  for (const LayerCost& c : in.layers) r.backward_s += c.backward_s;
  r.step_s = plan->step_s;
  r.update_tail_s = plan->tail_s;
  r.gpu_fraction = plan->gpu_fraction;
  return r;
}

}  // namespace l2l

// Analytic scale-out step model (see cluster_model.h).
#include "common/cluster_model.h"

#include <algorithm>
#include <cmath>

namespace l2l {
namespace {

enum Res { kCompute, kPcie, kNvlink, kWorkerNic, kShardNic, kShardRam, kShardUpdate, kSsd, kOverhead, kNumRes };

// The slowest of `t` (seconds per resource); ties go to the earlier resource.
int Slowest(const double (&t)[kNumRes]) {
  int best = 0;
  for (int i = 1; i < kNumRes; ++i) {
    if (t[i] > t[best]) best = i;
  }
  return best;
}

bool Positive(double x) { return x > 0 && std::isfinite(x); }

}  // namespace

const char* ToString(ShardLayout layout) { return layout == ShardLayout::kRange ? "range" : "stripe"; }

const std::vector<std::string>& ClusterResources() {
  static const std::vector<std::string> names = {"compute",    "PCIe",     "NVLink",       "worker NIC", "shard NIC",
                                                 "shard RAM", "shard update", "SSD",      "shard overhead"};
  return names;
}

std::vector<int> PartitionLayersByBytes(const std::vector<double>& bytes, int shards) {
  const int n = static_cast<int>(bytes.size());
  double total = 0;
  for (double b : bytes) total += b;
  std::vector<int> owner(bytes.size());
  double before = 0;
  int prev = -1;
  for (int i = 0; i < n; ++i) {
    const double mid = before + bytes[i] / 2;
    int s = total > 0 ? static_cast<int>(mid / total * shards) : 0;
    s = std::max(s, shards - (n - i));  // leave a layer for every later shard
    s = std::min({s, prev + 1, shards - 1});  // contiguous, none skipped
    owner[i] = s;
    prev = s;
    before += bytes[i];
  }
  return owner;
}

Result<ClusterResult> SimulateClusterStep(const RelayShape& shape, const RelayHardware& gpu,
                                          const ClusterHardware& hosts, const ClusterOptions& opt,
                                          const ClusterWorkload& work) {
  if (shape.n_layer < 1 || shape.d_model < 1 || shape.d_ff < 1 || shape.vocab < 1 || shape.seq_len < 1) {
    return InvalidArgument("cluster model: shape '" + shape.name + "' has a size < 1");
  }
  if (opt.workers < 1) {
    return InvalidArgument("cluster model: workers must be >= 1, not " + std::to_string(opt.workers));
  }
  if (opt.gpus_per_host < 1) {
    return InvalidArgument("cluster model: gpus_per_host must be >= 1, not " + std::to_string(opt.gpus_per_host));
  }
  const std::vector<RelayLayer> layers = RelayLayers(shape);
  const int L = static_cast<int>(layers.size());
  if (opt.shards < 1 || opt.shards > L) {
    return InvalidArgument("cluster model: shards must be in [1, " + std::to_string(L) + "] (the layers of '" +
                           shape.name + "'), not " + std::to_string(opt.shards));
  }
  if (!Positive(hosts.link_bytes_per_s)) return InvalidArgument("cluster model: link bandwidth must be > 0");
  if (hosts.worker_nics < 1 || hosts.shard_nics < 1) {
    return InvalidArgument("cluster model: NICs per host must be >= 1");
  }
  if (!(hosts.shard_ram_bytes >= 0) || !std::isfinite(hosts.shard_ram_bytes)) {
    return InvalidArgument("cluster model: shard RAM must be >= 0 (0 = unlimited)");
  }
  if (!Positive(hosts.shard_ram_bw)) return InvalidArgument("cluster model: shard RAM bandwidth must be > 0");
  if (!(hosts.ssd_bytes_per_s >= 0)) return InvalidArgument("cluster model: SSD bandwidth must be >= 0");
  if (!(hosts.shard_overhead_s >= 0) || !std::isfinite(hosts.shard_overhead_s)) {
    return InvalidArgument("cluster model: shard overhead must be >= 0 seconds");
  }
  if (work.tokens_per_gpu < 1) return InvalidArgument("cluster model: tokens per GPU must be >= 1");
  if (!Positive(work.publish_bytes) || !Positive(work.grad_bytes)) {
    return InvalidArgument("cluster model: bytes per parameter must be > 0");
  }
  for (double x : {gpu.pcie_h2d, gpu.pcie_d2h, gpu.host_aggregate, gpu.nvlink, gpu.device_flops, gpu.cpu_update,
                   gpu.cpu_cast}) {
    if (!Positive(x)) return InvalidArgument("cluster model: every hardware rate must be > 0");
  }
  if (!(gpu.attention_flops >= 0)) return InvalidArgument("cluster model: attention_flops must be >= 0");

  const int S = opt.shards;
  const int G = std::min(opt.gpus_per_host, opt.workers);  // GPUs on the busiest host
  ClusterResult r;
  r.hosts = (opt.workers + opt.gpus_per_host - 1) / opt.gpus_per_host;
  const bool bwc = opt.host_bandwidth_centric;
  r.copies = bwc ? r.hosts : opt.workers;
  const double C = r.copies;
  const double g = G;
  const double wnic = hosts.link_bytes_per_s * hosts.worker_nics;
  const double snic = hosts.link_bytes_per_s * hosts.shard_nics;
  const double tokens = static_cast<double>(work.tokens_per_gpu);

  // Who owns what: share[l][s] = the fraction of layer l shard s holds.
  std::vector<double> layer_bytes;
  for (const RelayLayer& l : layers) layer_bytes.push_back(l.fetch_params * work.publish_bytes);
  const std::vector<int> owner = PartitionLayersByBytes(layer_bytes, S);
  auto share = [&](int l, int s) -> double {
    if (opt.layout == ShardLayout::kStripe) return 1.0 / S;
    return owner[l] == s ? 1.0 : 0.0;
  };

  r.shards.resize(S);
  for (int s = 0; s < S; ++s) {
    ClusterShard& sh = r.shards[s];
    sh.first_layer = L;
    sh.end_layer = 0;
    double fetch_params = 0, max_layer = 0;
    for (int l = 0; l < L; ++l) {
      const double f = share(l, s);
      if (f == 0) continue;
      sh.first_layer = std::min(sh.first_layer, l);
      sh.end_layer = std::max(sh.end_layer, l + 1);
      sh.params += f * static_cast<double>(layers[l].update_params);
      fetch_params += f * layers[l].fetch_params;
      max_layer = std::max(max_layer, f * static_cast<double>(layers[l].update_params));
    }
    sh.nic_out_bytes = C * 2 * fetch_params * work.publish_bytes;  // forward + backward fetch
    sh.nic_in_bytes = C * sh.params * work.grad_bytes;
    const double state = 12 * sh.params;
    const double fixed = fetch_params * work.publish_bytes + C * max_layer * work.grad_bytes;
    sh.ram_need_bytes = state + fixed;
    if (hosts.shard_ram_bytes > 0 && sh.ram_need_bytes > hosts.shard_ram_bytes) {
      if (fixed > hosts.shard_ram_bytes) r.fits = false;
      sh.spilled_bytes = std::min(state, sh.ram_need_bytes - hosts.shard_ram_bytes);
      if (!(hosts.ssd_bytes_per_s > 0)) {
        return InvalidArgument("cluster model: shard " + std::to_string(s) +
                               " spills state to the SSD but the SSD bandwidth is 0");
      }
    }
    r.params += sh.params;
  }

  double charged[kNumRes] = {};
  const double attn_rate = gpu.attention_flops > 0 ? gpu.attention_flops : gpu.device_flops;
  double flops_fb = 0;
  std::vector<double> backward_of(L);
  for (int l = 0; l < L; ++l) {
    const RelayLayer& y = layers[l];
    const double compute_f =
        y.fwd_flops_per_token * tokens / gpu.device_flops + y.fwd_attn_flops_per_token * tokens / attn_rate;
    flops_fb += 3 * (y.fwd_flops_per_token + y.fwd_attn_flops_per_token) * tokens;
    const double w = y.fetch_params * work.publish_bytes;
    const double gr = static_cast<double>(y.update_params) * work.grad_bytes;
    // The worker host: per-GPU fetch moves G copies through the host and its NIC; host
    // bandwidth-centric moves one (each GPU 1/G), then NVLink all-gathers.
    const double per_gpu_w = bwc ? w / g : w, per_gpu_g = bwc ? gr / g : gr;
    const double host_w = bwc ? w : g * w, host_g = bwc ? gr : g * gr;
    const double pcie_f = std::max(per_gpu_w / gpu.pcie_h2d, host_w / gpu.host_aggregate);
    const double pcie_b = std::max({pcie_f, per_gpu_g / gpu.pcie_d2h, host_g / gpu.host_aggregate});
    const double nvl_f = bwc && G > 1 ? w * (g - 1) / g / gpu.nvlink : 0;
    const double nvl_b = bwc && G > 1 ? nvl_f + gr * (g - 1) / g / gpu.nvlink : 0;
    // The shards: the busiest owner of this layer sends C copies of its part, receives C
    // gradients of it; its RAM carries both (the NIC's DMA).
    double shard_out = 0, shard_in = 0, ram_f = 0, ram_b = 0;
    for (int s = 0; s < S; ++s) {
      const double f = share(l, s);
      if (f == 0) continue;
      shard_out = std::max(shard_out, C * f * w / snic);
      shard_in = std::max(shard_in, C * f * gr / snic);
      ram_f = std::max(ram_f, C * f * w / hosts.shard_ram_bw);
      ram_b = std::max(ram_b, C * f * (w + gr) / hosts.shard_ram_bw);
    }
    double fwd[kNumRes] = {};
    fwd[kCompute] = compute_f;
    fwd[kPcie] = pcie_f;
    fwd[kNvlink] = nvl_f;
    fwd[kWorkerNic] = host_w / wnic;
    fwd[kShardNic] = shard_out;
    fwd[kShardRam] = ram_f;
    double bwd[kNumRes] = {};
    bwd[kCompute] = 3 * compute_f;  // backward (2x) + the recomputed forward
    bwd[kPcie] = pcie_b;
    bwd[kNvlink] = nvl_b;
    bwd[kWorkerNic] = std::max(host_w, host_g) / wnic;  // full duplex: in (fetch) and out (push) apart
    bwd[kShardNic] = std::max(shard_out, shard_in);
    bwd[kShardRam] = ram_b;
    const int fi = Slowest(fwd), bi = Slowest(bwd);
    r.forward_s += fwd[fi];
    charged[fi] += fwd[fi];
    backward_of[l] = bwd[bi];
    r.backward_s += bwd[bi];
    charged[bi] += bwd[bi];
    r.worker_host_nic_in_bytes += 2 * host_w;
    r.worker_host_nic_out_bytes += host_g;
  }

  // The shards' update queues over the backward (layers L-1 .. 0; a layer's gradients are
  // all in when its backward ends).
  std::vector<double> free_at(S, 0), cpu_sum(S, 0), ssd_sum(S, 0);
  double t = 0;
  for (int l = L - 1; l >= 0; --l) {
    t += backward_of[l];
    for (int s = 0; s < S; ++s) {
      const double f = share(l, s);
      if (f == 0) continue;
      ClusterShard& sh = r.shards[s];
      const double p = f * static_cast<double>(layers[l].update_params);
      const double cpu = p / gpu.cpu_update + p / gpu.cpu_cast + C * p * work.grad_bytes / hosts.shard_ram_bw;
      const double spill_frac = sh.spilled_bytes > 0 ? sh.spilled_bytes / (12 * sh.params) : 0;
      const double ssd = spill_frac > 0 ? 2 * spill_frac * 12 * p / hosts.ssd_bytes_per_s : 0;
      free_at[s] = std::max(free_at[s], t) + std::max(cpu, ssd);
      sh.update_busy_s += std::max(cpu, ssd);
      cpu_sum[s] += cpu;
      ssd_sum[s] += ssd;
      sh.ssd_busy_s += ssd;
    }
  }
  int last = 0;
  for (int s = 1; s < S; ++s) {
    if (free_at[s] > free_at[last]) last = s;
  }
  r.update_tail_s = std::max(0.0, free_at[last] - r.backward_s);
  charged[ssd_sum[last] > cpu_sum[last] ? kSsd : kShardUpdate] += r.update_tail_s;
  r.overhead_s = hosts.shard_overhead_s * (S - 1);
  charged[kOverhead] += r.overhead_s;

  r.step_s = r.forward_s + r.backward_s + r.update_tail_s + r.overhead_s;
  r.tokens_per_s = tokens * opt.workers / r.step_s;
  r.tflops_per_gpu = flops_fb / r.step_s / 1e12;
  int b = 0;
  for (int i = 0; i < kNumRes; ++i) {
    r.seconds_by_resource.emplace_back(ClusterResources()[i], charged[i]);
    if (charged[i] > charged[b]) b = i;
  }
  r.bottleneck = ClusterResources()[b];
  return r;
}

}  // namespace l2l

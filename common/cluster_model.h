// Analytic model of one relay training step scaled out (issue 31): the model state (fp32
// master, AdamW m and v; the published bf16 copy) sharded over S l2l-eps daemons on S
// shard hosts, and W data-parallel GPU workers on ceil(W / G) worker hosts, every host
// on one network link (or several) of the given speed. For `l2l-bench-relay --simulate
// --shards ...`. It extends common/relay_model.h (same layers, same per-layer rule) and
// is a MODEL: nothing here is measured, and docs/performance.md says so beside its table.
//
// Per step every worker fetches every layer twice (forward, and again for the backward's
// recompute) from the shard(s) owning it, in the publish dtype, and pushes its gradient of
// every layer (fp32 on today's wire, proto/data.proto PushGradient) to the same shard(s).
// A shard therefore sends C copies of its layers and receives C gradients of them per
// step, C = W (each worker fetches for itself: today's data path) or C = hosts (the
// host's GPUs split each layer, fetch 1/G each and all-gather it over NVLink, and
// reduce-scatter the gradient so the host pushes one copy: seed 004's bandwidth-centric
// partitioning applied per worker host; not built).
//
// Layout of the state over the shards:
//  * kRange: each shard owns a contiguous range of layers, balanced by bytes (issue 31).
//    The workers run in lockstep (every layer's step-t version needs every worker's
//    step t-1 gradient), so at any moment they all fetch the SAME layer, from ONE shard:
//    the other shards' NICs idle. More shards split the bytes, the update and the RAM,
//    not the per-layer NIC time.
//  * kStripe: every shard owns 1/S of every layer (a layer's fetch and push are spread
//    over all S NICs). Not built; modelled to show what the layout costs.
//
// Per layer, forward: the slowest of compute (relay_model.h's rule, at the tokens one GPU
// computes), the GPU's PCIe fetch, the worker host's aggregate host bandwidth, the NVLink
// all-gather (host bandwidth-centric only), the worker host's NIC (in), the owning
// shards' NICs (out) and the shard's RAM (the NIC's DMA). Backward: the same with 3x the
// compute, plus the gradient push (PCIe D2H, worker NIC out, shard NIC in, shard RAM).
// Links are full duplex; copies run one layer ahead of compute, so a layer costs its
// slowest resource.
//
// Update: each shard updates its share as gradients arrive (eps_server/update_pipeline.h:
// once all C gradients of a layer are in: reduce over C copies, AdamW, cast). One queue
// per shard; a layer's job costs max(CPU, SSD): CPU = params / cpu_update + params /
// cpu_cast + C x 4 B x params / shard RAM bandwidth (the reduction reads every copy);
// SSD = 2 x spilled state bytes / SSD bandwidth (read ahead and written behind). The part
// of the slowest shard's queue that ends after the backward is the exposed tail.
// RAM per shard: 12 B/param state + the published copy + one layer's C gradient copies
// (the pipeline holds every worker's gradient of a layer until the last one arrives);
// what exceeds shard_ram_bytes spills (state only: eps_server/spill_tier.h keeps the
// published copies in RAM), spread evenly over the shard's layers. When even all state
// spilled would not fit, the configuration does not fit (fits = false).
//
// Step = forward + backward + tail + shard_overhead_s x (S - 1). The per-step cost of
// each extra shard (registration, one StepDone and commit per shard, a fetch stream per
// shard) is a parameter, 0 by default, to be calibrated by measuring 1 vs 2 vs 4 shards
// on one host (docs/performance.md, "Scaling out").
//
// Bottleneck: each layer's time is charged to the resource that set it (tail to "shard
// update" or "SSD", overhead to "shard overhead"); the resource with the largest total.
//
// Not modelled: collective or TCP efficiency (links run at their nominal rate), the
// network fabric (full bisection assumed), stragglers, kernel efficiency at the per-GPU
// batch, the reduction's competition with the NICs for RAM, GPUDirect (data crosses host
// memory once), interleaved (device-side) updates, global clipping (the whole update
// would be exposed). Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/relay_model.h"
#include "common/status.h"

namespace l2l {

enum class ShardLayout { kRange, kStripe };
const char* ToString(ShardLayout layout);

// The hosts around the GPUs (the GPUs themselves: RelayHardware). Bytes/s, bytes, seconds.
struct ClusterHardware {
  double link_bytes_per_s = 0;   // one NIC, each direction
  int worker_nics = 1;           // NICs per worker host
  int shard_nics = 1;            // NICs per shard host
  double shard_ram_bytes = 0;    // RAM per shard host for the job's state; 0 = unlimited
  double shard_ram_bw = 0;       // shard host memory bandwidth
  double ssd_bytes_per_s = 0;    // shard host SSD (read + write together); needed only if it spills
  double shard_overhead_s = 0;   // per step, per shard beyond the first (calibration)
};

struct ClusterOptions {
  int workers = 1;               // GPU workers (W), one GPU each
  int gpus_per_host = 8;         // G
  int shards = 1;                // S
  ShardLayout layout = ShardLayout::kRange;
  bool host_bandwidth_centric = false;  // a host fetches and pushes one copy (see above)
};

struct ClusterWorkload {
  int64_t tokens_per_gpu = 0;    // per step
  double publish_bytes = 2;      // per parameter fetched (bf16)
  double grad_bytes = 4;         // per parameter pushed (fp32)
};

// One shard's share and traffic per step.
struct ClusterShard {
  int first_layer = 0, end_layer = 0;  // kRange: its layers [first, end); kStripe: all
  double params = 0;                   // parameters it updates
  double nic_out_bytes = 0;            // layers sent per step
  double nic_in_bytes = 0;             // gradients received per step
  double ram_need_bytes = 0;           // state + published copy + gradient copies
  double spilled_bytes = 0;            // state on the SSD
  double update_busy_s = 0;            // its update queue's work per step (CPU or SSD, per layer the larger)
  double ssd_busy_s = 0;               // of which SSD-bound I/O, summed over layers
};

struct ClusterResult {
  bool fits = true;                    // false: some shard's RAM is short even with all state spilled
  double step_s = 0, forward_s = 0, backward_s = 0, update_tail_s = 0, overhead_s = 0;
  double tokens_per_s = 0;             // all workers
  double tflops_per_gpu = 0;           // forward + backward FLOPs (no recompute) / step / GPU
  int hosts = 0;                       // worker hosts
  int copies = 0;                      // C: layer copies each shard sends per step and layer
  double params = 0;
  double worker_host_nic_in_bytes = 0, worker_host_nic_out_bytes = 0;  // per host per step
  std::string bottleneck;              // the resource charged the most time
  std::vector<std::pair<std::string, double>> seconds_by_resource;      // fixed order
  std::vector<ClusterShard> shards;
};

// Resource names, in the order seconds_by_resource lists them.
const std::vector<std::string>& ClusterResources();

// Which shard owns each of `bytes.size()` layers: contiguous ranges, each shard at least
// one layer, layer i to the shard its byte midpoint falls in (so the ranges' sums differ
// from total / shards by at most one layer). REQUIRES 1 <= shards <= bytes.size().
std::vector<int> PartitionLayersByBytes(const std::vector<double>& bytes, int shards);

// Errors name the field: workers, gpus_per_host, shards (also: more shards than layers),
// link, NICs, RAM, SSD (when a shard spills), overhead, tokens, and the GPU rates.
Result<ClusterResult> SimulateClusterStep(const RelayShape& shape, const RelayHardware& gpu,
                                          const ClusterHardware& hosts, const ClusterOptions& opt,
                                          const ClusterWorkload& work);

}  // namespace l2l

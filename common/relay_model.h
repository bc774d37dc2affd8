// Analytic model of one relay training step on a host with N devices, for
// `l2l-bench-relay --simulate`: what bandwidth-centric fetch (each device fetches 1/N of
// a layer over its own PCIe link, then the devices all-gather it; gradients are
// reduce-scattered and each device pushes 1/N) and the interleaved optimizer
// (common/optimizer_model.h) would buy, before a multi-GPU host measures it.
//
// Compute is the matmuls (2 FLOPs per weight per token) at `device_flops` plus the
// attention products (4 x T x d per token) at `attention_flops` (the matmul rate when 0);
// `l2l-bench-relay --simulate --rates-json` sets both, and the links, from rates that
// scripts/bench_gpu.sh measures on the GPU.
// Per layer, in forward: max(compute, weight fetch, all-gather); in backward: max(compute
// with recompute, fetch, all-gather, reduce-scatter, gradient push) -- copies and
// collectives run on their own streams, prefetched one layer ahead, so a layer costs its
// slowest resource. The update tail comes from the optimizer model with the group's
// aggregate update rate and links. Data parallel with a fixed global batch (strong
// scaling): each device computes 1/N of the tokens.
//
// Not modelled: kernel efficiency changes with the per-device batch, PCIe switch sharing
// beyond the aggregate host cap, the optimizer copies' competition with the relay's own
// fetches, the head's softmax and the stash traffic. It is a model: docs/performance.md
// marks its numbers as such until measured.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/modes.h"
#include "common/optimizer_model.h"
#include "common/status.h"

namespace l2l {

// A transformer's shape, as far as the model needs it.
struct RelayShape {
  std::string name;
  int64_t n_layer = 0, d_model = 0, d_ff = 0, vocab = 0, seq_len = 0;
  bool gated_mlp = false;      // Llama's SwiGLU: three d x d_ff matrices instead of two
  bool tied_embeddings = true; // GPT-2: the head reads the embedding
  int64_t kv_dim = 0;          // key/value width (grouped-query attention); 0 = d_model
};
RelayShape Gpt2XlShape();      // 48 layers, d 1600, d_ff 6400, vocab 50257, T 1024 (1.56 B)
RelayShape Llama7bShape();     // 32 layers, d 4096, d_ff 11008, vocab 32000, T 4096 (6.7 B)
// Qwen2.5-1.5B: 28 layers, d 1536, kv 256 (12 heads on 2), d_ff 8960, vocab 151936, tied,
// at T 1024 (the GPU benchmark's sequence length, not the model's 32768 context).
RelayShape Qwen25_1_5bShape();
// Llama 3 70B: 80 layers, d 8192, 64 heads on 8 key/value heads (kv 1024), d_ff 28672,
// vocab 128256, untied, at T 8192 (70.55 B).
RelayShape Llama70bShape();
// The shape named `name` (gpt2-xl | llama-7b | qwen2.5-1.5b | llama-70b), or an error
// naming them.
Result<RelayShape> RelayShapeByName(const std::string& name);

// One unit the relay fetches, computes and updates: the embedding, each block, the head
// (in that order; index 0 is the embedding).
struct RelayLayer {
  double fwd_flops_per_token = 0;       // the matmuls (device_flops)
  double fwd_attn_flops_per_token = 0;  // scores and weighted sum (attention_flops)
  double fetch_params = 0;              // parameters the devices read for it
  int64_t update_params = 0;            // parameters whose update it owns
};
std::vector<RelayLayer> RelayLayers(const RelayShape& shape);

// The host. Bandwidths bytes/s, rates params/s or FLOP/s.
struct RelayHardware {
  double pcie_h2d = 0;           // per device, pinned
  double pcie_d2h = 0;           // per device, pinned
  double host_aggregate = 0;     // all devices' PCIe traffic together (host memory, switches)
  double nvlink = 0;             // device-to-device, per device, unidirectional
  double device_flops = 0;       // achieved dense throughput per device (the matmuls)
  double attention_flops = 0;    // the attention products' rate; 0 = device_flops
  double cpu_update = 0;         // daemon AdamW, all threads (params/s)
  double cpu_cast = 0;           // daemon fp32 -> publish dtype (params/s)
  double device_update = 0;      // AdamW on one device (params/s)
};
// Seed 003's 4xH100 testbed (its setup description and Table 1; per-device figures). Where the
// seed gives no number the value is an assumption, named in relay_model.cc.
RelayHardware H100TestbedHardware();
// Seed 004's DGX-2 (16 V100, PCIe Gen3 ~12 GB/s per GPU, 48 GB/s aggregate, NVLink 70 GB/s).
RelayHardware Dgx2Hardware();

struct RelayWorkload {
  int64_t tokens_per_step = 0;   // global batch in tokens (all devices together)
  double publish_bytes = 2;      // per parameter fetched (bf16 published copy)
  double grad_bytes = 4;         // per parameter pushed (fp32 gradient)
};

struct RelaySimOptions {
  int devices = 1;
  bool bandwidth_centric = false;
  bool interleave = false;       // split the optimizer (else the daemon updates all)
  GpuFraction gpu_fraction;      // with interleave: auto (the performance model) or fixed
};

struct RelaySimResult {
  double step_s = 0;
  double forward_s = 0, backward_s = 0, update_tail_s = 0;
  double fetch_gbps = 0;         // delivered weight bandwidth per device group, GB/s
  double gpu_fraction = 0;       // interleaved share chosen (0 without interleave)
  int64_t params = 0;
};

Result<RelaySimResult> SimulateRelayStep(const RelayShape& shape, const RelayWorkload& work,
                                         const RelayHardware& hw, const RelaySimOptions& opt);

}  // namespace l2l

// Tests of the scale-out step model (common/cluster_model.h): the 70B shape against the
// published parameter count, the layer partition, the traffic each shard carries against
// this file's own count (W copies of the layers out, W gradients in), compute-bound and
// NIC-bound steps against closed forms, the exposed update and the SSD, the overhead
// parameter, and the errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "common/cluster_model.h"

namespace l2l {
namespace {

// Llama 3 70B by its Hugging Face config: blocks of q, o (d x d), k, v (d x 1024), gate,
// up, down (d x 28672); untied embedding and head (128256 x d). No norms (the model
// leaves them out: 80 x 2 x 8192 + 8192 parameters).
constexpr double kD = 8192, kKv = 1024, kFf = 28672, kV = 128256, kT = 8192;
constexpr double kBlock = 2 * kD * kD + 2 * kD * kKv + 3 * kD * kFf;
constexpr double kTable = kV * kD;
constexpr double kParams = 80 * kBlock + 2 * kTable;

ClusterHardware Hosts(double gbps) {
  ClusterHardware h;
  h.link_bytes_per_s = gbps * 1e9 / 8;
  h.shard_ram_bytes = 0;  // unlimited unless a test says otherwise
  h.shard_ram_bw = 200e9;
  h.ssd_bytes_per_s = 6e9;
  return h;
}

ClusterResult Sim(const ClusterHardware& h, int workers, int shards, ShardLayout layout = ShardLayout::kRange,
                  bool bwc = false, int64_t tokens = 4 * 8192) {
  ClusterOptions o;
  o.workers = workers;
  o.gpus_per_host = 8;
  o.shards = shards;
  o.layout = layout;
  o.host_bandwidth_centric = bwc;
  ClusterWorkload w;
  w.tokens_per_gpu = tokens;
  Result<ClusterResult> r = SimulateClusterStep(Llama70bShape(), H100TestbedHardware(), h, o, w);
  REQUIRE(r.ok());
  return *r;
}

double MaxOut(const ClusterResult& r) {
  double m = 0;
  for (const ClusterShard& s : r.shards) m = std::max(m, s.nic_out_bytes);
  return m;
}

TEST_CASE("the 70B shape has Llama 3 70B's parameter count", "[common][cluster_model]") {
  // meta-llama/Meta-Llama-3-70B: 70,553,706,496 parameters, of which 1,318,912 are norms.
  const ClusterResult r = Sim(Hosts(100), 8, 1);
  CHECK(r.params == Approx(70553706496.0 - 1318912.0).epsilon(1e-12));
  CHECK(r.params == Approx(kParams).epsilon(1e-12));
  REQUIRE(RelayShapeByName("llama-70b").ok());
}

TEST_CASE("layers are split into contiguous ranges balanced by bytes", "[common][cluster_model]") {
  std::vector<double> bytes(82, 1.0);
  bytes.front() = bytes.back() = 1.2;
  for (int shards : {1, 2, 3, 4, 8, 82}) {
    const std::vector<int> owner = PartitionLayersByBytes(bytes, shards);
    REQUIRE(owner.size() == bytes.size());
    CHECK(owner.front() == 0);
    CHECK(owner.back() == shards - 1);
    std::vector<double> sum(shards, 0);
    for (size_t i = 0; i < owner.size(); ++i) {
      if (i > 0) CHECK((owner[i] == owner[i - 1] || owner[i] == owner[i - 1] + 1));
      sum[owner[i]] += bytes[i];
    }
    const double total = std::accumulate(bytes.begin(), bytes.end(), 0.0);
    for (double s : sum) CHECK(std::abs(s - total / shards) <= 1.2 + 1e-9);  // within one layer
  }
  // A huge first layer does not leave a shard empty.
  const std::vector<int> owner = PartitionLayersByBytes({100, 1, 1, 1}, 4);
  CHECK(owner == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("each shard carries W copies of its layers out and W gradients in", "[common][cluster_model]") {
  for (ShardLayout layout : {ShardLayout::kRange, ShardLayout::kStripe}) {
    for (int shards : {1, 2, 4, 8}) {
      for (bool bwc : {false, true}) {
        const ClusterResult r = Sim(Hosts(100), 64, shards, layout, bwc);
        const double copies = bwc ? 8 : 64;  // 8 hosts of 8 GPUs
        CHECK(r.copies == copies);
        double out = 0, in = 0;
        for (const ClusterShard& s : r.shards) {
          out += s.nic_out_bytes;
          in += s.nic_in_bytes;
        }
        // bf16 layers fetched twice (forward, backward's recompute); fp32 gradients once.
        CHECK(out == Approx(copies * 2 * 2 * kParams).epsilon(1e-12));
        CHECK(in == Approx(copies * 4 * kParams).epsilon(1e-12));
        // A worker host receives its GPUs' fetches (or one copy) and sends their gradients.
        CHECK(r.worker_host_nic_in_bytes == Approx((bwc ? 1 : 8) * 4 * kParams).epsilon(1e-12));
        CHECK(r.worker_host_nic_out_bytes == Approx((bwc ? 1 : 8) * 4 * kParams).epsilon(1e-12));
        if (layout == ShardLayout::kStripe) {
          for (const ClusterShard& s : r.shards) CHECK(s.nic_out_bytes == Approx(out / shards).epsilon(1e-12));
        }
      }
    }
  }
  // Doubling the shards halves each shard's traffic (ranges: up to one layer's share).
  const double one_layer = 64 * 2 * 2 * kTable;
  for (int shards : {1, 2, 4}) {
    CHECK(MaxOut(Sim(Hosts(100), 64, 2 * shards)) <= MaxOut(Sim(Hosts(100), 64, shards)) / 2 + one_layer);
    CHECK(MaxOut(Sim(Hosts(100), 64, 2 * shards, ShardLayout::kStripe)) ==
          Approx(MaxOut(Sim(Hosts(100), 64, shards, ShardLayout::kStripe)) / 2).epsilon(1e-12));
  }
}

TEST_CASE("a slow link: the shard NIC binds, and more ranges do not help", "[common][cluster_model]") {
  // 25 Gb/s, 64 workers, 1 shard: each layer crosses the shard's NIC 64 times each way.
  const ClusterResult one = Sim(Hosts(25), 64, 1);
  CHECK(one.bottleneck == "shard NIC");
  // Forward: 64 x 2 B/param out; backward: 64 x 4 B/param in (the fetch's 2 B out beside it).
  const double link = 25e9 / 8;
  CHECK(one.forward_s == Approx(64 * 2 * kParams / link).epsilon(1e-9));
  CHECK(one.backward_s == Approx(64 * 4 * kParams / link).epsilon(1e-9));
  // Lockstep workers fetch one layer at a time from its one owner: 8 ranges, same NIC time.
  const ClusterResult eight = Sim(Hosts(25), 64, 8);
  CHECK(eight.bottleneck == "shard NIC");
  CHECK(eight.forward_s == Approx(one.forward_s).epsilon(1e-9));
  // Striped over 8 shards the shard side carries 1/8 each; the worker host's NIC (8 GPUs'
  // copies) is then as slow as the shard's: the tie goes to the worker NIC.
  const ClusterResult striped = Sim(Hosts(25), 64, 8, ShardLayout::kStripe);
  CHECK(striped.forward_s == Approx(one.forward_s / 8).epsilon(1e-9));
  CHECK(striped.bottleneck == "worker NIC");
  // Two NICs per worker host move it back to... nothing on the network at all once the
  // shards have two as well: twice the link, half the time.
  ClusterHardware two = Hosts(25);
  two.worker_nics = two.shard_nics = 2;
  CHECK(Sim(two, 64, 8, ShardLayout::kStripe).forward_s == Approx(striped.forward_s / 2).epsilon(1e-9));
}

TEST_CASE("a fast link: compute binds, the last shard's update is exposed", "[common][cluster_model]") {
  const ClusterResult r = Sim(Hosts(1e6), 8, 1);
  CHECK(r.bottleneck == "compute");
  // Compute per GPU per step: 32768 tokens x (2 FLOPs per weight + 4 T d attention per
  // block), forward once, backward + recompute three times, at 400 TFLOP/s. The embedding
  // has no FLOPs: in the forward its time is 8 bf16 copies through the worker host's
  // (and the shard's) 200 GB/s; in the backward the shard's memory carries 8 bf16 copies
  // out and 8 fp32 gradients in.
  const double tokens = 4 * 8192;
  const double fwd = tokens * (80 * (2 * kBlock + 4 * kT * kD) + 2 * kTable) / 400e12;
  const double emb_bwd = 8 * (2 + 4) * kTable / 200e9;
  CHECK(r.forward_s == Approx(fwd + 8 * 2 * kTable / 200e9).epsilon(1e-9));
  CHECK(r.backward_s == Approx(3 * fwd + emb_bwd).epsilon(1e-9));
  // A layer's update: AdamW 8 G/s, cast 15.5 G/s, summing 8 fp32 copies at 200 GB/s. The
  // blocks' hide in the backward; the last block's runs past the embedding's backward, and
  // the embedding's (its gradient comes last) is exposed after it.
  auto update = [](double p, double copies) { return p / 8e9 + p / 15.5e9 + copies * 4 * p / 200e9; };
  const double tail = std::max(0.0, update(kBlock, 8) - emb_bwd) + update(kTable, 8);
  CHECK(r.update_tail_s == Approx(tail).epsilon(1e-9));
  CHECK(r.step_s == Approx(r.forward_s + r.backward_s + r.update_tail_s).epsilon(1e-12));
  CHECK(r.tokens_per_s == Approx(8 * tokens / r.step_s).epsilon(1e-12));
  // Two ranges: the embedding's owner has the same last jobs; striped, each shard half.
  CHECK(Sim(Hosts(1e6), 8, 2).update_tail_s == Approx(tail).epsilon(1e-9));
  REQUIRE(update(kBlock, 8) / 2 < emb_bwd);
  CHECK(Sim(Hosts(1e6), 8, 2, ShardLayout::kStripe).update_tail_s == Approx(update(kTable, 8) / 2).epsilon(1e-9));
  // 64 workers on one shard: 64 copies of every layer out and 64 gradients in through the
  // shard's 200 GB/s memory outlast the compute, whatever the link.
  CHECK(Sim(Hosts(1e6), 64, 1).bottleneck == "shard RAM");
  // A slow CPU: the update queue cannot keep up with the backward, and binds.
  ClusterHardware h = Hosts(1e6);
  RelayHardware gpu = H100TestbedHardware();
  gpu.cpu_update = 0.05e9;
  ClusterOptions o;
  o.workers = 64;
  ClusterWorkload w;
  w.tokens_per_gpu = 4096;
  Result<ClusterResult> slow = SimulateClusterStep(Llama70bShape(), gpu, h, o, w);
  REQUIRE(slow.ok());
  CHECK(slow->bottleneck == "shard update");
  CHECK(slow->update_tail_s > slow->backward_s);
}

TEST_CASE("state beyond the shard's RAM goes to the SSD, and can bind", "[common][cluster_model]") {
  ClusterHardware h = Hosts(1e6);
  h.shard_ram_bytes = 512e9;
  const ClusterResult r = Sim(h, 8, 1);
  // Need: 12 B/param state + 2 B published + 8 workers' fp32 gradient of the largest layer.
  const double need = 14 * kParams + 8 * 4 * kTable;
  REQUIRE(r.shards.size() == 1);
  CHECK(r.shards[0].ram_need_bytes == Approx(need).epsilon(1e-12));
  CHECK(r.shards[0].spilled_bytes == Approx(need - 512e9).epsilon(1e-12));
  // Every spilled byte is read and written once per step.
  CHECK(r.shards[0].ssd_busy_s == Approx(2 * (need - 512e9) / 6e9).epsilon(1e-9));
  CHECK(r.bottleneck == "SSD");
  CHECK(r.fits);
  // Four shards fit in 512 GB each: no SSD.
  const ClusterResult four = Sim(h, 8, 4);
  for (const ClusterShard& s : four.shards) CHECK(s.spilled_bytes == 0);
  CHECK(four.bottleneck == "compute");
  // Less RAM than the published copy and the gradients: does not fit.
  h.shard_ram_bytes = 100e9;
  CHECK(!Sim(h, 8, 1).fits);
}

TEST_CASE("the per-shard overhead adds (S - 1) x itself to the step", "[common][cluster_model]") {
  ClusterHardware h = Hosts(100);
  for (int shards : {1, 2, 4}) {
    const double base = Sim(h, 16, shards).step_s;
    h.shard_overhead_s = 0.25;
    CHECK(Sim(h, 16, shards).step_s == Approx(base + 0.25 * (shards - 1)).epsilon(1e-12));
    h.shard_overhead_s = 0;
  }
  h.shard_overhead_s = 3e6;
  CHECK(Sim(h, 16, 4).bottleneck == "shard overhead");
}

TEST_CASE("bad cluster options are errors naming the field", "[common][cluster_model]") {
  ClusterWorkload w;
  w.tokens_per_gpu = 8192;
  auto err = [&](ClusterHardware h, ClusterOptions o) {
    Result<ClusterResult> r = SimulateClusterStep(Llama70bShape(), H100TestbedHardware(), h, o, w);
    REQUIRE(!r.ok());
    return r.status().ToString();
  };
  ClusterOptions o;
  o.shards = 0;
  CHECK_THAT(err(Hosts(100), o), Catch::Contains("shards"));
  o.shards = 83;  // 80 blocks + embedding + head
  CHECK_THAT(err(Hosts(100), o), Catch::Contains("[1, 82]"));
  o = ClusterOptions{};
  o.workers = 0;
  CHECK_THAT(err(Hosts(100), o), Catch::Contains("workers"));
  o = ClusterOptions{};
  o.gpus_per_host = 0;
  CHECK_THAT(err(Hosts(100), o), Catch::Contains("gpus_per_host"));
  CHECK_THAT(err(Hosts(-25), ClusterOptions{}), Catch::Contains("link"));
  ClusterHardware h = Hosts(100);
  h.shard_overhead_s = -1;
  CHECK_THAT(err(h, ClusterOptions{}), Catch::Contains("overhead"));
  h = Hosts(100);
  h.shard_ram_bytes = 1e9;
  h.ssd_bytes_per_s = 0;
  CHECK_THAT(err(h, ClusterOptions{}), Catch::Contains("SSD"));
}

}  // namespace
}  // namespace l2l

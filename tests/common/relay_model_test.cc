// Tests of the analytic relay step model (common/relay_model.h): the shapes' parameter
// counts against the published models, and the properties the simulation table relies
// on (more devices with bandwidth-centric fetch never slower, one device the same with or
// without it, interleave at fraction 0 equal to no interleave, auto never slower).
#include <catch2/catch.hpp>

#include "common/relay_model.h"

namespace l2l {
namespace {

RelaySimResult Sim(const RelayShape& s, const RelayHardware& hw, int n, bool bwc, bool il,
                   GpuFraction f = GpuFraction{}) {
  RelayWorkload w;
  w.tokens_per_step = 8 * s.seq_len;
  RelaySimOptions o;
  o.devices = n;
  o.bandwidth_centric = bwc;
  o.interleave = il;
  o.gpu_fraction = f;
  Result<RelaySimResult> r = SimulateRelayStep(s, w, hw, o);
  REQUIRE(r.ok());
  return *r;
}

TEST_CASE("the model's shapes have the published parameter counts", "[common][relay_model]") {
  // GPT-2 XL: 1,557,611,200 parameters (Hugging Face gpt2-xl); Llama-2-7B: 6,738,415,616.
  // The model leaves out biases and norms (under 0.1%).
  const RelayHardware hw = H100TestbedHardware();
  CHECK(static_cast<double>(Sim(Gpt2XlShape(), hw, 1, false, false).params) == Approx(1557611200.0).epsilon(1e-3));
  CHECK(static_cast<double>(Sim(Llama7bShape(), hw, 1, false, false).params) == Approx(6738415616.0).epsilon(1e-3));
  // Qwen2.5-1.5B: 1,543,714,304 (configs/models/qwen2.5-1.5b.yaml); its k and v are 256 wide.
  CHECK(static_cast<double>(Sim(Qwen25_1_5bShape(), hw, 1, false, false).params) == Approx(1543714304.0).epsilon(1e-3));
  for (const char* name : {"gpt2-xl", "llama-7b", "qwen2.5-1.5b"}) {
    Result<RelayShape> s = RelayShapeByName(name);
    REQUIRE(s.ok());
    CHECK(s->name == name);
  }
  CHECK(!RelayShapeByName("gpt-5").ok());
}

TEST_CASE("the attention's own rate: 0 is the matmul rate, a slower one costs only compute",
          "[common][relay_model]") {
  RelayHardware hw = H100TestbedHardware();
  hw.pcie_h2d = hw.pcie_d2h = hw.host_aggregate = 1e15;  // compute binds every layer but the embedding
  const RelaySimResult base = Sim(Gpt2XlShape(), hw, 1, false, false);
  RelayHardware same = hw;
  same.attention_flops = hw.device_flops;
  CHECK(Sim(Gpt2XlShape(), same, 1, false, false).forward_s == Approx(base.forward_s).epsilon(1e-12));
  RelayHardware slow = hw;
  slow.attention_flops = hw.device_flops / 2;
  // GPT-2 XL forward per token: 48 x 4 x 1024 x 1600 attention FLOPs; at half the rate they
  // add their own time once more.
  const double attn_s = 48.0 * 4 * 1024 * 1600 * (8 * 1024) / hw.device_flops;
  CHECK(Sim(Gpt2XlShape(), slow, 1, false, false).forward_s == Approx(base.forward_s + attn_s).epsilon(1e-9));
  slow.attention_flops = -1;
  RelayWorkload w;
  w.tokens_per_step = 1024;
  CHECK(!SimulateRelayStep(Gpt2XlShape(), w, slow, RelaySimOptions{}).ok());
}

// More devices with bandwidth-centric fetch are never slower while the NVLink collectives
// do not bind: each device receives (N-1)/N of every layer over NVLink, a share that grows
// with N while the host's aggregate PCIe cap does not. So the check uses the H100's NVLink4
// figure (450 GB/s per direction) and the DGX-2 preset; the next test pins down the case
// where the model says it does bind.
TEST_CASE("more devices with bandwidth-centric fetch are never slower unless NVLink binds",
          "[common][relay_model]") {
  RelayHardware h100 = H100TestbedHardware();
  h100.nvlink = 450e9;
  for (const RelayHardware& hw : {h100, Dgx2Hardware(), H100TestbedHardware()}) {
    for (const RelayShape& s : {Gpt2XlShape(), Llama7bShape()}) {
      const bool nvlink_may_bind = hw.nvlink == H100TestbedHardware().nvlink && s.name == "gpt2-xl";
      for (bool il : {false, true}) {
        double prev = 0;
        for (int n : {1, 2, 4, 8}) {
          const double t = Sim(s, hw, n, true, il).step_s;
          CAPTURE(s.name, n, il, hw.nvlink);
          if (n > 1 && !nvlink_may_bind) CHECK(t <= prev * (1 + 1e-12));
          // Never slower than today's path (every device fetching whole layers).
          CHECK(t <= Sim(s, hw, n, false, il).step_s * (1 + 1e-12));
          prev = t;
        }
        CHECK(Sim(s, hw, 1, true, il).step_s == Sim(s, hw, 1, false, il).step_s);
      }
      // Bandwidth-centric fetch delivers more bandwidth than every device fetching alone.
      CHECK(Sim(s, hw, 4, true, false).fetch_gbps > Sim(s, hw, 4, false, false).fetch_gbps);
    }
  }
}

TEST_CASE("at the seed's measured NVLink the all-gather binds GPT-2 XL at 8 devices", "[common][relay_model]") {
  // 133 GB/s per device (seed 003's measured D2D): 8 devices each receive 7/8 of a layer over
  // NVLink (w/152 s per byte of layer) while the PCIe side is capped by the host at w/200;
  // 4 devices receive 3/4 (w/177). GPT-2 XL's small batch leaves compute below both.
  const RelayHardware hw = H100TestbedHardware();
  const RelaySimResult four = Sim(Gpt2XlShape(), hw, 4, true, false);
  const RelaySimResult eight = Sim(Gpt2XlShape(), hw, 8, true, false);
  CHECK(eight.fetch_gbps == Approx(133.0 * 8 / 7));
  CHECK(four.fetch_gbps == Approx(133.0 * 4 / 3));
  CHECK(eight.step_s > four.step_s);
}

TEST_CASE("interleave at fraction 0 is the daemon-only step and auto is never slower", "[common][relay_model]") {
  const RelayHardware hw = H100TestbedHardware();
  for (const RelayShape& s : {Gpt2XlShape(), Llama7bShape()}) {
    for (int n : {1, 2, 4, 8}) {
      for (bool bwc : {false, true}) {
        const RelaySimResult none = Sim(s, hw, n, bwc, false);
        const RelaySimResult zero = Sim(s, hw, n, bwc, true, GpuFraction{.automatic = false, .value = 0});
        CHECK(zero.step_s == none.step_s);
        CHECK(zero.gpu_fraction == 0);
        CHECK(Sim(s, hw, n, bwc, true).step_s <= none.step_s);
      }
    }
  }
}

TEST_CASE("bad simulation inputs are errors", "[common][relay_model]") {
  RelayWorkload w;
  w.tokens_per_step = 1024;
  RelaySimOptions o;
  o.devices = 0;
  CHECK(!SimulateRelayStep(Gpt2XlShape(), w, H100TestbedHardware(), o).ok());
  o.devices = 1;
  RelayHardware hw = H100TestbedHardware();
  hw.nvlink = 0;
  CHECK(!SimulateRelayStep(Gpt2XlShape(), w, hw, o).ok());
}

}  // namespace
}  // namespace l2l

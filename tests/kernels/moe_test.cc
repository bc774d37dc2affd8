// The mixture-of-experts MLP (kernels/layers/moe.h) on the CPU backend: its row ops
// against plain loops; a one-expert MoE block against the dense Llama block it must equal
// bit for bit (same products on the same rows, weight 1, a router with nothing to learn);
// the E=4, top-2 block's gradients (router through the softmax / top-k / renormalisation,
// experts, input, and the auxiliary load-balancing loss) against central finite
// differences of its own forward along random directions; and the routing statistics.
// Hugging Face's MixtralForCausalLM itself is the oracle of tests/oracle/hf_oracle.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "kernels/layers/moe.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using namespace kernels::testing;  // NOLINT

constexpr int64_t kB = 2, kT = 8;

ModelSpec MoeSpec(int64_t experts, int64_t k) {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 32;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_heads = 2;
  s.d_ff = 24;
  s.tied_embeddings = false;
  s.num_experts = experts;
  s.experts_per_token = k;
  return s;
}

std::vector<float> RandomBlock(const LayerLayout& layout, std::mt19937& rng) {
  std::vector<float> p(layout.numel);
  for (const ParamInfo& info : layout.params) {
    const bool norm = info.name.find("layernorm") != std::string::npos;
    const auto v = norm ? RandomVec(rng, info.numel, 0.6f, 1.4f) : RandomVec(rng, info.numel, -0.3f, 0.3f);
    std::copy(v.begin(), v.end(), p.begin() + info.offset);
  }
  return p;
}

struct Cpu {
  std::unique_ptr<Backend> be = kernels::CreateCpuBackend(2);
  DeviceBuffer Zeros(size_t n) {
    auto b = DeviceBuffer::Create(be.get(), n * sizeof(float));
    REQUIRE(b.ok());
    be->Zero(b->data(), n * sizeof(float));
    return std::move(b).value();
  }
};

TEST_CASE("MoE row ops gather, scatter-add and dot rows as plain loops do", "[layers][moe]") {
  Cpu cpu;
  std::mt19937 rng(3);
  const int64_t rows = 7, C = 5;
  const auto src = RandomVec(rng, rows * C), scale = RandomVec(rng, 3), dst0 = RandomVec(rng, rows * C);
  const std::vector<int32_t> idx = {5, 0, 3};
  auto dSrc = Upload(*cpu.be, src), dScale = Upload(*cpu.be, scale), dIdx = Upload(*cpu.be, idx);
  auto dOut = cpu.Zeros(3 * C);
  cpu.be->GatherRows(dOut.f32(), dSrc.f32(), dIdx.i32(), dScale.f32(), 3, C);
  const auto got = Download(*cpu.be, dOut, 3 * C);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < C; ++c) CHECK(got[i * C + c] == src[idx[i] * C + c] * scale[i]);
  }
  auto dDst = Upload(*cpu.be, dst0);
  cpu.be->ScatterAddRows(dDst.f32(), dOut.f32(), dIdx.i32(), nullptr, 3, C);
  const auto sum = Download(*cpu.be, dDst, rows * C);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      float want = dst0[r * C + c];
      for (int64_t i = 0; i < 3; ++i) {
        if (idx[i] == r) want += got[i * C + c];
      }
      CHECK(sum[r * C + c] == want);
    }
  }
  auto dDot = cpu.Zeros(3);
  cpu.be->RowDot(dDot.f32(), dOut.f32(), dSrc.f32(), 3, C);
  const auto dot = Download(*cpu.be, dDot, 3);
  for (int64_t i = 0; i < 3; ++i) {
    float want = 0.0f;
    for (int64_t c = 0; c < C; ++c) want += got[i * C + c] * src[i * C + c];
    CHECK(dot[i] == want);
  }
}

TEST_CASE("A one-expert MoE block computes the dense Llama block bit for bit", "[layers][moe]") {
  Cpu cpu;
  ModelSpec dense = MoeSpec(0, 0);
  ModelSpec moe = MoeSpec(1, 1);
  REQUIRE(dense.Validate().ok());
  REQUIRE(moe.Validate().ok());
  const LayerLayout Ld = BuildLayout(dense)[1], Lm = BuildLayout(moe)[1];
  std::mt19937 rng(5);
  const auto pd = RandomBlock(Ld, rng);
  std::vector<float> pm = RandomBlock(Lm, rng);  // the router keeps its random row
  const std::vector<std::pair<std::string, std::string>> same = {
      {"input_layernorm.weight", "input_layernorm.weight"},
      {"self_attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"self_attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"self_attn.o_proj.weight", "self_attn.o_proj.weight"},
      {"post_attention_layernorm.weight", "post_attention_layernorm.weight"},
      {"mlp.gate_proj.weight", "block_sparse_moe.experts.0.w1.weight"},
      {"mlp.up_proj.weight", "block_sparse_moe.experts.0.w3.weight"},
      {"mlp.down_proj.weight", "block_sparse_moe.experts.0.w2.weight"}};
  for (const auto& [d, m] : same) {
    const ParamInfo* a = Ld.Find(d);
    const ParamInfo* b = Lm.Find(m);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    REQUIRE(a->numel == b->numel);
    std::copy(pd.begin() + a->offset, pd.begin() + a->offset + a->numel, pm.begin() + b->offset);
  }
  const int64_t N = kB * kT, C = dense.d_model;
  const auto x = RandomVec(rng, N * C, -1.5f, 1.5f), R = RandomVec(rng, N * C);
  auto wsd = LayerWorkspace::Create(cpu.be.get(), dense, kB, kT);
  auto wsm = LayerWorkspace::Create(cpu.be.get(), moe, kB, kT);
  REQUIRE(wsd.ok());
  REQUIRE(wsm.ok());
  auto dPd = Upload(*cpu.be, pd), dPm = Upload(*cpu.be, pm), dX = Upload(*cpu.be, x), dR = Upload(*cpu.be, R);
  auto outd = cpu.Zeros(N * C), outm = cpu.Zeros(N * C), dind = cpu.Zeros(N * C), dinm = cpu.Zeros(N * C);
  auto gd = cpu.Zeros(Ld.numel), gm = cpu.Zeros(Lm.numel);
  MoeStats stats;
  stats.Reset(moe);
  SequenceInputs seq;
  seq.moe = &stats;
  BlockForward(*cpu.be, dense, Ld, dPd.f32(), dX.f32(), outd.f32(), kB, kT, *wsd);
  BlockForward(*cpu.be, moe, Lm, dPm.f32(), dX.f32(), outm.f32(), kB, kT, *wsm, seq);
  CHECK(Download(*cpu.be, outd, N * C) == Download(*cpu.be, outm, N * C));
  BlockBackward(*cpu.be, dense, Ld, dPd.f32(), dX.f32(), dR.f32(), dind.f32(), gd.f32(), kB, kT, *wsd);
  BlockBackward(*cpu.be, moe, Lm, dPm.f32(), dX.f32(), dR.f32(), dinm.f32(), gm.f32(), kB, kT, *wsm, seq);
  CHECK(Download(*cpu.be, dind, N * C) == Download(*cpu.be, dinm, N * C));
  const auto hd = Download(*cpu.be, gd, Ld.numel), hm = Download(*cpu.be, gm, Lm.numel);
  for (const auto& [d, m] : same) {
    const ParamInfo* a = Ld.Find(d);
    const ParamInfo* b = Lm.Find(m);
    INFO(d << " vs " << m);
    CHECK(std::equal(hd.begin() + a->offset, hd.begin() + a->offset + a->numel, hm.begin() + b->offset));
  }
  const ParamInfo* router = Lm.Find("block_sparse_moe.gate.weight");
  for (size_t i = 0; i < router->numel; ++i) CHECK(hm[router->offset + i] == 0.0f);  // softmax over one logit
  CHECK(stats.counts == std::vector<int64_t>{N});
  CHECK(stats.rows == N);
  CHECK(stats.touched == std::vector<uint8_t>{1, 0});  // block 0's only expert; block 1 not run
}

TEST_CASE("MoE block gradients (router, experts, input, aux loss) match finite differences", "[layers][moe]") {
  Cpu cpu;
  ModelSpec spec = MoeSpec(4, 2);
  spec.output_router_logits = true;
  const bool norm = GENERATE(true, false);
  spec.norm_topk_prob = norm;
  INFO("norm_topk_prob " << norm);
  REQUIRE(spec.Validate().ok());
  const LayerLayout L = BuildLayout(spec)[1];
  std::mt19937 rng(11);
  const auto p = RandomBlock(L, rng);
  const int64_t N = kB * kT, C = spec.d_model;
  const auto x = RandomVec(rng, N * C, -1.5f, 1.5f), R = RandomVec(rng, N * C);
  const double aux_scale = 0.7;  // d(objective)/d(aux)
  auto ws = LayerWorkspace::Create(cpu.be.get(), spec, kB, kT);
  REQUIRE(ws.ok());
  auto dR = Upload(*cpu.be, R);
  auto out = cpu.Zeros(N * C);
  // objective = <R, block(x)> + aux_scale * aux(block's router), in double from fp32 outputs.
  auto objective = [&](const std::vector<float>& params, const std::vector<float>& input) {
    auto dP = Upload(*cpu.be, params), dX = Upload(*cpu.be, input);
    MoeStats s;
    s.Reset(spec);
    SequenceInputs seq;
    seq.moe = &s;
    BlockForward(*cpu.be, spec, L, dP.f32(), dX.f32(), out.f32(), kB, kT, *ws, seq);
    const auto y = Download(*cpu.be, out, N * C);
    double v = 0.0;
    for (size_t i = 0; i < y.size(); ++i) v += double(y[i]) * double(R[i]);
    return v + aux_scale * MoeAuxLoss(spec, s);
  };
  // The analytic gradients.
  auto dP = Upload(*cpu.be, p), dX = Upload(*cpu.be, x);
  auto din = cpu.Zeros(N * C), grad = cpu.Zeros(L.numel);
  MoeStats s;
  s.Reset(spec);
  SequenceInputs seq;
  seq.moe = &s;
  BlockForward(*cpu.be, spec, L, dP.f32(), dX.f32(), out.f32(), kB, kT, *ws, seq);
  CHECK(s.rows == N);
  int64_t selections = 0;
  for (int64_t c : s.counts) selections += c;
  CHECK(selections == N * spec.experts_per_token);
  CHECK(MoeAuxLoss(spec, s) > 0.0);
  s.aux_grad_scale = static_cast<float>(aux_scale);
  BlockBackward(*cpu.be, spec, L, dP.f32(), dX.f32(), dR.f32(), din.f32(), grad.f32(), kB, kT, *ws, seq);
  const auto gp = Download(*cpu.be, grad, L.numel), gx = Download(*cpu.be, din, N * C);

  // Directional derivatives along random directions confined to one group of tensors.
  const ParamInfo* router = L.Find("block_sparse_moe.gate.weight");
  const ParamInfo* first = L.Find("block_sparse_moe.experts.0.w1.weight");
  struct Group {
    const char* what;
    size_t begin, end;  // of the params; x when begin == end == 0
  };
  const std::vector<Group> groups = {{"router", router->offset, router->offset + router->numel},
                                     {"experts", first->offset, L.numel},
                                     {"attention and norms", 0, router->offset},
                                     {"input", 0, 0}};
  for (const Group& g : groups) {
    const bool input = g.end == 0;
    const size_t n = input ? x.size() : g.end - g.begin;
    std::vector<float> dir = RandomVec(rng, n);
    double analytic = 0.0;
    for (size_t i = 0; i < n; ++i) analytic += double(dir[i]) * double(input ? gx[i] : gp[g.begin + i]);
    const double h = 1e-3;
    auto shifted = [&](double sign) {
      std::vector<float> pp = p, xx = x;
      for (size_t i = 0; i < n; ++i) {
        float& v = input ? xx[i] : pp[g.begin + i];
        v = static_cast<float>(double(v) + sign * h * double(dir[i]));
      }
      return objective(pp, xx);
    };
    const double numeric = (shifted(1.0) - shifted(-1.0)) / (2.0 * h);
    INFO(g.what << ": analytic " << analytic << ", finite differences " << numeric);
    CHECK(std::abs(analytic - numeric) <= 2e-3 * std::abs(numeric) + 2e-3);
  }
}

TEST_CASE("MoE routing statistics accumulate over blocks and mark the experts that got tokens", "[layers][moe]") {
  Cpu cpu;
  ModelSpec spec = MoeSpec(4, 1);
  const LayerLayout L0 = BuildLayout(spec)[1], L1 = BuildLayout(spec)[2];
  std::mt19937 rng(21);
  std::vector<float> p = RandomBlock(L0, rng);
  // Block 0's router: expert 3 can never win (its row is expert 0's minus a large margin
  // along the all-ones direction, and the normed rows below are made positive).
  const ParamInfo* router = L0.Find("block_sparse_moe.gate.weight");
  const int64_t C = spec.d_model, N = kB * kT;
  for (int64_t c = 0; c < C; ++c) p[router->offset + 3 * C + c] = p[router->offset + c] - 5.0f;
  const auto x = RandomVec(rng, N * C, 0.5f, 1.5f);  // positive rows: the ones-direction margin holds
  auto ws = LayerWorkspace::Create(cpu.be.get(), spec, kB, kT);
  REQUIRE(ws.ok());
  auto dP = Upload(*cpu.be, p), dX = Upload(*cpu.be, x);
  auto out = cpu.Zeros(N * C);
  MoeStats s;
  s.Reset(spec);
  SequenceInputs seq;
  seq.moe = &s;
  BlockForward(*cpu.be, spec, L0, dP.f32(), dX.f32(), out.f32(), kB, kT, *ws, seq);
  CHECK(s.touched[3] == 0);
  CHECK(s.counts[3] == 0);
  CHECK(s.rows == N);
  BlockForward(*cpu.be, spec, L1, dP.f32(), dX.f32(), out.f32(), kB, kT, *ws, seq);  // same weights as block 1
  CHECK(s.rows == 2 * N);
  CHECK(std::vector<uint8_t>(s.touched.begin() + 4, s.touched.end()) ==
        std::vector<uint8_t>(s.touched.begin(), s.touched.begin() + 4));
  int64_t total = 0;
  for (int64_t c : s.counts) total += c;
  CHECK(total == 2 * N);
  double probs = 0.0;
  for (double q : s.prob_sums) probs += q;
  CHECK(probs == Approx(2.0 * N).epsilon(1e-6));
  // aux = E * sum_e (count_e / R) (prob_e / R).
  double want = 0.0;
  for (int64_t e = 0; e < 4; ++e) want += double(s.counts[e]) / (2.0 * N) * s.prob_sums[e] / (2.0 * N);
  CHECK(MoeAuxLoss(spec, s) == Approx(4.0 * want).epsilon(1e-12));
}

}  // namespace
}  // namespace l2l::layers

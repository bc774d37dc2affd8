// The mixture-of-experts MLP (kernels/layers/moe.h) on the CUDA backend against the CPU
// backend: its row ops (GatherRows, ScatterAddRows: exact, the same fp32 products and sums;
// RowDot: column order on both, kElem for the CPU's possible fused multiply-adds) and a
// Mixtral block forward and recomputing backward (E=4, top-2, with the auxiliary loss:
// the routing statistics must agree exactly, out / din / dparams as the Llama block in
// llama_test.cc). The router's rows are scaled up so that no token's top-2 sits within
// rounding of a tie (the two backends' router products differ in their last bits).
// Label gpu (emu on the emulator): fails (never skips) without a GPU.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "kernels/layers/layers.h"
#include "kernels/layers/moe.h"
#include "tests/gpu/gpu_test_util.h"

namespace l2l::gpu_test {
namespace {

TEST_CASE("cuda MoE row ops gather, scatter-add and dot rows like the cpu", "[gpu][moe]") {
  Backends& b = Both();
  const int64_t rows = 37, C = GENERATE(5, 130);
  CAPTURE(C);
  std::mt19937 rng(static_cast<unsigned>(C));
  std::vector<int32_t> idx = {36, 0, 7, 12, 3, 30, 31, 8};  // distinct
  const int64_t n = static_cast<int64_t>(idx.size());
  Twin src = Twin::Of(b, RandomVec(rng, rows * C)), scale = Twin::Of(b, RandomVec(rng, n));
  Twin ix = Twin::Of(b, idx);
  Twin gathered = Twin::Of(b, RandomVec(rng, n * C));
  b.cpu->GatherRows(gathered.c(), src.c(), ix.ci(), scale.c(), n, C);
  b.gpu->GatherRows(gathered.g(), src.g(), ix.gi(), scale.g(), n, C);
  CHECK(gathered.FromCpu(b) == gathered.FromGpu(b));
  Twin dst = Twin::Of(b, RandomVec(rng, rows * C));
  b.cpu->ScatterAddRows(dst.c(), gathered.c(), ix.ci(), scale.c(), n, C);
  b.gpu->ScatterAddRows(dst.g(), gathered.g(), ix.gi(), scale.g(), n, C);
  b.cpu->ScatterAddRows(dst.c(), gathered.c(), ix.ci(), nullptr, n, C);
  b.gpu->ScatterAddRows(dst.g(), gathered.g(), ix.gi(), nullptr, n, C);
  CHECK(dst.FromCpu(b) == dst.FromGpu(b));
  Twin dot = Twin::Of(b, RandomVec(rng, n));
  b.cpu->RowDot(dot.c(), gathered.c(), src.c(), n, C);
  b.gpu->RowDot(dot.g(), gathered.g(), src.g(), n, C);
  ExpectClose(dot.FromGpu(b), dot.FromCpu(b), 1e-5, 1e-4, "RowDot");
}

TEST_CASE("cuda Mixtral block forward and recomputing backward match the cpu, aux loss included", "[gpu][moe]") {
  Backends& b = Both();
  ModelSpec spec;
  spec.family = ModelFamily::kLlama;
  spec.vocab_size = 96;
  spec.seq_len = 32;
  spec.d_model = 48;
  spec.n_layer = 2;
  spec.n_head = 6;
  spec.n_kv_heads = 2;
  spec.d_ff = 40;
  spec.tied_embeddings = false;
  spec.num_experts = 4;
  spec.experts_per_token = 2;
  spec.output_router_logits = true;
  REQUIRE(spec.Validate().ok());
  const LayerLayout block = BuildLayout(spec)[1];
  std::vector<float> p = InitParams(spec, block);
  const ParamInfo* router = block.Find("block_sparse_moe.gate.weight");
  REQUIRE(router != nullptr);
  for (size_t i = 0; i < router->numel; ++i) p[router->offset + i] *= 50.0f;
  const int64_t B = 2, T = 32, C = spec.d_model, N = B * T;
  std::mt19937 rng(17);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin params = Twin::Of(b, p);
  Twin in = Twin::Of(b, RandomVec(rng, N * C));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  layers::MoeStats sc, sg;
  sc.Reset(spec);
  sg.Reset(spec);
  layers::SequenceInputs qc, qg;
  qc.moe = &sc;
  qg.moe = &sg;
  layers::BlockForward(*b.cpu, spec, block, params.c(), in.c(), out.c(), B, T, *ws.cpu, qc);
  layers::BlockForward(*b.gpu, spec, block, params.g(), in.g(), out.g(), B, T, *ws.gpu, qg);
  ExpectTwinClose(b, out, 1e-4, 1e-3, "moe block out");
  CHECK(sc.counts == sg.counts);
  CHECK(sc.touched == sg.touched);
  CHECK(sc.rows == sg.rows);
  CHECK(layers::MoeAuxLoss(spec, sg) == Approx(layers::MoeAuxLoss(spec, sc)).epsilon(1e-5));
  sc.aux_grad_scale = sg.aux_grad_scale = 0.5f;
  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin din = Twin::Of(b, RandomVec(rng, N * C));
  Twin dparams = Twin::Of(b, RandomVec(rng, block.numel, -0.01f, 0.01f));  // accumulates
  layers::BlockBackward(*b.cpu, spec, block, params.c(), in.c(), dout.c(), din.c(), dparams.c(), B, T, *ws.cpu, qc);
  layers::BlockBackward(*b.gpu, spec, block, params.g(), in.g(), dout.g(), din.g(), dparams.g(), B, T, *ws.gpu, qg);
  ExpectTwinClose(b, din, 1e-4, 1e-3, "moe block din");
  ExpectTwinClose(b, dparams, 1e-4, 1e-3, "moe block dparams");
}

}  // namespace
}  // namespace l2l::gpu_test

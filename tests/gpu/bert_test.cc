// The BERT family on the CUDA backend against the CPU backend (the reference): every
// BERT-family Backend op (LayerNorm with the model's epsilon, erf GELU, tanh, bidirectional
// attention with a key padding mask) on fresh random inputs, in fp32 and (the attention)
// in bf16 GEMM mode; the embedding with token types, the post-LN block forward and
// recomputing backward with padded sequences, both heads' losses and gradients (masked-LM
// with the tied decoder and its bias; classification through the pooler). Training and
// the depth-flat memory check are in bert_train_test.cc.
// Label gpu (emu on the emulator): fails (never skips) without a GPU.
//
// Tolerances, |gpu - cpu| <= atol + rtol * |cpu| (both sides compute in fp32; the CPU's
// BERT ops accumulate in double, the GPU's in fp32, so differences are summation order
// and libm ulps; inputs are O(1)), as the Llama tests (llama_test.cc):
//   GELU, tanh, LayerNorm out/mean/rstd, probabilities   kElem atol 1e-5 rtol 1e-4
//   attention out, LayerNorm dinp, column sums            kGemm atol 1e-4 rtol 1e-4
//                                                         (x4 for the attention backward)
//   layers (embedding, block, heads): atol 1e-4 rtol 1e-3 (head gradients 1e-6 / 1e-3),
//     as the GPT-2 and Llama block checks.
//   bf16 GEMM mode attention: the CPU on bf16-rounded q|k|v (and dout), plus the
//     per-element bounds of rounding P and dS to bf16 (at most 2^-8 relative each), as
//     bf16_gemm_test.cc and llama_test.cc, summed over every key (bidirectional).
//   (training tolerances: bert_train_test.cc)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/bert_util.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"  // ScopedEnv

namespace l2l::gpu_test {
namespace {

constexpr double kElemAtol = 1e-5, kElemRtol = 1e-4;
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

// A key padding mask (B,T): sequence b keeps real[b] tokens, the rest are padding.
std::vector<int32_t> PaddingMask(const std::vector<int64_t>& real, int64_t T) {
  std::vector<int32_t> m;
  for (int64_t r : real) {
    for (int64_t t = 0; t < T; ++t) m.push_back(t < r ? 1 : 0);
  }
  return m;
}

// ---- ops -------------------------------------------------------------------------------

TEST_CASE("cuda LayerNormForwardEps uses the given epsilon like the cpu", "[gpu][bert]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67, 300), C = GENERATE(37, 64, 1000);
  const float eps = GENERATE(1e-12f, 1e-5f, 0.5f);  // 0.5: the epsilon visibly matters
  std::mt19937 rng(static_cast<unsigned>(N * 13 + C));
  CAPTURE(N, C, eps);
  Twin inp = Twin::Of(b, RandomVec(rng, N * C, -2.0f, 3.0f));
  Twin w = Twin::Of(b, RandomVec(rng, C, 0.5f, 1.5f));
  Twin bias = Twin::Of(b, RandomVec(rng, C));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  Twin mean = Twin::Of(b, RandomVec(rng, N));
  Twin rstd = Twin::Of(b, RandomVec(rng, N));
  b.cpu->LayerNormForwardEps(out.c(), mean.c(), rstd.c(), inp.c(), w.c(), bias.c(), N, C, eps);
  b.gpu->LayerNormForwardEps(out.g(), mean.g(), rstd.g(), inp.g(), w.g(), bias.g(), N, C, eps);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "LayerNorm out");
  ExpectTwinClose(b, mean, kElemAtol, kElemRtol, "LayerNorm mean");
  ExpectTwinClose(b, rstd, kElemAtol, kElemRtol, "LayerNorm rstd");

  // LayerNormBackward serves it (it reads the saved statistics).
  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dinp = Twin::Of(b, RandomVec(rng, N * C));  // accumulates
  Twin dw = Twin::Of(b, RandomVec(rng, C));
  Twin db = Twin::Of(b, RandomVec(rng, C));
  b.gpu->CopyToDevice(rstd.g(), rstd.FromCpu(b).data(), rstd.bytes);
  b.gpu->CopyToDevice(mean.g(), mean.FromCpu(b).data(), mean.bytes);
  b.cpu->LayerNormBackward(dinp.c(), dw.c(), db.c(), dout.c(), inp.c(), w.c(), mean.c(), rstd.c(), N, C);
  b.gpu->LayerNormBackward(dinp.g(), dw.g(), db.g(), dout.g(), inp.g(), w.g(), mean.g(), rstd.g(), N, C);
  ExpectTwinClose(b, dinp, kGemmAtol, kGemmRtol, "LayerNorm dinp");
  ExpectTwinClose(b, dw, 4 * kGemmAtol, kGemmRtol, "LayerNorm dweight");
  ExpectTwinClose(b, db, 4 * kGemmAtol, kGemmRtol, "LayerNorm dbias");
}

TEST_CASE("cuda erf GELU and tanh forward and backward match the cpu", "[gpu][bert]") {
  Backends& b = Both();
  const int64_t n = GENERATE(1, 1000, 70001);
  std::mt19937 rng(static_cast<unsigned>(n));
  CAPTURE(n);
  Twin inp = Twin::Of(b, RandomVec(rng, n, -6.0f, 6.0f));
  Twin dout = Twin::Of(b, RandomVec(rng, n));

  Twin gelu = Twin::Of(b, RandomVec(rng, n));
  b.cpu->GeluErfForward(gelu.c(), inp.c(), n);
  b.gpu->GeluErfForward(gelu.g(), inp.g(), n);
  ExpectTwinClose(b, gelu, kElemAtol, kElemRtol, "GeluErfForward");
  Twin dgelu = Twin::Of(b, RandomVec(rng, n));  // accumulates
  b.cpu->GeluErfBackward(dgelu.c(), inp.c(), dout.c(), n);
  b.gpu->GeluErfBackward(dgelu.g(), inp.g(), dout.g(), n);
  ExpectTwinClose(b, dgelu, kElemAtol, kElemRtol, "GeluErfBackward");

  // Not the tanh approximation: at x = -3 the exact GELU, x * Phi(x) = -1.5 erfc(3/sqrt 2)
  // = -0.00404969409489 (Python's math.erfc), tanh's is -0.0036374.
  std::vector<float> x3 = {-3.0f};
  Twin at3 = Twin::Of(b, x3), y3 = Twin::Of(b, x3);
  b.gpu->GeluErfForward(y3.g(), at3.g(), 1);
  CHECK(y3.FromGpu(b)[0] == Approx(-0.004049694094890287).epsilon(1e-5));

  Twin th = Twin::Of(b, RandomVec(rng, n));
  b.cpu->TanhForward(th.c(), inp.c(), n);
  b.gpu->TanhForward(th.g(), inp.g(), n);
  ExpectTwinClose(b, th, kElemAtol, kElemRtol, "TanhForward");
  Twin dth = Twin::Of(b, RandomVec(rng, n));  // accumulates; from the CPU's output on both
  b.gpu->CopyToDevice(th.g(), th.FromCpu(b).data(), th.bytes);
  b.cpu->TanhBackward(dth.c(), th.c(), dout.c(), n);
  b.gpu->TanhBackward(dth.g(), th.g(), dout.g(), n);
  ExpectTwinClose(b, dth, kElemAtol, kElemRtol, "TanhBackward");
}

// Masked attention forward and backward on `gpu` against the CPU on the same inputs (the
// backward on the CPU's probabilities). real: real tokens per sequence (empty: no mask).
void CheckMasked(Backends& b, int64_t T, int64_t C, int64_t NH, const std::vector<int64_t>& real,
                 int64_t B) {
  std::mt19937 rng(static_cast<unsigned>(B + 3 * T + 17 * NH + C));
  CAPTURE(B, T, C, NH, real);
  const std::vector<int32_t> mask = real.empty() ? std::vector<int32_t>{} : PaddingMask(real, T);
  Twin qkv = Twin::Of(b, RandomVec(rng, B * T * 3 * C, -2.0f, 2.0f));
  Twin km = Twin::Of(b, mask.empty() ? std::vector<int32_t>{0} : mask);
  const int32_t* cm = mask.empty() ? nullptr : km.ci();
  const int32_t* gm = mask.empty() ? nullptr : km.gi();
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin att = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionForwardMasked(out.c(), att.c(), qkv.c(), cm, B, T, C, NH);
  b.gpu->AttentionForwardMasked(out.g(), att.g(), qkv.g(), gm, B, T, C, NH);
  ExpectTwinClose(b, att, kElemAtol, kElemRtol, "masked attention probabilities");
  ExpectTwinClose(b, out, kGemmAtol, kGemmRtol, "masked attention out");
  // Padded keys get exactly 0; a query attends to keys after it (bidirectional).
  const auto p = att.FromGpu(b);
  bool zero_at_pad = true, future_used = false;
  for (int64_t bb = 0; bb < B; ++bb) {
    for (int64_t r = 0; r < NH * T; ++r) {
      for (int64_t j = 0; j < T; ++j) {
        const float v = p[(bb * NH * T + r) * T + j];
        if (!mask.empty() && mask[bb * T + j] == 0) zero_at_pad = zero_at_pad && v == 0.0f;
        if (j > r % T && v > 0.0f) future_used = true;
      }
    }
  }
  CHECK(zero_at_pad);
  if (T > 1) CHECK(future_used);

  b.gpu->CopyToDevice(att.g(), att.FromCpu(b).data(), att.bytes);
  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dqkv = Twin::Of(b, RandomVec(rng, B * T * 3 * C));  // accumulates
  Twin scratch = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionBackwardMasked(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, C, NH);
  b.gpu->AttentionBackwardMasked(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, C, NH);
  ExpectTwinClose(b, dqkv, 4 * kGemmAtol, 4 * kGemmRtol, "masked attention dqkv");
}

TEST_CASE("cuda bidirectional attention with a key padding mask matches the cpu", "[gpu][bert]") {
  Backends& b = Both();
  SECTION("one token, one head") { CheckMasked(b, 1, 8, 1, {1}, 1); }
  SECTION("padded sequences of different lengths") { CheckMasked(b, 37, 64, 4, {37, 20, 1}, 3); }
  SECTION("no mask") { CheckMasked(b, 29, 48, 3, {}, 2); }
  SECTION("longer than a warp of keys, heavy padding") { CheckMasked(b, 70, 32, 2, {3, 70}, 2); }
}

TEST_CASE("cuda masked attention matches the cpu through the one-GEMM-per-head fallback", "[gpu][bert]") {
  Both();
  ScopedEnv env("L2L_CUDA_EMU_LT_NO_BATCHED", "1");
  auto fresh = kernels::CreateCudaBackend(0);
  REQUIRE(fresh.ok());
  Backends fb;
  fb.cpu = kernels::CreateCpuBackend(0);
  fb.gpu = std::move(fresh).value();
  CheckMasked(fb, 23, 48, 6, {23, 11}, 2);
}

// ---- bf16 GEMM mode ----------------------------------------------------------------------

TEST_CASE("bf16 masked attention matches the cpu on bf16-rounded inputs within P and dS rounding",
          "[gpu][bert]") {
  Backends& b = Both();
  const std::unique_ptr<Backend> made = CudaBf16Backend();
  Backend& bf = *made;
  const int64_t B = 2, T = 40, C = 64, NH = 4, natt = B * NH * T * T;
  std::mt19937 rng(77);
  const auto mask = PaddingMask({40, 17}, T);
  const auto qkv = RandomVec(rng, B * T * 3 * C), dout = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * 3 * C);
  const auto qkv_r = RoundedBf16(qkv), dout_r = RoundedBf16(dout);

  // CPU oracle on the rounded inputs; the bf16 GPU gets the unrounded ones.
  auto c_qkv = Dev::Of(*b.cpu, qkv_r), c_out = Dev::Of(*b.cpu, std::vector<float>(B * T * C));
  auto c_att = Dev::Of(*b.cpu, std::vector<float>(natt));
  auto c_mask = DevOf<int32_t>::Of(*b.cpu, mask);
  b.cpu->AttentionForwardMasked(c_out.p(), c_att.p(), c_qkv.p(), c_mask.p(), B, T, C, NH);
  const auto ref_out = c_out.Host(*b.cpu), ref_att = c_att.Host(*b.cpu);
  auto g_qkv = Dev::Of(bf, qkv), g_out = Dev::Of(bf, std::vector<float>(B * T * C));
  auto g_att = Dev::Of(bf, std::vector<float>(natt));
  auto g_mask = DevOf<int32_t>::Of(bf, mask);
  bf.AttentionForwardMasked(g_out.p(), g_att.p(), g_qkv.p(), g_mask.p(), B, T, C, NH);
  const auto got_out = g_out.Host(bf), got_att = g_att.Host(bf);

  // The mode is on: the CPU on the UNrounded inputs gives clearly different probabilities.
  auto u_qkv = Dev::Of(*b.cpu, qkv), u_out = Dev::Of(*b.cpu, std::vector<float>(B * T * C));
  auto u_att = Dev::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionForwardMasked(u_out.p(), u_att.p(), u_qkv.p(), c_mask.p(), B, T, C, NH);
  const auto unrounded = u_att.Host(*b.cpu);
  double vs_unrounded = 0.0;
  for (size_t i = 0; i < unrounded.size(); ++i) {
    vs_unrounded = std::max(vs_unrounded, std::abs(double(got_att[i]) - unrounded[i]));
  }
  INFO("max |P_bf16 - P_cpu(unrounded qkv)| = " << vs_unrounded);
  CHECK(vs_unrounded > 1e-4);
  ExpectClose(got_att, ref_att, kElemAtol, kElemRtol, "att (probabilities)");

  // The backward on both sides reads the CPU's probabilities.
  auto c_dout = Dev::Of(*b.cpu, dout_r), c_dqkv = Dev::Of(*b.cpu, dqkv0);
  auto c_scr = Dev::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionBackwardMasked(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, C, NH);
  auto g_dout = Dev::Of(bf, dout), g_dqkv = Dev::Of(bf, dqkv0), g_att_ref = Dev::Of(bf, ref_att);
  auto g_scr = Dev::Of(bf, std::vector<float>(natt));
  bf.AttentionBackwardMasked(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att_ref.p(), B, T, C, NH);

  const AttentionBounds bounds = Bf16AttentionBounds(qkv_r, dout_r, ref_att, B, T, NH, NH, C / NH, /*causal=*/false);
  ExpectWithin(got_out, ref_out, bounds.out, kGemmAtol, kGemmRtol, "out");
  ExpectWithin(g_dqkv.Host(bf), c_dqkv.Host(*b.cpu), bounds.dqkv, 4 * kGemmAtol, 4 * kGemmRtol, "dqkv");
}

// ---- layers --------------------------------------------------------------------------------



// Initial parameters with every tensor perturbed (LayerNorm weights start at 1 and biases
// at 0, which would hide a mix-up of the two).
std::vector<float> PerturbedParams(const ModelSpec& spec, const LayerLayout& layout, std::mt19937& rng) {
  std::vector<float> p(layout.numel);
  InitLayerParams(spec, layout, 42, p.data());
  std::uniform_real_distribution<float> d(-0.1f, 0.1f);
  for (float& x : p) x += d(rng);
  return p;
}

// Token types and padding for B sequences of T: sequence b keeps real[b] tokens, the
// second half of them of type 1.
struct SeqTwins {
  Twin types, mask;
  layers::SequenceInputs cpu() const { return {types.ci(), mask.ci()}; }
  layers::SequenceInputs gpu() const { return {types.gi(), mask.gi()}; }
};
SeqTwins MakeSeq(Backends& b, const std::vector<int64_t>& real, int64_t T) {
  std::vector<int32_t> types;
  for (int64_t r : real) {
    for (int64_t t = 0; t < T; ++t) types.push_back(t >= r / 2 && t < r ? 1 : 0);
  }
  return {Twin::Of(b, types), Twin::Of(b, PaddingMask(real, T))};
}

TEST_CASE("cuda BERT embedding with token types forward and backward match the cpu", "[gpu][bert]") {
  Backends& b = Both();
  const ModelSpec spec = SmallBert(0);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const int64_t B = 3, T = 32, C = spec.d_model;
  std::mt19937 rng(31);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin params = Twin::Of(b, PerturbedParams(spec, emb, rng));
  Twin tokens = Twin::Of(b, RandomTokens(rng, B * T, static_cast<int32_t>(spec.vocab_size)));
  const bool with_seq = GENERATE(true, false);  // types + padding, or neither (all type 0)
  CAPTURE(with_seq);
  SeqTwins seq = MakeSeq(b, {32, 20, 5}, T);
  const layers::SequenceInputs cs = with_seq ? seq.cpu() : layers::SequenceInputs{};
  const layers::SequenceInputs gs = with_seq ? seq.gpu() : layers::SequenceInputs{};
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::EmbeddingForward(*b.cpu, spec, emb, params.c(), tokens.ci(), out.c(), B, T, cs, ws.cpu.get());
  layers::EmbeddingForward(*b.gpu, spec, emb, params.g(), tokens.gi(), out.g(), B, T, gs, ws.gpu.get());
  ExpectTwinClose(b, out, 1e-4, 1e-3, "embedding out");

  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  const auto dparams0 = RandomVec(rng, emb.numel, -0.01f, 0.01f);
  Twin dparams = Twin::Of(b, dparams0);  // accumulates
  layers::EmbeddingBackward(*b.cpu, spec, emb, tokens.ci(), dout.c(), dparams.c(), B, T, cs, params.c(),
                            ws.cpu.get());
  layers::EmbeddingBackward(*b.gpu, spec, emb, tokens.gi(), dout.g(), dparams.g(), B, T, gs, params.g(),
                            ws.gpu.get());
  ExpectTwinClose(b, dparams, 1e-4, 1e-3, "embedding dparams");
  // Token type 1's row gets gradient exactly when some token has type 1.
  const ParamInfo* tt = emb.Find("embeddings.token_type_embeddings.weight");
  REQUIRE(tt != nullptr);
  const auto got = dparams.FromGpu(b);
  bool row1_moved = false;
  for (int64_t c = 0; c < C; ++c) {
    const size_t i = tt->offset + static_cast<size_t>(C + c);
    row1_moved = row1_moved || got[i] != dparams0[i];
  }
  CHECK(row1_moved == with_seq);
}

TEST_CASE("cuda BERT block forward and recomputing backward match the cpu with padding", "[gpu][bert]") {
  Backends& b = Both();
  const ModelSpec spec = SmallBert(0);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& block = layouts[1];
  const int64_t B = 3, T = 32, C = spec.d_model;
  std::mt19937 rng(41);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin params = Twin::Of(b, PerturbedParams(spec, block, rng));
  SeqTwins seq = MakeSeq(b, {32, 19, 2}, T);
  Twin in = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::BlockForward(*b.cpu, spec, block, params.c(), in.c(), out.c(), B, T, *ws.cpu, seq.cpu());
  layers::BlockForward(*b.gpu, spec, block, params.g(), in.g(), out.g(), B, T, *ws.gpu, seq.gpu());
  ExpectTwinClose(b, out, 1e-4, 1e-3, "block out");

  // The mask reaches the block: without it the real tokens' outputs change.
  Twin unmasked = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::BlockForward(*b.gpu, spec, block, params.g(), in.g(), unmasked.g(), B, T, *ws.gpu, {});
  const auto with = out.FromGpu(b), without = unmasked.FromGpu(b);
  double moved = 0.0;
  for (int64_t c = 0; c < C; ++c) moved = std::max(moved, std::abs(double(with[(T + 0) * C + c]) - without[(T + 0) * C + c]));
  CHECK(moved > 1e-3);  // sequence 1, token 0 (real) saw padded keys without the mask

  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dparams = Twin::Of(b, RandomVec(rng, block.numel, -0.01f, 0.01f));  // accumulates
  layers::BlockBackward(*b.cpu, spec, block, params.c(), in.c(), dout.c(), din.c(), dparams.c(), B, T, *ws.cpu,
                        seq.cpu());
  layers::BlockBackward(*b.gpu, spec, block, params.g(), in.g(), dout.g(), din.g(), dparams.g(), B, T, *ws.gpu,
                        seq.gpu());
  ExpectTwinClose(b, din, 1e-4, 1e-3, "block din");
  ExpectTwinClose(b, dparams, 1e-4, 1e-3, "block dparams");
}

TEST_CASE("cuda BERT block in bf16 GEMM mode stays near the fp32 cpu", "[gpu][bert]") {
  Both();
  Backends bb;
  bb.cpu = kernels::CreateCpuBackend(0);
  bb.gpu = CudaBf16Backend();
  const ModelSpec spec = SmallBert(0);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& block = layouts[1];
  const int64_t B = 2, T = 32, C = spec.d_model;
  std::mt19937 rng(43);
  Workspaces ws = MakeWorkspaces(bb, spec, B, T);
  Twin params = Twin::Of(bb, PerturbedParams(spec, block, rng));
  SeqTwins seq = MakeSeq(bb, {32, 13}, T);
  Twin in = Twin::Of(bb, RandomVec(rng, B * T * C));
  Twin out = Twin::Of(bb, RandomVec(rng, B * T * C));
  layers::BlockForward(*bb.cpu, spec, block, params.c(), in.c(), out.c(), B, T, *ws.cpu, seq.cpu());
  layers::BlockForward(*bb.gpu, spec, block, params.g(), in.g(), out.g(), B, T, *ws.gpu, seq.gpu());
  // Post-LN outputs are O(1) and every product rounds its operands to 8 significant bits:
  // a few 2^-8 relative errors through four products and two LayerNorms. Measured on the
  // emulator: 2.3e-3 at most; 1e-2 (~2.5 units of bf16 roundoff) leaves 4x for a GPU.
  const auto got = out.FromGpu(bb), ref = out.FromCpu(bb);
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
  INFO("max |bf16 gpu - fp32 cpu| of the block output = " << worst);
  CHECK(worst < 1e-2);
  CHECK(worst > 1e-5);  // the mode is on
}

TEST_CASE("cuda BERT masked-LM head (tied decoder, bias) loss and gradients match the cpu", "[gpu][bert]") {
  Backends& b = Both();
  const ModelSpec spec = SmallBert(0);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const LayerLayout& head = layouts.back();
  const int64_t B = 2, T = 32, C = spec.d_model;
  std::mt19937 rng(51);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin emb_params = Twin::Of(b, PerturbedParams(spec, emb, rng));
  Twin head_params = Twin::Of(b, PerturbedParams(spec, head, rng));
  // Targets at about a third of the positions, -1 (not trained) elsewhere and at padding.
  std::vector<int32_t> targets(B * T, -1);
  for (size_t i = 0; i < targets.size(); i += 3) targets[i] = static_cast<int32_t>(rng() % spec.vocab_size);
  Twin tg = Twin::Of(b, targets);
  Twin hidden = Twin::Of(b, RandomVec(rng, B * T * C));
  const size_t wte_off = emb.Find("embeddings.word_embeddings.weight")->offset;
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dhead = Twin::Of(b, RandomVec(rng, head.numel, -0.01f, 0.01f));
  Twin demb = Twin::Of(b, RandomVec(rng, emb.numel, -0.01f, 0.01f));
  const float lc = layers::HeadForwardBackward(*b.cpu, spec, head, head_params.c(), emb_params.c() + wte_off,
                                               hidden.c(), tg.ci(), 0.5f, din.c(), dhead.c(),
                                               demb.c() + wte_off, B, T, *ws.cpu);
  const float lg = layers::HeadForwardBackward(*b.gpu, spec, head, head_params.g(), emb_params.g() + wte_off,
                                               hidden.g(), tg.gi(), 0.5f, din.g(), dhead.g(),
                                               demb.g() + wte_off, B, T, *ws.gpu);
  INFO("loss cpu " << lc << " gpu " << lg);
  CHECK(std::abs(lg - lc) <= 1e-5 + 1e-5 * std::abs(lc));
  ExpectTwinClose(b, din, 1e-6, 1e-3, "MLM head din");
  ExpectTwinClose(b, dhead, 1e-6, 1e-3, "MLM head dparams (transform, decoder bias)");
  ExpectTwinClose(b, demb, 1e-6, 1e-3, "MLM head dwte (tied decoder)");
}

TEST_CASE("cuda BERT classification head (pooler, tanh) loss and gradients match the cpu", "[gpu][bert]") {
  Backends& b = Both();
  const ModelSpec spec = SmallBert(3);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& head = layouts.back();
  const int64_t B = 4, T = 32, C = spec.d_model;
  std::mt19937 rng(61);
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin params = Twin::Of(b, PerturbedParams(spec, head, rng));
  // Labels at position 0; sequence 2 is not trained on (label -1).
  std::vector<int32_t> targets(B * T, -1);
  targets[0] = 2;
  targets[T] = 0;
  targets[3 * T] = 1;
  Twin tg = Twin::Of(b, targets);
  Twin hidden = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dparams = Twin::Of(b, RandomVec(rng, head.numel, -0.01f, 0.01f));
  const float lc = layers::HeadForwardBackward(*b.cpu, spec, head, params.c(), nullptr, hidden.c(), tg.ci(), 0.5f,
                                               din.c(), dparams.c(), nullptr, B, T, *ws.cpu);
  const float lg = layers::HeadForwardBackward(*b.gpu, spec, head, params.g(), nullptr, hidden.g(), tg.gi(), 0.5f,
                                               din.g(), dparams.g(), nullptr, B, T, *ws.gpu);
  INFO("loss cpu " << lc << " gpu " << lg);
  CHECK(std::abs(lg - lc) <= 1e-5 + 1e-5 * std::abs(lc));
  ExpectTwinClose(b, din, 1e-6, 1e-3, "classification head din");
  ExpectTwinClose(b, dparams, 1e-6, 1e-3, "classification head dparams (pooler, classifier)");
  // Only the first token of each trained sequence gets an input gradient.
  const auto d = din.FromGpu(b);
  bool rest_zero = true, first_nonzero = false;
  for (int64_t bb = 0; bb < B; ++bb) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        const float v = d[(bb * T + t) * C + c];
        if (t > 0 || bb == 2) rest_zero = rest_zero && v == 0.0f;
        if (t == 0 && bb != 2 && v != 0.0f) first_nonzero = true;
      }
    }
  }
  CHECK(rest_zero);
  CHECK(first_nonzero);
}

}  // namespace
}  // namespace l2l::gpu_test

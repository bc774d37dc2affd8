// The Llama family on the CUDA backend against the CPU backend (the reference): every
// Llama-family Backend op (token embedding, RMSNorm, RoPE, SwiGLU, grouped-query
// attention) on fresh random inputs, the Llama block forward and recomputing backward,
// and the reference trainer and the relay on the llama-tiny preset for a few steps.
// Label gpu (emu on the emulator): fails (never skips) without a GPU.
//
// Tolerances, |gpu - cpu| <= atol + rtol * |cpu| (both sides compute in fp32, so
// differences come from summation order and libm ulps; inputs are O(1)):
//   token embedding forward: a copy, exact; backward: kElem (per-token sums in position
//     order on both sides, fp32 rounding of the accumulate only)
//   RMSNorm out, rstd, RoPE, SwiGLU      kElem  atol 1e-5  rtol 1e-4 (the CPU sums RMSNorm's
//                                               squares in double, the GPU in fp32)
//   RMSNorm dinp, attention, column sums kGemm  atol 1e-4  rtol 1e-4 (x4 for backward chains)
//   bf16 GEMM mode attention: the CPU on the bf16-rounded q|k|v (and dout), plus the
//     per-element rounding bounds of bf16_gemm_test.cc (P and dS rounded to bf16, at
//     most 2^-8 relative each), generalised to a key/value head shared by NH/NKV
//     query heads.
//   Block: atol 1e-4, rtol 1e-3 (as the GPT-2 block in training_test.cc).
//   Training: every step's loss within 1e-4 + 2e-3 * |loss| of the CPU's (training_test.cc).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/fake_eps_client.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"
#include "worker/reference/reference_trainer.h"
#include "worker/relay.h"

namespace l2l::gpu_test {
namespace {

constexpr double kElemAtol = 1e-5, kElemRtol = 1e-4;
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

// ---- ops -------------------------------------------------------------------------------

TEST_CASE("cuda token embedding forward and deterministic backward match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67, 256), C = GENERATE(37, 64);
  const int32_t V = GENERATE(7, 1001);  // V=7: nearly every token repeats
  std::mt19937 rng(static_cast<unsigned>(N * 100 + C + V));
  CAPTURE(N, C, V);
  Twin tokens = Twin::Of(b, RandomTokens(rng, N, V));
  Twin wte = Twin::Of(b, RandomVec(rng, int64_t{V} * C));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  b.cpu->TokenEmbeddingForward(out.c(), tokens.ci(), wte.c(), N, C);
  b.gpu->TokenEmbeddingForward(out.g(), tokens.gi(), wte.g(), N, C);
  ExpectTwinClose(b, out, 0.0, 0.0, "TokenEmbeddingForward");  // a gather: exact

  const auto dwte0 = RandomVec(rng, int64_t{V} * C);
  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dwte = Twin::Of(b, dwte0);  // accumulates into existing values
  b.cpu->TokenEmbeddingBackward(dwte.c(), dout.c(), tokens.ci(), N, C);
  b.gpu->TokenEmbeddingBackward(dwte.g(), dout.g(), tokens.gi(), N, C);
  ExpectTwinClose(b, dwte, kElemAtol, kElemRtol, "TokenEmbeddingBackward dwte");

  // Deterministic: the same inputs from the same start give the same bits.
  const auto first = dwte.FromGpu(b);
  b.gpu->CopyToDevice(dwte.g(), dwte0.data(), dwte.bytes);
  b.gpu->TokenEmbeddingBackward(dwte.g(), dout.g(), tokens.gi(), N, C);
  CHECK(dwte.FromGpu(b) == first);
}

TEST_CASE("cuda RMSNorm forward and backward match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67, 300), C = GENERATE(37, 64, 1000);
  const float eps = 1e-5f;
  std::mt19937 rng(static_cast<unsigned>(N * 13 + C));
  CAPTURE(N, C);
  Twin inp = Twin::Of(b, RandomVec(rng, N * C, -2.0f, 3.0f));
  Twin w = Twin::Of(b, RandomVec(rng, C, 0.5f, 1.5f));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  Twin rstd = Twin::Of(b, RandomVec(rng, N));
  b.cpu->RMSNormForward(out.c(), rstd.c(), inp.c(), w.c(), N, C, eps);
  b.gpu->RMSNormForward(out.g(), rstd.g(), inp.g(), w.g(), N, C, eps);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "RMSNorm out");
  ExpectTwinClose(b, rstd, kElemAtol, kElemRtol, "RMSNorm rstd");

  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dinp = Twin::Of(b, RandomVec(rng, N * C));  // accumulates
  Twin dw = Twin::Of(b, RandomVec(rng, C));        // accumulates
  // Both sides use the CPU's rstd so the backward is compared on identical inputs.
  b.gpu->CopyToDevice(rstd.g(), rstd.FromCpu(b).data(), rstd.bytes);
  b.cpu->RMSNormBackward(dinp.c(), dw.c(), dout.c(), inp.c(), w.c(), rstd.c(), N, C);
  b.gpu->RMSNormBackward(dinp.g(), dw.g(), dout.g(), inp.g(), w.g(), rstd.g(), N, C);
  ExpectTwinClose(b, dinp, kGemmAtol, kGemmRtol, "RMSNorm dinp");
  ExpectTwinClose(b, dw, 4 * kGemmAtol, kGemmRtol, "RMSNorm dweight");

  // Deterministic weight gradient: two runs from the same start give the same bits.
  const auto start = dw.FromGpu(b);
  b.gpu->RMSNormBackward(dinp.g(), dw.g(), dout.g(), inp.g(), w.g(), rstd.g(), N, C);
  const auto second = dw.FromGpu(b);
  b.gpu->CopyToDevice(dw.g(), start.data(), dw.bytes);
  b.gpu->RMSNormBackward(dinp.g(), dw.g(), dout.g(), inp.g(), w.g(), rstd.g(), N, C);
  CHECK(dw.FromGpu(b) == second);
}

TEST_CASE("cuda RoPE rotates q and k of packed q|k|v rows in place like the cpu", "[gpu][llama]") {
  Backends& b = Both();
  // {B, T, NH, NKV, hs}
  const auto shape = GENERATE(std::vector<int64_t>{1, 1, 2, 1, 2}, std::vector<int64_t>{2, 37, 4, 2, 16},
                              std::vector<int64_t>{3, 19, 6, 6, 10});
  const int64_t B = shape[0], T = shape[1], NH = shape[2], NKV = shape[3], hs = shape[4];
  const int64_t W = (NH + 2 * NKV) * hs, half = hs / 2, maxT = T + 3;  // tables may be longer
  std::mt19937 rng(static_cast<unsigned>(B + 10 * T + 100 * NH + hs));
  CAPTURE(B, T, NH, NKV, hs);
  const auto x0 = RandomVec(rng, B * T * W, -2.0f, 2.0f);
  std::vector<float> cos(maxT * half), sin(maxT * half);
  for (int64_t t = 0; t < maxT; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * std::pow(10000.0, -2.0 * double(i) / double(hs));
      cos[t * half + i] = float(std::cos(a));
      sin[t * half + i] = float(std::sin(a));
    }
  }
  Twin x = Twin::Of(b, x0), tc = Twin::Of(b, cos), ts = Twin::Of(b, sin);
  b.cpu->RopeForward(x.c(), tc.c(), ts.c(), B, T, W, NH + NKV, hs);
  b.gpu->RopeForward(x.g(), tc.g(), ts.g(), B, T, W, NH + NKV, hs);
  ExpectTwinClose(b, x, kElemAtol, kElemRtol, "RopeForward");
  // v (the last NKV heads of each row) is not touched.
  const auto got = x.FromGpu(b);
  bool v_same = true;
  for (int64_t n = 0; n < B * T; ++n) {
    for (int64_t c = (NH + NKV) * hs; c < W; ++c) v_same = v_same && got[n * W + c] == x0[n * W + c];
  }
  CHECK(v_same);

  Twin dx = Twin::Of(b, RandomVec(rng, B * T * W));
  b.cpu->RopeBackward(dx.c(), tc.c(), ts.c(), B, T, W, NH + NKV, hs);
  b.gpu->RopeBackward(dx.g(), tc.g(), ts.g(), B, T, W, NH + NKV, hs);
  ExpectTwinClose(b, dx, kElemAtol, kElemRtol, "RopeBackward");
}

TEST_CASE("cuda SwiGLU forward and backward match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67), F = GENERATE(37, 160, 1000);
  std::mt19937 rng(static_cast<unsigned>(N * 7 + F));
  CAPTURE(N, F);
  Twin gate_up = Twin::Of(b, RandomVec(rng, N * 2 * F, -6.0f, 6.0f));
  Twin out = Twin::Of(b, RandomVec(rng, N * F));
  b.cpu->SwiGLUForward(out.c(), gate_up.c(), N, F);
  b.gpu->SwiGLUForward(out.g(), gate_up.g(), N, F);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "SwiGLUForward");
  Twin dout = Twin::Of(b, RandomVec(rng, N * F));
  Twin dgu = Twin::Of(b, RandomVec(rng, N * 2 * F));  // accumulates
  b.cpu->SwiGLUBackward(dgu.c(), dout.c(), gate_up.c(), N, F);
  b.gpu->SwiGLUBackward(dgu.g(), dout.g(), gate_up.g(), N, F);
  ExpectTwinClose(b, dgu, kElemAtol, kElemRtol, "SwiGLUBackward");
}

// GQA forward and backward of `gpu` against the CPU on the same inputs.
void CheckGqa(Backends& b, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs, double atol,
              double rtol) {
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs;
  std::mt19937 rng(static_cast<unsigned>(B + 3 * T + 17 * NH + 71 * NKV + hs));
  CAPTURE(B, T, NH, NKV, hs);
  Twin qkv = Twin::Of(b, RandomVec(rng, B * T * W, -2.0f, 2.0f));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin att = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionForwardGqa(out.c(), att.c(), qkv.c(), B, T, NH, NKV, hs);
  b.gpu->AttentionForwardGqa(out.g(), att.g(), qkv.g(), B, T, NH, NKV, hs);
  ExpectTwinClose(b, out, atol, rtol, "GQA out");
  // `att` is each backend's own stash for its backward (the GPU keeps the probabilities,
  // the CPU each row's log-sum-exp): not compared, and each backward reads its own.
  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dqkv = Twin::Of(b, RandomVec(rng, B * T * W));  // accumulates
  Twin scratch = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionBackwardGqa(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, NH, NKV, hs);
  b.gpu->AttentionBackwardGqa(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, NH, NKV, hs);
  ExpectTwinClose(b, dqkv, 4 * atol, 4 * rtol, "GQA dqkv");
}

TEST_CASE("cuda grouped-query attention forward and backward match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  // {B, T, NH, NKV, hs}: one head; NKV < NH (groups of 2, 3, 4); NKV == NH.
  const auto shape = GENERATE(std::vector<int64_t>{1, 1, 1, 1, 8}, std::vector<int64_t>{2, 37, 4, 2, 16},
                              std::vector<int64_t>{1, 50, 6, 2, 8}, std::vector<int64_t>{1, 17, 4, 1, 10},
                              std::vector<int64_t>{2, 33, 4, 4, 16});
  CheckGqa(b, shape[0], shape[1], shape[2], shape[3], shape[4], kGemmAtol, kGemmRtol);
}

TEST_CASE("cuda GQA with NKV == NH equals the multi-head attention ops", "[gpu][llama]") {
  Backends& b = Both();
  const int64_t B = 2, T = 29, NH = 3, hs = 8, C = NH * hs;
  std::mt19937 rng(21);
  Twin qkv = Twin::Of(b, RandomVec(rng, B * T * 3 * C));
  Twin out1 = Twin::Of(b, std::vector<float>(B * T * C)), out2 = Twin::Of(b, std::vector<float>(B * T * C));
  Twin att1 = Twin::Of(b, std::vector<float>(B * NH * T * T)), att2 = Twin::Of(b, std::vector<float>(B * NH * T * T));
  b.gpu->AttentionForwardGqa(out1.g(), att1.g(), qkv.g(), B, T, NH, NH, hs);
  b.gpu->AttentionForward(out2.g(), att2.g(), qkv.g(), B, T, C, NH);
  CHECK(out1.FromGpu(b) == out2.FromGpu(b));
  CHECK(att1.FromGpu(b) == att2.FromGpu(b));
}

// The one-GEMM-per-group-member fallback (no batched cuBLASLt plan): on the emulator
// L2L_CUDA_EMU_LT_NO_BATCHED=1 forces it (a fresh backend, so no batched plan is
// cached); on a GPU the variable does nothing and this repeats the batched check.
TEST_CASE("cuda GQA matches the cpu through the one-GEMM-per-head fallback", "[gpu][llama]") {
  Both();
  ScopedEnv env("L2L_CUDA_EMU_LT_NO_BATCHED", "1");
  auto fresh = kernels::CreateCudaBackend(0);
  REQUIRE(fresh.ok());
  Backends fb;
  fb.cpu = kernels::CreateCpuBackend(0);
  fb.gpu = std::move(fresh).value();
  CheckGqa(fb, 2, 23, 6, 2, 8, kGemmAtol, kGemmRtol);
}

// ---- bf16 GEMM mode ----------------------------------------------------------------------

TEST_CASE("bf16 GQA matches the cpu on bf16-rounded inputs within P and dS rounding", "[gpu][llama]") {
  Backends& b = Both();
  const bool fallback = GENERATE(false, true);  // batched GEMMs / one GEMM per head (emulator)
  CAPTURE(fallback);
  std::unique_ptr<ScopedEnv> env;
  if (fallback) env = std::make_unique<ScopedEnv>("L2L_CUDA_EMU_LT_NO_BATCHED", "1");
  const std::unique_ptr<Backend> made = CudaBf16Backend();
  Backend& bf = *made;
  const auto shape = GENERATE(std::vector<int64_t>{2, 40, 4, 2, 16}, std::vector<int64_t>{1, 37, 6, 2, 8},
                              std::vector<int64_t>{1, 24, 3, 3, 16});
  const int64_t B = shape[0], T = shape[1], NH = shape[2], NKV = shape[3], hs = shape[4];
  const int64_t W = (NH + 2 * NKV) * hs, C = NH * hs, natt = B * NH * T * T;
  CAPTURE(B, T, NH, NKV, hs);
  std::mt19937 rng(static_cast<unsigned>(T * 11 + NH * 3 + NKV));
  const auto qkv = RandomVec(rng, B * T * W), dout = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * W);
  const auto qkv_r = RoundedBf16(qkv), dout_r = RoundedBf16(dout);

  // CPU oracle on the rounded inputs; the bf16 GPU gets the unrounded ones.
  Dev c_qkv = Dev::Of(*b.cpu, qkv_r), c_out = Dev::Of(*b.cpu, std::vector<float>(B * T * C));
  Dev c_att = Dev::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionForwardGqa(c_out.p(), c_att.p(), c_qkv.p(), B, T, NH, NKV, hs);
  const auto ref_out = c_out.Host(*b.cpu);
  const auto ref_att = CpuAttentionProbs(qkv_r, c_att.Host(*b.cpu), B, T, NH, NKV, hs);
  Dev g_qkv = Dev::Of(bf, qkv), g_out = Dev::Of(bf, std::vector<float>(B * T * C));
  Dev g_att = Dev::Of(bf, std::vector<float>(natt));
  bf.AttentionForwardGqa(g_out.p(), g_att.p(), g_qkv.p(), B, T, NH, NKV, hs);
  const auto got_out = g_out.Host(bf), got_att = g_att.Host(bf);

  // The mode is on: the CPU on the UNrounded inputs gives clearly different probabilities.
  Dev u_qkv = Dev::Of(*b.cpu, qkv), u_out = Dev::Of(*b.cpu, std::vector<float>(B * T * C));
  Dev u_att = Dev::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionForwardGqa(u_out.p(), u_att.p(), u_qkv.p(), B, T, NH, NKV, hs);
  const auto unrounded = CpuAttentionProbs(qkv, u_att.Host(*b.cpu), B, T, NH, NKV, hs);
  double vs_unrounded = 0.0;
  for (size_t i = 0; i < unrounded.size(); ++i) {
    vs_unrounded = std::max(vs_unrounded, std::abs(double(got_att[i]) - unrounded[i]));
  }
  INFO("max |P_bf16 - P_cpu(unrounded qkv)| = " << vs_unrounded);
  CHECK(vs_unrounded > 1e-4);
  ExpectClose(got_att, ref_att, 1e-5, 1e-4, "att (probabilities)");

  // The GPU's backward reads the CPU's probabilities; the CPU's, its own stash.
  Dev c_dout = Dev::Of(*b.cpu, dout_r), c_dqkv = Dev::Of(*b.cpu, dqkv0);
  Dev c_scr = Dev::Of(*b.cpu, std::vector<float>(natt));
  b.cpu->AttentionBackwardGqa(c_dqkv.p(), c_scr.p(), c_dout.p(), c_qkv.p(), c_att.p(), B, T, NH, NKV, hs);
  Dev g_dout = Dev::Of(bf, dout), g_dqkv = Dev::Of(bf, dqkv0), g_att_ref = Dev::Of(bf, ref_att);
  Dev g_scr = Dev::Of(bf, std::vector<float>(natt));
  bf.AttentionBackwardGqa(g_dqkv.p(), g_scr.p(), g_dout.p(), g_qkv.p(), g_att_ref.p(), B, T, NH, NKV, hs);

  const AttentionBounds bounds = Bf16AttentionBounds(qkv_r, dout_r, ref_att, B, T, NH, NKV, hs, /*causal=*/true);
  ExpectWithin(got_out, ref_out, bounds.out, 1e-4, 1e-4, "out");
  ExpectWithin(g_dqkv.Host(bf), c_dqkv.Host(*b.cpu), bounds.dqkv, 4e-4, 4e-4, "dqkv");
}

// ---- layers and training -----------------------------------------------------------------

// A small Llama: GQA (6 query heads on n_kv key/value heads of 8), q|k|v biases (Qwen2),
// llama3 rope scaling, untied head.
ModelSpec SmallLlama(int64_t n_kv) {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 96;
  s.seq_len = 32;
  s.d_model = 48;
  s.n_layer = 2;
  s.n_head = 6;
  s.n_kv_heads = n_kv;
  s.d_ff = 80;
  s.tied_embeddings = false;
  s.qkv_bias = true;
  s.rope_theta = 5e5;
  s.rms_norm_eps = 1e-5;
  s.rope_scaling = {RopeScalingType::kLlama3, 8.0, 1.0, 4.0, 16};
  INFO(s.Validate().ToString());
  REQUIRE(s.Validate().ok());
  return s;
}

TEST_CASE("cuda Llama block forward and recomputing backward match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  const int64_t n_kv = GENERATE(2, 6);
  CAPTURE(n_kv);
  const ModelSpec spec = SmallLlama(n_kv);
  const auto layouts = BuildLayout(spec);
  const LayerLayout& block = layouts[1];
  std::mt19937 rng(static_cast<unsigned>(11 + n_kv));
  auto p = InitParams(spec, block);
  // RMSNorm weights start at 1 and q|k|v biases at 0; perturb them so both are exercised.
  for (const char* name : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.bias"}) {
    const auto* t = block.Find(name);
    REQUIRE(t != nullptr);
    for (size_t i = 0; i < t->numel; ++i) p[t->offset + i] += 0.1f * std::uniform_real_distribution<float>(-1, 1)(rng);
  }
  ExpectBlockMatches(b, spec, block, p, 2, 32, rng);
}

TEST_CASE("cuda Llama embedding and head losses and gradients match the cpu", "[gpu][llama]") {
  Backends& b = Both();
  std::mt19937 rng(12);
  ExpectEmbeddingAndHeadMatch(b, SmallLlama(2), 2, 32, rng, 0.0, 0.0, nullptr);  // a gather: exact
}

// The llama-tiny preset (configs/models/llama-tiny.yaml: GQA 4 on 2, untied head), one
// micro-batch of 2 x 64 tokens (keeps the emulator run short), AdamW lr 3e-3. On the CPU
// the loss goes 5.540 -> 4.701 over the 8 steps (noisy with one micro-batch; 1e-2
// diverges).
JobConfig LlamaTinyJob() {
  // The source tree, or an unpacked GPU bundle's src/ (gpu_check.sh sets L2L_SOURCE_DIR).
  const char* env_src = std::getenv("L2L_SOURCE_DIR");
  const std::string src = env_src != nullptr && *env_src != '\0' ? env_src : L2L_SOURCE_DIR;
  auto loaded = LoadJobConfig(src + "/configs/models/llama-tiny.yaml");
  INFO(loaded.status().ToString());
  REQUIRE(loaded.ok());
  JobConfig cfg = SmallJob();
  cfg.model = loaded->model;
  REQUIRE(cfg.model.family == ModelFamily::kLlama);
  REQUIRE(cfg.model.kv_heads() < cfg.model.n_head);
  cfg.train.micro_batch_size = 2;
  cfg.train.micro_batches = 1;
  cfg.train.seq_len = 64;
  cfg.optim.lr = 3e-3f;
  REQUIRE(cfg.Validate().ok());
  return cfg;
}

constexpr int kTrainSteps = 8;

TEST_CASE("reference trainer on cuda tracks the cpu losses on llama-tiny", "[gpu][llama]") {
  Both();
  const JobConfig cfg = LlamaTinyJob();
  const auto cpu = TrainLosses(cfg, "cpu", kTrainSteps);
  const auto gpu = TrainLosses(cfg, "cuda:0", kTrainSteps);
  ExpectLossesTrack(gpu, cpu, 2e-3);
}

TEST_CASE("relay on cuda tracks the cpu relay on llama-tiny", "[gpu][llama]") {
  Backends& b = Both();
  const JobConfig job = LlamaTinyJob();
  const auto cpu = RelayLosses(job, b.cpu.get(), kTrainSteps);
  const auto gpu = RelayLosses(job, b.gpu.get(), kTrainSteps);
  ExpectLossesTrack(gpu, cpu, 2e-3);
}

TEST_CASE("relay on cuda with bf16 GEMMs reuses activation copies on llama-tiny and trains bit for bit as without",
          "[gpu][llama]") {
  // As the GPT-2 case in cuda_worker_test.cc, for the Llama block (kernels/cuda/
  // bf16_operands.h): reuse on and off give the same losses bit for bit. Per block and
  // micro-batch of N tokens, at least these activation elements are read from a copy
  // instead of cast: forward and recompute, ln1 (N C), the flash attention's output
  // (o_proj's input, N A), ln2 (N C), the SwiGLU output (N F); backward, the down
  // projection's dy (N C, cast by its dW GEMM, read by its dx GEMM), the SwiGLU
  // backward's dgate|dup (2 x 2 N F), ln2's backward (o_proj's dy, 2 x N C) and RoPE's
  // backward (the qkv layer's dy, 2 x N W: q and k rotated, v as it is, all written by
  // the rotation); and the weight-gradient GEMMs' activations, the recompute's copies held
  // for the call (Backend::HoldBf16Copy): ln1 and ln2 (2 N C), the attention output (N A).
  // Head size 64 (flash attention: the GEMM attention's own
  // products would add reuse of their own to the count).
  JobConfig job = LlamaTinyJob();
  job.model.d_model = 128;
  job.model.n_head = 2;
  job.model.n_kv_heads = 1;
  job.publish_dtype = DType::kBF16;
  REQUIRE(job.Validate().ok());
  constexpr int kSteps = 3;
  const ReuseCounts c = RunWithReuseOnAndOff(kSteps, [&](Backend* be) { return RelayLosses(job, be, kSteps); });
  const Backend::Bf16OperandStats &d_on = c.on, &d_off = c.off;
  const ModelSpec& m = job.model;
  const int64_t N = job.train.micro_batch_size * job.seq_len(), C = m.d_model, F = m.d_ff;
  REQUIRE(m.head_dim() == 64);
  const int64_t W = (m.n_head + 2 * m.kv_heads()) * m.head_dim(), A = m.n_head * m.head_dim();
  const int64_t per_block =
      2 * (2 * N * C + N * A + N * F) + N * C + 4 * N * F + 2 * N * C + 2 * N * W + (2 * N * C + N * A);
  INFO("operand elements cast: reuse off " << d_off.cast_elements << ", on " << d_on.cast_elements
                                           << "; the bound " << job.train.micro_batches * kSteps * m.n_layer * per_block);
  CHECK(d_off.cast_elements - d_on.cast_elements >= job.train.micro_batches * kSteps * m.n_layer * per_block);
}

}  // namespace
}  // namespace l2l::gpu_test

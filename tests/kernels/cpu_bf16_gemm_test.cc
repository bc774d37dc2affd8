// The CPU backend's bf16 GEMM mode (CpuGemmPrecision::kBf16, L2L_CPU_GEMM=bf16): matrix
// products cast their fp32 operands to bf16 (round to nearest even) and multiply with
// fp32 accumulation into fp32 outputs; on a CPU without AVX512_BF16 the mode is refused.
//
// Oracles, independent of the code under test:
//  * The cast: FloatToBf16Span on every ISA path this CPU has must give the bits of
//    common/dtype.h's scalar FloatToBf16, and named bit patterns (ties to even, NaN with
//    a low payload, the largest finite value rounding to Inf, denormals not flushed).
//  * Gemm and DnnlMatmul (batched, transposed and arbitrarily strided operands): the
//    product of the inputs rounded to bf16 by the test's own RNE (RoundBf16,
//    tests/testing/bf16_reference.h), in double. A product of two bf16 values is exact in
//    fp32, so only fp32 accumulation is left: |got - ref| <= 1e-5 * |alpha| sum_k |a||b|
//    (+ 1e-6 |beta c|). Against the fp32 backend the same product must differ by bf16
//    rounding: max |bf16 - fp32| / (|alpha| sum|a||b|) above 1e-4 (the rms for uniform
//    data is ~3e-3/sqrt(K)) and at most 2^-7 + 1e-5 (each operand moves by at most 2^-8
//    relative).
//  * Attention: the fp32 CPU backend on host-rounded qkv (and dout), plus per-element
//    bounds for the rounding of the probabilities P and the softmax gradient dS
//    (Bf16AttentionBounds), as the CUDA bf16 test does.
// Where the CPU lacks AVX512_BF16 each numeric case checks the refusal, then runs the same
// numerics against the same oracles on oneDNN's AVX-512 emulation of bf16
// (L2L_CPU_BF16_FALLBACK=1), or, where oneDNN cannot (no AVX-512), is counted as skipped
// (tests/testing/cpu_bf16_mode.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_matmul.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/testing/bf16_reference.h"
#include "tests/testing/cpu_bf16_mode.h"
#include "tests/testing/scoped_env.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT
using l2l::testing::AttentionBounds;
using l2l::testing::Bf16AttentionBounds;
using l2l::testing::CpuAttentionProbs;
using l2l::testing::ExpectWithin;
using l2l::testing::CheckBf16Gemm;
using l2l::testing::CpuBf16Mode;
using l2l::testing::RoundedBf16;
using l2l::testing::ScopedEnv;

std::unique_ptr<Backend> Bf16Cpu(int threads) {
  auto be = CreateCpuBackend(CpuBackendOptions{.num_threads = threads, .gemm = CpuGemmPrecision::kBf16});
  INFO(be.status().ToString());
  REQUIRE(be.ok());
  return std::move(be).value();
}

TEST_CASE("FloatToBf16Span rounds to nearest even on every ISA path, as FloatToBf16",
          "[kernels][cpu][bf16]") {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u,              // +-0
      0x7f800000u, 0xff800000u,              // +-Inf
      0x7f800001u, 0xffc00000u, 0x7fbfffffu,  // NaNs (a low payload must stay NaN)
      0x3f808000u,                           // 1 + 2^-8: tie, kept even (1.0)
      0x3f818000u,                           // tie above an odd bf16: rounds up
      0x3f808001u,                           // just above a tie: up
      0x7f7fffffu,                           // largest finite: rounds to Inf
      0x00000001u, 0x00008000u, 0x00018000u,  // denormals: rounded, not flushed
  };
  std::mt19937 rng(3);
  for (int i = 0; i < 4000; ++i) bits.push_back(rng());  // every exponent, sign, mantissa
  std::vector<float> in(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) in[i] = std::bit_cast<float>(bits[i]);
  std::vector<uint16_t> want(in.size());
  for (size_t i = 0; i < in.size(); ++i) want[i] = FloatToBf16(in[i]);
  // Named cases, by hand.
  CHECK(want[7] == 0x3f80);
  CHECK(want[8] == 0x3f82);
  CHECK(want[9] == 0x3f81);
  CHECK(want[10] == 0x7f80);
  CHECK(want[12] == 0x0000);  // 2^-134: a tie between 0 and the smallest bf16 denormal, kept even
  CHECK(want[13] == 0x0002);  // 0x00018000: tie above an odd value, rounds up
  const MathIsa saved = ActiveMathIsa();
  for (MathIsa isa : {MathIsa::kBase, MathIsa::kAvx2, MathIsa::kAvx512}) {
    if (!SetMathIsa(isa)) continue;
    INFO("isa " << MathIsaName(isa));
    std::vector<uint16_t> got(in.size() + 1, 0xabcd);
    FloatToBf16Span(got.data(), in.data(), int64_t(in.size()));
    CHECK(got.back() == 0xabcd);  // nothing past n written
    size_t bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const bool nan_ok = std::isnan(in[i]) && ((got[i] & 0x7f80) == 0x7f80) && (got[i] & 0x7f);
      if (got[i] != want[i] && !nan_ok) ++bad;
      if (std::isnan(in[i])) CHECK(nan_ok);
    }
    CHECK(bad == 0);
  }
  SetMathIsa(saved);
}

TEST_CASE("bf16 Gemm equals the product of host-rounded inputs and differs from fp32",
          "[kernels][cpu][bf16]") {
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  // The second and third are split into row / column blocks over the two threads.
  const auto shape = GENERATE(std::vector<int64_t>{37, 53, 71}, std::vector<int64_t>{130, 96, 300},
                              std::vector<int64_t>{64, 400, 96});
  const int threads = GENERATE(1, 2);
  const int64_t M = shape[0], N = shape[1], K = shape[2];
  const int64_t pad = 3;  // leading dimensions larger than the rows
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  const float alpha = 0.75f, beta = GENERATE(0.0f, 0.5f);
  CAPTURE(ta, tb, M, N, K, beta, threads);
  std::mt19937 rng(static_cast<unsigned>(M * 7 + N * 3 + K + ta * 2 + tb));
  const auto a = RandomVec(rng, (ta ? K : M) * lda), bm = RandomVec(rng, (tb ? N : K) * ldb);
  const auto c0 = RandomVec(rng, M * ldc);
  const auto ar = RoundedBf16(a), br = RoundedBf16(bm);

  auto bf = Bf16Cpu(threads);
  CHECK(bf->name().find("gemm bf16") != std::string::npos);
  auto A = Upload(*bf, a), B = Upload(*bf, bm), C = Upload(*bf, c0);
  bf->Gemm(ta, tb, M, N, K, alpha, A.f32(), lda, B.f32(), ldb, beta, C.f32(), ldc);
  const auto got = Download(*bf, C, M * ldc);
  CHECK(Download(*bf, A, a.size()) == a);  // operands untouched
  auto fp = CreateCpuBackend(threads);
  auto A32 = Upload(*fp, a), B32 = Upload(*fp, bm), C32 = Upload(*fp, c0);
  fp->Gemm(ta, tb, M, N, K, alpha, A32.f32(), lda, B32.f32(), ldb, beta, C32.f32(), ldc);
  const auto fp32 = Download(*fp, C32, M * ldc);

  CheckBf16Gemm(got, fp32, ar, br, c0, ta, tb, M, N, K, alpha, beta, lda, ldb, ldc);
}

TEST_CASE("bf16 LinearForward keeps its fp32 epilogues (bias, GELU, residual)", "[kernels][cpu][bf16]") {
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  const int64_t N = 200, IC = 96, OC = 160;
  std::mt19937 rng(11);
  const auto x = RandomVec(rng, N * IC), w = RandomVec(rng, OC * IC), bias = RandomVec(rng, OC);
  const auto res = RandomVec(rng, N * OC);
  auto bf = Bf16Cpu(2);
  auto fp = CreateCpuBackend(2);
  // The bf16 backend on x, w must equal the fp32 backend on the rounded x, w up to fp32
  // accumulation order (both add bias, GELU, residual in fp32 the same way).
  const auto xr = RoundedBf16(x), wr = RoundedBf16(w);
  for (int mode = 0; mode < 2; ++mode) {
    CAPTURE(mode);
    auto X = Upload(*bf, x), W = Upload(*bf, w), Bi = Upload(*bf, bias), R = Upload(*bf, res);
    auto Y = Upload(*bf, std::vector<float>(N * OC)), Act = Upload(*bf, std::vector<float>(N * OC));
    auto Xr = Upload(*fp, xr), Wr = Upload(*fp, wr), Bf = Upload(*fp, bias), Rf = Upload(*fp, res);
    auto Yf = Upload(*fp, std::vector<float>(N * OC)), Actf = Upload(*fp, std::vector<float>(N * OC));
    if (mode == 0) {
      bf->LinearForward(Y.f32(), X.f32(), W.f32(), true, Bi.f32(), N, IC, OC, Act.f32(), nullptr);
      fp->LinearForward(Yf.f32(), Xr.f32(), Wr.f32(), true, Bf.f32(), N, IC, OC, Actf.f32(), nullptr);
      ExpectClose(Download(*bf, Act, N * OC), Download(*fp, Actf, N * OC), 1e-5, 1e-5, "gelu(xW^T + b)");
    } else {
      bf->LinearForward(Y.f32(), X.f32(), W.f32(), true, Bi.f32(), N, IC, OC, nullptr, R.f32());
      fp->LinearForward(Yf.f32(), Xr.f32(), Wr.f32(), true, Bf.f32(), N, IC, OC, nullptr, Rf.f32());
    }
    ExpectClose(Download(*bf, Y, N * OC), Download(*fp, Yf, N * OC), 1e-5, 1e-5, "y");
  }
}

TEST_CASE("bf16 Gemm reads a noted bf16 copy of a dense weight instead of casting it, with the same bits",
          "[kernels][cpu][bf16]") {
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  // A "layer" published as bf16: its bits, and the fp32 slot that is their widening.
  std::mt19937 rng(23);
  const int64_t M = 24, K = 40, N = 56, layer = 8 + K * N + 40;
  const auto [bits, slot] = l2l::testing::RandomBf16Layer(rng, layer);
  const auto x = RandomVec(rng, M * K);
  auto bf = Bf16Cpu(2);
  REQUIRE(bf->TakesBf16Copies());
  auto X = Upload(*bf, x), W = Upload(*bf, slot), C = Upload(*bf, std::vector<float>(M * N));
  auto product = [&](int64_t offset, bool trans_w) {
    bf->Gemm(false, trans_w, M, N, K, 1.0f, X.f32(), K, W.f32() + offset, trans_w ? K : N, 0.0f, C.f32(), N);
    return Download(*bf, C, M * N);
  };
  for (const bool trans_w : {false, true}) {
    for (const int64_t offset : {int64_t{3}, layer - K * N}) {
      CAPTURE(trans_w, offset);
      const auto cast = product(offset, trans_w);
      const auto before = bf->bf16_operand_stats();
      bf->NoteBf16Copy(W.f32(), bits.data(), layer);
      const auto noted = product(offset, trans_w);
      const auto after = bf->bf16_operand_stats();
      CHECK(noted == cast);  // the same bf16 values multiplied: the same bits
      // A dense (not transposed) weight is read in place; a transposed one is packed.
      CHECK(after.reused_elements - before.reused_elements == (trans_w ? 0 : K * N));
      CHECK(after.cast_elements - before.cast_elements == M * K + (trans_w ? K * N : 0));
      bf->ForgetBf16Copy(W.f32());
      CHECK(product(offset, trans_w) == cast);
      CHECK(bf->bf16_operand_stats().reused_elements == after.reused_elements);  // forgotten: cast again
    }
  }
  // LinearForward (the layers' path) reads it too; an extent past the copy is cast.
  const auto before = bf->bf16_operand_stats();
  bf->NoteBf16Copy(W.f32(), bits.data(), layer);
  bf->LinearForward(C.f32(), X.f32(), W.f32() + 8, false, nullptr, M, K, N, nullptr, nullptr);
  CHECK(bf->bf16_operand_stats().reused_elements == before.reused_elements + K * N);
  bf->NoteBf16Copy(W.f32(), bits.data(), K * N - 1);  // replaces the note
  (void)product(0, false);
  CHECK(bf->bf16_operand_stats().reused_elements == before.reused_elements + K * N);
  bf->ForgetBf16Copy(W.f32());
  // The fp32 backend ignores a note (its product would change if it read the bits).
  auto fp = CreateCpuBackend(2);
  CHECK_FALSE(fp->TakesBf16Copies());
  auto Xf = Upload(*fp, x), Wf = Upload(*fp, slot), Cf = Upload(*fp, std::vector<float>(M * N));
  fp->Gemm(false, false, M, N, K, 1.0f, Xf.f32(), K, Wf.f32() + 8, N, 0.0f, Cf.f32(), N);
  const auto plain = Download(*fp, Cf, M * N);
  fp->NoteBf16Copy(Wf.f32(), bits.data(), layer);
  fp->Gemm(false, false, M, N, K, 1.0f, Xf.f32(), K, Wf.f32() + 8, N, 0.0f, Cf.f32(), N);
  CHECK(Download(*fp, Cf, M * N) == plain);
  CHECK(plain != product(8, false));
}

TEST_CASE("bf16 DnnlMatmul: batched, transposed and strided operands, one primitive per shape",
          "[kernels][cpu][bf16]") {
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  const int64_t B0 = 2, B1 = 3, M = 70, N = 45, K = 90;
  // A column-major per matrix (a transposed view), B with neither stride 1 (every
  // other element of a wider buffer), C with padded rows.
  const MatStrides sa{B1 * M * K + 5, M * K, 1, M};
  const MatStrides sb{B1 * (2 * K * N) + 7, 2 * K * N, 2 * N, 2};
  const MatStrides sc{B1 * M * (N + 2), M * (N + 2), N + 2, 1};
  std::mt19937 rng(21);
  const auto a = RandomVec(rng, B0 * sa.b0), b = RandomVec(rng, B0 * sb.b0);
  const auto c0 = RandomVec(rng, B0 * sc.b0);
  const auto ar = RoundedBf16(a), br = RoundedBf16(b);
  const float alpha = 1.25f, beta = 1.0f;
  tbb::task_arena arena(2);
  DnnlMatmul mm(2, &arena, /*bf16=*/true);
  CHECK(mm.bf16());
  std::vector<float> c = c0;
  mm.Run(B0, B1, M, N, K, alpha, a.data(), sa, b.data(), sb, beta, c.data(), sc);
  const size_t prims = mm.cached_primitives();
  std::vector<float> c2 = c0;
  mm.Run(B0, B1, M, N, K, alpha, a.data(), sa, b.data(), sb, beta, c2.data(), sc);
  CHECK(mm.cached_primitives() == prims);  // the second call created nothing
  CHECK(c2 == c);                          // and gave the same bits
  size_t bad = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < B0; ++i)
    for (int64_t j = 0; j < B1; ++j)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double dot = 0.0, mag = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = double(ar[i * sa.b0 + j * sa.b1 + m * sa.row + k * sa.col]) *
                             br[i * sb.b0 + j * sb.b1 + k * sb.row + n * sb.col];
            dot += p;
            mag += std::abs(p);
          }
          const int64_t ci = i * sc.b0 + j * sc.b1 + m * sc.row + n * sc.col;
          const double ref = alpha * dot + beta * c0[ci];
          const double err = std::abs(c[ci] - ref);
          if (!(err <= 1e-5 * alpha * mag + 1e-6 * std::abs(c0[ci]))) ++bad;
          worst = std::max(worst, err / (alpha * mag));
        }
  INFO("worst |got - oracle| / (alpha sum|a||b|) = " << worst);
  CHECK(bad == 0);
  // A plain product of a model's shape runs on oneDNN's AMX or AVX512_BF16 kernels, not
  // its reference code (on the emulation path: not its reference code either).
  const MatStrides pa{0, 0, 384, 1}, pb{0, 0, 1536, 1}, pc{0, 0, 1536, 1};
  const std::string impl = mm.ImplName(1, 1, 2048, 1536, 384, 1.0f, pa, pb, 0.0f, pc);
  INFO("oneDNN implementation: " << impl);
  CHECK(impl.find("ref") == std::string::npos);
  if (!bf16_mode.native()) return;
  CHECK((impl.find("amx") != std::string::npos || impl.find("bf16") != std::string::npos ||
         impl.find("gemm:jit") != std::string::npos));
}

TEST_CASE("bf16 attention matches the fp32 cpu on bf16-rounded inputs within P and dS rounding",
          "[kernels][cpu][bf16][attention]") {
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  // B, T, NH, NKV, hs: several query strips (a partial last one), and grouped-query.
  const auto a = GENERATE(std::vector<int64_t>{2, 130, 4, 4, 16}, std::vector<int64_t>{1, 100, 6, 2, 8});
  const int64_t B = a[0], T = a[1], NH = a[2], NKV = a[3], hs = a[4];
  const int64_t C = NH * hs, W = (NH + 2 * NKV) * hs;
  CAPTURE(B, T, NH, NKV, hs);
  std::mt19937 rng(static_cast<unsigned>(T * 11 + NH));
  const auto qkv = RandomVec(rng, B * T * W, -1.5f, 1.5f), dout = RandomVec(rng, B * T * C);
  const auto dqkv0 = RandomVec(rng, B * T * W);  // the backward accumulates into it
  const auto qkv_r = RoundedBf16(qkv), dout_r = RoundedBf16(dout);
  const int64_t natt = B * NH * T * T;
  auto run = [&](Backend& be, const std::vector<float>& q, const std::vector<float>& d,
                 std::vector<float>* out, std::vector<float>* lse, std::vector<float>* dq) {
    auto Q = Upload(be, q), D = Upload(be, d), G = Upload(be, dqkv0);
    auto O = Upload(be, std::vector<float>(B * T * C)), A = Upload(be, std::vector<float>(natt));
    auto S = Upload(be, std::vector<float>(natt));
    be.AttentionForwardGqa(O.f32(), A.f32(), Q.f32(), B, T, NH, NKV, hs);
    be.AttentionBackwardGqa(G.f32(), S.f32(), D.f32(), Q.f32(), A.f32(), B, T, NH, NKV, hs);
    *out = Download(be, O, B * T * C);
    *lse = Download(be, A, B * NH * T);
    *dq = Download(be, G, B * T * W);
  };
  auto fp = CreateCpuBackend(2);
  auto bf = Bf16Cpu(2);
  std::vector<float> ref_out, ref_lse, ref_dqkv, got_out, got_lse, got_dqkv, u_out, u_lse, u_dqkv;
  run(*fp, qkv_r, dout_r, &ref_out, &ref_lse, &ref_dqkv);  // the oracle: fp32 on rounded inputs
  run(*bf, qkv, dout, &got_out, &got_lse, &got_dqkv);      // bf16 mode on the raw inputs
  run(*fp, qkv, dout, &u_out, &u_lse, &u_dqkv);            // fp32 on the raw inputs
  // The scores come from exactly rounded q and k on both sides: fp32 tolerance; and they
  // are clearly off the unrounded ones (q and k really were rounded).
  ExpectClose(got_lse, ref_lse, 1e-5, 1e-5, "log-sum-exp");
  double vs_unrounded = 0.0;
  for (size_t i = 0; i < got_lse.size(); ++i)
    vs_unrounded = std::max(vs_unrounded, std::abs(double(got_lse[i]) - u_lse[i]));
  INFO("max |lse_bf16 - lse_fp32(unrounded)| = " << vs_unrounded);
  CHECK(vs_unrounded > 1e-4);
  const auto P = CpuAttentionProbs(qkv_r, ref_lse, B, T, NH, NKV, hs);
  const AttentionBounds bounds = Bf16AttentionBounds(qkv_r, dout_r, P, B, T, NH, NKV, hs, /*causal=*/true);
  ExpectWithin(got_out, ref_out, bounds.out, 1e-5, 1e-5, "out");
  ExpectWithin(got_dqkv, ref_dqkv, bounds.dqkv, 4e-5, 4e-5, "dqkv");
}

TEST_CASE("L2L_CPU_GEMM selects the mode for backends made by name, bad values and a missing ISA are refused",
          "[kernels][cpu][bf16]") {
  {
    ScopedEnv env("L2L_CPU_GEMM", "fp16");
    auto be = CreateBackend("cpu");
    REQUIRE(!be.ok());
    CHECK(be.status().code() == StatusCode::kInvalidArgument);
    CHECK(be.status().message().find("L2L_CPU_GEMM=fp16") != std::string::npos);
  }
  {
    // L2L_CPU_ISA=avx2 caps the ISA below AVX512_BF16: the refusal path on any CPU.
    ScopedEnv isa("L2L_CPU_ISA", "avx2");
    ScopedEnv env("L2L_CPU_GEMM", "bf16");
    CHECK_FALSE(CpuHasBf16Gemm());
    auto be = CreateBackend("cpu");
    REQUIRE(!be.ok());
    CHECK(be.status().code() == StatusCode::kFailedPrecondition);
    INFO(be.status().message());
    CHECK(be.status().message().find("AVX512_BF16") != std::string::npos);
    CHECK(be.status().message().find("L2L_CPU_ISA=avx2") != std::string::npos);
    // Options alone are refused the same way.
    ScopedEnv no_env("L2L_CPU_GEMM", "fp32");
    auto fp = CreateCpuBackend(CpuBackendOptions{.num_threads = 1, .gemm = CpuGemmPrecision::kFp32});
    REQUIRE(fp.ok());  // fp32 from the environment wins over the options' bf16 too:
    auto over = CreateCpuBackend(CpuBackendOptions{.num_threads = 1, .gemm = CpuGemmPrecision::kBf16});
    REQUIRE(over.ok());
    CHECK((*over)->name().find("gemm bf16") == std::string::npos);
  }
  {
    ScopedEnv env("L2L_CPU_GEMM", "fp32");
    auto be = CreateBackend("cpu");
    REQUIRE(be.ok());
    CHECK((*be)->name().find("gemm bf16") == std::string::npos);
  }
  const CpuBf16Mode bf16_mode;
  if (!bf16_mode.runs()) return;
  ScopedEnv env("L2L_CPU_GEMM", "bf16");
  auto be = CreateBackend("cpu");
  REQUIRE(be.ok());
  CHECK((*be)->name().find("gemm bf16") != std::string::npos);
  // The int overload is the fp32 reference whatever the environment says.
  CHECK(CreateCpuBackend(1)->name().find("gemm bf16") == std::string::npos);
}

}  // namespace
}  // namespace l2l::kernels

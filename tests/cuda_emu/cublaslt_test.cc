// Tests of the emulated cuBLASLt arithmetic (cuda_emu/cublaslt.cc,
// cublaslt_gemm.cc). Every product is checked against the double-precision reference of
// cublaslt_test_util.h (never against the emulator's own output): the four transpose
// combinations with padded leading dimensions, interleaved strided batches laid out as
// kernels/cuda/attention.cc lays them out, beta with D == C, bf16 inputs with fp32 and
// bf16 outputs, the bias/ReLU/GELU epilogues and TF32 rounding. A hidden benchmark
// ([.][benchmark]) measures the GEMM speed. Validation errors: cublaslt_errors_test.cc.
// Thread-safety: each test owns its handles, buffers and stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/cuda_emu/cublaslt_test_util.h"

namespace cublaslt_test {

TEST_CASE("cublasLt: all four transpose combinations, padded leading dimensions",
          "[cuda_emu][cublaslt]") {
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      Spec s;
      s.ta = ta;
      s.tb = tb;
      s.m = 37;
      s.n = 29;
      s.k = 23;
      s.lda = s.a_rows() + 3;
      s.ldb = s.b_rows() + 5;
      s.ldc = s.m + 2;
      s.alpha = 1.5f;
      INFO("transa=" << ta << " transb=" << tb);
      RunAndCheck(s, 100 + ta * 2 + tb);
    }
  }
}

TEST_CASE("cublasLt: larger fp32 product crosses tile edges", "[cuda_emu][cublaslt]") {
  Spec s;
  s.ta = CUBLAS_OP_T;
  s.m = 131;
  s.n = 67;
  s.k = 301;
  RunAndCheck(s, 7);
}

TEST_CASE("cublasLt: beta accumulates into C, D may alias C, beta 0 never reads C",
          "[cuda_emu][cublaslt]") {
  Spec s;
  s.m = 19;
  s.n = 11;
  s.k = 13;
  s.ldc = 21;
  s.alpha = 2.0f;
  s.beta = 0.5f;
  RunAndCheck(s, 11, /*in_place=*/true);
  RunAndCheck(s, 12, /*in_place=*/false);

  // beta == 0: C full of NaN must not reach D.
  s.beta = 0.0f;
  s.ldc = 0;
  Operands o = MakeOperands(s, 13);
  Expected e = Reference(s, o);
  DevMem A(o.a.size() * 4), B(o.b.size() * 4), CD(o.c.size() * 4);
  Put(A.p, o.a);
  Put(B.p, o.b);
  Put(CD.p, std::vector<float>(o.c.size(), kNaN));
  Plan plan(s);
  Plan::Heur hr = plan.Heuristic();
  REQUIRE(hr.count == 1);
  Stream st;
  REQUIRE(plan.Matmul(s, A.p, B.p, CD.p, CD.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
  st.Sync();
  std::vector<float> got = Get<float>(CD.p, o.c.size());
  for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::fabs(got[i] - e.want[i]) <= e.tol[i]);
}

// The batched attention products of kernels/cuda/attention.cc, in cuBLASLt's column-major
// terms: qkv is row-major (T, 3C) with head h of Q, K, V at columns h*hs, C + h*hs,
// 2C + h*hs, so the NH matrices of each operand interleave (stride hs, ld 3C).
TEST_CASE("cublasLt: interleaved strided batches as attention uses them", "[cuda_emu][cublaslt]") {
  const int64_t T = 9, NH = 3, hs = 4, C = NH * hs, C3 = 3 * C, TT = T * T;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> qkv(T * C3), p(NH * TT);
  for (auto& x : qkv) x = uni(rng);
  for (auto& x : p) x = uni(rng);
  DevMem dqkv(qkv.size() * 4), datt(p.size() * 4), dp(p.size() * 4), dout(T * C * 4);
  Put(dqkv.p, qkv);
  Put(dp.p, p);
  const float* q = dqkv.as<float>();
  Stream st;

  SECTION("S_h (T,T) = scale * Q_h K_h^T: interleaved inputs") {
    // D(i, t) = sum_l K(i, l) Q(t, l): A = K part stored (hs x T, ld 3C) transposed,
    // B = Q part stored (hs x T, ld 3C), D (T x T) per head, stride T*T.
    const Spec s{.ta = CUBLAS_OP_T, .m = T, .n = T, .k = hs, .lda = C3, .ldb = C3, .ldc = T,
                 .batch = static_cast<int32_t>(NH), .sa = hs, .sb = hs, .sc = TT, .alpha = 0.5f};
    Plan plan(s);
    const float* k = q + C;
    Plan::Heur hr = plan.Heuristic(AlignOf(k, hs * 4, NH), AlignOf(q, hs * 4, NH),
                                   AlignOf(datt.p, TT * 4, NH), AlignOf(datt.p, TT * 4, NH));
    REQUIRE(hr.count == 1);
    REQUIRE(plan.Matmul(s, k, q, datt.p, datt.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
    st.Sync();
    std::vector<float> got = Get<float>(datt.p, NH * TT);
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < T; ++i) {
          double want = 0.0;
          for (int64_t l = 0; l < hs; ++l) {
            want += double{qkv[t * C3 + h * hs + l]} * qkv[i * C3 + C + h * hs + l];
          }
          want *= 0.5;
          REQUIRE(std::fabs(got[h * TT + t * T + i] - want) <= 1e-5);
        }
      }
    }
  }

  SECTION("out_h (T,hs) = P_h V_h: interleaved output, heads side by side") {
    // D(d, t) = sum_i V(i, d) P(t, i): A = V part stored (hs x T, ld 3C), B = P_h^T stored
    // (T x T, ld T, stride T*T), D = out_h^T stored (hs x T, ld C, stride hs).
    const Spec s{.m = hs, .n = T, .k = T, .lda = C3, .ldb = T, .ldc = C,
                 .batch = static_cast<int32_t>(NH), .sa = hs, .sb = TT, .sc = hs};
    Plan plan(s);
    const float* v = q + 2 * C;
    Plan::Heur hr = plan.Heuristic(AlignOf(v, hs * 4, NH), AlignOf(dp.p, TT * 4, NH),
                                   AlignOf(dout.p, hs * 4, NH), AlignOf(dout.p, hs * 4, NH));
    REQUIRE(hr.count == 1);
    REQUIRE(plan.Matmul(s, v, dp.p, dout.p, dout.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
    st.Sync();
    std::vector<float> got = Get<float>(dout.p, T * C);
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t d = 0; d < hs; ++d) {
          double want = 0.0;
          for (int64_t i = 0; i < T; ++i)
            want += double{p[h * TT + t * T + i]} * qkv[i * C3 + 2 * C + h * hs + d];
          REQUIRE(std::fabs(got[t * C + h * hs + d] - want) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("cublasLt: plain strided batch with beta", "[cuda_emu][cublaslt]") {
  Spec s;
  s.tb = CUBLAS_OP_T;
  s.m = 10;
  s.n = 7;
  s.k = 6;
  s.lda = 12;
  s.batch = 3;
  s.sa = 12 * 6 + 5;
  s.sb = 7 * 6;
  s.sc = 10 * 7 + 1;
  s.beta = -1.0f;
  RunAndCheck(s, 21);
  RunAndCheck(s, 22, /*in_place=*/true);
}

TEST_CASE("cublasLt: bf16 inputs with fp32 and bf16 outputs", "[cuda_emu][cublaslt]") {
  for (cudaDataType_t cd : {CUDA_R_32F, CUDA_R_16BF}) {
    for (float beta : {0.0f, 1.0f}) {
      Spec s;
      s.ab = CUDA_R_16BF;
      s.cd = cd;
      s.ta = CUBLAS_OP_T;
      s.m = 33;
      s.n = 18;
      s.k = 40;
      s.lda = 41;
      s.alpha = 0.75f;
      s.beta = beta;
      INFO("D type " << cd << " beta " << beta);
      RunAndCheck(s, 31 + cd, /*in_place=*/beta != 0.0f);
    }
  }
}

TEST_CASE("cublasLt: bf16 output rounds to nearest even", "[cuda_emu][cublaslt]") {
  // 1 x 1 x 2 products whose exact fp32 sums sit on bf16 rounding ties and next to them.
  // D = a0*b0 + a1*b1 with b = (1, 1): 1 + 2^-8 (tie, rounds down to even 1.0),
  // 1 + 3*2^-8 (tie, rounds up to 1 + 2^-6), 1 + 2^-8 + 2^-12 (above the tie: up).
  const float cases[][3] = {
      {1.0f, 0x1p-8f, 1.0f},
      {1.0f, 0x3p-8f, 1.0f + 0x1p-6f},
      {1.0f + 0x1p-7f, 0x1p-8f, 1.0f + 0x1p-6f},  // 1+2^-7+2^-8: tie up to even
      {1.0f, 0x1p-8f + 0x1p-12f, 1.0f + 0x1p-7f}};
  for (const auto& c : cases) {
    // a0, a1 must be exact in bf16; split the small addend over a1 and a scaling b1.
    Spec s;
    s.m = 1;
    s.n = 1;
    s.k = 2;
    s.ab = CUDA_R_16BF;
    s.cd = CUDA_R_16BF;
    // a = (c0, c1 * 2^8 ... ) would not be exact for every case; use b1 = 2^-12 and
    // a1 = c1 * 2^12 (an integer below 2^8 here, so exact in bf16).
    const std::vector<uint16_t> a = {ExactBf16Bits(c[0]), ExactBf16Bits(c[1] * 4096.0f)};
    const std::vector<uint16_t> b = {ExactBf16Bits(1.0f), ExactBf16Bits(0x1p-12f)};
    DevMem A(4), B(4), D(2);
    Put(A.p, a);
    Put(B.p, b);
    Plan plan(s);
    Plan::Heur hr = plan.Heuristic();
    REQUIRE(hr.count == 1);
    Stream st;
    REQUIRE(plan.Matmul(s, A.p, B.p, D.p, D.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
    st.Sync();
    INFO("a0=" << c[0] << " addend=" << c[1]);
    CHECK(Bf16BitsToFloat(Get<uint16_t>(D.p, 1)[0]) == c[2]);
  }
}

TEST_CASE("cublasLt: bias, ReLU and GELU epilogues, fp32 and bf16", "[cuda_emu][cublaslt]") {
  const cublasLtEpilogue_t epis[] = {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU,
                                     CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_RELU,
                                     CUBLASLT_EPILOGUE_RELU_BIAS};
  for (cublasLtEpilogue_t epi : epis) {
    for (cudaDataType_t t : {CUDA_R_32F, CUDA_R_16BF}) {
      Spec s;
      s.epi = epi;
      s.ab = t;
      s.cd = t;
      s.tb = CUBLAS_OP_T;
      s.m = 24;
      s.n = 17;
      s.k = 12;
      s.ldc = 26;
      s.alpha = 1.25f;
      s.beta = t == CUDA_R_32F ? 0.5f : 0.0f;
      INFO("epilogue " << epi << " type " << t);
      RunAndCheck(s, 41 + epi + t);
    }
  }
}

TEST_CASE("cublasLt: TF32 compute rounds A and B to 10 mantissa bits", "[cuda_emu][cublaslt]") {
  Stream st;
  // op(A) is 4 x 1 and B = 1: D = tf32(a). Then A = 1 and op(B) 1 x 4: D = tf32(b).
  const std::vector<float> in = {1.0f + 0x1p-12f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                                 1.0f + 0x1p-10f};
  const std::vector<float> want_tf32 = {1.0f, 1.0f, 1.0f + 0x1p-9f, 1.0f + 0x1p-10f};
  for (bool round_b : {false, true}) {
    for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}) {
      Spec s;
      s.compute = ct;
      s.m = round_b ? 1 : 4;
      s.n = round_b ? 4 : 1;
      s.k = 1;
      DevMem X(16), one(4), D(16);
      Put(X.p, in);
      Put(one.p, std::vector<float>{1.0f});
      Plan plan(s);
      Plan::Heur hr = plan.Heuristic();
      REQUIRE(hr.count == 1);
      const void* A = round_b ? one.p : X.p;
      const void* B = round_b ? X.p : one.p;
      REQUIRE(plan.Matmul(s, A, B, D.p, D.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
      st.Sync();
      const std::vector<float> got = Get<float>(D.p, 4);
      INFO("round_b=" << round_b << " compute=" << ct);
      CHECK(got == (ct == CUBLAS_COMPUTE_32F ? in : want_tf32));
    }
  }
  // A random product: matches the TF32 reference tightly and differs from the fp32 one.
  Spec s;
  s.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  s.m = 16;
  s.n = 16;
  s.k = 32;
  RunAndCheck(s, 51);
  Spec f = s;
  f.compute = CUBLAS_COMPUTE_32F;
  Operands o = MakeOperands(s, 52);
  Expected e32 = Reference(f, o);
  DevMem A(o.a.size() * 4), B(o.b.size() * 4), D(o.c.size() * 4);
  Put(A.p, o.a);
  Put(B.p, o.b);
  Plan plan(s);
  Plan::Heur hr = plan.Heuristic();
  REQUIRE(plan.Matmul(s, A.p, B.p, D.p, D.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
  st.Sync();
  std::vector<float> got = Get<float>(D.p, o.c.size());
  double max_diff = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(got[i] - e32.want[i]));
  CHECK(max_diff > 1e-4);  // fp32 results agree to ~1e-6; TF32 inputs move them by ~1e-3
}

TEST_CASE("cublasLt: GEMM speed, 512x768x768 fp32", "[.][benchmark][cuda_emu][cublaslt]") {
  Spec s;
  s.m = 768;
  s.n = 512;
  s.k = 768;
  s.tb = CUBLAS_OP_T;
  DevMem A(s.m * s.k * 4), B(s.n * s.k * 4), D(s.m * s.n * 4);
  Put(A.p, std::vector<float>(s.m * s.k, 0.5f));
  Put(B.p, std::vector<float>(s.n * s.k, 0.25f));
  for (cublasComputeType_t ct : {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}) {
    for (cudaDataType_t t : {CUDA_R_32F, CUDA_R_16BF}) {
      if (t == CUDA_R_16BF && ct != CUBLAS_COMPUTE_32F) continue;
      s.compute = ct;
      s.ab = t;
      s.cd = t;
      Plan p(s);
      Plan::Heur hr = p.Heuristic();
      REQUIRE(hr.count == 1);
      Stream st;
      REQUIRE(p.Matmul(s, A.p, B.p, D.p, D.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);  // warm up
      st.Sync();
      const int reps = 5;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i)
        REQUIRE(p.Matmul(s, A.p, B.p, D.p, D.p, &hr.algo, st.s) == CUBLAS_STATUS_SUCCESS);
      st.Sync();
      const double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      std::printf("cublasLt emu %s compute=%d: %.3f ms, %.2f GFLOP/s\n",
                  t == CUDA_R_32F ? "fp32" : "bf16", static_cast<int>(ct), sec * 1e3,
                  2.0 * s.m * s.n * s.k / sec / 1e9);
    }
  }
}

TEST_CASE("cublasLt: L2L_CUDA_EMU_SKIP_COMPUTE=1 checks and queues a matmul without computing it",
          "[cuda_emu][cublaslt]") {
  Spec s;
  s.m = 8;
  s.n = 6;
  s.k = 5;
  Operands o = MakeOperands(s, 7);
  DevMem A(o.a.size() * 4), B(o.b.size() * 4), C(o.c.size() * 4), D(o.c.size() * 4);
  PutAs(A.p, o.a, s.ab);
  PutAs(B.p, o.b, s.ab);
  PutAs(C.p, o.c, s.cd);
  const std::vector<float> d_init(o.c.size(), kSentinel);
  PutAs(D.p, d_init, s.cd);
  Plan plan(s);
  Plan::Heur hr = plan.Heuristic(AlignOf(A.p, 0, 1), AlignOf(B.p, 0, 1), AlignOf(C.p, 0, 1), AlignOf(D.p, 0, 1));
  REQUIRE(hr.st == CUBLAS_STATUS_SUCCESS);
  Stream stream;
  setenv("L2L_CUDA_EMU_SKIP_COMPUTE", "1", 1);
  const cublasStatus_t queued = plan.Matmul(s, A.p, B.p, C.p, D.p, &hr.algo, stream.s);
  const cublasStatus_t bad = plan.Matmul(s, A.p, B.p, C.p, nullptr, &hr.algo, stream.s);  // still checked
  unsetenv("L2L_CUDA_EMU_SKIP_COMPUTE");
  CHECK(queued == CUBLAS_STATUS_SUCCESS);
  CHECK(bad == CUBLAS_STATUS_INVALID_VALUE);
  stream.Sync();
  CHECK(GetAs(D.p, o.c.size(), s.cd) == d_init);  // D untouched
  REQUIRE(plan.Matmul(s, A.p, B.p, C.p, D.p, &hr.algo, stream.s) == CUBLAS_STATUS_SUCCESS);
  stream.Sync();
  CHECK(GetAs(D.p, o.c.size(), s.cd) != d_init);  // computed once the switch is off
}

}  // namespace cublaslt_test

// Every CPU backend op against a naive double-precision loop written here (forward) and
// central finite differences of that double-precision forward (backward). Attention and
// cross-entropy are in ops_attention_test.cc. Inputs are fresh random values (never
// zeros); shapes include sizes that are not multiples of 8 and sizes large enough to
// take the parallel paths.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "common/dtype.h"
#include "kernels/backend.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::kernels {
namespace {

using namespace testing;  // NOLINT

// ---- registry and buffers ----------------------------------------------------------------

TEST_CASE("CreateBackend makes a CPU backend and rejects unknown devices by name",
          "[kernels][backend]") {
  auto cpu = CreateBackend("cpu");
  REQUIRE(cpu.ok());
  CHECK((*cpu)->kind() == DeviceKind::kCpu);
  CHECK((*cpu)->name().find("cpu") != std::string::npos);

  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0x", "CPU", ""}) {
    auto r = CreateBackend(bad);
    INFO("device \"" << bad << "\" -> " << r.status().ToString());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK(r.status().message().find("\"" + std::string(bad) + "\"") != std::string::npos);
  }
  // cuda:0 fails here either way: no CUDA in this build, or (with CUDA) no GPU on a CI host
  // is reported by the CUDA backend. Without CUDA the message says why.
  auto cuda = CreateBackend("cuda:0");
#ifndef L2L_HAVE_CUDA
  REQUIRE_FALSE(cuda.ok());
  CHECK(cuda.status().message().find("no CUDA support") != std::string::npos);
#else
  if (!cuda.ok()) CHECK_FALSE(cuda.status().message().empty());
#endif
}

TEST_CASE("DeviceBuffer owns one allocation and moves it", "[kernels][backend]") {
  auto be = CreateCpuBackend(1);
  auto a = DeviceBuffer::Create(be.get(), 1000);
  REQUIRE(a.ok());
  CHECK(a->bytes() == 1000);
  CHECK(reinterpret_cast<uintptr_t>(a->data()) % 64 == 0);
  void* p = a->data();
  DeviceBuffer b = std::move(a).value();
  CHECK(b.data() == p);
  DeviceBuffer c;
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(b.data() == nullptr);  // NOLINT: moved-from is empty by contract
  CHECK(c.bytes() == 1000);
  // Huge requests fail with RESOURCE_EXHAUSTED naming the size instead of aborting.
  auto huge = DeviceBuffer::Create(be.get(), size_t{1} << 62);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == StatusCode::kResourceExhausted);
  CHECK(huge.status().message().find(std::to_string(size_t{1} << 62)) != std::string::npos);
}

// ---- bf16 layer boundaries ---------------------------------------------------------------

TEST_CASE("RoundToBf16 rounds in place as common/dtype.h does and WidenBf16 is exact", "[kernels][cpu][bf16]") {
  auto be = CreateCpuBackend(1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  // Random values (large enough for the backend's parallel chunks), then the cases where
  // rounding is easy to get wrong: ties to even both ways, a carry into the exponent,
  // denormals, signed zero, infinities, NaN, the largest finite float.
  std::vector<float> x(70001);
  for (float& v : x) v = u(rng);
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x3f7fffffu, 0x00000001u, 0x007fffffu,
                               0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu};
  for (size_t k = 0; k < std::size(specials); ++k) std::memcpy(&x[k], &specials[k], 4);
  std::vector<float> y = x;
  std::vector<uint16_t> bits(x.size(), 0xdead);
  be->RoundToBf16(y.data(), bits.data(), static_cast<int64_t>(y.size()));
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t want = FloatToBf16(x[i]);
    const float wantf = Bf16ToFloat(want);
    const bool same = std::memcmp(&y[i], &wantf, 4) == 0 || (std::isnan(y[i]) && std::isnan(wantf));
    if (bits[i] != want || !same) ++bad;
  }
  CHECK(bad == 0);
  CHECK(bits[0] == 0x3f80);  // 1 + 2^-8: the tie goes to the even 1.0
  CHECK(bits[1] == 0x3f82);  // 1 + 3*2^-8: the tie goes up, to even
  // No bits requested: the same rounded values.
  std::vector<float> z = x;
  be->RoundToBf16(z.data(), nullptr, static_cast<int64_t>(z.size()));
  CHECK(std::memcmp(z.data() + std::size(specials), y.data() + std::size(specials),
                    (z.size() - std::size(specials)) * 4) == 0);
  // Widening gives back exactly the rounded values.
  std::vector<float> w(x.size());
  be->WidenBf16(w.data(), bits.data(), static_cast<int64_t>(w.size()));
  CHECK(std::memcmp(w.data() + std::size(specials), y.data() + std::size(specials),
                    (w.size() - std::size(specials)) * 4) == 0);
}

// ---- GEMM ------------------------------------------------------------------------------

TEST_CASE("Gemm matches a double reference for all transposes, alpha, beta and padded lds",
          "[kernels][cpu][gemm]") {
  auto be = CreateCpuBackend(2);
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  // The last two are big enough for the backend to split C into row / column blocks
  // across threads (with a ragged last block).
  const auto shape = GENERATE(std::array<int64_t, 3>{5, 7, 3}, std::array<int64_t, 3>{17, 13, 29},
                              std::array<int64_t, 3>{64, 40, 72}, std::array<int64_t, 3>{300, 100, 40},
                              std::array<int64_t, 3>{70, 290, 52});
  const float beta = GENERATE(0.0f, 1.0f, -0.5f);
  const int64_t M = shape[0], N = shape[1], K = shape[2];
  const float alpha = 1.25f;
  const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
  std::mt19937 rng(static_cast<uint32_t>(M * 131 + N * 7 + K + ta * 2 + tb));
  const auto A = RandomVec(rng, size_t((ta ? K : M) * lda));
  const auto Bm = RandomVec(rng, size_t((tb ? N : K) * ldb));
  auto C0 = RandomVec(rng, size_t(M * ldc));
  if (beta == 0.0f) {
    // beta = 0 must not read C: NaN in the output rows must not leak through.
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) C0[m * ldc + n] = std::numeric_limits<float>::quiet_NaN();
  }
  auto dA = Upload(*be, A), dB = Upload(*be, Bm), dC = Upload(*be, C0);
  be->Gemm(ta, tb, M, N, K, alpha, dA.f32(), lda, dB.f32(), ldb, beta, dC.f32(), ldc);
  const auto C = Download(*be, dC, C0.size());

  std::vector<double> ref(C0.size());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * lda + m] : A[m * lda + k];
        const double b = tb ? Bm[n * ldb + k] : Bm[k * ldb + n];
        s += a * b;
      }
      ref[m * ldc + n] = alpha * s + (beta == 0.0f ? 0.0 : double(beta) * C0[m * ldc + n]);
    }
    for (int64_t n = N; n < ldc; ++n) ref[m * ldc + n] = C0[m * ldc + n];  // padding untouched
  }
  INFO("ta=" << ta << " tb=" << tb << " M=" << M << " N=" << N << " K=" << K << " beta=" << beta);
  ExpectClose(C, ref, 4e-6 * K, 1e-5, "Gemm");
}

TEST_CASE("Gemm with beta=1 adds exactly the beta=0 product to C", "[kernels][cpu][gemm]") {
  auto be = CreateCpuBackend(2);
  const int64_t M = 33, N = 65, K = 47;
  std::mt19937 rng(3);
  const auto A = RandomVec(rng, M * K), Bm = RandomVec(rng, K * N), C0 = RandomVec(rng, M * N);
  auto dA = Upload(*be, A), dB = Upload(*be, Bm), dC = Upload(*be, C0);
  auto dP = Upload(*be, RandomVec(rng, M * N));
  be->Gemm(false, false, M, N, K, 1.0f, dA.f32(), K, dB.f32(), N, 0.0f, dP.f32(), N);
  be->Gemm(false, false, M, N, K, 1.0f, dA.f32(), K, dB.f32(), N, 1.0f, dC.f32(), N);
  const auto P = Download(*be, dP, M * N), C = Download(*be, dC, M * N);
  std::vector<double> want(M * N);
  for (size_t i = 0; i < want.size(); ++i) want[i] = double(C0[i]) + double(P[i]);
  // One fp32 rounding of (C0 + product) apart at most.
  ExpectClose(C, want, 0.0, 2.0 * std::numeric_limits<float>::epsilon(), "beta=1 accumulate");
  // Accumulating twice from zero gives exactly 2x (micro-batch gradient sums rely on it).
  be->Zero(dC.data(), M * N * sizeof(float));
  be->Gemm(false, false, M, N, K, 1.0f, dA.f32(), K, dB.f32(), N, 1.0f, dC.f32(), N);
  be->Gemm(false, false, M, N, K, 1.0f, dA.f32(), K, dB.f32(), N, 1.0f, dC.f32(), N);
  const auto C2 = Download(*be, dC, M * N);
  std::vector<double> twice(M * N);
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = 2.0 * double(P[i]);
  ExpectClose(C2, twice, 0.0, 2.0 * std::numeric_limits<float>::epsilon(), "two beta=1 calls");
}

TEST_CASE("Gemm with K=0 scales C by beta", "[kernels][cpu][gemm]") {
  auto be = CreateCpuBackend(1);
  std::mt19937 rng(5);
  const auto C0 = RandomVec(rng, 12);
  auto dC = Upload(*be, C0);
  float dummy = 1.0f;
  be->Gemm(false, false, 3, 4, 0, 1.0f, &dummy, 1, &dummy, 4, 0.5f, dC.f32(), 4);
  std::vector<double> want(12);
  for (size_t i = 0; i < 12; ++i) want[i] = 0.5 * C0[i];
  ExpectClose(Download(*be, dC, 12), want, 0.0, 1e-7, "K=0");
}

// ---- bias --------------------------------------------------------------------------------

TEST_CASE("AddBias and BiasBackward match naive loops and accumulate", "[kernels][cpu]") {
  auto be = CreateCpuBackend(2);
  const auto shape = GENERATE(std::array<int64_t, 2>{3, 5}, std::array<int64_t, 2>{37, 130},
                              std::array<int64_t, 2>{1500, 19});
  const int64_t N = shape[0], OC = shape[1];
  std::mt19937 rng(static_cast<uint32_t>(N + OC));
  const auto out0 = RandomVec(rng, N * OC), bias = RandomVec(rng, OC), db0 = RandomVec(rng, OC);
  auto dOut = Upload(*be, out0), dBias = Upload(*be, bias), dDb = Upload(*be, db0);
  be->AddBias(dOut.f32(), dBias.f32(), N, OC);
  std::vector<double> want(N * OC);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < OC; ++c) want[r * OC + c] = double(out0[r * OC + c]) + bias[c];
  ExpectClose(Download(*be, dOut, N * OC), want, 1e-7, 1e-6, "AddBias");

  be->BiasBackward(dDb.f32(), dOut.f32(), N, OC);
  const auto out1 = Download(*be, dOut, N * OC);
  std::vector<double> dbw(OC);
  for (int64_t c = 0; c < OC; ++c) {
    double s = db0[c];
    for (int64_t r = 0; r < N; ++r) s += out1[r * OC + c];
    dbw[c] = s;
  }
  ExpectClose(Download(*be, dDb, OC), dbw, 1e-6 * N, 1e-5, "BiasBackward");

  // The same bits whatever the thread count (rows are summed in fixed chunks).
  auto be1 = CreateCpuBackend(1);
  auto hOut = Upload(*be1, out1), hDb = Upload(*be1, db0);
  be1->BiasBackward(hDb.f32(), hOut.f32(), N, OC);
  CHECK(Download(*be1, hDb, OC) == Download(*be, dDb, OC));
}

TEST_CASE("GeluBackwardBias overwrites the gradient, sums it into the bias, and equals the unfused ops",
          "[kernels][cpu]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{1, 7}, std::array<int64_t, 2>{45, 33},
                              std::array<int64_t, 2>{300, 1536});
  const int64_t N = shape[0], F = shape[1];
  CAPTURE(N, F);
  std::mt19937 rng(static_cast<uint32_t>(N * 7 + F));
  const auto x = RandomVec(rng, N * F, -4.0f, 4.0f), dout = RandomVec(rng, N * F), db0 = RandomVec(rng, F);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dD = Upload(*be, dout), dDb = Upload(*be, db0);
  auto dIn = Upload(*be, RandomVec(rng, N * F));  // garbage: must be overwritten
  be->GeluBackwardBias(dIn.f32(), dDb.f32(), dX.f32(), dD.f32(), N, F);
  std::vector<double> gwant(N * F), bwant(F);
  for (int64_t c = 0; c < F; ++c) bwant[c] = db0[c];
  for (int64_t i = 0; i < N * F; ++i) {
    const double h = 1e-5;
    gwant[i] = dout[i] * (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
    bwant[i % F] += gwant[i];
  }
  const auto got = Download(*be, dIn, N * F), gotb = Download(*be, dDb, F);
  ExpectClose(got, gwant, 1e-5, 1e-4, "GeluBackwardBias dinp");
  ExpectClose(gotb, bwant, 1e-5 * N, 1e-4, "GeluBackwardBias dbias");

  // The backend's default (Zero, GeluBackward, BiasBackward) on the same backend gives
  // the same bits: the fused pass adds the same values in the same order.
  auto uIn = Upload(*be, RandomVec(rng, N * F)), uDb = Upload(*be, db0);
  be->Backend::GeluBackwardBias(uIn.f32(), uDb.f32(), dX.f32(), dD.f32(), N, F);
  CHECK(Download(*be, uIn, N * F) == got);
  CHECK(Download(*be, uDb, F) == gotb);
  // Null dbias: only the gradient.
  auto nIn = Upload(*be, RandomVec(rng, N * F));
  be->GeluBackwardBias(nIn.f32(), nullptr, dX.f32(), dD.f32(), N, F);
  CHECK(Download(*be, nIn, N * F) == got);
  // One thread: the same bits.
  auto be1 = CreateCpuBackend(1);
  auto hIn = Upload(*be1, RandomVec(rng, N * F)), hDb = Upload(*be1, db0);
  be1->GeluBackwardBias(hIn.f32(), hDb.f32(), dX.f32(), dD.f32(), N, F);
  CHECK(Download(*be1, hIn, N * F) == got);
  CHECK(Download(*be1, hDb, F) == gotb);
}

// ---- elementwise -------------------------------------------------------------------------

TEST_CASE("Add, Axpy and Scale match naive loops (including in-place Add)", "[kernels][cpu]") {
  auto be = CreateCpuBackend(2);
  const int64_t n = GENERATE(7, 100003);
  std::mt19937 rng(static_cast<uint32_t>(n));
  const auto a = RandomVec(rng, n), b = RandomVec(rng, n);
  auto da = Upload(*be, a), db = Upload(*be, b), dout = Upload(*be, RandomVec(rng, n));
  std::vector<double> want(n);

  be->Add(dout.f32(), da.f32(), db.f32(), n);
  for (int64_t i = 0; i < n; ++i) want[i] = double(a[i]) + b[i];
  ExpectClose(Download(*be, dout, n), want, 0.0, 1e-7, "Add");
  be->Add(da.f32(), da.f32(), db.f32(), n);  // out aliases a
  ExpectClose(Download(*be, da, n), want, 0.0, 1e-7, "Add in place");

  be->CopyToDevice(da.data(), a.data(), n * sizeof(float));
  be->Axpy(da.f32(), db.f32(), -0.75f, n);
  for (int64_t i = 0; i < n; ++i) want[i] = double(a[i]) - 0.75 * b[i];
  ExpectClose(Download(*be, da, n), want, 1e-7, 1e-6, "Axpy");

  be->CopyToDevice(da.data(), a.data(), n * sizeof(float));
  be->Scale(da.f32(), 3.5f, n);
  for (int64_t i = 0; i < n; ++i) want[i] = 3.5 * a[i];
  ExpectClose(Download(*be, da, n), want, 0.0, 1e-7, "Scale");
}

TEST_CASE("GELU forward matches the tanh formula and backward its finite differences",
          "[kernels][cpu]") {
  auto be = CreateCpuBackend(2);
  const int64_t n = GENERATE(13, 70001);
  std::mt19937 rng(static_cast<uint32_t>(n));
  const auto x = RandomVec(rng, n, -4.0f, 4.0f), dout = RandomVec(rng, n), d0 = RandomVec(rng, n);
  auto dx = Upload(*be, x), dy = Upload(*be, RandomVec(rng, n)), dd = Upload(*be, dout),
       dg = Upload(*be, d0);
  be->GeluForward(dy.f32(), dx.f32(), n);
  std::vector<double> want(n), gwant(n);
  for (int64_t i = 0; i < n; ++i) {
    want[i] = GeluRef(x[i]);
    // d/dx by a central difference of the double formula; accumulated onto d0.
    const double h = 1e-5;
    gwant[i] = d0[i] + dout[i] * (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
  }
  ExpectClose(Download(*be, dy, n), want, 1e-6, 1e-5, "GeluForward");
  be->GeluBackward(dg.f32(), dx.f32(), dd.f32(), n);
  ExpectClose(Download(*be, dg, n), gwant, 1e-5, 1e-4, "GeluBackward");
}

TEST_CASE("GELU saturates cleanly for large and tiny inputs", "[kernels][cpu]") {
  auto be = CreateCpuBackend(1);
  const std::vector<float> x = {-100.0f, -30.0f, -9.0f, -1e-3f, -1e-30f, 0.0f, 1e-30f, 1e-3f,
                                0.6f,    0.65f,  9.0f,  30.0f,  100.0f};
  const size_t n = x.size();
  auto dx = Upload(*be, x), dy = Upload(*be, std::vector<float>(n, 7.0f)),
       dd = Upload(*be, std::vector<float>(n, 1.0f)), dg = Upload(*be, std::vector<float>(n, 0.0f));
  be->GeluForward(dy.f32(), dx.f32(), int64_t(n));
  be->GeluBackward(dg.f32(), dx.f32(), dd.f32(), int64_t(n));
  std::vector<double> want(n), gwant(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = GeluRef(x[i]);
    const double h = 1e-6 * std::max(1.0, std::abs(double(x[i])));
    gwant[i] = (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
  }
  ExpectClose(Download(*be, dy, n), want, 1e-7, 1e-6, "GeluForward extremes");
  ExpectClose(Download(*be, dg, n), gwant, 1e-6, 1e-5, "GeluBackward extremes");
}

TEST_CASE("SumSquares is the double sum of squares and independent of thread count",
          "[kernels][cpu]") {
  const int64_t n = GENERATE(5, 300007);
  std::mt19937 rng(static_cast<uint32_t>(n));
  const auto x = RandomVec(rng, n, -3.0f, 3.0f);
  double want = 0.0;
  for (float v : x) want += double(v) * v;
  auto be1 = CreateCpuBackend(1), be2 = CreateCpuBackend(2);
  auto d1 = Upload(*be1, x), d2 = Upload(*be2, x);
  const double s1 = be1->SumSquares(d1.f32(), n), s2 = be2->SumSquares(d2.f32(), n);
  CHECK(std::abs(s2 - want) <= 1e-12 * want);
  CHECK(s1 == s2);
}

// ---- embedding ------------------------------------------------------------------------

TEST_CASE("Embedding forward gathers rows and backward scatters deterministically",
          "[kernels][cpu][embedding]") {
  const auto shape = GENERATE(std::array<int64_t, 4>{2, 5, 7, 11},     // B, T, C, V
                              std::array<int64_t, 4>{3, 33, 150, 20});  // repeated tokens
  const int64_t B = shape[0], T = shape[1], C = shape[2], V = shape[3], Tmax = T + 2;
  std::mt19937 rng(static_cast<uint32_t>(B * T * C));
  const auto tokens = RandomTokens(rng, B * T, int32_t(V));
  const auto wte = RandomVec(rng, V * C), wpe = RandomVec(rng, Tmax * C);
  const auto dout = RandomVec(rng, B * T * C);
  const auto dwte0 = RandomVec(rng, V * C), dwpe0 = RandomVec(rng, Tmax * C);
  auto be = CreateCpuBackend(2);
  auto dTok = Upload(*be, tokens), dWte = Upload(*be, wte), dWpe = Upload(*be, wpe);
  auto dOut = Upload(*be, RandomVec(rng, B * T * C)), dDout = Upload(*be, dout);
  be->EmbeddingForward(dOut.f32(), dTok.i32(), dWte.f32(), dWpe.f32(), B, T, C);
  std::vector<double> want(B * T * C);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c)
      want[n * C + c] = double(wte[tokens[n] * C + c]) + wpe[(n % T) * C + c];
  ExpectClose(Download(*be, dOut, B * T * C), want, 0.0, 1e-7, "EmbeddingForward");

  // The backward is the adjoint of the gather: dwte[v] += sum of dout rows with token v.
  std::vector<double> gwte = ToDouble(dwte0), gwpe = ToDouble(dwpe0);
  for (int64_t n = 0; n < B * T; ++n)
    for (int64_t c = 0; c < C; ++c) {
      gwte[tokens[n] * C + c] += dout[n * C + c];
      gwpe[(n % T) * C + c] += dout[n * C + c];
    }
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2}) {
    auto bt = CreateCpuBackend(threads);
    auto gw = Upload(*bt, dwte0), gp = Upload(*bt, dwpe0);
    bt->EmbeddingBackward(gw.f32(), gp.f32(), dDout.f32(), dTok.i32(), B, T, C);
    ExpectClose(Download(*bt, gw, V * C), gwte, 1e-6, 1e-5, "EmbeddingBackward dwte");
    ExpectClose(Download(*bt, gp, Tmax * C), gwpe, 1e-6, 1e-5, "EmbeddingBackward dwpe");
    runs.push_back(Download(*bt, gw, V * C));
  }
  CHECK(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float)) == 0);
}

// ---- LayerNorm -------------------------------------------------------------------------

TEST_CASE("LayerNorm forward matches the torch formula and backward the finite differences",
          "[kernels][cpu][layernorm]") {
  const auto shape = GENERATE(std::array<int64_t, 2>{6, 13}, std::array<int64_t, 2>{70, 200},
                              std::array<int64_t, 2>{97, 384});
  const int64_t N = shape[0], C = shape[1];
  std::mt19937 rng(static_cast<uint32_t>(N * C));
  const auto x = RandomVec(rng, N * C, -2.0f, 3.0f), w = RandomVec(rng, C, 0.5f, 1.5f),
             b = RandomVec(rng, C), R = RandomVec(rng, N * C);
  const auto dx0 = RandomVec(rng, N * C), dw0 = RandomVec(rng, C), db0 = RandomVec(rng, C);
  auto be = CreateCpuBackend(2);
  auto dX = Upload(*be, x), dW = Upload(*be, w), dB = Upload(*be, b), dR = Upload(*be, R);
  auto dOut = Upload(*be, RandomVec(rng, N * C)), dMean = Upload(*be, RandomVec(rng, N)),
       dRstd = Upload(*be, RandomVec(rng, N));
  be->LayerNormForward(dOut.f32(), dMean.f32(), dRstd.f32(), dX.f32(), dW.f32(), dB.f32(), N, C);
  std::vector<double> mean, rstd;
  const auto xd0 = ToDouble(x), wd0 = ToDouble(w), bd0 = ToDouble(b);
  const auto want = LayerNormRef(xd0.data(), wd0.data(), bd0.data(), N, C, &mean, &rstd);
  ExpectClose(Download(*be, dOut, N * C), want, 1e-5, 1e-5, "LayerNormForward out");
  ExpectClose(Download(*be, dMean, N), mean, 1e-6, 1e-5, "LayerNormForward mean");
  ExpectClose(Download(*be, dRstd, N), rstd, 1e-6, 1e-5, "LayerNormForward rstd");

  // loss = sum(out * R): dout = R. Gradients accumulate onto dx0, dw0, db0.
  auto gX = Upload(*be, dx0), gW = Upload(*be, dw0), gB = Upload(*be, db0);
  be->LayerNormBackward(gX.f32(), gW.f32(), gB.f32(), dR.f32(), dX.f32(), dW.f32(), dMean.f32(),
                        dRstd.f32(), N, C);
  const auto Rd = ToDouble(R);
  auto xd = ToDouble(x), wd = ToDouble(w), bd = ToDouble(b);
  std::vector<double> fx, fw, fb;
  const auto sx = SampleIndices(N * C, 300), sc = SampleIndices(C, 100);
  for (size_t i : sx)
    fx.push_back(dx0[i] + FiniteDiff([&](const auto& v) { return Dot(LayerNormRef(v.data(), wd.data(), bd.data(), N, C), Rd); }, xd, i));
  for (size_t i : sc) {
    fw.push_back(dw0[i] + FiniteDiff([&](const auto& v) { return Dot(LayerNormRef(xd.data(), v.data(), bd.data(), N, C), Rd); }, wd, i));
    fb.push_back(db0[i] + FiniteDiff([&](const auto& v) { return Dot(LayerNormRef(xd.data(), wd.data(), v.data(), N, C), Rd); }, bd, i));
  }
  const auto gx = Download(*be, gX, N * C), gw = Download(*be, gW, C), gb = Download(*be, gB, C);
  std::vector<float> gxs, gws, gbs;
  for (size_t i : sx) gxs.push_back(gx[i]);
  for (size_t i : sc) {
    gws.push_back(gw[i]);
    gbs.push_back(gb[i]);
  }
  ExpectClose(gxs, fx, 1e-4, 1e-3, "LayerNormBackward dinp");
  ExpectClose(gws, fw, 1e-4 * N, 1e-3, "LayerNormBackward dweight");
  ExpectClose(gbs, fb, 1e-4 * N, 1e-3, "LayerNormBackward dbias");

  // dweight/dbias do not depend on the thread count.
  auto be1 = CreateCpuBackend(1);
  auto hW = Upload(*be1, dw0), hB = Upload(*be1, db0), hX = Upload(*be1, dx0);
  be1->LayerNormBackward(hX.f32(), hW.f32(), hB.f32(), dR.f32(), dX.f32(), dW.f32(), dMean.f32(),
                         dRstd.f32(), N, C);
  CHECK(Download(*be1, hW, C) == gw);
  CHECK(Download(*be1, hB, C) == gb);
}

}  // namespace
}  // namespace l2l::kernels

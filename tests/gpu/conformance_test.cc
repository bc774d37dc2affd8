// Conformance of the CUDA backend: every kernels::Backend op, and the CUDA-only bf16
// entry points, against the CPU backend (the reference) on fresh random inputs, with
// |gpu - cpu| <= atol + rtol * |cpu|. Label gpu: fails (never skips) without a GPU.
//
// Tolerances (both sides compute in fp32, so differences come from summation order and
// libm ulps; inputs are O(1)):
//   kElem   elementwise, LayerNorm, softmax rows     atol 1e-5  rtol 1e-4
//   kGemm   fp32 GEMMs, attention, column sums       atol 1e-4  rtol 1e-4 (x4 for backward chains)
//   kTf32   GEMMs with L2L_CUDA_GEMM=tf32            atol 2e-2  rtol 1e-2 (10-bit mantissa inputs)
//   kBf16   bf16 GEMM, fp32 output                   atol 1e-4  rtol 1e-4 (bf16 products are exact in fp32)
//           bf16 GEMM, bf16 output                   atol 1e-3  rtol 8e-3 (one bf16 rounding, 2^-9)
//           GELU epilogue                            +atol 2e-3, rtol >= 1e-3 (cuBLASLt's GELU may
//                                                    be erf-based or use a fast tanh: |erf - tanh
//                                                    GELU| <= 4.8e-4)
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/train_util.h"

namespace l2l::gpu_test {
namespace {

constexpr double kElemAtol = 1e-5, kElemRtol = 1e-4;
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

TEST_CASE("cuda backend reports a CUDA device", "[gpu]") {
  Backends& b = Both();
  CHECK(b.gpu->kind() == kernels::DeviceKind::kCuda);
  CHECK(b.gpu->name().rfind("cuda:0", 0) == 0);
  CHECK(kernels::CudaDeviceCount() >= 1);
}

TEST_CASE("cuda backend rejects a GPU index that does not exist", "[gpu]") {
  Both();
  auto be = kernels::CreateCudaBackend(kernels::CudaDeviceCount() + 3);
  REQUIRE_FALSE(be.ok());
  CHECK(be.status().message().find("no such GPU") != std::string::npos);
}

TEST_CASE("cuda backend counts its live and peak allocations", "[gpu]") {
  Backends& b = Both();
  REQUIRE(kernels::ResetCudaPeakMemory(*b.gpu).ok());
  auto before = kernels::GetCudaMemoryStats(*b.gpu);
  REQUIRE(before.ok());
  {
    auto buf = DeviceBuffer::Create(b.gpu.get(), size_t{48} << 20);
    REQUIRE(buf.ok());
    auto during = kernels::GetCudaMemoryStats(*b.gpu);
    REQUIRE(during.ok());
    CHECK(during->allocated == before->allocated + (size_t{48} << 20));
    CHECK(during->device_used >= during->allocated);
    CHECK(during->device_total >= during->device_used);
  }
  auto after = kernels::GetCudaMemoryStats(*b.gpu);
  REQUIRE(after.ok());
  CHECK(after->allocated == before->allocated);
  CHECK(after->peak_allocated == before->allocated + (size_t{48} << 20));
  CHECK(kernels::GetCudaMemoryStats(*b.cpu).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("cuda copies zero and device to device copies round trip", "[gpu]") {
  Backends& b = Both();
  std::mt19937 rng(1);
  auto host = RandomVec(rng, 1001);
  Twin a = Twin::Of(b, host);
  Twin c = Twin::Of(b, RandomVec(rng, 1001));
  b.gpu->CopyDeviceToDevice(c.g(), a.g(), 1001 * sizeof(float));
  CHECK(c.FromGpu(b) == host);
  b.gpu->Zero(c.g() + 10, 100 * sizeof(float));
  auto z = c.FromGpu(b);
  for (int i = 0; i < 1001; ++i) CHECK(z[i] == (i >= 10 && i < 110 ? 0.0f : host[i]));
}

TEST_CASE("cuda Gemm matches the cpu for every transpose and leading dimension", "[gpu]") {
  Backends& b = Both();
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const auto shape = GENERATE(std::vector<int64_t>{37, 53, 71}, std::vector<int64_t>{256, 384, 512},
                              std::vector<int64_t>{1, 768, 3});
  const int64_t M = shape[0], N = shape[1], K = shape[2];
  const int64_t pad = 5;  // leading dimensions larger than the rows
  const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
  std::mt19937 rng(static_cast<unsigned>(M * 7 + N * 3 + K + ta * 2 + tb));
  Twin A = Twin::Of(b, RandomVec(rng, (ta ? K : M) * lda));
  Twin B = Twin::Of(b, RandomVec(rng, (tb ? N : K) * ldb));
  Twin C = Twin::Of(b, RandomVec(rng, M * ldc));
  const float alpha = 0.75f, beta = GENERATE(0.0f, 0.5f, 1.0f);
  CAPTURE(ta, tb, M, N, K, beta);
  b.cpu->Gemm(ta, tb, M, N, K, alpha, A.c(), lda, B.c(), ldb, beta, C.c(), ldc);
  b.gpu->Gemm(ta, tb, M, N, K, alpha, A.g(), lda, B.g(), ldb, beta, C.g(), ldc);
  ExpectTwinClose(b, C, kGemmAtol, kGemmRtol, "Gemm C");
}

TEST_CASE("cuda Gemm with beta 0 does not read C", "[gpu]") {
  Backends& b = Both();
  std::mt19937 rng(2);
  const int64_t M = 33, N = 40, K = 17;
  Twin A = Twin::Of(b, RandomVec(rng, M * K));
  Twin B = Twin::Of(b, RandomVec(rng, K * N));
  Twin C = Twin::Of(b, std::vector<float>(M * N, std::numeric_limits<float>::quiet_NaN()));
  Twin R = Twin::Of(b, std::vector<float>(M * N, 0.0f));
  b.gpu->Gemm(false, false, M, N, K, 1.0f, A.g(), K, B.g(), N, 0.0f, C.g(), N);
  b.cpu->Gemm(false, false, M, N, K, 1.0f, A.c(), K, B.c(), N, 0.0f, R.c(), N);
  ExpectClose(C.FromGpu(b), R.FromCpu(b), kGemmAtol, kGemmRtol, "Gemm beta=0 over NaN");
}

TEST_CASE("cuda Gemm in tf32 mode stays within tf32 tolerance", "[gpu]") {
  Backends& b = Both();
  kernels::CudaBackendOptions opt;
  opt.gemm = kernels::CudaGemmPrecision::kTf32;
  auto tf = kernels::CreateCudaBackend(0, opt);
  REQUIRE(tf.ok());
  Backend& t = **tf;
  CHECK(t.name().find("tf32") != std::string::npos);
  std::mt19937 rng(3);
  const int64_t M = 128, N = 96, K = 256;
  auto a = RandomVec(rng, M * K), bb = RandomVec(rng, K * N);
  Twin A = Twin::Of(b, a), B = Twin::Of(b, bb), C = Twin::Of(b, std::vector<float>(M * N, 0.0f));
  b.cpu->Gemm(false, false, M, N, K, 1.0f, A.c(), K, B.c(), N, 0.0f, C.c(), N);
  auto da = DeviceBuffer::Create(&t, a.size() * 4), db = DeviceBuffer::Create(&t, bb.size() * 4),
       dc = DeviceBuffer::Create(&t, M * N * 4);
  REQUIRE((da.ok() && db.ok() && dc.ok()));
  t.CopyToDevice(da->data(), a.data(), a.size() * 4);
  t.CopyToDevice(db->data(), bb.data(), bb.size() * 4);
  t.Gemm(false, false, M, N, K, 1.0f, da->f32(), K, db->f32(), N, 0.0f, dc->f32(), N);
  std::vector<float> got(M * N);
  t.CopyToHost(got.data(), dc->data(), got.size() * 4);
  ExpectClose(got, C.FromCpu(b), 2e-2, 1e-2, "tf32 Gemm");
}

TEST_CASE("cuda elementwise ops match the cpu", "[gpu]") {
  Backends& b = Both();
  const int64_t n = GENERATE(1, 1000, 1 << 20);
  std::mt19937 rng(static_cast<unsigned>(n));
  Twin x = Twin::Of(b, RandomVec(rng, n, -4.0f, 4.0f));
  Twin y = Twin::Of(b, RandomVec(rng, n));
  Twin out = Twin::Of(b, RandomVec(rng, n));
  CAPTURE(n);
  SECTION("Add, also in place") {
    b.cpu->Add(out.c(), x.c(), y.c(), n);
    b.gpu->Add(out.g(), x.g(), y.g(), n);
    ExpectTwinClose(b, out, kElemAtol, kElemRtol, "Add");
    b.cpu->Add(x.c(), x.c(), y.c(), n);
    b.gpu->Add(x.g(), x.g(), y.g(), n);
    ExpectTwinClose(b, x, kElemAtol, kElemRtol, "Add in place");
  }
  SECTION("Axpy accumulates") {
    b.cpu->Axpy(out.c(), x.c(), -0.3f, n);
    b.gpu->Axpy(out.g(), x.g(), -0.3f, n);
    ExpectTwinClose(b, out, kElemAtol, kElemRtol, "Axpy");
  }
  SECTION("Scale") {
    b.cpu->Scale(x.c(), 1.7f, n);
    b.gpu->Scale(x.g(), 1.7f, n);
    ExpectTwinClose(b, x, kElemAtol, kElemRtol, "Scale");
  }
  SECTION("GeluForward overwrites, GeluBackward accumulates") {
    b.cpu->GeluForward(out.c(), x.c(), n);
    b.gpu->GeluForward(out.g(), x.g(), n);
    ExpectTwinClose(b, out, kElemAtol, kElemRtol, "GeluForward");
    Twin din = Twin::Of(b, RandomVec(rng, n));
    b.cpu->GeluBackward(din.c(), x.c(), y.c(), n);
    b.gpu->GeluBackward(din.g(), x.g(), y.g(), n);
    ExpectTwinClose(b, din, kElemAtol, kElemRtol, "GeluBackward");
  }
  SECTION("GeluBackwardBias overwrites the gradient and sums it into the bias") {
    const int64_t F = n >= 37 ? 37 : 1, N = n / F;
    Twin din = Twin::Of(b, RandomVec(rng, N * F)), dbias = Twin::Of(b, RandomVec(rng, F));
    b.cpu->GeluBackwardBias(din.c(), dbias.c(), x.c(), y.c(), N, F);
    b.gpu->GeluBackwardBias(din.g(), dbias.g(), x.g(), y.g(), N, F);
    ExpectTwinClose(b, din, kElemAtol, kElemRtol, "GeluBackwardBias dinp");
    ExpectTwinClose(b, dbias, kGemmAtol, kGemmRtol, "GeluBackwardBias dbias");
  }
  SECTION("SumSquares in double") {
    double c = b.cpu->SumSquares(x.c(), n), g = b.gpu->SumSquares(x.g(), n);
    CHECK(std::abs(g - c) <= 1e-10 * std::abs(c));
    // Deterministic: the same bits again.
    CHECK(b.gpu->SumSquares(x.g(), n) == g);
  }
}

TEST_CASE("cuda RoundToBf16 and WidenBf16 give the cpu's bits", "[gpu]") {
  Backends& b = Both();
  const int64_t n = GENERATE(1, 1000, 1 << 20);
  std::mt19937 rng(static_cast<unsigned>(n) + 11);
  Twin x = Twin::Of(b, RandomVec(rng, n, -300.0f, 300.0f));
  Twin bits = Twin::Of(b, std::vector<uint16_t>(static_cast<size_t>(n), 0));
  b.cpu->RoundToBf16(x.c(), static_cast<uint16_t*>(bits.cpu.data()), n);
  b.gpu->RoundToBf16(x.g(), static_cast<uint16_t*>(bits.gpu.data()), n);
  CHECK(x.FromGpu(b) == x.FromCpu(b));
  CHECK(bits.FromGpu<uint16_t>(b) == bits.FromCpu<uint16_t>(b));
  Twin w = Twin::Of(b, std::vector<float>(static_cast<size_t>(n), 1.0f));
  b.cpu->WidenBf16(w.c(), static_cast<const uint16_t*>(bits.cpu.data()), n);
  b.gpu->WidenBf16(w.g(), static_cast<const uint16_t*>(bits.gpu.data()), n);
  CHECK(w.FromGpu(b) == x.FromCpu(b));  // widening the bits gives the rounded values back
}

TEST_CASE("cuda AddBias and BiasBackward match the cpu", "[gpu]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 77, 4096), OC = GENERATE(3, 768, 2304);
  std::mt19937 rng(static_cast<unsigned>(N * 31 + OC));
  Twin out = Twin::Of(b, RandomVec(rng, N * OC));
  Twin bias = Twin::Of(b, RandomVec(rng, OC));
  CAPTURE(N, OC);
  b.cpu->AddBias(out.c(), bias.c(), N, OC);
  b.gpu->AddBias(out.g(), bias.g(), N, OC);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "AddBias");
  Twin dbias = Twin::Of(b, RandomVec(rng, OC));  // accumulates into existing values
  b.cpu->BiasBackward(dbias.c(), out.c(), N, OC);
  b.gpu->BiasBackward(dbias.g(), out.g(), N, OC);
  ExpectTwinClose(b, dbias, kGemmAtol, kGemmRtol, "BiasBackward");
}

TEST_CASE("cuda LayerNorm forward and backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 67, 2048), C = GENERATE(37, 768, 1600);
  std::mt19937 rng(static_cast<unsigned>(N * 13 + C));
  Twin inp = Twin::Of(b, RandomVec(rng, N * C, -2.0f, 3.0f));
  Twin w = Twin::Of(b, RandomVec(rng, C, 0.5f, 1.5f));
  Twin bias = Twin::Of(b, RandomVec(rng, C));
  Twin out = Twin::Of(b, RandomVec(rng, N * C));
  Twin mean = Twin::Of(b, RandomVec(rng, N)), rstd = Twin::Of(b, RandomVec(rng, N));
  CAPTURE(N, C);
  b.cpu->LayerNormForward(out.c(), mean.c(), rstd.c(), inp.c(), w.c(), bias.c(), N, C);
  b.gpu->LayerNormForward(out.g(), mean.g(), rstd.g(), inp.g(), w.g(), bias.g(), N, C);
  ExpectTwinClose(b, out, kElemAtol, kElemRtol, "LayerNorm out");
  ExpectTwinClose(b, mean, kElemAtol, kElemRtol, "LayerNorm mean");
  ExpectTwinClose(b, rstd, kElemAtol, kElemRtol, "LayerNorm rstd");

  Twin dout = Twin::Of(b, RandomVec(rng, N * C));
  Twin dinp = Twin::Of(b, RandomVec(rng, N * C));
  Twin dw = Twin::Of(b, RandomVec(rng, C)), db = Twin::Of(b, RandomVec(rng, C));
  // Both sides use the CPU's mean/rstd so the backward is compared on identical inputs.
  b.gpu->CopyToDevice(mean.g(), mean.FromCpu(b).data(), mean.bytes);
  b.gpu->CopyToDevice(rstd.g(), rstd.FromCpu(b).data(), rstd.bytes);
  b.cpu->LayerNormBackward(dinp.c(), dw.c(), db.c(), dout.c(), inp.c(), w.c(), mean.c(), rstd.c(), N, C);
  b.gpu->LayerNormBackward(dinp.g(), dw.g(), db.g(), dout.g(), inp.g(), w.g(), mean.g(), rstd.g(), N, C);
  ExpectTwinClose(b, dinp, kGemmAtol, kGemmRtol, "LayerNorm dinp");
  ExpectTwinClose(b, dw, 4 * kGemmAtol, kGemmRtol, "LayerNorm dweight");
  ExpectTwinClose(b, db, 4 * kGemmAtol, kGemmRtol, "LayerNorm dbias");
}

TEST_CASE("cuda embedding forward and deterministic backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const int64_t B = GENERATE(1, 4), T = GENERATE(5, 64), C = GENERATE(32, 768);
  const int32_t V = GENERATE(7, 5003);  // V=7: nearly every token repeats
  const int64_t maxT = T + 3;            // wpe may have more rows than T
  std::mt19937 rng(static_cast<unsigned>(B * 1000 + T * 10 + C + V));
  Twin tokens = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin wte = Twin::Of(b, RandomVec(rng, int64_t{V} * C)), wpe = Twin::Of(b, RandomVec(rng, maxT * C));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  CAPTURE(B, T, C, V);
  b.cpu->EmbeddingForward(out.c(), tokens.ci(), wte.c(), wpe.c(), B, T, C);
  b.gpu->EmbeddingForward(out.g(), tokens.gi(), wte.g(), wpe.g(), B, T, C);
  ExpectTwinClose(b, out, 0.0, 0.0, "EmbeddingForward");  // one fp32 add: exact

  auto dwte0 = RandomVec(rng, int64_t{V} * C), dwpe0 = RandomVec(rng, maxT * C);
  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dwte = Twin::Of(b, dwte0), dwpe = Twin::Of(b, dwpe0);
  b.cpu->EmbeddingBackward(dwte.c(), dwpe.c(), dout.c(), tokens.ci(), B, T, C);
  b.gpu->EmbeddingBackward(dwte.g(), dwpe.g(), dout.g(), tokens.gi(), B, T, C);
  ExpectTwinClose(b, dwte, kElemAtol, kElemRtol, "EmbeddingBackward dwte");
  ExpectTwinClose(b, dwpe, kElemAtol, kElemRtol, "EmbeddingBackward dwpe");

  // Deterministic: the same inputs from the same start give the same bits.
  auto first = dwte.FromGpu(b);
  b.gpu->CopyToDevice(dwte.g(), dwte0.data(), dwte.bytes);
  b.gpu->CopyToDevice(dwpe.g(), dwpe0.data(), dwpe.bytes);
  b.gpu->EmbeddingBackward(dwte.g(), dwpe.g(), dout.g(), tokens.gi(), B, T, C);
  CHECK(dwte.FromGpu(b) == first);
}

TEST_CASE("cuda causal attention forward and backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const auto shape = GENERATE(std::vector<int64_t>{1, 1, 8, 2}, std::vector<int64_t>{2, 67, 96, 4},
                              std::vector<int64_t>{3, 128, 128, 2}, std::vector<int64_t>{1, 256, 768, 12});
  const int64_t B = shape[0], T = shape[1], C = shape[2], NH = shape[3];
  std::mt19937 rng(static_cast<unsigned>(B + T + C + NH));
  CAPTURE(B, T, C, NH);
  Twin qkv = Twin::Of(b, RandomVec(rng, B * T * 3 * C, -2.0f, 2.0f));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin att = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionForward(out.c(), att.c(), qkv.c(), B, T, C, NH);
  b.gpu->AttentionForward(out.g(), att.g(), qkv.g(), B, T, C, NH);
  ExpectTwinClose(b, out, kGemmAtol, kGemmRtol, "attention out");

  // `att` is each backend's own stash for its backward (the GPU keeps the probabilities,
  // the CPU each row's log-sum-exp), so it is not compared; each backward reads its own.
  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dqkv = Twin::Of(b, RandomVec(rng, B * T * 3 * C));  // accumulates
  Twin scratch = Twin::Of(b, RandomVec(rng, B * NH * T * T));
  b.cpu->AttentionBackward(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, C, NH);
  b.gpu->AttentionBackward(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, C, NH);
  ExpectTwinClose(b, dqkv, 4 * kGemmAtol, 4 * kGemmRtol, "attention dqkv");
}

// When cuBLASLt offers no algorithm for the heads' strided batch, attention runs one GEMM
// per head (kernels/cuda/attention.cc). On the emulator, L2L_CUDA_EMU_LT_NO_BATCHED=1
// forces that path (a fresh backend, so no batched plan is cached); on a GPU the variable
// does nothing and this repeats the batched check. fp32 and bf16 GEMM modes.
TEST_CASE("cuda attention matches the cpu through the one-GEMM-per-head fallback", "[gpu]") {
  Backends& b = Both();
  const bool bf16 = GENERATE(false, true);
  CAPTURE(bf16);
  ScopedEnv env("L2L_CUDA_EMU_LT_NO_BATCHED", "1");
  kernels::CudaBackendOptions opt;
  opt.gemm = bf16 ? kernels::CudaGemmPrecision::kBf16 : kernels::CudaGemmPrecision::kFp32;
  auto fresh = kernels::CreateCudaBackend(0, opt);
  REQUIRE(fresh.ok());
  Backends fb;
  fb.cpu = kernels::CreateCpuBackend(0);
  fb.gpu = std::move(fresh).value();
  const int64_t B = 2, T = 37, C = 96, NH = 4;
  std::mt19937 rng(11);
  // bf16 inputs: compare with the CPU on the same rounded values would need the rounding
  // bounds of bf16_gemm_test.cc; here only the path matters, so bf16 uses loose bounds.
  const double atol = bf16 ? 2e-2 : kGemmAtol, rtol = bf16 ? 2e-2 : kGemmRtol;
  Twin qkv = Twin::Of(fb, RandomVec(rng, B * T * 3 * C, -1.0f, 1.0f));
  Twin out = Twin::Of(fb, RandomVec(rng, B * T * C));
  Twin att = Twin::Of(fb, RandomVec(rng, B * NH * T * T));
  fb.cpu->AttentionForward(out.c(), att.c(), qkv.c(), B, T, C, NH);
  fb.gpu->AttentionForward(out.g(), att.g(), qkv.g(), B, T, C, NH);
  ExpectTwinClose(fb, out, atol, rtol, "attention out");  // att: each backend's own stash
  Twin dout = Twin::Of(fb, RandomVec(rng, B * T * C));
  Twin dqkv = Twin::Of(fb, RandomVec(rng, B * T * 3 * C));
  Twin scratch = Twin::Of(fb, RandomVec(rng, B * NH * T * T));
  fb.cpu->AttentionBackward(dqkv.c(), scratch.c(), dout.c(), qkv.c(), att.c(), B, T, C, NH);
  fb.gpu->AttentionBackward(dqkv.g(), scratch.g(), dout.g(), qkv.g(), att.g(), B, T, C, NH);
  ExpectTwinClose(fb, dqkv, 4 * atol, 4 * rtol, "attention dqkv");
  (void)b;
}

TEST_CASE("cuda cross entropy forward and backward match the cpu", "[gpu]") {
  Backends& b = Both();
  const int64_t N = GENERATE(1, 33), V = GENERATE(2, 1000, 50257);
  const bool alias = GENERATE(false, true);  // probs written over the logits
  std::mt19937 rng(static_cast<unsigned>(N * 7 + V + alias));
  CAPTURE(N, V, alias);
  Twin logits = Twin::Of(b, RandomVec(rng, N * V, -5.0f, 5.0f));
  Twin targets = Twin::Of(b, RandomTokens(rng, N, static_cast<int32_t>(V)));
  Twin probs_buf = Twin::Of(b, RandomVec(rng, N * V));
  Twin& probs = alias ? logits : probs_buf;
  Twin losses = Twin::Of(b, RandomVec(rng, N));
  b.cpu->CrossEntropyForward(losses.c(), probs.c(), logits.c(), targets.ci(), N, V);
  b.gpu->CrossEntropyForward(losses.g(), probs.g(), logits.g(), targets.gi(), N, V);
  ExpectTwinClose(b, losses, 1e-4, 1e-5, "cross-entropy losses");
  ExpectTwinClose(b, probs, 1e-7, 1e-4, "softmax probs");

  const float scale = 1.0f / (N * 2);
  Twin dlogits_buf = Twin::Of(b, RandomVec(rng, N * V));
  Twin& dlogits = alias ? probs : dlogits_buf;  // OVERWRITES, may alias probs
  b.gpu->CopyToDevice(probs.g(), probs.FromCpu(b).data(), probs.bytes);
  b.cpu->CrossEntropyBackward(dlogits.c(), probs.c(), targets.ci(), scale, N, V);
  b.gpu->CrossEntropyBackward(dlogits.g(), probs.g(), targets.gi(), scale, N, V);
  ExpectTwinClose(b, dlogits, 1e-8, 1e-5, "cross-entropy dlogits");
}

// ---- CUDA-only bf16 entry points -------------------------------------------------------

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}
std::vector<float> RoundBf16(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = Bf16ToFloat(FloatToBf16(v[i]));
  return out;
}

TEST_CASE("cuda f32 to bf16 casts round to nearest even like common/dtype.h", "[gpu]") {
  Backends& b = Both();
  std::mt19937 rng(5);
  auto x = RandomVec(rng, 100003, -1e4f, 1e4f);
  x[0] = 1.0f + 0x1.0p-8f;  // a tie: rounds to even (1.0)
  x[1] = 1.0f + 3 * 0x1.0p-8f;  // a tie: rounds up to even
  x[2] = -0.0f;
  x[3] = 3.0e38f;
  Twin src = Twin::Of(b, x);
  auto dst = DeviceBuffer::Create(b.gpu.get(), x.size() * 2);
  auto back = DeviceBuffer::Create(b.gpu.get(), x.size() * 4);
  REQUIRE((dst.ok() && back.ok()));
  auto* bf = static_cast<uint16_t*>(dst->data());
  REQUIRE(kernels::CastF32ToBf16(*b.gpu, bf, src.g(), static_cast<int64_t>(x.size())).ok());
  REQUIRE(kernels::CastBf16ToF32(*b.gpu, back->f32(), bf, static_cast<int64_t>(x.size())).ok());
  std::vector<uint16_t> got(x.size());
  b.gpu->CopyToHost(got.data(), bf, got.size() * 2);
  CHECK(got == ToBf16(x));
  std::vector<float> widened(x.size());
  b.gpu->CopyToHost(widened.data(), back->data(), widened.size() * 4);
  CHECK(widened == RoundBf16(x));
  // The bf16 entry points refuse a non-CUDA backend with a message.
  Status st = kernels::CastF32ToBf16(*b.cpu, bf, src.c(), 1);
  CHECK(st.code() == StatusCode::kInvalidArgument);
}

TEST_CASE("cuda bf16 GEMM with fp32 accumulation and epilogues matches the cpu", "[gpu]") {
  Backends& b = Both();
  const bool ta = GENERATE(false, true), tb = GENERATE(false, true);
  const bool c_bf16 = GENERATE(false, true);
  const auto epi = GENERATE(kernels::GemmEpilogue::kNone, kernels::GemmEpilogue::kBias,
                            kernels::GemmEpilogue::kGelu, kernels::GemmEpilogue::kBiasGelu);
  const int64_t M = 192, N = 320, K = 256;  // multiples of 8: the bf16 tensor-core paths
  std::mt19937 rng(static_cast<unsigned>(ta + 2 * tb + 4 * c_bf16 + 8 * int(epi)));
  CAPTURE(ta, tb, c_bf16, int(epi));
  auto a = RoundBf16(RandomVec(rng, M * K)), bm = RoundBf16(RandomVec(rng, K * N));
  auto bias = RandomVec(rng, N);
  if (c_bf16) bias = RoundBf16(bias);
  const bool has_bias = epi == kernels::GemmEpilogue::kBias || epi == kernels::GemmEpilogue::kBiasGelu;
  const bool has_gelu = epi == kernels::GemmEpilogue::kGelu || epi == kernels::GemmEpilogue::kBiasGelu;
  const float beta = has_gelu ? 0.0f : 0.5f;
  auto c0 = RandomVec(rng, M * N);
  if (c_bf16) c0 = RoundBf16(c0);

  // CPU reference in fp32 on the bf16-rounded values.
  Twin A = Twin::Of(b, a), Bm = Twin::Of(b, bm), Bias = Twin::Of(b, bias), Cref = Twin::Of(b, c0);
  b.cpu->Gemm(ta, tb, M, N, K, 1.0f, A.c(), ta ? M : K, Bm.c(), tb ? K : N, beta, Cref.c(), N);
  if (has_bias) b.cpu->AddBias(Cref.c(), Bias.c(), M, N);
  if (has_gelu) b.cpu->GeluForward(Cref.c(), Cref.c(), M * N);
  auto ref = Cref.FromCpu(b);

  // GPU: A and B as bf16 (the row-major data is the same whether or not op() transposes).
  Twin A16 = Twin::Of(b, ToBf16(a)), B16 = Twin::Of(b, ToBf16(bm));
  Twin Bias16 = Twin::Of(b, ToBf16(bias));
  Twin C = c_bf16 ? Twin::Of(b, ToBf16(c0)) : Twin::Of(b, c0);
  kernels::Bf16GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.beta = beta;
  g.A = static_cast<const uint16_t*>(A16.gpu.data());
  g.lda = ta ? M : K;
  g.B = static_cast<const uint16_t*>(B16.gpu.data());
  g.ldb = tb ? K : N;
  g.C = C.gpu.data();
  g.ldc = N;
  g.c_bf16 = c_bf16;
  g.epilogue = epi;
  g.bias = c_bf16 ? Bias16.gpu.data() : Bias.gpu.data();
  Status st = kernels::GemmBf16(*b.gpu, g);
  INFO(st.ToString());
  REQUIRE(st.ok());
  std::vector<float> got;
  if (c_bf16) {
    for (uint16_t h : C.FromGpu<uint16_t>(b)) got.push_back(Bf16ToFloat(h));
  } else {
    got = C.FromGpu(b);
  }
  const double atol = (c_bf16 ? 1e-3 : 1e-4) + (has_gelu ? 2e-3 : 0.0);
  const double rtol = c_bf16 ? 8e-3 : (has_gelu ? 1e-3 : 1e-4);
  ExpectClose(got, ref, atol, rtol, "bf16 GEMM");
}

}  // namespace
}  // namespace l2l::gpu_test

// Shared helpers of the emulated cuBLASLt tests (cublaslt_test.cc,
// cublaslt_errors_test.cc): device buffers and streams, a problem description (Spec)
// and its descriptors (Plan), random operands stored exactly as on the device with NaN
// padding, and an independent double-precision reference (with its own TF32 rounding and
// GELU) that RunAndCheck compares every element against.
// Ownership: DevMem, Stream and Plan own what they create (RAII).
// Thread-safety: none needed; each test builds its own.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "tests/cuda_emu/emu_test_util.h"

namespace cublaslt_test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kSentinel = 1152.0f;  // marks padding; exact in bf16
inline constexpr double kPi = 3.14159265358979323846;

// ---- Device memory and streams (emu_test_util.h) ---------------------------------------
using emu_test::DevMem;
using emu_test::Get;
using emu_test::Put;
using emu_test::Stream;

// ---- Independent number formats (written here, not taken from the emulator) ------------

// bf16 bits of a float that must be exactly representable in bf16.
inline uint16_t ExactBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  REQUIRE((u & 0xffffu) == 0u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16BitsToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds x to `bits` significant bits, nearest even (the default rounding mode of
// nearbyint), for normal numbers.
inline double RoundSignificand(double x, int bits) {
  if (x == 0.0 || !std::isfinite(x)) return x;
  int e;
  const double m = std::frexp(x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}
inline double Tf32(double x) { return RoundSignificand(x, 11); }  // 1 implicit + 10 explicit bits

inline double Gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}

// ---- Problems --------------------------------------------------------------------------

struct Spec {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;  // 0: the stored rows
  int32_t batch = 1;
  int64_t sa = 0, sb = 0, sc = 0;  // batch strides, elements
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  float alpha = 1.0f, beta = 0.0f;

  int64_t a_rows() const { return ta == CUBLAS_OP_N ? m : k; }
  int64_t a_cols() const { return ta == CUBLAS_OP_N ? k : m; }
  int64_t b_rows() const { return tb == CUBLAS_OP_N ? k : n; }
  int64_t b_cols() const { return tb == CUBLAS_OP_N ? n : k; }
  int64_t LdA() const { return lda ? lda : a_rows(); }
  int64_t LdB() const { return ldb ? ldb : b_rows(); }
  int64_t LdC() const { return ldc ? ldc : m; }
};

inline int64_t Extent(int64_t rows, int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
  return (cols - 1) * ld + rows + (batch - 1) * stride;
}

// Largest power of two (<= 256) dividing the address and, for batches, the stride in
// bytes — what kernels/cuda/gemm.cc asks the heuristic for.
inline uint32_t AlignOf(const void* p, int64_t stride_bytes, int32_t batch) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1) v |= static_cast<uint64_t>(stride_bytes);
  return static_cast<uint32_t>(v & (~v + 1));
}

// Descriptors for one Spec (one handle each), destroyed with it.
struct Plan {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;

  explicit Plan(const Spec& s) {
    REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc, s.compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const int32_t ta = s.ta, tb = s.tb;
    const uint32_t epi = s.epi;
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                           sizeof(epi)) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&a, s.ab, s.a_rows(), s.a_cols(), s.LdA()) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b, s.ab, s.b_rows(), s.b_cols(), s.LdB()) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&c, s.cd, s.m, s.n, s.LdC()) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&d, s.cd, s.m, s.n, s.LdC()) == CUBLAS_STATUS_SUCCESS);
    if (s.batch > 1) {
      const int64_t strides[4] = {s.sa, s.sb, s.sc, s.sc};
      cublasLtMatrixLayout_t ls[4] = {a, b, c, d};
      for (int i = 0; i < 4; ++i) {
        REQUIRE(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                 &s.batch,
                                                 sizeof(s.batch)) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                 &strides[i],
                                                 sizeof(strides[i])) == CUBLAS_STATUS_SUCCESS);
      }
    }
  }
  ~Plan() {
    for (auto* l : {a, b, c, d}) {
      if (l) (void)cublasLtMatrixLayoutDestroy(l);
    }
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
    if (h) (void)cublasLtDestroy(h);
  }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  void SetBias(const void* bias) {
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias)) == CUBLAS_STATUS_SUCCESS);
  }

  struct Heur {
    cublasStatus_t st;
    int count;
    cublasLtMatmulAlgo_t algo;
  };
  // Alignments for A, B, C, D (bytes; the preference's default is 256).
  Heur Heuristic(uint32_t align_a = 256, uint32_t align_b = 256, uint32_t align_c = 256,
                 uint32_t align_d = 256) const {
    cublasLtMatmulPreference_t pref = nullptr;
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    const uint64_t ws = 1 << 20;
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS);
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attr, v] : aligns) {
      REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof(v)) ==
              CUBLAS_STATUS_SUCCESS);
    }
    cublasLtMatmulHeuristicResult_t r{};
    int count = -1;
    Heur out{};
    out.st = cublasLtMatmulAlgoGetHeuristic(h, desc, a, b, c, d, pref, 1, &r, &count);
    out.count = count;
    out.algo = r.algo;
    if (out.st == CUBLAS_STATUS_SUCCESS && count == 1) {
      CHECK(r.state == CUBLAS_STATUS_SUCCESS);
    }
    REQUIRE(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
    return out;
  }

  cublasStatus_t Matmul(const Spec& s, const void* A, const void* B, const void* C, void* D,
                        const cublasLtMatmulAlgo_t* algo, cudaStream_t stream) const {
    return cublasLtMatmul(h, desc, &s.alpha, A, a, B, b, &s.beta, C, c, D, d, algo, nullptr, 0,
                          stream);
  }
};

// Host images of the operands exactly as stored on the device (padding NaN), as floats.
struct Operands {
  std::vector<float> a, b, c, bias;
};

// Random values; for bf16 inputs, multiples of 1/64 in [-2, 2] (exact in bf16).
inline Operands MakeOperands(const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::uniform_int_distribution<int> grid(-128, 128);
  auto value = [&](cudaDataType_t t) {
    return t == CUDA_R_16BF ? static_cast<float>(grid(rng)) / 64.0f : uni(rng);
  };
  auto fill = [&](std::vector<float>& v, int64_t rows, int64_t cols, int64_t ld, int64_t stride,
                  cudaDataType_t t) {
    v.assign(static_cast<size_t>(Extent(rows, cols, ld, s.batch, stride)), kNaN);
    for (int32_t bt = 0; bt < s.batch; ++bt) {
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i) v[bt * stride + i + j * ld] = value(t);
      }
    }
  };
  Operands o;
  fill(o.a, s.a_rows(), s.a_cols(), s.LdA(), s.sa, s.ab);
  fill(o.b, s.b_rows(), s.b_cols(), s.LdB(), s.sb, s.ab);
  fill(o.c, s.m, s.n, s.LdC(), s.sc, s.cd);
  o.bias.resize(static_cast<size_t>(s.m));
  for (auto& x : o.bias) x = value(s.cd);
  return o;
}

// Copies a host image to the device in type t.
inline void PutAs(void* dst, const std::vector<float>& v, cudaDataType_t t) {
  if (t == CUDA_R_32F) return Put(dst, v);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = std::isnan(v[i]) ? 0x7fc0 : ExactBf16Bits(v[i]);
  Put(dst, bits);
}
inline std::vector<float> GetAs(const void* src, size_t n, cudaDataType_t t) {
  if (t == CUDA_R_32F) return Get<float>(src, n);
  std::vector<uint16_t> bits = Get<uint16_t>(src, n);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Bf16BitsToFloat(bits[i]);
  return v;
}
inline size_t Bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// want: reference results; tol: allowed error per element (fp32 accumulation and, for a
// bf16 D, half a bf16 ulp).
struct Expected {
  std::vector<double> want, tol;
};

inline Expected Reference(const Spec& s, const Operands& o) {
  const bool tf32 = s.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  Expected e;
  e.want.assign(static_cast<size_t>(s.batch * s.m * s.n), 0.0);
  e.tol = e.want;
  for (int32_t bt = 0; bt < s.batch; ++bt) {
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t i = 0; i < s.m; ++i) {
        double sum = 0.0, mag = 0.0;
        for (int64_t l = 0; l < s.k; ++l) {
          double x = s.ta == CUBLAS_OP_N ? o.a[bt * s.sa + i + l * s.LdA()]
                                         : o.a[bt * s.sa + l + i * s.LdA()];
          double y = s.tb == CUBLAS_OP_N ? o.b[bt * s.sb + l + j * s.LdB()]
                                         : o.b[bt * s.sb + j + l * s.LdB()];
          if (tf32) {
            x = Tf32(x);
            y = Tf32(y);
          }
          sum += x * y;
          mag += std::fabs(x * y);
        }
        double v = s.alpha * sum;
        mag = std::fabs(s.alpha) * mag;
        if (s.beta != 0.0f) {
          const double cv = o.c[bt * s.sc + i + j * s.LdC()];
          v += s.beta * cv;
          mag += std::fabs(s.beta * cv);
        }
        const bool bias = s.epi == CUBLASLT_EPILOGUE_BIAS || s.epi == CUBLASLT_EPILOGUE_GELU_BIAS ||
                          s.epi == CUBLASLT_EPILOGUE_RELU_BIAS;
        if (bias) {
          v += o.bias[i];
          mag += std::fabs(o.bias[i]);
        }
        if (s.epi == CUBLASLT_EPILOGUE_GELU || s.epi == CUBLASLT_EPILOGUE_GELU_BIAS) v = Gelu(v);
        if (s.epi == CUBLASLT_EPILOGUE_RELU || s.epi == CUBLASLT_EPILOGUE_RELU_BIAS)
          v = v > 0 ? v : 0;
        double tol = 1e-6 * (mag + 1e-3) * (s.k + 4) / 4.0;
        if (s.cd == CUDA_R_16BF) tol += std::ldexp(std::fabs(v), -8) * 1.0001;
        const size_t idx = static_cast<size_t>(bt * s.m * s.n + i + j * s.m);
        e.want[idx] = v;
        e.tol[idx] = tol;
      }
    }
  }
  return e;
}

// Runs s on the device (through the heuristic, with D a separate buffer or, when
// `in_place`, D == C) and checks every element against the reference, and that D's
// padding is untouched.
inline void RunAndCheck(const Spec& s, uint32_t seed, bool in_place = false) {
  Operands o = MakeOperands(s, seed);
  Expected e = Reference(s, o);
  const size_t ab = Bytes(s.ab), cd = Bytes(s.cd);
  DevMem A(o.a.size() * ab), B(o.b.size() * ab), C(o.c.size() * cd), D(o.c.size() * cd),
      bias(o.bias.size() * cd);
  PutAs(A.p, o.a, s.ab);
  PutAs(B.p, o.b, s.ab);
  PutAs(C.p, o.c, s.cd);
  std::vector<float> d_init(o.c.size(), kNaN);
  for (size_t i = 0; i < d_init.size(); ++i) {
    if (std::isnan(o.c[i])) d_init[i] = kSentinel;  // padding
  }
  PutAs(D.p, d_init, s.cd);
  if (in_place)
    PutAs(
        C.p,
        [&] {
          std::vector<float> v = o.c;
          for (auto& x : v)
            if (std::isnan(x)) x = kSentinel;
          return v;
        }(),
        s.cd);
  PutAs(bias.p, o.bias, s.cd);
  void* dst = in_place ? C.p : D.p;

  Plan plan(s);
  plan.SetBias(bias.p);
  // Ask for the alignments the pointers and strides have, as kernels/cuda/gemm.cc does.
  Plan::Heur hr =
      plan.Heuristic(AlignOf(A.p, s.sa * ab, s.batch), AlignOf(B.p, s.sb * ab, s.batch),
                     AlignOf(C.p, s.sc * cd, s.batch), AlignOf(dst, s.sc * cd, s.batch));
  REQUIRE(hr.st == CUBLAS_STATUS_SUCCESS);
  REQUIRE(hr.count == 1);
  Stream stream;
  REQUIRE(plan.Matmul(s, A.p, B.p, C.p, dst, &hr.algo, stream.s) == CUBLAS_STATUS_SUCCESS);
  stream.Sync();
  std::vector<float> got = GetAs(dst, o.c.size(), s.cd);
  int bad = 0;
  for (int32_t bt = 0; bt < s.batch; ++bt) {
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t i = 0; i < s.m; ++i) {
        const double g = got[bt * s.sc + i + j * s.LdC()];
        const size_t idx = static_cast<size_t>(bt * s.m * s.n + i + j * s.m);
        if (!(std::fabs(g - e.want[idx]) <= e.tol[idx]) && bad++ < 5) {
          FAIL_CHECK("D(" << i << "," << j << ") batch " << bt << ": got " << g << ", want "
                          << e.want[idx] << " +- " << e.tol[idx]);
        }
      }
    }
  }
  CHECK(bad == 0);
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(o.c[i])) {
      INFO("padding element " << i);
      REQUIRE(got[i] == kSentinel);
    }
  }
}

}  // namespace cublaslt_test

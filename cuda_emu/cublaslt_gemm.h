// Internal to cuda_emu: the CPU GEMM behind the emulated cublasLtMatmul
// (cublaslt.cc validates and queues; cublaslt_gemm.cc computes). A MatmulWork holds a
// validated problem and raw pointers, copied out of the caller's descriptors, so it can
// run later on a stream thread.
//
// The GEMM: per batch, op(A) rows and op(B) columns are packed as contiguous fp32 rows
// (bf16 widened exactly, TF32 rounded to nearest even), K padded to a multiple of 4 with
// zeros; 64 x 64 output tiles run in parallel (oneTBB) and each element is a dot product
// in 4 SIMD lanes summed in a fixed order, so results do not depend on the partitioning
// (bitwise reproducible run to run, as l2l's kernels promise). Then
// D = epilogue(alpha * acc + beta * C + bias), C read only when beta != 0, rounded to D's
// type (bf16: nearest even).
//
// Ownership: MatmulWork owns nothing; the caller keeps every buffer alive until the work
// has run. Thread-safety: operator() may run on any thread; it only reads the inputs and
// writes D (distinct tiles from distinct TBB tasks).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace l2l_cuda_emu::lt {

inline size_t TypeBytes(uint32_t t) { return t == CUDA_R_16BF ? 2 : 4; }

inline bool HasBias(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
         e == CUBLASLT_EPILOGUE_GELU_BIAS;
}
inline bool HasRelu(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_BIAS;
}
inline bool HasGelu(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS;
}

// A validated problem, copied out of the descriptors (the queued work must not read them:
// the caller may change or destroy them as soon as cublasLtMatmul returns).
struct Problem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int32_t batch = 1;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0, stride_d = 0;
  uint32_t ab_type = CUDA_R_32F, cd_type = CUDA_R_32F;
  bool tf32 = false;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  uint32_t bias_type = CUDA_R_32F;
  uint64_t signature = 0;  // what an algorithm is tied to
};

// One queued cublasLtMatmul. Types: A/B CUDA_R_32F or CUDA_R_16BF, C/D likewise, bias
// of bias_type; alpha and beta already read from the host.
struct MatmulWork {
  Problem p;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;

  void operator()() const;
  void OneBatch(int64_t batch, std::vector<float>& ap, std::vector<float>& bp) const;
};

}  // namespace l2l_cuda_emu::lt

// LtGemm: row-major GEMMs through cuBLASLt, with a plan cache. cuBLASLt is
// column-major; a row-major C (M,N) is the column-major C^T (N,M) = op(B)^T op(A)^T, so
// Run() swaps the operands and describes each buffer by its stored shape — no copies,
// no transposes. Plans (operation descriptor, three layouts, the heuristic's algorithm)
// are cached per (shape, layout, dtypes, epilogue, pointer alignment): the heuristic
// query costs tens of microseconds, the cached lookup well under one.
//
// Used for: the fp32 Backend::Gemm (CUBLAS_COMPUTE_32F, or _FAST_TF32), the batched
// attention products (strided batches), and the bf16 GEMMs with fp32 accumulation and
// bias/GELU epilogues.
//
// Internal to kernels/cuda: exposes CUDA types. Ownership: owns a cuBLASLt handle and
// its workspace. Thread-safety: one thread at a time (the plan cache is unguarded).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>

#include "common/status.h"
#include "kernels/cuda/cuda_resources.h"

namespace l2l::kernels::cuda {

// C (M,N) = epilogue(alpha * op(A) @ op(B) + beta * C), row-major; A (M,K) or (K,M)
// when trans_a; B (K,N) or (N,K) when trans_b. Leading dimensions in elements.
// batch > 1: matrix i starts at A + i*stride_a (elements), etc.; batches may interleave
// (stride smaller than a matrix) as long as outputs do not overlap.
struct LtGemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  cudaDataType_t ab_type = CUDA_R_32F;  // CUDA_R_32F or CUDA_R_16BF
  cudaDataType_t c_type = CUDA_R_32F;   // CUDA_R_32F or CUDA_R_16BF
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;  // or CUBLAS_COMPUTE_32F_FAST_TF32
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;  // (N) of c_type, for the BIAS epilogues
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

class LtGemm {
 public:
  LtGemm();
  static Result<LtGemm> Create(size_t workspace_bytes);
  ~LtGemm();
  LtGemm(LtGemm&&) noexcept;
  LtGemm& operator=(LtGemm&&) noexcept;

  // Queues the GEMM on `stream`. INVALID_ARGUMENT names a bad shape or leading
  // dimension; NOT_FOUND when cuBLASLt offers no algorithm for this case (callers may
  // fall back to smaller problems); INTERNAL for a cuBLASLt failure.
  Status Run(const LtGemmArgs& args, cudaStream_t stream);

  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  struct Plan;
  using Key = std::array<int64_t, 19>;
  Result<Plan*> GetPlan(const LtGemmArgs& a);

  CublasLtHandle handle_;
  CudaBuffer workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace l2l::kernels::cuda

// One generic GPU error check (ggml's CUDA_CHECK_GEN, nccl's checks.h) and the macros
// built from it: L2L_CUDA_CHECK / L2L_CUBLAS_CHECK abort with a message naming the
// statement, the device and file:line (for the void compute ops, where a GPU error is a
// bug or a dead device and there is nothing to return); L2L_CUDA_RETURN_IF_ERROR /
// L2L_CUBLAS_RETURN_IF_ERROR return an l2l::Status instead (setup paths: device
// selection, allocation, handle creation). L2L_CUDA_CHECK_LAUNCH() follows every kernel
// launch: it reads cudaGetLastError(), so a bad launch configuration is caught at the
// launch that made it, not at the next synchronisation.
//
// Internal to kernels/cuda: this header exposes CUDA types.
// Thread-safety: stateless.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace l2l::kernels::cuda {

inline const char* GpuErrorString(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* GpuErrorString(cublasStatus_t s) { return cublasLtGetStatusString(s); }

// "cudaMalloc(&p, bytes) failed on cuda:0: out of memory (kernels/cuda/x.cc:42)".
std::string GpuErrorMessage(const char* stmt, const char* what, const char* file, int line);

// Aborts the process with GpuErrorMessage(...). Never returns.
[[noreturn]] void GpuCheckFailed(const char* stmt, const char* what, const char* file, int line);

}  // namespace l2l::kernels::cuda

// The generic form: `expr` returns a status value comparable with `success`;
// `to_string` turns it into text.
#define L2L_GPU_CHECK_GEN(expr, success, to_string)                                         \
  do {                                                                                      \
    auto l2l_gpu_err_ = (expr);                                                             \
    if (l2l_gpu_err_ != (success)) {                                                        \
      ::l2l::kernels::cuda::GpuCheckFailed(#expr, to_string(l2l_gpu_err_), __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

#define L2L_GPU_RETURN_IF_ERROR_GEN(expr, success, to_string, code_fn)                       \
  do {                                                                                      \
    auto l2l_gpu_err_ = (expr);                                                             \
    if (l2l_gpu_err_ != (success)) {                                                        \
      return ::l2l::code_fn(::l2l::kernels::cuda::GpuErrorMessage(                           \
          #expr, to_string(l2l_gpu_err_), __FILE__, __LINE__));                             \
    }                                                                                       \
  } while (0)

#define L2L_CUDA_CHECK(expr) \
  L2L_GPU_CHECK_GEN(expr, cudaSuccess, ::l2l::kernels::cuda::GpuErrorString)
#define L2L_CUBLAS_CHECK(expr) \
  L2L_GPU_CHECK_GEN(expr, CUBLAS_STATUS_SUCCESS, ::l2l::kernels::cuda::GpuErrorString)
#define L2L_CUDA_RETURN_IF_ERROR(expr) \
  L2L_GPU_RETURN_IF_ERROR_GEN(expr, cudaSuccess, ::l2l::kernels::cuda::GpuErrorString, Internal)
#define L2L_CUBLAS_RETURN_IF_ERROR(expr)                                                 \
  L2L_GPU_RETURN_IF_ERROR_GEN(expr, CUBLAS_STATUS_SUCCESS, ::l2l::kernels::cuda::GpuErrorString, \
                              Internal)
// After every <<<...>>>: catches invalid configurations and earlier asynchronous faults.
#define L2L_CUDA_CHECK_LAUNCH() L2L_CUDA_CHECK(cudaGetLastError())

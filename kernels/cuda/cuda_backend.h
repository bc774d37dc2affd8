// The CUDA backend: kernels::Backend on one NVIDIA GPU (cuBLASLt GEMMs + our kernels in
// kernels/cuda/*.cu), plus the extra bf16 entry points the optimised worker path uses.
// This header exposes NO CUDA types, so kernels/backend.cc (the one place that registers
// backends) and the GPU tests include it from plain C++; everything CUDA stays in
// kernels/cuda/. Built only when CMake finds nvcc (L2L_HAVE_CUDA).
//
// It implements the Backend's optional asynchronous transfers (kernels/backend.h) with
// kernels/cuda/copy_queue.h: CreateCopyQueue gives a stream of its own, CreateEvent a
// cudaEvent (timing disabled), RecordEvent/WaitEvent order the compute stream against
// them, AllocHost is cudaMallocHost and PinHostRange cudaHostRegister (read-only ranges
// with cudaHostRegisterReadOnly). The worker moves layers, gradients and the host stash
// through these (worker/prefetch.h, worker/stash.h).
//
// Ownership: the returned Backend owns its device context use, a non-blocking compute
// stream, a cuBLASLt handle with its workspace, a scratch buffer some ops use
// (column-sum partials, the embedding-backward sort) and, in kBf16 mode, two scratch
// buffers for the bf16 copies of GEMM operands (grown on demand, counted as internal).
// Memory from Alloc() is the caller's to Free(); copy queues, events, host buffers and
// pins are the caller's too.
// Thread-safety: as kernels::Backend, one thread at a time; the backend makes its device
// current at the start of each call, so several backends may live in one process.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"

namespace l2l::kernels {

// How the fp32 GEMMs of the backend (Backend::Gemm and the attention products) compute.
// kFp32: CUBLAS_COMPUTE_32F (IEEE fp32, the default; what the conformance test compares
// at fp32 tolerances). kTf32: inputs rounded to TF32 (10-bit mantissa) on the tensor
// cores, fp32 accumulation; ~relative 1e-3 per product. kBf16: PyTorch bf16-autocast
// numerics for matmul: both operands are cast to bf16 (round to nearest even) into
// backend-owned scratch, then a bf16 tensor-core GEMM accumulates in fp32; unlike
// autocast the output stays fp32 (C, alpha and beta as in fp32 mode). Each operand
// moves by at most 2^-8 relative (bf16's unit roundoff), a product by at most ~2^-7.
// Environment override (wins over the options): L2L_CUDA_GEMM=fp32|tf32|bf16
// (common/env.h).
enum class CudaGemmPrecision { kFp32, kTf32, kBf16 };
const char* ToString(CudaGemmPrecision p);                             // "fp32" | "tf32" | "bf16"
Result<CudaGemmPrecision> ParseCudaGemmPrecision(std::string_view s);  // inverse of ToString

// How the attention ops compute. kFlash: the fused kernels of kernels/cuda/
// flash_attention.h (no (T,T) buffer; att keeps B*NH*T log-sum-exps) for head sizes 64,
// 80, 96 and 128, the GEMM path for others; products in fp32 FMA, or bf16 WMMA with fp32
// accumulation in the kBf16 GEMM mode (tf32 mode computes as fp32 there). kGemm:
// kernels/cuda/attention.h (cuBLASLt GEMMs around a softmax, att the (B,NH,T,T)
// probabilities). Environment override: L2L_CUDA_ATTENTION=flash|gemm (common/env.h).
enum class CudaAttentionKind { kFlash, kGemm };
const char* ToString(CudaAttentionKind k);                             // "flash" | "gemm"
Result<CudaAttentionKind> ParseCudaAttentionKind(std::string_view s);  // inverse of ToString

struct CudaBackendOptions {
  CudaGemmPrecision gemm = CudaGemmPrecision::kFp32;
  CudaAttentionKind attention = CudaAttentionKind::kFlash;
  // cuBLASLt workspace (32 MiB is NVIDIA's recommendation for Hopper).
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // Scratch for column-sum partials and the embedding-backward sort; grows (with a
  // device sync) if an op ever needs more.
  size_t scratch_bytes = size_t{32} << 20;
  // bf16 mode: reuse a GEMM operand's bf16 copy that a producer op wrote beside its output
  // or the previous GEMM cast (kernels/cuda/bf16_operands.h; bit-identical either way).
  // false casts every operand that is not a noted layer copy (the tests compare the two).
  bool reuse_bf16_operands = true;
  // With reuse: keep the copies a layer holds (Backend::HoldBf16Copy) past other ops.
  // false ignores the holds (the tests measure what they save; bit-identical either way).
  bool hold_bf16_copies = true;
};

// Number of CUDA devices visible (0 when there is no driver or no GPU; never fails).
int CudaDeviceCount();

// A CUDA backend on device `device` (0-based). Fails with a message naming the device
// and the reason: no driver, no such device, out of memory for the workspace.
Result<std::unique_ptr<Backend>> CreateCudaBackend(int device);
Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, const CudaBackendOptions& options);

// Device memory as the backend sees it. allocated: bytes of live Alloc()ations;
// peak_allocated: their high-water mark since creation (or the last reset); internal:
// the backend's own buffers (GEMM workspace, op scratch); device_used / device_total:
// the whole GPU per cudaMemGetInfo (every process and context on it).
struct CudaMemoryStats {
  size_t allocated = 0;
  size_t peak_allocated = 0;
  size_t internal = 0;
  size_t device_used = 0;
  size_t device_total = 0;
};
Result<CudaMemoryStats> GetCudaMemoryStats(Backend& backend);
// Restarts peak_allocated from the current allocated bytes.
Status ResetCudaPeakMemory(Backend& backend);

// ---- bf16 entry points (the optimised path; fp32 accumulation everywhere) ----------
// REQUIRES for all: `backend` came from CreateCudaBackend (else INVALID_ARGUMENT), and
// pointers are its device memory. bf16 values are stored as uint16_t (the upper half of
// an IEEE fp32). Work is queued on the backend's compute stream.

// dst (n) = round-to-nearest-even bf16(src (n)).
Status CastF32ToBf16(Backend& backend, uint16_t* dst, const float* src, int64_t n);
// dst (n) = float(src (n)) (exact).
Status CastBf16ToF32(Backend& backend, float* dst, const uint16_t* src, int64_t n);

// cuBLASLt epilogues applied to the fp32 accumulator before the output is written.
// kGelu is GELU with the tanh approximation, as cuBLASLt implements it.
enum class GemmEpilogue { kNone, kBias, kGelu, kBiasGelu };

// C (M,N) = epilogue(alpha * op(A) @ op(B) + beta * C [+ bias]), row-major, shapes and
// leading dimensions as Backend::Gemm. A and B are bf16; C is fp32 (c_bf16 = false) or
// bf16 (c_bf16 = true). bias (N) has C's dtype; it is added before the GELU.
// beta must be 0 with a GELU epilogue.
struct Bf16GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const uint16_t* A = nullptr;  // (M,K) or (K,M) when trans_a
  int64_t lda = 0;
  const uint16_t* B = nullptr;  // (K,N) or (N,K) when trans_b
  int64_t ldb = 0;
  void* C = nullptr;            // (M,N) fp32 or bf16
  int64_t ldc = 0;
  bool c_bf16 = false;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  const void* bias = nullptr;   // (N), required by kBias / kBiasGelu
};
Status GemmBf16(Backend& backend, const Bf16GemmArgs& args);

// The device index of a backend from CreateCudaBackend; -1 for any other backend.
int CudaBackendDevice(Backend& backend);

// kernels::CreateDeviceCollectives for CUDA backends (kernels/cuda/nccl_collective.cc):
// ncclCommInitAll over the backends' devices. UNIMPLEMENTED when this build has no NCCL.
Result<std::vector<std::unique_ptr<DeviceCollective>>> CreateNcclCollectives(
    const std::vector<Backend*>& backends);

}  // namespace l2l::kernels

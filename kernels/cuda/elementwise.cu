// Elementwise CUDA kernels (grid-stride loops, int64 indices): add/axpy/scale, GELU,
// bias add, the linear layer's epilogue (bias + residual or GELU in one pass), embedding forward, cross-entropy backward, f32<->bf16 casts, counter-based
// dropout (LoRA's adapter input). Launchers are
// declared in ops.h; each takes its stream and checks the launch.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

#define L2L_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

__global__ void AddKernel(float* out, const float* a, const float* b, int64_t n) {
  L2L_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void AxpyKernel(float* dst, const float* src, float alpha, int64_t n) {
  L2L_GRID_STRIDE(i, n) dst[i] += alpha * src[i];
}

__global__ void ScaleKernel(float* x, float alpha, int64_t n) {
  L2L_GRID_STRIDE(i, n) x[i] *= alpha;
}

__global__ void ScaleMatrixKernel(float* c, float alpha, int64_t rows, int64_t cols, int64_t ld) {
  L2L_GRID_STRIDE(i, rows * cols) {
    float& v = c[(i / cols) * ld + i % cols];
    v = alpha == 0.0f ? 0.0f : v * alpha;  // beta == 0 means "do not read C" (BLAS)
  }
}

// common/rng.h SplitMix64 and DropoutKeep, repeated for the device (this file is nvcc
// C++17 and does not include common/); tests/gpu/lora_test.cc checks the bits agree.
__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One thread per element of (N, C); keep(i), i = n*C + c, as kernels/backend.h
// CounterDropout. __fmul_rn / __fadd_rn: no fused multiply-add, the CPU's rounding.
__global__ void CounterDropoutKernel(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N,
                                     int64_t C, uint64_t stream, uint32_t threshold, float scale,
                                     bool accumulate) {
  L2L_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    const bool keep = (SplitMix64(stream + static_cast<uint64_t>(i)) >> 40) >= threshold;
    const float v = keep ? __fmul_rn(x[n * ldx + c], scale) : 0.0f;
    float& o = out[n * ldo + c];
    o = accumulate ? __fadd_rn(o, v) : v;
  }
}

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, n) {
    const float v = GeluTanh(inp[i]);
    out[i] = v;
    if (bits != nullptr) bits[i] = __float2bfloat16_rn(v);
  }
}

// Backend::LinearForward's epilogue after the GEMM, one pass: y += bias (when not null);
// then y += residual (when not null) or act = gelu(y) (when act is not null). The same
// operations in the same order as AddBias, Add and GeluForward.
__global__ void LinearEpilogueKernel(float* y, const float* bias, float* act, const float* residual,
                                     int64_t N, int64_t OC, __nv_bfloat16* act_bits) {
  L2L_GRID_STRIDE(i, N * OC) {
    float v = y[i];
    if (bias != nullptr) v += bias[i % OC];
    if (residual != nullptr) v = v + residual[i];
    y[i] = v;
    if (act != nullptr) {
      const float a = GeluTanh(v);
      act[i] = a;
      if (act_bits != nullptr) act_bits[i] = __float2bfloat16_rn(a);
    }
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  L2L_GRID_STRIDE(i, n) {
    dinp[i] += GeluTanhGrad(inp[i]) * dout[i];
  }
}

__global__ void AddBiasKernel(float* out, const float* bias, int64_t N, int64_t OC) {
  L2L_GRID_STRIDE(i, N * OC) out[i] += bias[i % OC];
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int64_t T, int64_t C, int64_t total) {
  L2L_GRID_STRIDE(i, total) {
    int64_t row = i / C, c = i % C;  // row = b*T + t
    int64_t t = row % T;
    out[i] = wte[int64_t{tokens[row]} * C + c] + wpe[t * C + c];
  }
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, float scale, int64_t N,
                                           int64_t V) {
  L2L_GRID_STRIDE(i, N * V) {
    int64_t row = i / V, col = i % V;
    const int32_t target = targets[row];
    float onehot = col == target ? 1.0f : 0.0f;
    dlogits[i] = target == -1 ? 0.0f : scale * (probs[i] - onehot);  // -1: kIgnoreTarget
  }
}

__global__ void CastF32ToBf16Kernel(__nv_bfloat16* dst, const float* src, int64_t n) {
  L2L_GRID_STRIDE(i, n) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void CastBf16ToF32Kernel(float* dst, const __nv_bfloat16* src, int64_t n) {
  L2L_GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}

__global__ void RoundToBf16Kernel(float* x, __nv_bfloat16* bits, int64_t n) {
  L2L_GRID_STRIDE(i, n) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    if (bits != nullptr) bits[i] = b;
    x[i] = __bfloat162float(b);
  }
}

}  // namespace

void LaunchAdd(float* out, const float* a, const float* b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(AddKernel, GridFor(n), kThreads, 0, s)(out, a, b, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchAxpy(float* dst, const float* src, float alpha, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(AxpyKernel, GridFor(n), kThreads, 0, s)(dst, src, alpha, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchScale(float* x, float alpha, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(ScaleKernel, GridFor(n), kThreads, 0, s)(x, alpha, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C,
                          uint64_t stream, uint32_t threshold, float scale, bool accumulate, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  L2L_LAUNCH(CounterDropoutKernel, GridFor(N * C), kThreads, 0, s)(out, ldo, x, ldx, N, C, stream, threshold,
                                                                   scale, accumulate);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchScaleMatrix(float* c, float alpha, int64_t rows, int64_t cols, int64_t ld,
                       cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return;
  L2L_LAUNCH(ScaleMatrixKernel, GridFor(rows * cols), kThreads, 0, s)(c, alpha, rows, cols, ld);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchGeluForward(float* out, const float* inp, int64_t n, cudaStream_t s, uint16_t* bits) {
  if (n <= 0) return;
  L2L_LAUNCH(GeluForwardKernel, GridFor(n), kThreads, 0, s)(out, inp, n, reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchGeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                        cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(GeluBackwardKernel, GridFor(n), kThreads, 0, s)(dinp, inp, dout, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchLinearEpilogue(float* y, const float* bias, float* act, const float* residual, int64_t N,
                          int64_t OC, cudaStream_t s, uint16_t* act_bits) {
  if (N <= 0 || OC <= 0 || (bias == nullptr && act == nullptr && residual == nullptr)) return;
  L2L_LAUNCH(LinearEpilogueKernel, GridFor(N * OC), kThreads, 0, s)(y, bias, act, residual, N, OC,
                                                                    reinterpret_cast<__nv_bfloat16*>(act_bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchAddBias(float* out, const float* bias, int64_t N, int64_t OC, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  L2L_LAUNCH(AddBiasKernel, GridFor(N * OC), kThreads, 0, s)(out, bias, N, OC);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                            const float* wpe, int64_t B, int64_t T, int64_t C, cudaStream_t s) {
  int64_t total = B * T * C;
  if (total <= 0) return;
  L2L_LAUNCH(EmbeddingForwardKernel, GridFor(total), kThreads, 0, s)(
      out, tokens, wte, wpe, T, C, total);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                float scale, int64_t N, int64_t V, cudaStream_t s) {
  if (N <= 0 || V <= 0) return;
  L2L_LAUNCH(CrossEntropyBackwardKernel, GridFor(N * V), kThreads, 0, s)(
      dlogits, probs, targets, scale, N, V);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCastF32ToBf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(CastF32ToBf16Kernel, GridFor(n), kThreads, 0, s)(
      reinterpret_cast<__nv_bfloat16*>(dst), src, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchRoundToBf16(float* x, uint16_t* bits, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(RoundToBf16Kernel, GridFor(n), kThreads, 0, s)(x, reinterpret_cast<__nv_bfloat16*>(bits), n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCastBf16ToF32(float* dst, const uint16_t* src, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(CastBf16ToF32Kernel, GridFor(n), kThreads, 0, s)(
      dst, reinterpret_cast<const __nv_bfloat16*>(src), n);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda

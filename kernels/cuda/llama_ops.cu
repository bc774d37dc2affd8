// The Llama family's elementwise CUDA kernels: token embedding gather (no position
// table), rotary position embedding in place (forward and its transposed rotation) and
// SwiGLU and GeGLU forward/backward, a strided 2-D copy. Grid-stride loops with int64 indices; every output element is
// written by one thread, so results are deterministic. RMSNorm lives in reduce.cu (it
// needs the column-sum passes) and the token-embedding backward in embedding_backward.cu
// (the sort). Launchers are declared in ops.h; each takes its stream and checks the
// launch. Thread-safety: stateless.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

#define L2L_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

__global__ void TokenEmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                            int64_t N, int64_t C) {
  L2L_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    out[i] = wte[int64_t{tokens[n]} * C + c];
  }
}

// One thread per (row, head, i < hs/2) pair: reads x[i], x[i + hs/2], writes both. With
// bits, over every head of the row (row_stride / hs of them; those from n_heads on, a
// packed row's v, are not rotated) and their bf16 values into bits (rows x row_stride).
__global__ void RopeKernel(float* x, const float* cos, const float* sin, int64_t rows, int64_t T,
                           int64_t row_stride, int64_t n_heads, int64_t hs, float sign, __nv_bfloat16* bits) {
  const int64_t half = hs / 2, per_row = (bits != nullptr ? row_stride / hs : n_heads) * half;
  L2L_GRID_STRIDE(idx, rows * per_row) {
    const int64_t n = idx / per_row, rem = idx - n * per_row;
    const int64_t h = rem / half, i = rem - h * half;
    const int64_t t = n % T;
    const int64_t at = n * row_stride + h * hs + i;
    float xa = x[at], xb = x[at + half];
    if (h < n_heads) {
      const float c = cos[t * half + i], s = sign * sin[t * half + i];
      const float ra = xa * c - xb * s, rb = xb * c + xa * s;
      xa = ra;
      xb = rb;
      x[at] = xa;
      x[at + half] = xb;
    }
    if (bits != nullptr) {
      bits[at] = __float2bfloat16_rn(xa);
      bits[at + half] = __float2bfloat16_rn(xb);
    }
  }
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void SwiGLUForwardKernel(float* out, const float* gate_up, int64_t N, int64_t F, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const float g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f];
    const float v = g * Sigmoid(g) * u;
    out[i] = v;
    if (bits != nullptr) bits[i] = __float2bfloat16_rn(v);
  }
}

__global__ void SwiGLUBackwardKernel(float* dgate_up, const float* dout, const float* gate_up,
                                     int64_t N, int64_t F, bool accumulate, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const int64_t gi = n * 2 * F + f, ui = gi + F;
    const float g = gate_up[gi], u = gate_up[ui], d = dout[i];
    const float sg = Sigmoid(g);
    const float dg = d * u * sg * (1.0f + g * (1.0f - sg)), du = d * (g * sg);
    const float vg = accumulate ? dgate_up[gi] + dg : dg, vu = accumulate ? dgate_up[ui] + du : du;
    dgate_up[gi] = vg;
    dgate_up[ui] = vu;
    if (bits != nullptr) {
      bits[gi] = __float2bfloat16_rn(vg);
      bits[ui] = __float2bfloat16_rn(vu);
    }
  }
}

__global__ void GatherRowsKernel(float* dst, const float* src, const int32_t* idx, const float* scale,
                                 int64_t n, int64_t C) {
  L2L_GRID_STRIDE(i, n * C) {
    const int64_t r = i / C, c = i - r * C;
    const float v = src[int64_t{idx[r]} * C + c];
    dst[i] = scale == nullptr ? v : v * scale[r];
  }
}

// Distinct idx: each destination element has one writer per launch.
__global__ void ScatterAddRowsKernel(float* dst, const float* src, const int32_t* idx, const float* scale,
                                     int64_t n, int64_t C) {
  L2L_GRID_STRIDE(i, n * C) {
    const int64_t r = i / C, c = i - r * C;
    const float v = scale == nullptr ? src[i] : __fmul_rn(src[i], scale[r]);  // no fused multiply-add
    float* d = dst + int64_t{idx[r]} * C + c;
    *d = __fadd_rn(*d, v);
  }
}

// One thread per row, columns in order (matches the CPU's fp32 order).
__global__ void RowDotKernel(float* out, const float* a, const float* b, int64_t n, int64_t C) {
  L2L_GRID_STRIDE(r, n) {
    float acc = 0.0f;
    for (int64_t c = 0; c < C; ++c) acc = __fadd_rn(acc, __fmul_rn(a[r * C + c], b[r * C + c]));
    out[r] = acc;
  }
}

// GELU, tanh form, and its derivative (the same formulas as elementwise.cu's GeluForward).
__device__ __forceinline__ float GeluTanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float GeluTanhGrad(float x) {
  const float k = 0.7978845608028654f;
  const float th = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * x * x);
}

__global__ void GegluForwardKernel(float* out, const float* gate_up, int64_t N, int64_t F, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const float v = GeluTanh(gate_up[n * 2 * F + f]) * gate_up[n * 2 * F + F + f];
    out[i] = v;
    if (bits != nullptr) bits[i] = __float2bfloat16_rn(v);
  }
}

__global__ void GegluBackwardKernel(float* dgate_up, const float* dout, const float* gate_up,
                                    int64_t N, int64_t F) {
  L2L_GRID_STRIDE(i, N * F) {
    const int64_t n = i / F, f = i - n * F;
    const int64_t gi = n * 2 * F + f, ui = gi + F;
    const float g = gate_up[gi], u = gate_up[ui], d = dout[i];
    dgate_up[gi] += GeluTanhGrad(g) * (d * u);
    dgate_up[ui] += d * GeluTanh(g);
  }
}

// bits (not null): the bf16 copy of dst's buffer at dst's offsets (a held operand copy,
// Bf16Operands::HeldBits) gets the copied values' bits too.
__global__ void Copy2DKernel(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                             int64_t rows, int64_t cols, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i - r * cols;
    const float v = src[r * src_ld + c];
    dst[r * dst_ld + c] = v;
    if (bits != nullptr) bits[r * dst_ld + c] = __float2bfloat16_rn(v);
  }
}

}  // namespace

void LaunchGatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int64_t n,
                      int64_t C, cudaStream_t s) {
  if (n <= 0 || C <= 0) return;
  L2L_LAUNCH(GatherRowsKernel, GridFor(n * C), kThreads, 0, s)(dst, src, idx, scale, n, C);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                          int64_t n, int64_t C, cudaStream_t s) {
  if (n <= 0 || C <= 0) return;
  L2L_LAUNCH(ScatterAddRowsKernel, GridFor(n * C), kThreads, 0, s)(dst, src, idx, scale, n, C);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchRowDot(float* out, const float* a, const float* b, int64_t n, int64_t C, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(RowDotKernel, GridFor(n), kThreads, 0, s)(out, a, b, n, C);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchGegluForward(float* out, const float* gate_up, int64_t N, int64_t F, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || F <= 0) return;
  L2L_LAUNCH(GegluForwardKernel, GridFor(N * F), kThreads, 0, s)(out, gate_up, N, F,
                                                                 reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchGegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                         int64_t F, cudaStream_t s) {
  if (N <= 0 || F <= 0) return;
  L2L_LAUNCH(GegluBackwardKernel, GridFor(N * F), kThreads, 0, s)(dgate_up, dout, gate_up, N, F);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCopy2D(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t s, uint16_t* bits) {
  if (rows <= 0 || cols <= 0) return;
  L2L_LAUNCH(Copy2DKernel, GridFor(rows * cols), kThreads, 0, s)(dst, dst_ld, src, src_ld, rows, cols,
                                                                  reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchTokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                                 int64_t C, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  L2L_LAUNCH(TokenEmbeddingForwardKernel, GridFor(N * C), kThreads, 0, s)(out, tokens, wte, N, C);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchRope(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                int64_t row_stride, int64_t n_heads, int64_t hs, float sign, cudaStream_t s, uint16_t* bits) {
  const int64_t work = B * T * (bits != nullptr ? row_stride / hs : n_heads) * (hs / 2);
  if (work <= 0) return;
  L2L_LAUNCH(RopeKernel, GridFor(work), kThreads, 0, s)(x, cos, sin, B * T, T, row_stride, n_heads,
                                                        hs, sign, reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchSwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || F <= 0) return;
  L2L_LAUNCH(SwiGLUForwardKernel, GridFor(N * F), kThreads, 0, s)(out, gate_up, N, F,
                                                                  reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchSwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                          int64_t F, bool accumulate, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || F <= 0) return;
  L2L_LAUNCH(SwiGLUBackwardKernel, GridFor(N * F), kThreads, 0, s)(dgate_up, dout, gate_up, N, F,
                                                                    accumulate,
                                                                    reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda

// The BERT family's elementwise CUDA kernels: the exact (erf) GELU and tanh (the
// pooler), forward and backward. Grid-stride loops with int64 indices; every output
// element is written by one thread, so results are deterministic. The BERT family's other
// ops live beside their decoder cousins: LayerNorm with the model's epsilon in reduce.cu,
// the key-masked bidirectional softmax in softmax.cu, the attention products in
// attention.cc. Launchers are declared in ops.h; each takes its stream and checks the
// launch. Thread-safety: stateless.
#include <cuda_bf16.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

#define L2L_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

// Phi(x) = erfc(-x / sqrt 2) / 2: 1 + erf(x / sqrt 2) in fp32 cancels for negative x
// (an ulp of erf is ~1e-5 of Phi(-3)); erfc keeps the left tail to a few ulps.
// bits (not null: the bf16 GEMM mode's operand copy, Bf16Operands::Produce): out's bf16
// bits too, rounded to nearest even as a cast would.
__global__ void GeluErfForwardKernel(float* out, const float* inp, int64_t n, __nv_bfloat16* bits) {
  L2L_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float v = 0.5f * x * erfcf(-x * kInvSqrt2);
    out[i] = v;
    if (bits != nullptr) bits[i] = __float2bfloat16_rn(v);
  }
}

// gelu'(x) = Phi(x) + x phi(x), Phi the standard normal CDF, phi its density.
__global__ void GeluErfBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  L2L_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float g = 0.5f * erfcf(-x * kInvSqrt2) + x * expf(-0.5f * x * x) * kInvSqrt2Pi;
    dinp[i] += g * dout[i];
  }
}

__global__ void TanhForwardKernel(float* out, const float* inp, int64_t n) {
  L2L_GRID_STRIDE(i, n) out[i] = tanhf(inp[i]);
}

__global__ void TanhBackwardKernel(float* dinp, const float* out, const float* dout, int64_t n) {
  L2L_GRID_STRIDE(i, n) {
    const float y = out[i];
    dinp[i] += (1.0f - y * y) * dout[i];
  }
}

}  // namespace

void LaunchGeluErfForward(float* out, const float* inp, int64_t n, cudaStream_t s, uint16_t* bits) {
  if (n <= 0) return;
  L2L_LAUNCH(GeluErfForwardKernel, GridFor(n), kThreads, 0, s)(out, inp, n, reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchGeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                           cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(GeluErfBackwardKernel, GridFor(n), kThreads, 0, s)(dinp, inp, dout, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchTanhForward(float* out, const float* inp, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(TanhForwardKernel, GridFor(n), kThreads, 0, s)(out, inp, n);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchTanhBackward(float* dinp, const float* out, const float* dout, int64_t n,
                        cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(TanhBackwardKernel, GridFor(n), kThreads, 0, s)(dinp, out, dout, n);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda

// The interleaved optimizer's device AdamW: common/adamw.h AdamWStep per element, with
// every operation an explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fsub_rn,
// __fdiv_rn, __fsqrt_rn) in AdamWStep's order, so nvcc cannot contract a multiply-add
// into an FMA and the result is bitwise the daemon's. The per-call scalars come from
// common/adamw.h MakeAdamWScalars (formed on the host in double, as AdamWStep does; the
// backend passes them in, so this file needs no C++20 header under nvcc's C++17).
// Launcher declared in ops.h. Thread-safety: stateless; callers serialise the stream.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, int64_t n, float decay_mul,
                            float one_minus_b1, float beta2, float one_minus_b2, float bc2_sqrt,
                            float neg_step_size, float eps, float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{blockDim.x} * gridDim.x) {
    const float g = __fmul_rn(grad[i], grad_scale);
    float p = __fmul_rn(param[i], decay_mul);
    const float mi = __fadd_rn(m[i], __fmul_rn(one_minus_b1, __fsub_rn(g, m[i])));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}

}  // namespace

void LaunchAdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWKernelScalars& c,
                 cudaStream_t s) {
  if (n <= 0) return;
  L2L_LAUNCH(AdamWKernel, GridFor(n), kThreads, 0, s)(p, g, m, v, n, c.decay_mul, c.one_minus_b1, c.beta2,
                                                      c.one_minus_b2, c.bc2_sqrt, c.neg_step_size, c.eps,
                                                      c.grad_scale);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda

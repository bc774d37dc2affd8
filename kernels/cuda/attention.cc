// Causal attention as batched GEMMs + fused causal softmax. See attention.h.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "common/status.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

// One product for all NH heads of one batch element: matrix h of each operand starts at
// base + h*stride. Falls back to NH single GEMMs when cuBLASLt has no algorithm for the
// interleaved batch.
void HeadsGemm(LtGemm& gemm, LtGemmArgs a, int64_t NH, cudaStream_t s) {
  a.batch = static_cast<int>(NH);
  Status st = gemm.Run(a, s);
  if (st.code() == StatusCode::kNotFound && NH > 1) {
    LtGemmArgs one = a;
    one.batch = 1;
    for (int64_t h = 0; h < NH; ++h) {
      one.A = static_cast<const float*>(a.A) + h * a.stride_a;
      one.B = static_cast<const float*>(a.B) + h * a.stride_b;
      one.C = static_cast<float*>(a.C) + h * a.stride_c;
      st = gemm.Run(one, s);
      if (!st.ok()) break;
    }
  }
  L2L_CHECK(st.ok()) << "attention gemm: " << st.ToString();
}

LtGemmArgs Args(cublasComputeType_t compute, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const float* A, int64_t lda, int64_t sa, const float* B,
                int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc, int64_t sc) {
  LtGemmArgs a;
  a.trans_a = ta;
  a.trans_b = tb;
  a.M = M;
  a.N = N;
  a.K = K;
  a.alpha = alpha;
  a.beta = beta;
  a.A = A;
  a.lda = lda;
  a.stride_a = sa;
  a.B = B;
  a.ldb = ldb;
  a.stride_b = sb;
  a.C = C;
  a.ldc = ldc;
  a.stride_c = sc;
  a.compute = compute;
  return a;
}

}  // namespace

void AttentionForward(LtGemm& gemm, cublasComputeType_t compute, float* out, float* att,
                      const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  const int64_t hs = C / NH, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    const float* k = q + C;
    float* att_b = att + b * NH * TT;
    // S_h (T,T) = scale * Q_h (T,hs) @ K_h^T.
    HeadsGemm(gemm, Args(compute, false, true, T, T, hs, scale, q, C3, hs, k, C3, hs, 0.0f, att_b,
                         T, TT),
              NH, s);
  }
  LaunchCausalSoftmaxForward(att, B * NH, T, s);
  for (int64_t b = 0; b < B; ++b) {
    const float* v = qkv + b * T * C3 + 2 * C;
    // out_h (T,hs) = P_h (T,T) @ V_h (T,hs); heads land side by side in out (B,T,C).
    HeadsGemm(gemm, Args(compute, false, false, T, hs, T, 1.0f, att + b * NH * TT, T, TT, v, C3,
                         hs, 0.0f, out + b * T * C, C, hs),
              NH, s);
  }
}

void AttentionBackward(LtGemm& gemm, cublasComputeType_t compute, float* dqkv, float* scratch,
                       const float* dout, const float* qkv, const float* att, int64_t B,
                       int64_t T, int64_t C, int64_t NH, cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  const int64_t hs = C / NH, C3 = 3 * C, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; ++b) {
    const float* v = qkv + b * T * C3 + 2 * C;
    const float* dout_b = dout + b * T * C;
    const float* att_b = att + b * NH * TT;
    // dP_h (T,T) = dout_h (T,hs) @ V_h^T.
    HeadsGemm(gemm, Args(compute, false, true, T, T, hs, 1.0f, dout_b, C, hs, v, C3, hs, 0.0f,
                         scratch + b * NH * TT, T, TT),
              NH, s);
    // dV_h (T,hs) += P_h^T @ dout_h.
    HeadsGemm(gemm, Args(compute, true, false, T, hs, T, 1.0f, att_b, T, TT, dout_b, C, hs, 1.0f,
                         dqkv + b * T * C3 + 2 * C, C3, hs),
              NH, s);
  }
  // dS = scale * P * (dP - rowsum(P * dP)): the gradient w.r.t. the unscaled Q K^T.
  LaunchCausalSoftmaxBackward(scratch, att, B * NH, T, scale, s);
  for (int64_t b = 0; b < B; ++b) {
    const float* q = qkv + b * T * C3;
    const float* k = q + C;
    const float* ds_b = scratch + b * NH * TT;
    float* dq = dqkv + b * T * C3;
    // dQ_h (T,hs) += dS_h (T,T) @ K_h (T,hs).
    HeadsGemm(gemm, Args(compute, false, false, T, hs, T, 1.0f, ds_b, T, TT, k, C3, hs, 1.0f, dq,
                         C3, hs),
              NH, s);
    // dK_h (T,hs) += dS_h^T @ Q_h.
    HeadsGemm(gemm, Args(compute, true, false, T, hs, T, 1.0f, ds_b, T, TT, q, C3, hs, 1.0f,
                         dq + C, C3, hs),
              NH, s);
  }
}

}  // namespace l2l::kernels::cuda

// CpuBackend's causal multi-head attention, GEMM-based: batched oneDNN matmuls over
// (B, NH) on strided views of qkv (B,T,3C) (head h of q is columns [h*hs, (h+1)*hs) of
// the first C, k and v follow at offsets C and 2C), and a TBB loop for the causal
// softmax and its backward. The full (T,T) score matrix is computed and the upper
// triangle masked, which wastes half the QK^T flops but runs at GEMM speed.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_matmul.h"
#include "kernels/cpu/cpu_parallel.h"

namespace l2l::kernels {
namespace {

// Views of one (B, NH) batch of matrices.
struct AttnViews {
  MatStrides qkv_head;    // q, k or v of a head as (T, hs): rows 3C apart
  MatStrides qkv_head_t;  // the same, transposed (hs, T)
  MatStrides out_head;    // (T, hs) slice of a (B,T,C) tensor
  MatStrides att;         // (T, T) of a (B,NH,T,T) tensor
  MatStrides att_t;       // its transpose
};

AttnViews MakeViews(int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  AttnViews v;
  v.qkv_head = MatStrides{T * 3 * C, hs, 3 * C, 1};
  v.qkv_head_t = MatStrides{T * 3 * C, hs, 1, 3 * C};
  v.out_head = MatStrides{T * C, hs, C, 1};
  v.att = MatStrides{NH * T * T, T * T, T, 1};
  v.att_t = MatStrides{NH * T * T, T * T, 1, T};
  return v;
}

}  // namespace

void CpuBackend::AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                  int64_t C, int64_t NH) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "AttentionForward: NH=" << NH << " does not divide C=" << C;
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const AttnViews v = MakeViews(T, C, NH);
  const float* q = qkv;
  const float* k = qkv + C;
  const float* val = qkv + 2 * C;
  // att (B,NH,T,T) = scale * q @ k^T (upper triangle masked below).
  matmul_->Run(B, NH, T, T, hs, scale, q, v.qkv_head, k, v.qkv_head_t, 0.0f, att, v.att);
  // Causal softmax per row, in place; entries past t become 0.
  InArena([&] {
    ParallelFor(B * NH * T, RowGrain(T), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r % T;
        float* row = att + r * T;
        const float mx = MaxSpan(row, t + 1);
        const double sum = ExpShiftSumSpan(row, row, mx, t + 1);
        ScaleSpan(row, float(1.0 / sum), t + 1);
        for (int64_t j = t + 1; j < T; ++j) row[j] = 0.0f;
      }
    });
  });
  // out (B,T,C), head h at columns h*hs: att @ v.
  matmul_->Run(B, NH, T, hs, T, 1.0f, att, v.att, val, v.qkv_head, 0.0f, out, v.out_head);
}

void CpuBackend::AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "AttentionBackward: NH=" << NH << " does not divide C=" << C;
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const AttnViews v = MakeViews(T, C, NH);
  const float* q = qkv;
  const float* k = qkv + C;
  const float* val = qkv + 2 * C;
  float* dq = dqkv;
  float* dk = dqkv + C;
  float* dv = dqkv + 2 * C;
  // datt (scratch) = dout @ v^T.
  matmul_->Run(B, NH, T, T, hs, 1.0f, dout, v.out_head, val, v.qkv_head_t, 0.0f, scratch, v.att);
  // dv += att^T @ dout.
  matmul_->Run(B, NH, T, hs, T, 1.0f, att, v.att_t, dout, v.out_head, 1.0f, dv, v.qkv_head);
  // Softmax backward, in place: dpre[j] = att[j] * (datt[j] - sum_i att[i] datt[i]) for
  // j <= t, 0 past t (att is 0 there). The 1/sqrt(hs) goes into the GEMMs below.
  InArena([&] {
    ParallelFor(B * NH * T, RowGrain(T), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r % T;
        const float* a = att + r * T;
        float* d = scratch + r * T;
        const float dot = DotSpan(a, d, t + 1);
        for (int64_t j = 0; j <= t; ++j) d[j] = a[j] * (d[j] - dot);
        for (int64_t j = t + 1; j < T; ++j) d[j] = 0.0f;
      }
    });
  });
  // dq += scale * dpre @ k ; dk += scale * dpre^T @ q.
  matmul_->Run(B, NH, T, hs, T, scale, scratch, v.att, k, v.qkv_head, 1.0f, dq, v.qkv_head);
  matmul_->Run(B, NH, T, hs, T, scale, scratch, v.att_t, q, v.qkv_head, 1.0f, dk, v.qkv_head);
}

}  // namespace l2l::kernels

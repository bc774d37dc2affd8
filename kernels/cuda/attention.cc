// Causal (grouped-query) attention and bidirectional attention with a key padding mask as
// batched GEMMs + a fused softmax, in fp32 or with bf16 operands (bf16 mode). See
// attention.h.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "common/status.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

size_t ElemBytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// One product for all NH heads of one batch element: matrix h of each operand starts at
// base + h*stride. Falls back to NH single GEMMs when cuBLASLt has no algorithm for the
// interleaved batch.
void HeadsGemm(LtGemm& gemm, LtGemmArgs a, int64_t NH, cudaStream_t s) {
  a.batch = static_cast<int>(NH);
  Status st = gemm.Run(a, s);
  if (st.code() == StatusCode::kNotFound && NH > 1) {
    const size_t ab = ElemBytes(a.ab_type), cb = ElemBytes(a.c_type);
    LtGemmArgs one = a;
    one.batch = 1;
    for (int64_t h = 0; h < NH; ++h) {
      one.A = static_cast<const char*>(a.A) + h * a.stride_a * ab;
      one.B = static_cast<const char*>(a.B) + h * a.stride_b * ab;
      one.C = static_cast<char*>(a.C) + h * a.stride_c * cb;
      st = gemm.Run(one, s);
      if (!st.ok()) break;
    }
  }
  L2L_CHECK(st.ok()) << "attention gemm: " << st.ToString();
}

// A GEMM operand tensor: the fp32 original, or (bf16 mode) its bf16 copy, addressed by
// the element offsets of the original.
class Operand {
 public:
  explicit Operand(const float* f32) : f32_(f32) {}
  explicit Operand(const uint16_t* bf16) : bf16_(bf16) {}
  const void* At(int64_t offset) const {
    return bf16_ != nullptr ? static_cast<const void*>(bf16_ + offset)
                            : static_cast<const void*>(f32_ + offset);
  }

 private:
  const float* f32_ = nullptr;
  const uint16_t* bf16_ = nullptr;
};

// `src` (n) as an operand: itself in fp32 mode; in bf16 mode cast into `dst` (n bf16).
Operand Stage(const float* src, uint16_t* dst, int64_t n, cudaStream_t s) {
  if (dst == nullptr) return Operand(src);
  LaunchCastF32ToBf16(dst, src, n, s);
  return Operand(dst);
}

// bf16 scratch for `elems` in `slot`, or nullptr in fp32 mode.
uint16_t* Scratch(const AttentionGemmMode& mode, int slot, int64_t elems) {
  return mode.bf16_scratch ? mode.bf16_scratch(slot, elems) : nullptr;
}

LtGemmArgs Args(const AttentionGemmMode& mode, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const void* A, int64_t lda, int64_t sa, const void* B, int64_t ldb,
                int64_t sb, float beta, float* C, int64_t ldc, int64_t sc) {
  const bool bf16 = static_cast<bool>(mode.bf16_scratch);
  return LtGemmArgs{.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
                    .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = ldc,
                    .ab_type = bf16 ? CUDA_R_16BF : CUDA_R_32F,
                    .compute = bf16 ? CUBLAS_COMPUTE_32F : mode.compute,  // bf16 inputs, fp32 accumulate
                    .stride_a = sa, .stride_b = sb, .stride_c = sc};
}

// Which softmax sits between the products: causal (decoders) or bidirectional with an
// optional key padding mask (encoders).
struct SoftmaxKind {
  bool causal = true;
  const int32_t* key_mask = nullptr;  // (B,T), bidirectional only; nullptr: every key
  int64_t window = 0;                 // causal only: > 0 a sliding window
};

void ForwardImpl(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                 const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                 SoftmaxKind kind, cudaStream_t s) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "attention: NKV=" << NKV << " does not divide NH=" << NH;
  const int64_t rep = NH / NKV, C = NH * hs, W = (NH + 2 * NKV) * hs, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const Operand qkv_op = Stage(qkv, Scratch(mode, 0, B * T * W), B * T * W, s);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = b * T * W, k = q + C;
    for (int64_t r = 0; r < rep; ++r) {
      // S_h (T,T) = scale * Q_h (T,hs) @ K_g^T for the heads h = g*rep + r.
      HeadsGemm(gemm, Args(mode, false, true, T, T, hs, scale, qkv_op.At(q + r * hs), W, rep * hs,
                           qkv_op.At(k), W, hs, 0.0f, att + b * NH * TT + r * TT, T, rep * TT),
                NKV, s);
    }
  }
  if (kind.causal) {
    LaunchCausalSoftmaxForward(att, B * NH, T, s, kind.window);
  } else {
    LaunchMaskedSoftmaxForward(att, kind.key_mask, B, NH, T, s);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t v = b * T * W + C + NKV * hs;
    const Operand p = Stage(att + b * NH * TT, Scratch(mode, 1, NH * TT), NH * TT, s);
    for (int64_t r = 0; r < rep; ++r) {
      // out_h (T,hs) = P_h (T,T) @ V_g (T,hs); heads land side by side in out (B,T,C).
      HeadsGemm(gemm, Args(mode, false, false, T, hs, T, 1.0f, p.At(r * TT), T, rep * TT,
                           qkv_op.At(v), W, hs, 0.0f, out + b * T * C + r * hs, C, rep * hs),
                NKV, s);
    }
  }
}

// The gradient of either softmax kind: masked keys and (causal) future keys have
// probability 0, so the full-row softmax backward gives them gradient 0; the causal form
// only skips reading them.
void BackwardImpl(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv, float* scratch,
                  const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                  int64_t NH, int64_t NKV, int64_t hs, bool causal, cudaStream_t s,
                  int64_t window = 0) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "attention: NKV=" << NKV << " does not divide NH=" << NH;
  const int64_t rep = NH / NKV, C = NH * hs, W = (NH + 2 * NKV) * hs, TT = T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // bf16 mode: qkv and dout share slot 0 (dout 256-byte aligned after qkv), leaving slot 1
  // for the per-batch-element (NH,T,T) operands.
  const int64_t n_qkv = B * T * W, n_dout = B * T * C;
  const int64_t dout_at = (n_qkv + 127) / 128 * 128;
  uint16_t* s0 = Scratch(mode, 0, dout_at + n_dout);
  const Operand qkv_op = Stage(qkv, s0, n_qkv, s);
  const Operand dout_op = Stage(dout, s0 != nullptr ? s0 + dout_at : nullptr, n_dout, s);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t v = b * T * W + C + NKV * hs, d = b * T * C;
    const Operand p = Stage(att + b * NH * TT, Scratch(mode, 1, NH * TT), NH * TT, s);
    for (int64_t r = 0; r < rep; ++r) {
      // dP_h (T,T) = dout_h (T,hs) @ V_g^T.
      HeadsGemm(gemm, Args(mode, false, true, T, T, hs, 1.0f, dout_op.At(d + r * hs), C, rep * hs,
                           qkv_op.At(v), W, hs, 0.0f, scratch + b * NH * TT + r * TT, T, rep * TT),
                NKV, s);
      // dV_g (T,hs) += P_h^T @ dout_h, summed over the group's heads (one r per pass).
      HeadsGemm(gemm, Args(mode, true, false, T, hs, T, 1.0f, p.At(r * TT), T, rep * TT,
                           dout_op.At(d + r * hs), C, rep * hs, 1.0f, dqkv + v, W, hs),
                NKV, s);
    }
  }
  // dS = scale * P * (dP - rowsum(P * dP)): the gradient w.r.t. the unscaled Q K^T.
  if (causal) {
    LaunchCausalSoftmaxBackward(scratch, att, B * NH, T, scale, s, window);
  } else {
    LaunchSoftmaxBackward(scratch, att, B * NH, T, scale, s);
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q = b * T * W, k = q + C;
    const Operand ds = Stage(scratch + b * NH * TT, Scratch(mode, 1, NH * TT), NH * TT, s);
    for (int64_t r = 0; r < rep; ++r) {
      // dQ_h (T,hs) += dS_h (T,T) @ K_g (T,hs).
      HeadsGemm(gemm, Args(mode, false, false, T, hs, T, 1.0f, ds.At(r * TT), T, rep * TT,
                           qkv_op.At(k), W, hs, 1.0f, dqkv + q + r * hs, W, rep * hs),
                NKV, s);
      // dK_g (T,hs) += dS_h^T @ Q_h, summed over the group's heads.
      HeadsGemm(gemm, Args(mode, true, false, T, hs, T, 1.0f, ds.At(r * TT), T, rep * TT,
                           qkv_op.At(q + r * hs), W, rep * hs, 1.0f, dqkv + k, W, hs),
                NKV, s);
    }
  }
}

}  // namespace

void AttentionForwardGqa(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                         const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t hs, cudaStream_t s, int64_t window) {
  ForwardImpl(gemm, mode, out, att, qkv, B, T, NH, NKV, hs, SoftmaxKind{.window = window}, s);
}

void AttentionBackwardGqa(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv, float* scratch,
                          const float* dout, const float* qkv, const float* att, int64_t B,
                          int64_t T, int64_t NH, int64_t NKV, int64_t hs, cudaStream_t s,
                          int64_t window) {
  BackwardImpl(gemm, mode, dqkv, scratch, dout, qkv, att, B, T, NH, NKV, hs, /*causal=*/true, s, window);
}

void AttentionForwardMasked(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                            const float* qkv, const int32_t* key_mask, int64_t B, int64_t T,
                            int64_t C, int64_t NH, cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  ForwardImpl(gemm, mode, out, att, qkv, B, T, NH, NH, C / NH, SoftmaxKind{false, key_mask}, s);
}

void AttentionBackwardMasked(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv,
                             float* scratch, const float* dout, const float* qkv, const float* att,
                             int64_t B, int64_t T, int64_t C, int64_t NH, cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  BackwardImpl(gemm, mode, dqkv, scratch, dout, qkv, att, B, T, NH, NH, C / NH, /*causal=*/false,
               s);
}

void AttentionForward(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                      const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  AttentionForwardGqa(gemm, mode, out, att, qkv, B, T, NH, NH, C / NH, s);
}

void AttentionBackward(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv, float* scratch,
                       const float* dout, const float* qkv, const float* att, int64_t B,
                       int64_t T, int64_t C, int64_t NH, cudaStream_t s) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "attention: NH=" << NH << " does not divide C=" << C;
  AttentionBackwardGqa(gemm, mode, dqkv, scratch, dout, qkv, att, B, T, NH, NH, C / NH, s);
}

}  // namespace l2l::kernels::cuda

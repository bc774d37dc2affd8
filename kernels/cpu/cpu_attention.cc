// CpuBackend's causal attention (GPT-2 multi-head and Llama grouped-query), blocked so
// that only the causal half is computed and no (T,T) matrix is ever stored.
//
// Queries are cut into strips of kQueryTile rows. A strip [i0, i1) only attends to keys
// [0, i1), so its scores are a (rows, i1) block: scale * q_strip @ k[0:i1]^T, one oneDNN
// matmul. The softmax runs on that block (row t masked past t: only the diagonal tile
// is partly masked), the row's log-sum-exp goes to the stash, and out_strip = P @ v[0:i1].
// Summed over strips this is ~T^2/2 + T*kQueryTile/2 score entries instead of T^2, and
// the block (at most kQueryTile x T floats per task) stays in cache instead of a
// (B,NH,T,T) tensor streaming through memory.
//
// The backward recomputes each strip's probabilities from q, k and the stashed
// log-sum-exp, P = exp(s - lse), and then (per strip, keys [0, i1)):
//   dP = dout_strip @ v^T;  dv += P^T @ dout_strip;  dS = P * (dP - rowsum(P * dP));
//   dq_strip += scale * dS @ k;  dk += scale * dS^T @ q_strip.
// The row sums are over the whole row (the strip holds every key the row sees), so this
// is the same arithmetic as the unblocked softmax backward, not an approximation.
//
// The `att` buffer (B,NH,T,T floats, from the caller) holds the log-sum-exp of row t of
// head h of sequence b at att[(b*NH + h)*T + t]; nothing else of it is written or read,
// and `scratch` is not used. Parallelism: the forward's tasks are (b, head, strip); the
// backward's are (b, kv head), each walking its query heads and strips in a fixed order,
// so the dk/dv sums (and every output bit) do not depend on the thread count.
//
// bf16 GEMM mode (the matmul's bf16()): qkv (and dout in the backward) are cast to bf16
// once per call, whole, into the matmul's slots 2 and 3, and every product reads them in
// place; a strip's probabilities P (and the softmax gradient dS) are cast per strip into
// a per-thread bf16 block before they multiply. Scores, softmax, log-sum-exps and the
// products' outputs stay fp32, as in PyTorch's autocast. The 1/sqrt(hs) scale is not a
// oneDNN output scale in this mode (oneDNN 2.x's bf16 gemm applies one in a scalar loop,
// ~10x the product's own time on these blocks): scores are scaled in fp32 before the
// softmax, and dS carries the scale before it is cast (the dq and dk products then run
// with alpha 1).
// Sliding window (AttentionForwardGqaWindow): row t sees keys (t - window, t]. A strip
// then starts its keys at k0 = max(0, i0 - window + 1) (its block is (rows, i1 - k0)), and
// each row's softmax runs on its own span of the block, the rest of the row zeroed. With
// no window k0 = 0 and every span starts at column 0: the same operations as before.
// Thread-safety: as every Backend, one thread at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_matmul.h"
#include "kernels/cpu/cpu_parallel.h"

namespace l2l::kernels {
namespace {

// Rows of a query strip. 64 keeps the oneDNN blocks efficient (M = 64) while the
// wasted half of the diagonal tile is 64/(2T) of the work (12% at T = 256).
constexpr int64_t kQueryTile = 64;

// Leading dimension of a strip's score block: T rounded up to 16 floats (64 bytes).
int64_t StripLd(int64_t T) { return (T + 15) / 16 * 16; }

// Per-thread score/gradient blocks of kQueryTile x ld floats.
float* ThreadBlock(int which, int64_t floats) {
  thread_local std::vector<float> blocks[2];
  std::vector<float>& v = blocks[which];
  if (int64_t(v.size()) < floats) v.resize(floats);
  return v.data();
}

// Per-thread bf16 copies of the blocks above.
uint16_t* ThreadBlock16(int which, int64_t elems) {
  thread_local std::vector<uint16_t> blocks[2];
  std::vector<uint16_t>& v = blocks[which];
  if (int64_t(v.size()) < elems) v.resize(elems);
  return v.data();
}

struct Strip {
  int64_t i0, rows;  // query rows [i0, i0 + rows); keys [k0, i0 + rows)
  int64_t k0;        // the strip's first key (0 without a window)
  int64_t keys() const { return i0 + rows - k0; }
  // Row t = i0 + i sees keys [Lo(t), t]: block columns [Lo(t) - k0, t - k0].
  int64_t Lo(int64_t t, int64_t window) const { return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0; }
};

// window <= 0: none.
std::vector<Strip> Strips(int64_t T, int64_t window) {
  std::vector<Strip> s;
  for (int64_t i0 = 0; i0 < T; i0 += kQueryTile) {
    s.push_back({i0, std::min(kQueryTile, T - i0), window > 0 ? std::max<int64_t>(0, i0 - window + 1) : 0});
  }
  return s;
}

// Zeroes row[0, a) and row[b, keys).
void ZeroOutside(float* row, int64_t a, int64_t b, int64_t keys) {
  std::fill(row, row + a, 0.0f);
  std::fill(row + b, row + keys, 0.0f);
}

}  // namespace

void CpuBackend::CausalAttentionForward(float* out, float* lse, const float* qkv, int64_t B,
                                        int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                        int64_t window) {
  if (window >= T) window = 0;
  const int64_t rep = NH / NKV, C = NH * hs, W = C + 2 * NKV * hs, ld = StripLd(T);
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::vector<Strip> strips = Strips(T, window);
  const int64_t n_strips = int64_t(strips.size());
  const bool bf16 = matmul_->bf16();
  const float s_alpha = bf16 ? 1.0f : scale;  // bf16: scaled in the softmax loop
  struct Plans {
    const DnnlMatmul::Plan *s, *pv;
  };
  std::vector<Plans> plans(n_strips);
  for (int64_t si = 0; si < n_strips; ++si) {
    const int64_t rows = strips[si].rows, keys = strips[si].keys();
    // S (rows, keys) = scale * q_strip @ k^T ; out_strip (rows, hs) = P @ v.
    plans[si].s = matmul_->Prepare(rows, keys, hs, s_alpha, MatStrides{0, 0, W, 1},
                                   MatStrides{0, 0, 1, W}, 0.0f, MatStrides{0, 0, ld, 1});
    plans[si].pv = matmul_->Prepare(rows, hs, keys, 1.0f, MatStrides{0, 0, ld, 1},
                                    MatStrides{0, 0, W, 1}, 0.0f, MatStrides{0, 0, C, 1});
  }
  const uint16_t* qkv16 = nullptr;
  if (bf16) {
    uint16_t* q = matmul_->Bf16Slot(2, B * T * W);
    matmul_->ToBf16(q, qkv, B * T * W);
    qkv16 = q;
  }
  InArena([&] {
    ParallelFor(B * NH * n_strips, 1, [&](int64_t t0, int64_t t1) {
      float* S = ThreadBlock(0, kQueryTile * ld);
      uint16_t* S16 = bf16 ? ThreadBlock16(0, kQueryTile * ld) : nullptr;
      for (int64_t task = t0; task < t1; ++task) {
        // Longest strips first: the last strip of each head is the most work.
        const int64_t si = n_strips - 1 - task % n_strips, bh = task / n_strips;
        const int64_t b = bh / NH, h = bh % NH, g = h / rep;
        const Strip st = strips[si];
        const int64_t keys = st.keys(), kr = st.k0 * W;  // kr: the first key's row offset
        const float* base = qkv + b * T * W;
        const uint16_t* base16 = bf16 ? qkv16 + b * T * W : nullptr;
        if (bf16) {
          matmul_->Execute(plans[si].s, base16 + st.i0 * W + h * hs, base16 + kr + C + g * hs, S);
        } else {
          matmul_->Execute(plans[si].s, base + st.i0 * W + h * hs, base + kr + C + g * hs, S);
        }
        float* row_lse = lse + bh * T + st.i0;
        for (int64_t i = 0; i < st.rows; ++i) {
          const int64_t t = st.i0 + i, a = st.Lo(t, window) - st.k0;
          const int64_t n = t - st.k0 + 1 - a;  // row t sees block columns [a, a + n)
          float* row = S + i * ld + a;
          if (bf16) ScaleSpan(row, scale, n);
          const float mx = MaxSpan(row, n);
          const double sum = ExpShiftSumSpan(row, row, mx, n);
          ScaleSpan(row, float(1.0 / sum), n);
          ZeroOutside(S + i * ld, a, a + n, keys);
          row_lse[i] = mx + float(std::log(sum));
        }
        float* o = out + b * T * C + st.i0 * C + h * hs;
        if (bf16) {
          FloatToBf16Span(S16, S, (st.rows - 1) * ld + keys);
          matmul_->Execute(plans[si].pv, S16, base16 + kr + C + NKV * hs + g * hs, o);
        } else {
          matmul_->Execute(plans[si].pv, S, base + kr + C + NKV * hs + g * hs, o);
        }
      }
    });
  });
}

void CpuBackend::CausalAttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                         const float* lse, int64_t B, int64_t T, int64_t NH,
                                         int64_t NKV, int64_t hs, int64_t window) {
  if (window >= T) window = 0;
  const int64_t rep = NH / NKV, C = NH * hs, W = C + 2 * NKV * hs, ld = StripLd(T);
  const float scale = 1.0f / std::sqrt(float(hs));
  const std::vector<Strip> strips = Strips(T, window);
  const int64_t n_strips = int64_t(strips.size());
  const MatStrides qkv_rows{0, 0, W, 1}, qkv_t{0, 0, 1, W}, out_rows{0, 0, C, 1};
  const MatStrides blk{0, 0, ld, 1}, blk_t{0, 0, 1, ld};
  const bool bf16 = matmul_->bf16();
  const float alpha = bf16 ? 1.0f : scale;  // bf16: S scaled in the loop, dS pre-scaled
  struct Plans {
    const DnnlMatmul::Plan *s, *dp, *dv, *dq, *dk;
  };
  std::vector<Plans> plans(n_strips);
  for (int64_t si = 0; si < n_strips; ++si) {
    const int64_t rows = strips[si].rows, keys = strips[si].keys();
    Plans& p = plans[si];
    p.s = matmul_->Prepare(rows, keys, hs, alpha, qkv_rows, qkv_t, 0.0f, blk);      // q k^T
    p.dp = matmul_->Prepare(rows, keys, hs, 1.0f, out_rows, qkv_t, 0.0f, blk);      // dout v^T
    p.dv = matmul_->Prepare(keys, hs, rows, 1.0f, blk_t, out_rows, 1.0f, qkv_rows);  // P^T dout
    p.dq = matmul_->Prepare(rows, hs, keys, alpha, blk, qkv_rows, 1.0f, qkv_rows);  // dS k
    p.dk = matmul_->Prepare(keys, hs, rows, alpha, blk_t, qkv_rows, 1.0f, qkv_rows);  // dS^T q
  }
  const uint16_t *qkv16 = nullptr, *dout16 = nullptr;
  if (bf16) {
    uint16_t* q = matmul_->Bf16Slot(2, B * T * W);
    uint16_t* d = matmul_->Bf16Slot(3, B * T * C);
    matmul_->ToBf16(q, qkv, B * T * W);
    matmul_->ToBf16(d, dout, B * T * C);
    qkv16 = q;
    dout16 = d;
  }
  InArena([&] {
    ParallelFor(B * NKV, 1, [&](int64_t t0, int64_t t1) {
      float* P = ThreadBlock(0, kQueryTile * ld);
      float* D = ThreadBlock(1, kQueryTile * ld);
      uint16_t* P16 = bf16 ? ThreadBlock16(0, kQueryTile * ld) : nullptr;
      uint16_t* D16 = bf16 ? ThreadBlock16(1, kQueryTile * ld) : nullptr;
      for (int64_t task = t0; task < t1; ++task) {
        const int64_t b = task / NKV, g = task % NKV;
        const float* base = qkv + b * T * W;
        const float* k = base + C + g * hs;
        const float* v = base + C + NKV * hs + g * hs;
        float* dbase = dqkv + b * T * W;
        float* dk = dbase + C + g * hs;
        float* dv = dbase + C + NKV * hs + g * hs;
        const uint16_t* base16 = bf16 ? qkv16 + b * T * W : nullptr;
        const uint16_t* k16 = bf16 ? base16 + C + g * hs : nullptr;
        const uint16_t* v16 = bf16 ? base16 + C + NKV * hs + g * hs : nullptr;
        for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
          const float* row_lse_h = lse + (b * NH + h) * T;
          for (int64_t si = 0; si < n_strips; ++si) {
            const Strip st = strips[si];
            const int64_t keys = st.keys(), kr = st.k0 * W;  // kr: the first key's row offset
            const Plans& p = plans[si];
            const float* q = base + st.i0 * W + h * hs;
            const float* d_out = dout + b * T * C + st.i0 * C + h * hs;
            const uint16_t* q16 = bf16 ? base16 + st.i0 * W + h * hs : nullptr;
            const uint16_t* d_out16 = bf16 ? dout16 + b * T * C + st.i0 * C + h * hs : nullptr;
            if (bf16) {
              matmul_->Execute(p.s, q16, k16 + kr, P);
              matmul_->Execute(p.dp, d_out16, v16 + kr, D);
            } else {
              matmul_->Execute(p.s, q, k + kr, P);
              matmul_->Execute(p.dp, d_out, v + kr, D);
            }
            for (int64_t i = 0; i < st.rows; ++i) {
              const int64_t t = st.i0 + i, a = st.Lo(t, window) - st.k0;
              const int64_t n = t - st.k0 + 1 - a;  // row t's block columns [a, a + n)
              float* pr = P + i * ld + a;
              float* dr = D + i * ld + a;
              if (bf16) ScaleSpan(pr, scale, n);
              ExpShiftSumSpan(pr, pr, row_lse_h[t], n);  // probabilities
              const float dot = DotSpan(pr, dr, n);
              SoftmaxGradSpan(dr, pr, dot, n);
              if (bf16) ScaleSpan(dr, scale, n);  // (p * (d - dot)) * scale, as one expression
              ZeroOutside(P + i * ld, a, a + n, keys);
              ZeroOutside(D + i * ld, a, a + n, keys);
            }
            float* dq = dbase + st.i0 * W + h * hs;
            if (bf16) {
              const int64_t n16 = (st.rows - 1) * ld + keys;
              FloatToBf16Span(P16, P, n16);
              FloatToBf16Span(D16, D, n16);
              matmul_->Execute(p.dv, P16, d_out16, dv + kr);
              matmul_->Execute(p.dq, D16, k16 + kr, dq);
              matmul_->Execute(p.dk, D16, q16, dk + kr);
            } else {
              matmul_->Execute(p.dv, P, d_out, dv + kr);
              matmul_->Execute(p.dq, D, k + kr, dq);
              matmul_->Execute(p.dk, D, q, dk + kr);
            }
          }
        }
      }
    });
  });
}

void CpuBackend::AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                  int64_t C, int64_t NH) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "AttentionForward: NH=" << NH << " does not divide C=" << C;
  CausalAttentionForward(out, att, qkv, B, T, NH, NH, C / NH, 0);
}

void CpuBackend::AttentionBackward(float* dqkv, float* /*scratch*/, const float* dout,
                                   const float* qkv, const float* att, int64_t B, int64_t T,
                                   int64_t C, int64_t NH) {
  L2L_CHECK(NH > 0 && C % NH == 0) << "AttentionBackward: NH=" << NH << " does not divide C=" << C;
  CausalAttentionBackward(dqkv, dout, qkv, att, B, T, NH, NH, C / NH, 0);
}

void CpuBackend::AttentionForwardGqa(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                     int64_t NH, int64_t NKV, int64_t hs) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "AttentionForwardGqa: NKV=" << NKV << " does not divide NH=" << NH;
  CausalAttentionForward(out, att, qkv, B, T, NH, NKV, hs, 0);
}

void CpuBackend::AttentionBackwardGqa(float* dqkv, float* /*scratch*/, const float* dout,
                                      const float* qkv, const float* att, int64_t B, int64_t T,
                                      int64_t NH, int64_t NKV, int64_t hs) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "AttentionBackwardGqa: NKV=" << NKV << " does not divide NH=" << NH;
  CausalAttentionBackward(dqkv, dout, qkv, att, B, T, NH, NKV, hs, 0);
}

void CpuBackend::AttentionForwardGqaWindow(float* out, float* att, const float* qkv, int64_t B,
                                           int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                           int64_t window) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "AttentionForwardGqaWindow: NKV=" << NKV << " does not divide NH=" << NH;
  CausalAttentionForward(out, att, qkv, B, T, NH, NKV, hs, window);
}

void CpuBackend::AttentionBackwardGqaWindow(float* dqkv, float* /*scratch*/, const float* dout,
                                            const float* qkv, const float* att, int64_t B, int64_t T,
                                            int64_t NH, int64_t NKV, int64_t hs, int64_t window) {
  L2L_CHECK(NKV > 0 && NH % NKV == 0) << "AttentionBackwardGqaWindow: NKV=" << NKV << " does not divide NH=" << NH;
  CausalAttentionBackward(dqkv, dout, qkv, att, B, T, NH, NKV, hs, window);
}

}  // namespace l2l::kernels

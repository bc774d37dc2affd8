// CpuBackend's BERT-family ops: LayerNorm with a configurable epsilon, the exact (erf)
// GELU, tanh, and bidirectional multi-head attention with a key padding mask. See
// kernels/backend.h for the contracts. The attention is a direct loop per (sequence, head)
// with double accumulators (no GEMM): BERT fine-tuning shapes are small next to the
// decoders', and the loop keeps the masked softmax obvious. Every op's result is
// independent of the thread count (no reduction crosses the parallel split).
// Thread-safety: as every Backend, one thread at a time.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_parallel.h"

namespace l2l::kernels {
namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

}  // namespace

void CpuBackend::LayerNormForwardEps(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int64_t N, int64_t C,
                                     float eps) {
  InArena([&] {
    ParallelFor(N, RowGrain(C), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        LayerNormRowForward(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C, eps);
      }
    });
  });
}

void CpuBackend::GeluErfForward(float* out, const float* inp, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double x = inp[i];
        out[i] = float(0.5 * x * (1.0 + std::erf(x * kInvSqrt2)));
      }
    });
  });
}

void CpuBackend::GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double x = inp[i];
        const double g = 0.5 * (1.0 + std::erf(x * kInvSqrt2)) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
        dinp[i] += float(g * dout[i]);
      }
    });
  });
}

void CpuBackend::TanhForward(float* out, const float* inp, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) out[i] = std::tanh(inp[i]);
    });
  });
}

void CpuBackend::TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) {
  InArena([&] {
    ParallelFor(n, kElemGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dinp[i] += (1.0f - out[i] * out[i]) * dout[i];
    });
  });
}

void CpuBackend::AttentionForwardMasked(float* out, float* att, const float* qkv,
                                        const int32_t* key_mask, int64_t B, int64_t T, int64_t C,
                                        int64_t NH) {
  const int64_t hs = C / NH, W = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  if (key_mask != nullptr) {
    for (int64_t b = 0; b < B; ++b) {
      bool any = false;
      for (int64_t j = 0; j < T; ++j) any |= key_mask[b * T + j] != 0;
      L2L_CHECK(any) << "AttentionForwardMasked: sequence " << b << " has no real token (its attention mask is all 0)";
    }
  }
  InArena([&] {
    ParallelFor(B * NH, 1, [&](int64_t k0, int64_t k1) {
      std::vector<double> w(static_cast<size_t>(T)), acc(static_cast<size_t>(hs));
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t b = k / NH, h = k % NH;
        const int32_t* mask = key_mask != nullptr ? key_mask + b * T : nullptr;
        for (int64_t t = 0; t < T; ++t) {
          const float* q = qkv + (b * T + t) * W + h * hs;
          double mx = -INFINITY;
          for (int64_t j = 0; j < T; ++j) {
            if (mask != nullptr && mask[j] == 0) {
              w[j] = -INFINITY;
              continue;
            }
            const float* kk = qkv + (b * T + j) * W + C + h * hs;
            double s = 0.0;
            for (int64_t i = 0; i < hs; ++i) s += double(q[i]) * double(kk[i]);
            w[j] = s * scale;
            mx = std::max(mx, w[j]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            w[j] = std::isinf(w[j]) ? 0.0 : std::exp(w[j] - mx);
            sum += w[j];
          }
          float* a = att + ((b * NH + h) * T + t) * T;
          for (int64_t i = 0; i < hs; ++i) acc[i] = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            const float p = float(w[j] / sum);
            a[j] = p;
            if (p == 0.0f) continue;
            const float* v = qkv + (b * T + j) * W + 2 * C + h * hs;
            for (int64_t i = 0; i < hs; ++i) acc[i] += double(p) * double(v[i]);
          }
          float* o = out + (b * T + t) * C + h * hs;
          for (int64_t i = 0; i < hs; ++i) o[i] = float(acc[i]);
        }
      }
    });
  });
}

void CpuBackend::AttentionBackwardMasked(float* dqkv, float* scratch, const float* dout,
                                         const float* qkv, const float* att, int64_t B, int64_t T,
                                         int64_t C, int64_t NH) {
  const int64_t hs = C / NH, W = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  // Each (b, h) task writes only its own head's columns of dqkv, so tasks never overlap.
  InArena([&] {
    ParallelFor(B * NH, 1, [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t b = k / NH, h = k % NH;
        float* ds = scratch + k * T * T;  // dscores (T,T)
        for (int64_t t = 0; t < T; ++t) {
          const float* a = att + (k * T + t) * T;
          const float* dy = dout + (b * T + t) * C + h * hs;
          // datt[j] = dy . v_j; dscore = a * (datt - sum_j a datt).
          double dot = 0.0;
          for (int64_t j = 0; j < T; ++j) {
            double da = 0.0;
            if (a[j] != 0.0f) {
              const float* v = qkv + (b * T + j) * W + 2 * C + h * hs;
              for (int64_t i = 0; i < hs; ++i) da += double(dy[i]) * double(v[i]);
              // dv_j += a[j] * dy
              float* dv = dqkv + (b * T + j) * W + 2 * C + h * hs;
              for (int64_t i = 0; i < hs; ++i) dv[i] += a[j] * dy[i];
            }
            ds[t * T + j] = float(da);
            dot += double(a[j]) * da;
          }
          for (int64_t j = 0; j < T; ++j) ds[t * T + j] = float(double(a[j]) * (double(ds[t * T + j]) - dot) * scale);
        }
        for (int64_t t = 0; t < T; ++t) {
          const float* q = qkv + (b * T + t) * W + h * hs;
          float* dq = dqkv + (b * T + t) * W + h * hs;
          for (int64_t j = 0; j < T; ++j) {
            const float d = ds[t * T + j];
            if (d == 0.0f) continue;
            const float* kk = qkv + (b * T + j) * W + C + h * hs;
            float* dk = dqkv + (b * T + j) * W + C + h * hs;
            for (int64_t i = 0; i < hs; ++i) {
              dq[i] += d * kk[i];
              dk[i] += d * q[i];
            }
          }
        }
      }
    });
  });
}

}  // namespace l2l::kernels

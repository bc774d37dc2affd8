// CpuBackend's Llama-family ops: token embedding without positions, RMSNorm, rotary
// position embeddings, SwiGLU and grouped-query attention. See kernels/backend.h for the
// contracts. Reductions that cross rows (the token embedding's gradient: rows in order
// inside column slices; RMSNorm's weight gradient: fixed row chunks, ReduceRowChunks) do
// not depend on the thread count. SwiGLU's sigmoid and the norms run vectorised
// (cpu_math.h). Thread-safety: as every Backend, one thread at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_math.h"
#include "kernels/cpu/cpu_parallel.h"

namespace l2l::kernels {
// ---- token embedding -------------------------------------------------------------------

void CpuBackend::TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                                       int64_t N, int64_t C) {
  InArena([&] {
    ParallelFor(N, RowGrain(C), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const int32_t tok = tokens[n];
        L2L_CHECK(tok >= 0) << "TokenEmbeddingForward: token " << tok << " at row " << n << " is negative";
        const float* e = wte + int64_t(tok) * C;
        float* o = out + n * C;
        for (int64_t c = 0; c < C; ++c) o[c] = e[c];
      }
    });
  });
}

void CpuBackend::TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens,
                                        int64_t N, int64_t C) {
  InArena([&] {
    ForColumnChunks(C, kColumnChunk, [&](int64_t c0, int64_t c1) {
      for (int64_t n = 0; n < N; ++n) {
        float* dw = dwte + int64_t(tokens[n]) * C;
        const float* d = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dw[c] += d[c];
      }
    });
  });
}

// ---- mixture-of-experts row ops ----------------------------------------------------------
// Rows are independent (ScatterAddRows' indices are distinct), so any split is exact.

void CpuBackend::GatherRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                            int64_t n, int64_t C) {
  InArena([&] {
    ParallelFor(n, RowGrain(C), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* s = src + int64_t(idx[i]) * C;
        float* d = dst + i * C;
        if (scale == nullptr) {
          for (int64_t c = 0; c < C; ++c) d[c] = s[c];
        } else {
          const float w = scale[i];
          for (int64_t c = 0; c < C; ++c) d[c] = s[c] * w;
        }
      }
    });
  });
}

void CpuBackend::ScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                                int64_t n, int64_t C) {
  InArena([&] {
    ParallelFor(n, RowGrain(C), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const float* s = src + i * C;
        float* d = dst + int64_t(idx[i]) * C;
        if (scale == nullptr) {
          for (int64_t c = 0; c < C; ++c) d[c] += s[c];
        } else {
          const float w = scale[i];
          for (int64_t c = 0; c < C; ++c) {
            const float t = s[c] * w;  // rounded, as torch multiplies before index_add_
            d[c] += t;
          }
        }
      }
    });
  });
}

void CpuBackend::RowDot(float* out, const float* a, const float* b, int64_t n, int64_t C) {
  InArena([&] {
    ParallelFor(n, RowGrain(C), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float acc = 0.0f;
        for (int64_t c = 0; c < C; ++c) acc += a[i * C + c] * b[i * C + c];
        out[i] = acc;
      }
    });
  });
}

// ---- RMSNorm ---------------------------------------------------------------------------

void CpuBackend::RMSNormForward(float* out, float* rstd, const float* inp, const float* weight,
                                int64_t N, int64_t C, float eps) {
  InArena([&] {
    ParallelFor(N, RowGrain(C), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) RMSNormRowForward(out + n * C, rstd + n, inp + n * C, weight, C, eps);
    });
  });
}

void CpuBackend::RMSNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                                 const float* weight, const float* rstd, int64_t N, int64_t C) {
  // One pass: each row's dinp, and its dweight terms into its row chunk's partial.
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, C, {dweight}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t n = r0; n < r1; ++n) {
        RMSNormRowBackward(dinp + n * C, part, inp + n * C, dout + n * C, weight, rstd[n], C);
      }
    });
  });
}

void CpuBackend::RMSNormBackwardResidual(float* dinp, float* dweight, const float* dresid,
                                         const float* dout, const float* inp, const float* weight,
                                         const float* rstd, int64_t N, int64_t C) {
  // The copy of dresid in the row loop (cache-hot): the default's bits, one pass fewer.
  InArena([&] {
    ReduceRowChunks(&row_partials_, N, C, {dweight}, [&](int64_t r0, int64_t r1, float* part) {
      for (int64_t n = r0; n < r1; ++n) {
        if (dinp != dresid) std::copy(dresid + n * C, dresid + (n + 1) * C, dinp + n * C);
        RMSNormRowBackward(dinp + n * C, part, inp + n * C, dout + n * C, weight, rstd[n], C);
      }
    });
  });
}

// ---- rotary position embedding ---------------------------------------------------------

namespace {

// Rotates every head of rows [n0, n1) by +angle (sign = 1, forward) or -angle (sign = -1,
// the backward's transposed rotation).
void RotateRows(float* x, const float* cos, const float* sin, int64_t n0, int64_t n1, int64_t T,
                int64_t row_stride, int64_t n_heads, int64_t hs, float sign) {
  const int64_t half = hs / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t t = n % T;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    float* row = x + n * row_stride;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* a = row + h * hs;
      float* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const float xa = a[i], xb = b[i], si = sign * s[i];
        a[i] = xa * c[i] - xb * si;
        b[i] = xb * c[i] + xa * si;
      }
    }
  }
}

}  // namespace

void CpuBackend::RopeForward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                             int64_t row_stride, int64_t n_heads, int64_t hs) {
  L2L_CHECK(hs % 2 == 0) << "RopeForward: head size " << hs << " is odd";
  InArena([&] {
    ParallelFor(B * T, RowGrain(n_heads * hs), [&](int64_t n0, int64_t n1) {
      RotateRows(x, cos, sin, n0, n1, T, row_stride, n_heads, hs, 1.0f);
    });
  });
}

void CpuBackend::RopeBackward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                              int64_t row_stride, int64_t n_heads, int64_t hs) {
  L2L_CHECK(hs % 2 == 0) << "RopeBackward: head size " << hs << " is odd";
  InArena([&] {
    ParallelFor(B * T, RowGrain(n_heads * hs), [&](int64_t n0, int64_t n1) {
      RotateRows(dx, cos, sin, n0, n1, T, row_stride, n_heads, hs, -1.0f);
    });
  });
}

// ---- SwiGLU ----------------------------------------------------------------------------

void CpuBackend::SwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F) {
  InArena([&] {
    ParallelFor(N, RowGrain(F), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) SwiGLUForwardSpan(out + n * F, gate_up + n * 2 * F, gate_up + n * 2 * F + F, F);
    });
  });
}

namespace {
// Rows [0, N) of the SwiGLU backward: dgate_up accumulates, or (overwrite) each row is
// zeroed right before its accumulate (cache-hot) instead of a Zero pass first.
void SwiGLUBackwardRows(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int64_t F,
                        bool overwrite) {
  ParallelFor(N, RowGrain(F), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* g = gate_up + n * 2 * F;
      float* dg = dgate_up + n * 2 * F;
      if (overwrite) std::fill(dg, dg + 2 * F, 0.0f);
      SwiGLUBackwardSpan(dg, dg + F, g, g + F, dout + n * F, F);
    }
  });
}
}  // namespace

void CpuBackend::SwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                                int64_t F) {
  InArena([&] { SwiGLUBackwardRows(dgate_up, dout, gate_up, N, F, /*overwrite=*/false); });
}

void CpuBackend::SwiGLUBackwardInto(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                                    int64_t F) {
  InArena([&] { SwiGLUBackwardRows(dgate_up, dout, gate_up, N, F, /*overwrite=*/true); });
}

// ---- GeGLU (Gemma) -------------------------------------------------------------------------

void CpuBackend::GegluForward(float* out, const float* gate_up, int64_t N, int64_t F) {
  InArena([&] {
    ParallelFor(N, RowGrain(F), [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        float* o = out + n * F;
        const float* u = gate_up + n * 2 * F + F;
        GeluForwardSpan(o, gate_up + n * 2 * F, F);
        for (int64_t f = 0; f < F; ++f) o[f] *= u[f];
      }
    });
  });
}

void CpuBackend::GegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                               int64_t F) {
  InArena([&] {
    ParallelFor(N, RowGrain(F), [&](int64_t n0, int64_t n1) {
      thread_local std::vector<float> tmp;
      if (int64_t(tmp.size()) < F) tmp.resize(F);
      for (int64_t n = n0; n < n1; ++n) {
        const float* g = gate_up + n * 2 * F;
        const float* u = g + F;
        const float* d = dout + n * F;
        float* dg = dgate_up + n * 2 * F;
        float* du = dg + F;
        for (int64_t f = 0; f < F; ++f) tmp[f] = d[f] * u[f];
        GeluBackwardSpan(dg, g, tmp.data(), F);  // dg += gelu'(g) * dout * up
        GeluForwardSpan(tmp.data(), g, F);
        for (int64_t f = 0; f < F; ++f) du[f] += d[f] * tmp[f];
      }
    });
  });
}

// Grouped-query attention is in cpu_attention.cc (shared with the multi-head case).

}  // namespace l2l::kernels

// Vectorised fp32 math for the CPU backend's hot loops: GELU (tanh form) and its
// gradient, exp-sums for softmax/cross-entropy, the row kernels of the fused backward
// passes (LayerNorm and RMSNorm rows, SwiGLU, the softmax gradient, adds), and the
// fp32 -> bf16 cast of the bf16 GEMM mode. libm's scalar tanhf/expf cost
// ~10-20 ns an element, which made GELU and softmax slower than the GEMMs around them;
// these use Cephes-style polynomials (~2 ulp) on GCC vectors, compiled for AVX-512
// (16 lanes), AVX2+FMA and the baseline ISA (8 lanes), picked at run time from the CPU's
// features (cpu_math.cc).
// Thread-safety: pure functions over caller-owned spans; SetMathIsa is for tests and
// benchmarks, not to be called while other threads run these.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace l2l::kernels {

// The instruction set the functions below run on: the best the CPU has (BestMathIsa),
// capped by L2L_CPU_ISA=avx2|base in the environment at load (common/env.h), or by
// SetMathIsa (false, and no change, when the CPU lacks `isa`).
enum class MathIsa { kBase = 0, kAvx2 = 1, kAvx512 = 2 };
MathIsa BestMathIsa();
MathIsa ActiveMathIsa();
bool SetMathIsa(MathIsa isa);
const char* MathIsaName(MathIsa isa);           // "base" | "avx2" | "avx512"
Result<MathIsa> ParseMathIsa(std::string_view s);  // inverse of MathIsaName

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = in[i]. out may alias in.
void GeluForwardSpan(float* out, const float* in, int64_t n);
// dinp[i] += gelu'(in[i]) * dout[i].
void GeluBackwardSpan(float* dinp, const float* in, const float* dout, int64_t n);
// dinp[i] = gelu'(in[i]) * dout[i] (overwritten); sum[i] += dinp[i].
void GeluBackwardSumSpan(float* dinp, float* sum, const float* in, const float* dout, int64_t n);
// Softmax backward of one row: d[i] = p[i] * (d[i] - dot), dot = sum p * d (the caller's).
void SoftmaxGradSpan(float* d, const float* p, float dot, int64_t n);
// SwiGLU over one row: out[i] = silu(g[i]) * u[i] (silu(g) = g * sigmoid(g)).
void SwiGLUForwardSpan(float* out, const float* g, const float* u, int64_t n);
// Its backward: dg[i] += d u sigmoid(g) (1 + g (1 - sigmoid(g))); du[i] += d silu(g).
void SwiGLUBackwardSpan(float* dg, float* du, const float* g, const float* u, const float* d, int64_t n);
// One row of RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps) (saved).
void RMSNormRowForward(float* out, float* rstd, const float* x, const float* w, int64_t C, float eps);
// Its backward, d = dout row: dinp += rs (w d - norm mean(w d norm)), norm = x rs; dw += norm d.
void RMSNormRowBackward(float* dinp, float* dw, const float* x, const float* d, const float* w, float rs,
                        int64_t C);
// out[i] = a[i] + b[i]; out may alias a or b.
void AddSpan(float* out, const float* a, const float* b, int64_t n);
// One row of LayerNorm: out = (x - mean) * rstd * w + b over C; *mean, *rstd saved
// (mean and biased variance from fp32 lane sums combined in double).
void LayerNormRowForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int64_t C, float eps);
// One row of LayerNorm's backward, d = dout row: dinp += (w d - mean(w d) - norm mean(w d norm))
// rstd with norm = (x - mean) rstd; dw += norm d; db += d (all over C).
void LayerNormRowBackward(float* dinp, float* dw, float* db, const float* x, const float* d,
                          const float* w, float mean, float rstd, int64_t C);
// max of x[0..n), n >= 1.
float MaxSpan(const float* x, int64_t n);
// out[i] = exp(x[i] - shift); returns the sum of out (out may alias x).
double ExpShiftSumSpan(float* out, const float* x, float shift, int64_t n);
// x[i] *= s.
void ScaleSpan(float* x, float s, int64_t n);
// sum of a[i] * b[i].
float DotSpan(const float* a, const float* b, int64_t n);
// out[i] = bf16(in[i]), round to nearest even (NaN stays NaN, denormals are rounded, not
// flushed): bit-identical to common/dtype.h's FloatToBf16 on every path.
void FloatToBf16Span(uint16_t* out, const float* in, int64_t n);

}  // namespace l2l::kernels

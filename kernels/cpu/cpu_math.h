// Vectorised fp32 math for the CPU backend's hot loops: GELU (tanh form) and its
// gradient, and exp-sums for softmax/cross-entropy. libm's scalar tanhf/expf cost
// ~10-20 ns an element, which made GELU and softmax slower than the GEMMs around them;
// these use Cephes-style polynomials (~2 ulp) on 8-wide GCC vectors, compiled twice
// (AVX2+FMA and the baseline ISA) and picked at load time (target_clones).
// Thread-safety: pure functions over caller-owned spans.
#pragma once

#include <cstdint>

namespace l2l::kernels {

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = in[i]. out may alias in.
void GeluForwardSpan(float* out, const float* in, int64_t n);
// dinp[i] += gelu'(in[i]) * dout[i].
void GeluBackwardSpan(float* dinp, const float* in, const float* dout, int64_t n);
// max of x[0..n), n >= 1.
float MaxSpan(const float* x, int64_t n);
// out[i] = exp(x[i] - shift); returns the sum of out (out may alias x).
double ExpShiftSumSpan(float* out, const float* x, float shift, int64_t n);
// x[i] *= s.
void ScaleSpan(float* x, float s, int64_t n);
// sum of a[i] * b[i].
float DotSpan(const float* a, const float* b, int64_t n);

}  // namespace l2l::kernels

// Vectorised fp32 math on 8-wide GCC vector extensions; see cpu_math.h. The bodies
// (cpu_math_impl.inc) are compiled twice, for AVX2+FMA and for the baseline x86-64 ISA,
// and each entry point picks one by a CPU feature check made once. (GCC's target_clones
// would dispatch "arch=haswell" by CPU model, which skips AMD parts that have AVX2.)
#include "kernels/cpu/cpu_math.h"

#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vectors in the baseline build: all inlined

#define L2L_INLINE static inline __attribute__((always_inline))

namespace l2l::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
namespace avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "kernels/cpu/cpu_math_impl.inc"
#pragma GCC pop_options
}  // namespace avx2
const bool kHaveAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#define L2L_DISPATCH(fn, ...) (kHaveAvx2 ? avx2::fn(__VA_ARGS__) : base::fn(__VA_ARGS__))
#else
#define L2L_DISPATCH(fn, ...) base::fn(__VA_ARGS__)
#endif

namespace base {
#include "kernels/cpu/cpu_math_impl.inc"
}  // namespace base

}  // namespace

void GeluForwardSpan(float* out, const float* in, int64_t n) {
  L2L_DISPATCH(GeluForwardSpan, out, in, n);
}
void GeluBackwardSpan(float* dinp, const float* in, const float* dout, int64_t n) {
  L2L_DISPATCH(GeluBackwardSpan, dinp, in, dout, n);
}
float MaxSpan(const float* x, int64_t n) { return L2L_DISPATCH(MaxSpan, x, n); }
double ExpShiftSumSpan(float* out, const float* x, float shift, int64_t n) {
  return L2L_DISPATCH(ExpShiftSumSpan, out, x, shift, n);
}
void ScaleSpan(float* x, float s, int64_t n) { L2L_DISPATCH(ScaleSpan, x, s, n); }
float DotSpan(const float* a, const float* b, int64_t n) { return L2L_DISPATCH(DotSpan, a, b, n); }

}  // namespace l2l::kernels

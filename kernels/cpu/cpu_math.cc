// Vectorised fp32 math on GCC vector extensions; see cpu_math.h. The bodies
// (cpu_math_impl.inc) are compiled three times: 16 lanes for AVX-512 (F, BW, DQ, VL),
// 8 lanes for AVX2+FMA, and 8 lanes for the baseline x86-64 ISA. Each entry point picks
// one by CPU feature checks made once at load (GCC's target_clones would dispatch
// "arch=haswell" by CPU model, which skips AMD parts that have AVX2), capped by
// L2L_CPU_ISA=avx512|avx2|base when set. Elementwise results (GELU, exp) are the same
// on every path; sums (ExpShiftSumSpan, DotSpan) differ by rounding, as lanes differ.
#include "kernels/cpu/cpu_math.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "common/env.h"
#include "common/name_table.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // wide vectors in narrower builds: all inlined

#define L2L_INLINE static inline __attribute__((always_inline))

namespace l2l::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
#define L2L_HAVE_X86 1
// Each ISA region: GCC's push_options + `#pragma GCC target`. Clang has neither pragma (it
// warns -Wunknown-pragmas and would compile the region for the baseline ISA, as the ASan
// and fuzz builds did): there the same target is an attribute on every function of the
// region (`#pragma clang attribute`), so the always-inline helpers match their callers.
namespace avx512 {
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")
#endif
#define L2L_VEC_FLOATS 16
#include "kernels/cpu/cpu_math_impl.inc"
#undef L2L_VEC_FLOATS
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx512
namespace avx2 {
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define L2L_VEC_FLOATS 8
#include "kernels/cpu/cpu_math_impl.inc"
#undef L2L_VEC_FLOATS
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
}  // namespace avx2
#endif

namespace base {
#define L2L_VEC_FLOATS 8
#include "kernels/cpu/cpu_math_impl.inc"
#undef L2L_VEC_FLOATS
}  // namespace base

constexpr std::pair<MathIsa, const char*> kMathIsaNames[] = {
    {MathIsa::kBase, "base"}, {MathIsa::kAvx2, "avx2"}, {MathIsa::kAvx512, "avx512"}};

MathIsa Detect() {
#ifdef L2L_HAVE_X86
  MathIsa best = MathIsa::kBase;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = MathIsa::kAvx2;
  if (best == MathIsa::kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    best = MathIsa::kAvx512;
  }
  return best;
#else
  return MathIsa::kBase;
#endif
}

const MathIsa kBest = Detect();

// Runs during static initialisation, so a bad value cannot be returned: it is reported
// (ResolveCpuGemm returns it as an error) and the best ISA is used.
MathIsa Initial() {
  const Result<std::optional<MathIsa>> cap = EnvEnum(EnvVar::kCpuIsa, ParseMathIsa);
  if (!cap.ok()) std::fprintf(stderr, "cpu backend: %s; using %s\n", cap.status().message().c_str(), MathIsaName(kBest));
  const MathIsa want = cap.ok() ? cap->value_or(kBest) : kBest;
  return static_cast<int>(want) < static_cast<int>(kBest) ? want : kBest;
}

std::atomic<MathIsa> g_isa{Initial()};

#ifdef L2L_HAVE_X86
#define L2L_DISPATCH(fn, ...)                                                 \
  switch (g_isa.load(std::memory_order_relaxed)) {                           \
    case MathIsa::kAvx512: return avx512::fn(__VA_ARGS__);                   \
    case MathIsa::kAvx2: return avx2::fn(__VA_ARGS__);                       \
    default: return base::fn(__VA_ARGS__);                                   \
  }
#else
#define L2L_DISPATCH(fn, ...) return base::fn(__VA_ARGS__);
#endif

}  // namespace

MathIsa BestMathIsa() { return kBest; }
MathIsa ActiveMathIsa() { return g_isa.load(); }
bool SetMathIsa(MathIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(kBest)) return false;
  g_isa.store(isa);
  return true;
}
const char* MathIsaName(MathIsa isa) { return NameOf(kMathIsaNames, isa); }
Result<MathIsa> ParseMathIsa(std::string_view s) { return ParseName(kMathIsaNames, s); }

void GeluForwardSpan(float* out, const float* in, int64_t n) { L2L_DISPATCH(GeluForwardSpan, out, in, n); }
void GeluBackwardSpan(float* dinp, const float* in, const float* dout, int64_t n) {
  L2L_DISPATCH(GeluBackwardSpan, dinp, in, dout, n);
}
float MaxSpan(const float* x, int64_t n) { L2L_DISPATCH(MaxSpan, x, n); }
void GeluBackwardSumSpan(float* dinp, float* sum, const float* in, const float* dout, int64_t n) {
  L2L_DISPATCH(GeluBackwardSumSpan, dinp, sum, in, dout, n);
}
void SoftmaxGradSpan(float* d, const float* p, float dot, int64_t n) { L2L_DISPATCH(SoftmaxGradSpan, d, p, dot, n); }
void AddSpan(float* out, const float* a, const float* b, int64_t n) { L2L_DISPATCH(AddSpan, out, a, b, n); }
void SwiGLUForwardSpan(float* out, const float* g, const float* u, int64_t n) {
  L2L_DISPATCH(SwiGLUForwardSpan, out, g, u, n);
}
void SwiGLUBackwardSpan(float* dg, float* du, const float* g, const float* u, const float* d, int64_t n) {
  L2L_DISPATCH(SwiGLUBackwardSpan, dg, du, g, u, d, n);
}
void RMSNormRowForward(float* out, float* rstd, const float* x, const float* w, int64_t C, float eps) {
  L2L_DISPATCH(RMSNormRowForward, out, rstd, x, w, C, eps);
}
void RMSNormRowBackward(float* dinp, float* dw, const float* x, const float* d, const float* w, float rs,
                        int64_t C) {
  L2L_DISPATCH(RMSNormRowBackward, dinp, dw, x, d, w, rs, C);
}
void LayerNormRowForward(float* out, float* mean, float* rstd, const float* x, const float* w,
                         const float* b, int64_t C, float eps) {
  L2L_DISPATCH(LayerNormRowForward, out, mean, rstd, x, w, b, C, eps);
}
void LayerNormRowBackward(float* dinp, float* dw, float* db, const float* x, const float* d,
                          const float* w, float mean, float rstd, int64_t C) {
  L2L_DISPATCH(LayerNormRowBackward, dinp, dw, db, x, d, w, mean, rstd, C);
}

double ExpShiftSumSpan(float* out, const float* x, float shift, int64_t n) {
  L2L_DISPATCH(ExpShiftSumSpan, out, x, shift, n);
}
void ScaleSpan(float* x, float s, int64_t n) { L2L_DISPATCH(ScaleSpan, x, s, n); }
float DotSpan(const float* a, const float* b, int64_t n) { L2L_DISPATCH(DotSpan, a, b, n); }
void FloatToBf16Span(uint16_t* out, const float* in, int64_t n) {
  L2L_DISPATCH(FloatToBf16Span, out, in, n);
}

}  // namespace l2l::kernels

// Vectorised AdamW for the EPS update pipeline (eps_server/update_pipeline.h): one pass
// over memory that reduces the workers' gradients (summed in worker order), applies
// AdamW to the fp32 master and moments in place, and writes the published copy (bf16 or
// fp32) of the new weights.
// AVX-512 / AVX2 / scalar chosen at run time (__builtin_cpu_supports).
//
// Bound: bit-identical to common/adamw.h AdamWStep applied to g = (g_0 + g_1 + ...) *
// grad_scale. Every element goes through the same IEEE operations in the same order
// (mul, add, sqrt, div: all correctly rounded; this file is compiled with
// -ffp-contract=off so no FMA is formed), so all code paths agree bit for bit; the
// unit test (tests/kernels/adamw_simd_test.cc) checks exact equality on every path the
// CPU supports. The per-call scalars are common/adamw.h MakeAdamWScalars, the one
// derivation AdamWStep uses too.
//
// Its own library, l2l_kernels_cpu_adamw (kernels/CMakeLists.txt): the daemon links it
// without oneDNN or the rest of the CPU backend.
//
// AdamWUpdateFast: the same update with fewer, cheaper operations (fused multiply-adds,
// a multiply by 1/sqrt(1-b2^t) instead of a divide: one sqrt and one divide per element,
// as torch's fused CPU AdamW and DeepSpeedCPUAdam do). It differs from the exact update by
// a few fp32 rounding steps per element (tested against a double-precision reference);
// its paths agree with each other bit for bit (fma, sqrt and divide are correctly rounded
// on every path, the scalar one included). The pipeline uses the exact update.
//
// Thread-safety: pure function over caller-owned buffers; callers split large arrays
// across threads (different ranges never alias).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/status.h"

namespace l2l::kernels {

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* SimdLevelName(SimdLevel s);
SimdLevel DetectSimdLevel();  // best level this CPU supports (AVX2 means AVX2 + FMA)
// The path a request runs on: `requested`, or the best supported level below it.
SimdLevel ResolveSimdLevel(SimdLevel requested);

// One AdamW step with arguments `a` (a.weight_decay as the range's decay has it:
// common/adamw.h WithDecay). param, m, v: (n) fp32, updated in place. grads: num_grads arrays of (n) fp32, summed in
// index order then scaled. out: (n) elements of out_dtype (kF32 or kBF16) receiving the
// new param, or nullptr. level: code path (kScalar..kAvx512); a level the CPU lacks
// falls back to the best supported one.
// Returns whether every reduced, scaled gradient element was finite (the check is fused
// into the same pass: one compare per vector). On false the state was still written
// (with non-finite values): the caller must restore it (the update pipeline keeps an
// undo copy, eps_server/update_pipeline.h).
bool AdamWUpdate(const AdamWStepArgs& a, float* param, float* m, float* v, const float* const* grads,
                 int num_grads, size_t n, DType out_dtype, void* out,
                 SimdLevel level = DetectSimdLevel());

// As AdamWUpdate (the same finiteness result), with the fast arithmetic described at the
// top of this file.
bool AdamWUpdateFast(const AdamWStepArgs& a, float* param, float* m, float* v, const float* const* grads,
                     int num_grads, size_t n, DType out_dtype, void* out,
                     SimdLevel level = DetectSimdLevel());

// sum_i ((sum_w grads[w][i]) * scale)^2 in double: the squared norm of the reduced
// gradient (clipping).
double ReducedSumSquares(const float* const* grads, int num_grads, size_t n, float scale);

// Parameters per second of AdamWUpdate (exact arithmetic, one gradient, bf16 copy out) as
// the daemon's pipeline runs it: chunks in parallel on the TBB threads, over n-element
// buffers (far larger than the caches, so memory bandwidth limits it as it does the real
// update). One untimed pass brings the pages in; the timed one is the steady state. Used
// by the daemon's optimizer split and the worker's micro-batch planner.
double MeasureAdamWUpdateRate(size_t n);

}  // namespace l2l::kernels

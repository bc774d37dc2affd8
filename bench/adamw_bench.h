// The AdamW part of l2l-bench-eps: the EPS update (kernels/cpu/adamw_simd.h, exact and fast
// arithmetic, every SIMD path this CPU has) against the memory bound of its own traffic,
// measured by a STREAM-style kernel that reads and writes exactly what the update does.
//
// Thread-safety: call from one thread; it runs its kernels on the TBB arena of the caller
// (the caller limits the thread count with tbb::global_control).
#pragma once

#include <cstddef>

namespace l2l::bench {

struct AdamWBenchOptions {
  size_t params = size_t{16} << 20;  // parameters per step
  int threads = 1;                   // only printed: the caller sets the TBB limit
  int iters = 5;                     // timed steps per variant (median and best printed)
  bool publish_bf16 = true;          // the update also writes the bf16 copy (as the pipeline)
  int grads = 1;                     // workers' gradients summed in the same pass (1..8)
};

// Runs the stream kernels and the AdamW variants, printing one line each:
//   bound: stream ... params/s
//   adamw[exact,avx512]: median X params/s, best Y params/s, median/bound F, best/bound G
// and the machine-readable lines bench_peers.sh reads:
//   RESULT adamw_exact_median_params_per_s = X    (the pipeline's update, best SIMD path)
//   RESULT adamw_fast_median_params_per_s = X
//   RESULT adamw_bound_params_per_s = X
void RunAdamWBench(const AdamWBenchOptions& o);

}  // namespace l2l::bench

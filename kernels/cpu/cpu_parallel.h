// Small helpers for the CPU backend's TBB loops: a parallel_for over [0, n) in chunks of
// at least `grain` items that runs inline when there is only one chunk (so tiny ops do
// not pay for task scheduling). Call inside the backend's task_arena.
// Thread-safety: stateless.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>

namespace l2l::kernels {

// Elements per task for streaming elementwise ops (~64 KB of floats).
constexpr int64_t kElemGrain = 16384;

// Rows per task so that each task touches about kElemGrain elements of `row_len`.
inline int64_t RowGrain(int64_t row_len) {
  return std::max<int64_t>(1, kElemGrain / std::max<int64_t>(1, row_len));
}

// f(begin, end) over disjoint sub-ranges covering [0, n).
template <typename F>
void ParallelFor(int64_t n, int64_t grain, const F& f) {
  if (n <= 0) return;
  if (n <= grain) {
    f(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); });
}

// f(c0, c1) for every slice [c0, c1) of at most `chunk` columns of [0, n_cols); slices run
// in parallel. Each call sees a whole slice, so per-slice scratch of `chunk` floats fits.
template <typename F>
void ForColumnChunks(int64_t n_cols, int64_t chunk, const F& f) {
  const int64_t n_chunks = (n_cols + chunk - 1) / chunk;
  ParallelFor(n_chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) f(k * chunk, std::min(n_cols, (k + 1) * chunk));
  });
}

}  // namespace l2l::kernels

// Small helpers for the CPU backend's TBB loops: a parallel_for over [0, n) in chunks of
// at least `grain` items that runs inline when there is only one chunk (so tiny ops do
// not pay for task scheduling), column-slice loops, and the deterministic row-chunked
// column sums of the bias and norm weight gradients. Call inside the backend's task_arena.
// Thread-safety: stateless.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernels/cpu/cpu_math.h"

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

// Columns per task in the column-parallel reductions (the embedding gradients: each task
// owns a disjoint slice of columns and walks rows in order, so the result does not depend
// on the thread count) and the least per task in ReduceRowChunks' final sum.
constexpr int64_t kColumnChunk = 64;
// Rows per partial sum in ReduceRowChunks (fixed: the bits must not depend on threads).
constexpr int64_t kRowChunk = 32;

// Column sums over N rows of width-wide outputs, deterministic and with contiguous row
// reads: fn(r0, r1, part) adds rows [r0, r1) (one chunk of at most kRowChunk rows, in
// order) into part, outs.size() zeroed vectors of `width` floats back to back; chunks run
// in parallel. Then, per column slice in parallel, the chunks' partials are summed in
// chunk order and added to each out. `scratch` holds the partials (grown, reused). Call
// inside the backend's arena.
template <typename F>
void ReduceRowChunks(std::vector<float>* scratch, int64_t N, int64_t width,
                     std::initializer_list<float*> outs, const F& fn) {
  if (N <= 0 || width <= 0) return;
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  const int64_t n_out = static_cast<int64_t>(outs.size());
  const int64_t stride = n_out * width;
  if (int64_t(scratch->size()) < chunks * stride) scratch->resize(chunks * stride);
  float* part = scratch->data();
  ParallelFor(chunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* p = part + k * stride;
      std::fill(p, p + stride, 0.0f);
      fn(k * kRowChunk, std::min(N, (k + 1) * kRowChunk), p);
    }
  });
  ParallelFor(width, std::max<int64_t>(kColumnChunk, kElemGrain / chunks), [&](int64_t c0, int64_t c1) {
    int64_t j = 0;
    for (float* out : outs) {
      float* total = part + j * width + c0;  // chunk 0's partial collects the others
      for (int64_t k = 1; k < chunks; ++k) AddSpan(total, total, part + k * stride + j * width + c0, c1 - c0);
      AddSpan(out + c0, out + c0, total, c1 - c0);
      ++j;
    }
  });
}

}  // namespace l2l::kernels

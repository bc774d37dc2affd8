// AdamW update rate vs the memory bound of its own traffic. See adamw_bench.h.
//
// The bound: a STREAM-style kernel that touches memory exactly as the update does, per
// parameter: reads param, grad, m, v (16 B), writes param, m, v in place (12 B) and, when
// publishing, the bf16 copy (2 B, a write-only stream), with trivial arithmetic so that
// memory, not the core, limits it. Measured twice, with ordinary and with non-temporal
// stores; the bound is the faster. Counting bytes and dividing a separately measured
// bandwidth (memcpy, triad) by them is what this replaces: write-only streams cost a read
// for ownership unless stored non-temporally, so such bandwidths do not transfer from one
// access pattern to another.
#include "bench/adamw_bench.h"

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_*.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adamw_simd.h"

namespace l2l::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <typename T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <typename T>
Buffer<T> Alloc(size_t n) {
  const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
  return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes)));
}

// Element ranges split statically over the threads, each a multiple of 16 elements
// (64-byte aligned in the aligned buffers) except the last.
void ParallelRanges(size_t n, const std::function<void(size_t, size_t)>& f) {
  const size_t lines = (n + 15) / 16;
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, lines, 1024),
      [&](const tbb::blocked_range<size_t>& r) { f(r.begin() * 16, std::min(n, r.end() * 16)); },
      tbb::static_partitioner());
}

struct Stats {
  double median = 0, best = 0;  // params/s
};

Stats Measure(size_t n, int iters, const std::function<void()>& step) {
  step();  // warm-up: page faults, caches, TBB threads
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    step();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  const double med = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
  return {static_cast<double>(n) / med, static_cast<double>(n) / t.front()};
}

// The update's traffic with trivial arithmetic: ng gradients summed, p/m/v updated, the
// optional bf16 copy written.
void StreamScalar(float* p, float* m, float* v, const float* const* g, int ng, uint16_t* out,
                  size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    float gi = g[0][i];
    for (int w = 1; w < ng; ++w) gi += g[w][i];
    p[i] += 1e-3f * gi;
    m[i] += 1e-3f * gi;
    v[i] += 1e-3f * gi;
    if (out != nullptr) out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(p[i]) >> 16);
  }
}

// The same with AVX2 vectors. kNt: non-temporal stores.
template <bool kNt>
__attribute__((target("avx2"))) void StreamAvx2(float* p, float* m, float* v, const float* const* g,
                                                 int ng, uint16_t* out, size_t begin, size_t end) {
  const __m256 s = _mm256_set1_ps(1e-3f);
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 gi = _mm256_loadu_ps(g[0] + i);
    for (int w = 1; w < ng; ++w) gi = _mm256_add_ps(gi, _mm256_loadu_ps(g[w] + i));
    const __m256 pi = _mm256_add_ps(_mm256_loadu_ps(p + i), _mm256_mul_ps(s, gi));
    const __m256 mi = _mm256_add_ps(_mm256_loadu_ps(m + i), _mm256_mul_ps(s, gi));
    const __m256 vi = _mm256_add_ps(_mm256_loadu_ps(v + i), _mm256_mul_ps(s, gi));
    __m128i h{};
    if (out != nullptr) {  // the top halves, packed (truncation: only the traffic matters)
      const __m256i u = _mm256_srli_epi32(_mm256_castps_si256(pi), 16);
      h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(u, u), 0xd8));
    }
    if constexpr (kNt) {
      _mm256_stream_ps(p + i, pi);
      _mm256_stream_ps(m + i, mi);
      _mm256_stream_ps(v + i, vi);
      if (out != nullptr) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), h);
    } else {
      _mm256_storeu_ps(p + i, pi);
      _mm256_storeu_ps(m + i, mi);
      _mm256_storeu_ps(v + i, vi);
      if (out != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    }
  }
  StreamScalar(p, m, v, g, ng, out, i, end);
  if constexpr (kNt) _mm_sfence();
}

}  // namespace

void RunAdamWBench(const AdamWBenchOptions& o) {
  const size_t n = o.params;
  const int ng = std::max(1, o.grads);
  auto p = Alloc<float>(n), m = Alloc<float>(n), v = Alloc<float>(n);
  std::vector<Buffer<float>> grads;
  for (int w = 0; w < ng; ++w) grads.push_back(Alloc<float>(n));
  auto out = Alloc<uint16_t>(n);
  uint16_t* outp = o.publish_bf16 ? out.get() : nullptr;
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0, 1);
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.02f * d(rng);
      for (int w = 0; w < ng; ++w) grads[w][i] = 0.01f * d(rng) / static_cast<float>(ng);
      m[i] = 0.001f * d(rng);
      v[i] = 1e-5f * std::abs(d(rng));
    }
  }
  const double bytes = 24.0 + 4.0 * ng + (o.publish_bf16 ? 2.0 : 0.0);
  std::printf("adamw: %zu params, %d threads, fp32 param/m/v/grad, %d worker gradient%s summed in "
              "the same pass, %s; traffic %.0f B/param (read p,m,v and %d gradient%s; write p,m,v%s)\n",
              n, o.threads, ng, ng > 1 ? "s" : "", o.publish_bf16 ? "bf16 copy published" : "no published copy",
              bytes, ng, ng > 1 ? "s" : "", o.publish_bf16 ? "; write the bf16 copy" : "");
  std::vector<const float*> gbase;
  for (int w = 0; w < ng; ++w) gbase.push_back(grads[w].get());

  // The bound. The stream kernels also keep p/m/v/g finite and small for AdamW below.
  const bool avx2 = kernels::DetectSimdLevel() >= kernels::SimdLevel::kAvx2;
  Stats bound_stats[2];
  for (int nt = 0; nt < 2; ++nt) {
    if (nt && !avx2) break;
    const Stats s = Measure(n, o.iters, [&] {
      ParallelRanges(n, [&](size_t b, size_t e) {
        if (!avx2) {
          StreamScalar(p.get(), m.get(), v.get(), gbase.data(), ng, outp, b, e);
        } else if (nt) {
          StreamAvx2<true>(p.get(), m.get(), v.get(), gbase.data(), ng, outp, b, e);
        } else {
          StreamAvx2<false>(p.get(), m.get(), v.get(), gbase.data(), ng, outp, b, e);
        }
      });
    });
    bound_stats[nt] = s;
    std::printf("bound: stream with the update's traffic, %s stores: median %.4g params/s (%.1f GB/s), "
                "best %.4g params/s (%.1f GB/s)\n",
                nt ? "non-temporal" : "ordinary", s.median, s.median * bytes / 1e9, s.best,
                s.best * bytes / 1e9);
  }
  const double bound = std::max(bound_stats[0].best, bound_stats[1].best);
  std::printf("bound: %.4g params/s (the best of the stream kernels)\n", bound);
  std::printf("RESULT adamw_bound_params_per_s = %.6g\n", bound);

  // The update. Restore sane optimizer state first (the stream kernels drifted v).
  for (size_t i = 0; i < n; ++i) v[i] = std::abs(v[i]) * 1e-3f;
  AdamWStepArgs a;
  a.lr = 1e-3f;
  a.weight_decay = 0.1f;
  int64_t t = 0;
  const kernels::SimdLevel best_level = kernels::DetectSimdLevel();
  for (int fast = 0; fast < 2; ++fast) {
    for (int lvl = static_cast<int>(best_level); lvl >= 0; --lvl) {
      const auto level = static_cast<kernels::SimdLevel>(lvl);
      const Stats s = Measure(n, o.iters, [&] {
        a.t = ++t;
        ParallelRanges(n, [&](size_t b, size_t e) {
          const float* gs[8];  // the workers' gradients of this range
          for (int w = 0; w < ng; ++w) gs[w] = gbase[w] + b;
          void* dst = outp != nullptr ? static_cast<void*>(outp + b) : nullptr;
          if (fast) {
            kernels::AdamWUpdateFast(a, p.get() + b, m.get() + b, v.get() + b, gs, ng, e - b, DType::kBF16, dst,
                                     level);
          } else {
            kernels::AdamWUpdate(a, p.get() + b, m.get() + b, v.get() + b, gs, ng, e - b, DType::kBF16, dst,
                                 level);
          }
        });
      });
      const char* arith = fast ? "fast" : "exact";
      std::printf("adamw[%s,%s]: median %.4g params/s, best %.4g params/s; median/bound %.2f, best/bound %.2f\n",
                  arith, kernels::SimdLevelName(level), s.median, s.best, s.median / bound, s.best / bound);
      if (level == best_level) {
        std::printf("RESULT adamw_%s_median_params_per_s = %.6g\n", arith, s.median);
        std::printf("RESULT adamw_%s_best_params_per_s = %.6g\n", arith, s.best);
      }
    }
  }
}

}  // namespace l2l::bench

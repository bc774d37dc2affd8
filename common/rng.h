// SplitMix64: the counter-based mixing function l2l uses wherever a reproducible stream of
// random bits is needed (data order, sampling, test data). A pure function of its input,
// so any process derives the same stream from (seed, index) without shared state.
#pragma once

#include <cstdint>

namespace l2l {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Counter-based dropout (kernels/backend.h Backend::CounterDropout): whether element i of
// the mask stream `stream` is kept. The top 24 bits of SplitMix64(stream + i) (uint64
// arithmetic mod 2^64) are a uniform draw in [0, 2^24); the element is kept when the draw
// is >= threshold, with threshold = DropoutThreshold(p). The CUDA kernel
// (kernels/cuda/elementwise.cu) repeats this formula; tests check that they agree.
inline bool DropoutKeep(uint64_t stream, uint64_t i, uint32_t threshold) {
  return (SplitMix64(stream + i) >> 40) >= threshold;
}

// floor(p * 2^24) for a drop probability p in [0, 1): P(keep) = 1 - threshold / 2^24.
inline uint32_t DropoutThreshold(double p) { return static_cast<uint32_t>(p * 16777216.0); }

}  // namespace l2l

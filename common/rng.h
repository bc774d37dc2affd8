// SplitMix64: the counter-based mixing function l2l uses wherever a reproducible stream of
// random bits is needed (data order, sampling, test data). A pure function of its input,
// so any process derives the same stream from (seed, index) without shared state.
// Fnv1a64: the byte hash l2l uses for fingerprints and keys (a spill file's layout, a LoRA
// base's identity, a dropout stream's weight name).
#pragma once

#include <cstddef>
#include <cstdint>

namespace l2l {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a 64 of n bytes, continuing from h (the offset basis for a fresh hash).
inline constexpr uint64_t kFnv1a64Basis = 0xCBF29CE484222325ull;
inline uint64_t Fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Basis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
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

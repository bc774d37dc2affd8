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

}  // namespace l2l

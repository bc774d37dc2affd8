// Random gradients for the update-pipeline tests: grads[step][worker][layer], normal
// with sigma 0.1, sized by the ParamStore's layouts, from a seeded generator (the same
// seed gives the same gradients). Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "eps_server/param_store.h"

namespace l2l::eps {

using Grads = std::vector<std::vector<std::vector<std::vector<float>>>>;

inline Grads MakeGrads(const ParamStore& ps, int steps, int workers, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.1f);
  Grads g(steps, std::vector<std::vector<std::vector<float>>>(workers));
  for (auto& s : g) {
    for (auto& w : s) {
      for (int64_t l = 0; l < ps.num_layers(); ++l) {
        std::vector<float> v(ps.layout(l).numel);
        for (auto& x : v) x = d(rng);
        w.push_back(std::move(v));
      }
    }
  }
  return g;
}

}  // namespace l2l::eps

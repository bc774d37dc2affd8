// Helpers for the EPS integration tests (eps_*_test.cc): a tiny job, deterministic
// per-(step, worker, layer) gradients, and the test's own reference trainer -- AdamW
// from common/adamw.h over plain vectors with the EPS's reduction rule (sum over
// workers in id order, divided by the total micro-batches, global clip or none) -- so expected
// weights never come from the code under test.
//
// Thread-safety: values; one thread per object.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "common/adamw.h"
#include "common/config.h"
#include "common/model_spec.h"
#include "tests/testing/jobs.h"

namespace l2l::epstest {

inline JobConfig TinyJob(DType dt = DType::kF32, int64_t steps = 4) {
  JobConfig j = testing::GptJob({64, 16, 32, 2, 4, 128}, {.steps = steps, .seed = 77, .clip = l2l::ClipMode::kGlobal,
                                                         .lr = 1e-2f, .grad_clip = 0.05f});
  j.publish_dtype = dt;
  return j;
}

// Deterministic gradient of (step, worker, layer).
inline std::vector<float> Grad(int64_t step, int worker, int64_t layer, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(step * 1000 + worker * 100 + layer));
  std::normal_distribution<float> d(0.0f, 0.1f);
  std::vector<float> g(n);
  for (auto& x : g) x = d(rng);
  return g;
}

struct Reference {
  explicit Reference(const JobConfig& job) : job(job), layouts(BuildLayout(job.model)) {
    for (const auto& l : layouts) {
      p.emplace_back(l.numel);
      InitLayerParams(job.model, l, job.train.seed, p.back().data());
      m.emplace_back(l.numel, 0.0f);
      v.emplace_back(l.numel, 0.0f);
    }
  }
  // One step from the workers `ids` (in increasing order) with micro-batch counts mbs.
  void Step(int64_t step, const std::vector<int>& ids, const std::vector<int64_t>& mbs) {
    int64_t total = 0;
    for (auto x : mbs) total += x;
    const float inv = 1.0f / static_cast<float>(total);
    std::vector<std::vector<float>> sum;
    double n2 = 0;
    for (size_t l = 0; l < layouts.size(); ++l) {
      std::vector<float> s = Grad(step, ids[0], static_cast<int64_t>(l), layouts[l].numel);
      for (size_t w = 1; w < ids.size(); ++w) {
        auto g = Grad(step, ids[w], static_cast<int64_t>(l), layouts[l].numel);
        for (size_t i = 0; i < s.size(); ++i) s[i] = s[i] + g[i];
      }
      std::vector<float> avg(s.size());
      for (size_t i = 0; i < s.size(); ++i) avg[i] = s[i] * inv;
      n2 += SumSquares(avg.data(), avg.size());
      sum.push_back(std::move(s));
    }
    const float coef = job.train.clip == l2l::ClipMode::kGlobal ? ClipCoefficient(std::sqrt(n2), job.optim.grad_clip) : 1.0f;
    for (size_t l = 0; l < layouts.size(); ++l) {
      for (const ParamInfo& pi : layouts[l].params) {
        AdamWStep(p[l].data() + pi.offset, sum[l].data() + pi.offset, m[l].data() + pi.offset,
                  v[l].data() + pi.offset, pi.numel,
                  WithDecay(AdamWStepArgsAt(job.optim, step, inv * coef), pi.decay));
      }
    }
  }
  JobConfig job;
  std::vector<LayerLayout> layouts;
  std::vector<std::vector<float>> p, m, v;
};

}  // namespace l2l::epstest

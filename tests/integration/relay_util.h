// Shared pieces of the end-to-end relay tests (relay_integration_test.cc, spill_test.cc):
// a small job, a structured token stream, the reference trainer's weights after the
// job's steps (the oracle), the closeness check against it, running worker processes
// and reading the daemon's weights back through Export.
// Tolerances as in tests/worker/relay_test.cc: elementwise |eps - ref| <= 5e-6 + 1e-5 |ref|
// and per tensor ||eps - ref|| <= 1e-5 ||ref|| + 5e-6 sqrt(n).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/model_io.h"
#include "tests/integration/harness.h"
#include "tests/testing/jobs.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::itest::relay {

using namespace std::chrono_literals;

constexpr double kRtol = 1e-5, kAtol = 5e-6;

inline JobConfig SmallJob(const std::string& tokens_path) {
  JobConfig job = testing::GptJob(testing::kTinyGpt,
                                  {.steps = 3, .micro_batch_size = 2, .micro_batches = 3, .seed = 77, .lr = 3e-3f,
                                   .warmup_steps = 2, .eps = 1e-6f /* see tests/worker/relay_test.cc */});
  job.train.log_every = 1;
  job.data.train_path = tokens_path;
  return job;
}

// A token stream with structure (a noisy walk), so loss can fall.
inline std::vector<int32_t> MakeTokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = 12345;
  int64_t cur = 0;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t r = static_cast<int64_t>((x >> 33) % 8);
    cur = r < 7 ? (cur + 1) % vocab : static_cast<int64_t>((x >> 20) % vocab);
    v = static_cast<int32_t>(cur);
  }
  return t;
}

// The reference trainer after `steps` steps on the union of `shards` shards (each step
// takes job.train.micro_batches micro-batches from every shard, as the workers do).
inline std::unique_ptr<worker::ReferenceTrainer> TrainedReference(const JobConfig& job, int shards,
                                                                  int64_t steps) {
  worker::ReferenceTrainerOptions o;
  o.num_threads = 1;
  auto ref = worker::ReferenceTrainer::Create(job, o);
  REQUIRE(ref.ok());
  std::vector<worker::DataLoader> loaders;
  for (int r = 0; r < shards; ++r) {
    worker::DataLoaderOptions d;
    d.B = job.train.micro_batch_size;
    d.T = job.seq_len();
    d.seed = job.train.seed;
    d.rank = r;
    d.world = shards;
    d.vocab_size = job.model.vocab_size;
    d.task = job.effective_task();
    d.num_labels = job.model.num_labels;
    d.mlm = job.mlm;
    auto l = worker::DataLoader::OpenForTask(job.data.train_path, d);
    REQUIRE(l.ok());
    loaders.push_back(std::move(l).value());
  }
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<worker::MicroBatch> batches;
    for (auto& l : loaders) {
      for (auto& mb : l.NextMany(job.train.micro_batches)) batches.push_back(std::move(mb));
    }
    REQUIRE((*ref)->Step(batches).ok());
  }
  return std::move(ref).value();
}

// The oracle's weights after job.train.steps steps on the union of `shards` shards.
inline std::vector<std::vector<float>> Reference(const JobConfig& job, int shards) {
  return TrainedReference(job, shards, job.train.steps)->params();
}

inline void RequireClose(const JobConfig& job, const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& ref) {
  REQUIRE(got.size() == ref.size());
  const auto layouts = BuildLayout(job.model);
  double worst = 0, worst_norm = 0, moved = 0;
  std::string worst_name;
  for (size_t l = 0; l < ref.size(); ++l) {
    REQUIRE(got[l].size() == ref[l].size());
    std::vector<float> init(layouts[l].numel);
    InitLayerParams(job.model, layouts[l], job.train.seed, init.data());
    for (const ParamInfo& p : layouts[l].params) {
      double d2 = 0, r2 = 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double d = std::fabs(double(got[l][i]) - ref[l][i]);
        d2 += d * d;
        r2 += double(ref[l][i]) * ref[l][i];
        worst = std::max(worst, d / (kAtol + kRtol * std::fabs(ref[l][i])));
        moved = std::max(moved, std::fabs(double(ref[l][i]) - init[i]));
      }
      const double norm_ratio =
          std::sqrt(d2) / (kRtol * std::sqrt(r2) + kAtol * std::sqrt(static_cast<double>(p.numel)));
      if (norm_ratio > worst_norm) {
        worst_norm = norm_ratio;
        worst_name = p.name;
      }
    }
  }
  INFO("worst elementwise ratio " << worst << ", worst per-tensor norm ratio " << worst_norm << " ("
                                   << worst_name << ")");
  CHECK(worst <= 1.0);
  CHECK(worst_norm <= 1.0);
  CHECK(moved > 1e-3);  // training really changed the weights
}

struct Run {
  std::unique_ptr<TempDir> dir;
  JobConfig job;
};

inline Run Prepare(const std::string& name) {
  auto dir = TempDir::Create("l2l-itest-" + name);
  REQUIRE(dir.ok());
  Run r{std::move(dir).value(), {}};
  const std::string tokens = r.dir->File("train.bin");
  r.job = SmallJob(tokens);
  REQUIRE(WriteTokens(tokens, MakeTokens(20000, r.job.model.vocab_size)).ok());
  return r;
}

// Starts `n` workers, waits for all to exit 0, returns their logs.
inline std::vector<std::string> RunWorkers(EpsDaemon& eps, const TempDir& dir, int n,
                                    const std::vector<std::string>& extra = {},
                                    std::chrono::seconds timeout = 180s) {
  std::vector<std::unique_ptr<Process>> ws;
  for (int i = 0; i < n; ++i) {
    auto w = StartWorker(eps.address(), "w" + std::to_string(i), dir.File("worker" + std::to_string(i) + ".log"),
                         extra);
    REQUIRE(w.ok());
    ws.push_back(std::move(w).value());
  }
  std::vector<std::string> logs;
  for (auto& w : ws) {
    auto code = w->Wait(timeout);
    INFO(w->LogTail());
    REQUIRE(code.ok());
    CHECK(*code == 0);
    logs.push_back(w->Log());
  }
  return logs;
}

inline std::vector<std::vector<float>> Exported(EpsDaemon& eps, const ModelSpec& spec) {
  const std::string path = eps.state_dir() + "/export.safetensors";
  Status st = eps.Export(path);
  INFO(st.ToString());
  REQUIRE(st.ok());
  auto m = LoadModel(path, spec);
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  return m->layers;
}

}  // namespace l2l::itest::relay

// l2l-bench-startup: how long the daemon takes from CreateJob to a published state for a
// large random init (docs/performance.md "Start-up"). Runs the daemon's own EpsCore
// in-process (no workers) on a Llama-family shape of --d-model / --layers, with
// memory.host_bytes set so that --spill-fraction of the fp32 state lives in --dir, and
// prints the phases:
//   store     ParamStore::Create (page allocation, spill file preallocation)
//   init      InitFromSeed, serial (one layer buffer: the code before issue 27) and
//             parallel (as CreateJob runs it: layer buffers from the guard's budget)
//   publish   PublishMaster of every layer, serial and parallel
//   create    EpsCore::CreateJob end to end (store + parallel init + publish + rates)
// The serial and parallel inits must give the same bytes: it checks one layer's master
// and exits 1 if they differ.
//
//   l2l-bench-startup --dir DIR [--d-model 2048] [--layers 12] [--spill-fraction 0.5]
//
// Not a test: never fails on speed. Everything is local to main.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <oneapi/tbb/parallel_for.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/config.h"
#include "common/logging.h"
#include "eps_server/eps_core.h"
#include "eps_server/param_store.h"

namespace {

using namespace l2l;
using namespace l2l::eps;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

JobConfig LlamaJob(int64_t d, int64_t layers) {
  JobConfig job;
  ModelSpec& m = job.model;
  m.family = ModelFamily::kLlama;
  m.vocab_size = 32000;
  m.seq_len = 1024;
  m.d_model = d;
  m.n_layer = layers;
  m.n_head = d / 128;
  m.n_kv_heads = std::max<int64_t>(1, d / 512);
  m.d_ff = d * 8 / 3 / 256 * 256;
  m.tied_embeddings = false;
  job.publish_dtype = DType::kBF16;
  job.train.seed = 1234;
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t d = 2048, layers = 12;
  double spill_fraction = 0.5;
  CLI::App app{"l2l-bench-startup: CreateJob time for a large random init with spilled state"};
  app.add_option("--dir", dir, "spill directory (a local SSD)")->required();
  app.add_option("--d-model", d, "hidden size (multiple of 512)");
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--spill-fraction", spill_fraction, "fraction of the fp32 state on SSD");
  CLI11_PARSE(app, argc, argv);
  (void)SetLogLevel("warn");
  std::filesystem::create_directories(dir);

  const JobConfig job = LlamaJob(d, layers);
  if (Status s = job.Validate(); !s.ok()) {
    std::fprintf(stderr, "l2l-bench-startup: %s\n", s.ToString().c_str());
    return 2;
  }
  ParamStoreOptions po;
  po.publish_dtype = DType::kBF16;
  const size_t all = ParamStore::RequiredHostBytes(job.model, po);
  const size_t published = 4 * static_cast<size_t>(job.model.NumParams());
  const size_t state = all - published;
  po.host_bytes = all - static_cast<size_t>(spill_fraction * static_cast<double>(state));
  po.spill.dir = dir;
  po.spill.job_id = "bench-startup";
  std::printf("model: llama d_model=%lld layers=%lld, %lld params, state %.2f GB, published %.2f GB, "
              "host_bytes %.2f GB (spill %.0f%%), %d TBB threads\n",
              static_cast<long long>(d), static_cast<long long>(layers),
              static_cast<long long>(job.model.NumParams()), state / 1e9, published / 1e9, po.host_bytes / 1e9,
              100 * spill_fraction, tbb::this_task_arena::max_concurrency());

  std::vector<float> serial_layer;
  for (int parallel = 0; parallel < 2; ++parallel) {
    auto t0 = Clock::now();
    auto store = ParamStore::Create(job.model, po);
    if (!store.ok()) {
      std::fprintf(stderr, "l2l-bench-startup: %s\n", store.status().ToString().c_str());
      return 2;
    }
    const double create_s = Since(t0);
    t0 = Clock::now();
    // Serial: one buffer (the code before issue 27). Parallel: 12 B/param of guard
    // budget, capped at 8 GiB, as CreateJob passes it.
    const size_t scratch = parallel ? std::min<size_t>(12 * job.model.NumParams(), size_t{8} << 30) : 0;
    if (Status s = (*store)->InitFromSeed(job.train.seed, scratch); !s.ok()) {
      std::fprintf(stderr, "l2l-bench-startup: init: %s\n", s.ToString().c_str());
      return 2;
    }
    const double init_s = Since(t0);
    t0 = Clock::now();
    const int64_t L = (*store)->num_layers();
    std::vector<Status> st(static_cast<size_t>(L));
    if (parallel) {
      tbb::parallel_for(int64_t{0}, L, int64_t{1}, [&](int64_t l) { st[l] = (*store)->PublishMaster(l, 0); });
    } else {
      for (int64_t l = 0; l < L; ++l) st[l] = (*store)->PublishMaster(l, 0);
    }
    for (const Status& s : st) {
      if (!s.ok()) {
        std::fprintf(stderr, "l2l-bench-startup: publish: %s\n", s.ToString().c_str());
        return 2;
      }
    }
    const double publish_s = Since(t0);
    std::vector<float> layer((*store)->layout(L / 2).numel);
    if (Status s = (*store)->ReadState(L / 2, 0, layer.data()); !s.ok()) return 2;
    if (!parallel) {
      serial_layer = layer;
    } else if (std::memcmp(layer.data(), serial_layer.data(), layer.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "l2l-bench-startup: the parallel init differs from the serial one (layer %lld)\n",
                   static_cast<long long>(L / 2));
      return 1;
    }
    std::printf("%-8s store %.2f s, init %.2f s, publish %.2f s, total %.2f s (on SSD %.2f GB)\n",
                parallel ? "parallel" : "serial", create_s, init_s, publish_s, create_s + init_s + publish_s,
                (*store)->ssd_bytes() / 1e9);
  }

  // The daemon's CreateJob end to end (includes its rate measurements).
  CoreOptions co;
  co.job_id = "bench-startup";
  co.host_bytes = po.host_bytes;
  co.spill = po.spill;
  co.transport = Transport::kGrpc;
  EpsCore core(co);
  const auto t0 = Clock::now();
  if (Status s = core.CreateJob(job); !s.ok()) {
    std::fprintf(stderr, "l2l-bench-startup: CreateJob: %s\n", s.ToString().c_str());
    return 2;
  }
  std::printf("CreateJob (store + parallel init + parallel publish + rate probes): %.2f s\n", Since(t0));
  core.Stop();
  return 0;
}

// l2l-bench-tier: what the SSD tier costs a training step (docs/performance.md "SSD
// tier"). The EPS side of training is run in-process (ParamStore + UpdatePipeline, the
// daemon's own code) with a simulated worker that behaves like the relay in sync mode:
//   forward:  for l = 0..L-1: wait for layer l's version t (ParamStore::Acquire), then
//             compute for --fwd-ms;
//   backward: for l = L-1..0: compute for --bwd-ms, then push layer l's gradient.
// The same run is timed twice: all state in RAM, then with memory.host_bytes set so
// that --spill-fraction of the fp32 state lives on SSD in --dir. Printed:
//   step time RAM vs spill (ratio), SSD bytes per step, the tier's exposed wait
//   (lease_wait_s: updates waiting for reads), and the fraction of SSD time hidden
//   behind compute = 1 - (step_spill - step_ram) / ssd_time, where ssd_time is the
//   step's bytes over the read/write bandwidth the IoEngine reaches on --dir in the
//   same run (page-sized transfers, same queue depth and block size).
//
//   l2l-bench-tier --dir DIR [--d-model 768] [--layers 8] [--steps 6]
//                  [--fwd-ms 20] [--bwd-ms 40] [--spill-fraction 0.7]
//
// Not a test: never fails on speed. Everything is local to main.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "eps_server/param_store.h"
#include "eps_server/spill_io.h"
#include "eps_server/update_pipeline.h"

namespace {

using namespace l2l;
using namespace l2l::eps;
using Clock = std::chrono::steady_clock;


struct RunResult {
  double step_s = 0;           // median step time after the first (warm-up) step
  TierStats tier;              // cumulative (zeros without spill)
  int64_t measured_steps = 0;
  double ssd_fraction = 0;     // spilled bytes / state bytes
};

Result<RunResult> RunSteps(const JobConfig& job, const ParamStoreOptions& po, int steps, double fwd_ms,
                           double bwd_ms) {
  L2L_ASSIGN_OR_RETURN(auto store, ParamStore::Create(job.model, po));
  L2L_RETURN_IF_ERROR(store->InitFromSeed(job.train.seed));
  for (int64_t l = 0; l < store->num_layers(); ++l) L2L_RETURN_IF_ERROR(store->PublishMaster(l, 0));
  UpdatePipeline pipe(store.get(), job, 1, 0);
  const int64_t L = store->num_layers();
  std::vector<std::vector<float>> grads(L);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  for (int64_t l = 0; l < L; ++l) {
    grads[l].resize(store->layout(l).numel);
    for (auto& g : grads[l]) g = nd(rng);
  }
  auto compute = [](double ms) { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); };
  std::vector<double> times;
  TierStats before{};
  for (int t = 0; t < steps; ++t) {
    if (t == 1 && store->tier() != nullptr) before = store->tier()->stats();
    const auto t0 = Clock::now();
    for (int64_t l = 0; l < L; ++l) {
      L2L_ASSIGN_OR_RETURN(auto pin, store->Acquire(l, t, std::chrono::minutes(5)));
      compute(fwd_ms);
    }
    for (int64_t l = L - 1; l >= 0; --l) {
      compute(bwd_ms);
      GradientRef r;
      r.worker_id = 0;
      r.data = grads[l].data();
      r.numel = grads[l].size();
      L2L_RETURN_IF_ERROR(pipe.Submit(l, t, std::move(r)));
    }
    if (t > 0) times.push_back(l2l::SecondsSince(t0));
  }
  if (!pipe.WaitForStep(steps, std::chrono::minutes(5))) {
    L2L_RETURN_IF_ERROR(pipe.failure());
    return Internal("the last step did not complete");
  }
  RunResult r;
  std::sort(times.begin(), times.end());
  r.step_s = times.empty() ? 0 : times[times.size() / 2];
  r.measured_steps = static_cast<int64_t>(times.size());
  if (SpillTier* tier = store->tier(); tier != nullptr) {
    L2L_RETURN_IF_ERROR(tier->Flush());
    TierStats s = tier->stats();
    s.io.bytes_read -= before.io.bytes_read;
    s.io.bytes_written -= before.io.bytes_written;
    s.lease_wait_s -= before.lease_wait_s;
    s.lease_hits -= before.lease_hits;
    s.lease_misses -= before.lease_misses;
    r.tier = s;
    r.ssd_fraction = static_cast<double>(s.ssd_bytes) / static_cast<double>(s.ssd_bytes + s.ram_state_bytes);
  }
  return r;
}

// Read and write GB/s of the IoEngine on `dir` with page-sized transfers, `total` bytes.
Result<std::pair<double, double>> EngineBandwidth(const std::string& dir, size_t page_bytes, size_t total,
                                                  const SpillOptions& so) {
  const std::string path = dir + "/l2l-bench-tier-bw.tmp";
  L2L_ASSIGN_OR_RETURN(SpillFile f, SpillFile::Open(path, total, {so.direct, false, true}));
  IoEngineOptions eo;
  eo.queue_depth = so.queue_depth;
  eo.block_bytes = so.block_bytes;
  L2L_ASSIGN_OR_RETURN(auto engine, IoEngine::Create(eo));
  const size_t n = total / page_bytes;
  const size_t inflight = std::max<size_t>(1, std::min<size_t>(n, so.queue_depth));
  L2L_ASSIGN_OR_RETURN(auto pool, AlignedBufferPool::Create(page_bytes, inflight));
  L2L_ASSIGN_OR_RETURN(std::vector<void*> bufs, pool->Acquire(inflight, std::chrono::seconds(1)));
  auto pass = [&](IoOp op) -> Result<double> {
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0, issued = 0;
    Status first;
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    auto issue = [&](size_t i, void* buf) {
      engine->Submit(f, op, buf, page_bytes, i * page_bytes, [&, buf](Status s) {
        std::lock_guard<std::mutex> g(mu);
        if (!s.ok() && first.ok()) first = s;
        ++done;
        cv.notify_all();
        (void)buf;
      });
    };
    // Keep `inflight` pages in flight, each buffer reused once its transfer is done.
    while (issued < std::min(n, inflight)) {
      lock.unlock();
      issue(issued, bufs[issued]);
      lock.lock();
      ++issued;
    }
    while (done < n) {
      const size_t seen = done;
      cv.wait(lock, [&] { return done > seen; });
      while (issued < n && issued - done < inflight) {
        void* buf = bufs[issued % inflight];
        lock.unlock();
        issue(issued, buf);
        lock.lock();
        ++issued;
      }
    }
    L2L_RETURN_IF_ERROR(first);
    return static_cast<double>(n * page_bytes) / l2l::SecondsSince(t0) / 1e9;
  };
  L2L_ASSIGN_OR_RETURN(double w, pass(IoOp::kWrite));
  L2L_ASSIGN_OR_RETURN(double r, pass(IoOp::kRead));
  pool->Release(bufs);
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return std::make_pair(r, w);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-bench-tier: step time with the SSD tier vs all state in RAM"};
  std::string dir;
  int64_t d_model = 768, layers = 8, vocab = 1024;
  int steps = 6, queue_depth = 32;
  double fwd_ms = 20, bwd_ms = 40, fraction = 0.7;
  int64_t page_bytes = 4 << 20, block_bytes = 1 << 20;
  bool direct = true;
  app.add_option("--dir", dir, "spill directory (on the SSD to measure)")->required();
  app.add_option("--d-model", d_model, "model width (GPT-2 small: 768)");
  app.add_option("--layers", layers, "transformer blocks");
  app.add_option("--vocab", vocab, "vocabulary (small keeps the blocks dominant)");
  app.add_option("--steps", steps, "steps per run (the first is warm-up)");
  app.add_option("--fwd-ms", fwd_ms, "simulated forward compute per layer (ms)");
  app.add_option("--bwd-ms", bwd_ms, "simulated backward compute per layer (ms)");
  app.add_option("--spill-fraction", fraction, "share of the fp32 state to put on SSD (0..1)");
  app.add_option("--page-bytes", page_bytes, "state page size");
  app.add_option("--block-bytes", block_bytes, "spill request size");
  app.add_option("--queue-depth", queue_depth, "spill requests in flight");
  app.add_flag("!--buffered", direct, "buffered I/O instead of O_DIRECT");
  CLI11_PARSE(app, argc, argv);
  InitLogging("warn", "", "bench").IgnoreError();

  JobConfig job;
  job.model.vocab_size = vocab;
  job.model.seq_len = 256;
  job.model.d_model = d_model;
  job.model.n_layer = layers;
  job.model.n_head = 12;
  job.model.d_ff = 4 * d_model;
  job.train.clip = l2l::ClipMode::kNone;
  job.publish_dtype = DType::kBF16;
  if (Status s = job.model.Validate(); !s.ok()) {
    std::fprintf(stderr, "l2l-bench-tier: %s\n", s.ToString().c_str());
    return 2;
  }
  std::filesystem::create_directories(dir);
  ParamStoreOptions ram;
  ram.page_bytes = static_cast<size_t>(page_bytes);
  ram.publish_dtype = job.publish_dtype;
  const size_t all = ParamStore::RequiredHostBytes(job.model, ram);
  size_t state = 0;
  for (const auto& l : BuildLayout(job.model)) state += 3 * ((l.numel * 4 + page_bytes - 1) / page_bytes) * page_bytes;
  ParamStoreOptions spill = ram;
  spill.spill.dir = dir;
  spill.spill.job_id = "bench-tier-" + std::to_string(::getpid());
  spill.spill.queue_depth = queue_depth;
  spill.spill.block_bytes = static_cast<size_t>(block_bytes);
  spill.spill.prefetch_layers = 2;
  spill.spill.direct = direct;
  // Pool: 3 of the largest layer's pages (prefetch 2 + the one being updated), counted in
  // the budget like the daemon does.
  size_t max_layer = 0;
  for (const auto& l : BuildLayout(job.model)) max_layer = std::max(max_layer, 3 * ((l.numel * 4 + page_bytes - 1) / page_bytes));
  const size_t pool = 3 * max_layer * static_cast<size_t>(page_bytes);
  spill.spill.pool_bytes = pool;  // fixed, so the budget below spills exactly `fraction`
  spill.host_bytes = all - static_cast<size_t>(fraction * static_cast<double>(state)) + pool;

  std::printf("model: %lld blocks x d_model %lld, %.1f M params, fp32 state %.0f MiB; compute/layer fwd %.0f ms bwd %.0f ms\n",
              static_cast<long long>(layers), static_cast<long long>(d_model),
              static_cast<double>(job.model.NumParams()) / 1e6, static_cast<double>(state) / (1 << 20), fwd_ms, bwd_ms);
  auto r_ram = RunSteps(job, ram, steps, fwd_ms, bwd_ms);
  if (!r_ram.ok()) {
    std::fprintf(stderr, "l2l-bench-tier: RAM run: %s\n", r_ram.status().ToString().c_str());
    return 1;
  }
  auto r_ssd = RunSteps(job, spill, steps, fwd_ms, bwd_ms);
  std::error_code ec;
  std::filesystem::remove(dir + "/l2l-" + spill.spill.job_id + ".spill", ec);
  if (!r_ssd.ok()) {
    std::fprintf(stderr, "l2l-bench-tier: spill run: %s\n", r_ssd.status().ToString().c_str());
    return 1;
  }
  auto bw = EngineBandwidth(dir, static_cast<size_t>(page_bytes), std::min<size_t>(state, size_t{512} << 20), spill.spill);
  if (!bw.ok()) {
    std::fprintf(stderr, "l2l-bench-tier: bandwidth pass: %s\n", bw.status().ToString().c_str());
    return 1;
  }
  const double n = static_cast<double>(r_ssd->measured_steps);
  const double rd = static_cast<double>(r_ssd->tier.io.bytes_read) / n, wr = static_cast<double>(r_ssd->tier.io.bytes_written) / n;
  const double ssd_time = rd / (bw->first * 1e9) + wr / (bw->second * 1e9);
  const double extra = std::max(0.0, r_ssd->step_s - r_ram->step_s);
  std::printf("spill: %.0f%% of the fp32 state on SSD (%.0f MiB), pool %.0f MiB, engine on this dir: read %.2f GB/s, write %.2f GB/s\n",
              100 * r_ssd->ssd_fraction, static_cast<double>(r_ssd->tier.ssd_bytes) / (1 << 20),
              static_cast<double>(r_ssd->tier.pool_bytes) / (1 << 20), bw->first, bw->second);
  std::printf("step time: RAM %.3f s, spill %.3f s, ratio spill/RAM %.3f\n", r_ram->step_s, r_ssd->step_s,
              r_ssd->step_s / r_ram->step_s);
  std::printf("per step: SSD read %.0f MiB + write %.0f MiB = %.3f s of SSD time at the measured bandwidth; "
              "updates waited %.3f s for reads (hits %lld, misses %lld)\n",
              rd / (1 << 20), wr / (1 << 20), ssd_time, r_ssd->tier.lease_wait_s / n,
              static_cast<long long>(r_ssd->tier.lease_hits), static_cast<long long>(r_ssd->tier.lease_misses));
  std::printf("SSD time hidden behind compute: %.0f%% (1 - added step time %.3f s / SSD time %.3f s)\n",
              100 * std::max(0.0, 1 - extra / std::max(ssd_time, 1e-9)), extra, ssd_time);
  return 0;
}

// l2l-bench-train: forward+backward throughput (tokens/s) of the reference trainer on
// random tokens, for the model of a job config. scripts/bench_cpu.sh runs it beside the
// same model in PyTorch and prints the ratio.
//
//   l2l-bench-train --config configs/quickstart.yaml [--B 8] [--T 128] [--iters 10]
//                   [--warmup 2] [--threads 2] [--recompute always|never|auto]
//                   [--compute fp32|bf16]
//
// --compute bf16: the CPU backend's matrix products in bf16 with fp32 accumulation
// (kernels::CpuGemmPrecision::kBf16; L2L_CPU_GEMM in the environment wins). The backend
// name printed ends in "gemm bf16" when the mode is on.
//
// Prints one line "l2l-bench-train: ... median tok/s M, best tok/s B, tok/s X" (X =
// B*T*iters / seconds of ComputeGradients calls, each one micro-batch; M and B from the
// per-iteration times). OMP_WAIT_POLICY defaults to PASSIVE, as l2l-train-ref sets it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/config.h"
#include "worker/reference/reference_trainer.h"

namespace {

l2l::Status Run(const std::string& config, int64_t B, int64_t T, int iters, int warmup, int threads,
                const std::string& recompute, const std::string& compute) {
  namespace w = l2l::worker;
  L2L_ASSIGN_OR_RETURN(l2l::JobConfig cfg, l2l::LoadJobConfig(config));
  if (T <= 0) T = cfg.model.seq_len;
  cfg.train.micro_batch_size = B;
  cfg.train.seq_len = T;
  if (!recompute.empty()) {
    L2L_ASSIGN_OR_RETURN(cfg.train.recompute, l2l::ParseRecomputeMode(recompute));
  }
  w::ReferenceTrainerOptions o;
  o.num_threads = threads;
  if (compute == "bf16") {
    o.cpu_gemm = l2l::kernels::CpuGemmPrecision::kBf16;
  } else if (compute != "fp32") {
    return l2l::InvalidArgument("--compute " + compute + ": expected fp32 or bf16");
  }
  L2L_ASSIGN_OR_RETURN(auto t, w::ReferenceTrainer::Create(cfg, o));
  w::MicroBatch mb;
  mb.B = B;
  mb.T = T;
  uint64_t x = 88172645463325252ull;  // xorshift64: any fixed token stream will do
  for (int64_t i = 0; i < B * T; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    mb.inputs.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(cfg.model.vocab_size)));
    mb.targets.push_back(static_cast<int32_t>((x >> 20) % static_cast<uint64_t>(cfg.model.vocab_size)));
  }
  for (int i = 0; i < warmup; ++i) L2L_RETURN_IF_ERROR(t->ComputeGradients({mb}).status());
  std::vector<double> ts;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    L2L_RETURN_IF_ERROR(t->ComputeGradients({mb}).status());
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  double s = 0;
  for (double x : ts) s += x;
  std::sort(ts.begin(), ts.end());
  const double med = ts.size() % 2 ? ts[ts.size() / 2] : 0.5 * (ts[ts.size() / 2 - 1] + ts[ts.size() / 2]);
  const double tok = static_cast<double>(B * T);
  std::printf("l2l-bench-train: %lld params, B=%lld T=%lld, recompute %s, %d iters, backend %s: %.1f ms/iter, "
              "median tok/s %.0f, best tok/s %.0f, tok/s %.0f\n",
              static_cast<long long>(cfg.model.NumParams()), static_cast<long long>(B), static_cast<long long>(T),
              l2l::ToString(cfg.train.recompute), iters, t->backend()->name().c_str(), 1e3 * s / iters, tok / med, tok / ts.front(), tok * iters / s);
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Reference trainer forward+backward throughput"};
  std::string config = "configs/quickstart.yaml";
  int64_t B = 8, T = 0;
  int iters = 10, warmup = 2, threads = 0;
  app.add_option("--config", config, "job config (its model is benchmarked)")->capture_default_str();
  app.add_option("--B", B, "sequences per micro-batch")->capture_default_str();
  app.add_option("--T", T, "tokens per sequence (0: model.seq_len)")->capture_default_str();
  app.add_option("--iters", iters, "timed iterations")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed iterations first")->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->capture_default_str();
  std::string recompute;
  app.add_option("--recompute", recompute, "always | never | auto (default: the config's train.recompute)");
  std::string compute = "fp32";
  app.add_option("--compute", compute, "fp32 | bf16: CPU matrix products (bf16: bf16 operands, fp32 accumulation)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // oneDNN's OpenMP threads spin between GEMMs and starve TBB's unless told to sleep.
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  const l2l::Status st = Run(config, B, T, iters, warmup, threads, recompute, compute);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-bench-train: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

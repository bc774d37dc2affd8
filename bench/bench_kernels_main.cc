// l2l-bench-kernels: how fast the CPU backend runs a transformer block's matrix products.
// For a model's shapes (a preset or --d_model/--d_ff/--seq) it times the forward and both
// backward GEMMs of the block's four linear layers (attn.c_attn, attn.c_proj, mlp.c_fc,
// mlp.c_proj) at N = batch*seq tokens through our oneDNN path, and in the same run:
//   * the same GEMMs in PyTorch (/usr/bin/python3, torch.set_num_threads(threads)),
//     printed as a ratio (>1: we are faster), plus torch's oneDNN linear for the forward;
//   * a register-only AVX2 FMA loop's rate (one core, times the thread count), printed
//     as "%fma" per GEMM. It is a same-run yardstick, not the hardware peak: on the
//     dev VM oneDNN's GEMM kernels beat it (FMA latency there seems longer than 12
//     chains cover), so read %fma as relative, and GFLOP/s as the figure;
//   * whole BlockForward/BlockBackward (recompute included) time and GFLOP/s, and the
//     causal attention's forward and backward alone;
//   * the fused elementwise backward ops (LayerNormBackwardResidual, RMSNormBackwardResidual,
//     SwiGLUBackwardInto) against the copy / Zero + op they replace, at the block's shapes.
// A benchmark, not a test: it never fails on speed. Runs in well under 30 s by default.
#include <sys/wait.h>
#include <unistd.h>

#include <immintrin.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/layers/layers.h"

namespace l2l {
namespace {

using Clock = std::chrono::steady_clock;

struct GemmCase {
  std::string name;
  bool ta, tb;
  int64_t M, N, K;
  float beta;
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

// Best time (s) of f over repeats until min_seconds have passed (at least 1, at most 50),
// after one warm-up call.
template <typename F>
double BestTime(F&& f, double min_seconds) {
  f();
  double best = 1e30, total = 0.0;
  for (int rep = 0; rep < 50 && (rep < 1 || total < min_seconds); ++rep) {
    const auto t0 = Clock::now();
    f();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

// ---- FMA-loop rate -------------------------------------------------------------------

// Twelve independent FMA chains held in registers (the most that fit 16 ymm registers
// beside the two operands); returns a value so the loop is not removed.
__attribute__((target("avx2,fma"), noinline)) float FmaLoop(int64_t iters) {
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  __m256 c[12];
  for (int i = 0; i < 12; ++i) c[i] = _mm256_set1_ps(0.1f * float(i));
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) c[i] = _mm256_fmadd_ps(c[i], a, b);
  }
  __m256 s = c[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, c[i]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

// One core's best rate (GFLOP/s) over a few short runs of FmaLoop (0: no AVX2+FMA). A
// single thread finds a quiet moment on shared cores far more easily than several.
double MeasureFmaLoopGflops() {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0.0;
  const int64_t iters = 5'000'000;  // 12 chains x 8 lanes x 2 flops = 192 flops/iter
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = Clock::now();
    sink = sink + FmaLoop(iters);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 192.0 * double(iters) / dt / 1e9);
  }
  return best;
}

// The 1-minute load average: other processes on the cores skew every figure here.
std::string LoadAverage() {
  std::string s = "?\n";
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    char buf[128] = {0};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) s = std::string(buf, strcspn(buf, " ")) + "\n";
    std::fclose(f);
  }
  return s;
}

// ---- PyTorch peer ------------------------------------------------------------------------

constexpr const char* kTorchScript = R"PY(
import json, sys, time
import torch
cases = json.loads(sys.argv[1]); threads = int(sys.argv[2]); min_s = float(sys.argv[3])
with_mm = sys.argv[4] == "1"
torch.set_num_threads(threads)
def best(f):
    f(); b = 1e30; tot = 0.0; rep = 0
    while rep < 50 and (rep < 1 or tot < min_s):
        t = time.perf_counter(); f(); dt = time.perf_counter() - t
        b = min(b, dt); tot += dt; rep += 1
    return b
mm, mkl = [], []
for (ta, tb, M, N, K, beta) in cases:
    A = torch.randn(K, M).t() if ta else torch.randn(M, K)
    B = torch.randn(N, K).t() if tb else torch.randn(K, N)
    C = torch.randn(M, N)
    if not with_mm: mm.append(None)
    elif beta == 0.0: mm.append(2.0 * M * N * K / best(lambda: torch.mm(A, B, out=C)) / 1e9)
    else: mm.append(2.0 * M * N * K / best(lambda: C.addmm_(A, B, beta=beta)) / 1e9)
    # torch's oneDNN linear computes the same product, x (M,K) @ W^T with W = op(B)^T (N,K),
    # on operands laid out as it prefers (the layout change is not timed).
    r = None
    if torch.backends.mkldnn.is_available():
        try:
            Am = A.contiguous().to_mkldnn(); Wm = B.t().contiguous().to_mkldnn()
            r = 2.0 * M * N * K / best(lambda: torch._C._nn.mkldnn_linear(Am, Wm, None)) / 1e9
        except Exception:
            r = None
    mkl.append(r)
import re
blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
print(json.dumps({"mm": mm, "mkldnn": mkl, "threads": torch.get_num_threads(),
                  "version": torch.__version__, "blas": blas.group(1) if blas else "?"}))
)PY";

// Runs argv (no shell) and returns its stdout, or an error naming the program.
Result<std::string> RunCapture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return ErrnoError("pipe", argv[0], errno);
  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork", argv[0], errno);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Unavailable(argv[0] + " exited with status " + std::to_string(WEXITSTATUS(status)) +
                       " (is python3-torch installed?)");
  }
  return out;
}

// ---- main ----------------------------------------------------------------------------------

int Run(int argc, char** argv) {
  CLI::App app{"l2l-bench-kernels: oneDNN GEMM and block speed vs PyTorch and the FMA peak"};
  std::string preset = "small";
  int64_t d_model = 0, d_ff = 0, seq = 0, n_head = 0, batch = 1;
  int threads = 0;
  double min_seconds = 0.15;
  bool no_torch = false, torch_mm = false;
  app.add_option("--preset", preset, "model preset (configs/models/NAME.yaml), e.g. small, gpt2-small");
  app.add_option("--d_model", d_model, "override C");
  app.add_option("--d_ff", d_ff, "override F (default 4*C when d_model is overridden)");
  app.add_option("--seq", seq, "override T (tokens per sequence)");
  app.add_option("--heads", n_head, "override the number of heads");
  app.add_option("--batch", batch, "sequences per micro-batch: N = batch*seq");
  app.add_option("--threads", threads, "threads for oneDNN/TBB and torch (0: all cores)");
  app.add_option("--min-time", min_seconds, "seconds of repeats per measurement");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch comparison");
  app.add_flag("--torch-mm", torch_mm,
               "also time torch.mm (slow where torch uses the reference netlib BLAS)");
  CLI11_PARSE(app, argc, argv);

  Result<JobConfig> job = ParseJobConfig("model: {preset: " + preset + "}\n", "--preset", ".");
  if (!job.ok()) {
    std::fprintf(stderr, "l2l-bench-kernels: %s\n", job.status().ToString().c_str());
    return 2;
  }
  ModelSpec spec = job->model;
  if (d_model > 0) {
    spec.d_model = d_model;
    spec.d_ff = 4 * d_model;
  }
  if (d_ff > 0) spec.d_ff = d_ff;
  if (seq > 0) spec.seq_len = seq;
  if (n_head > 0) spec.n_head = n_head;
  if (Status st = spec.Validate(); !st.ok() || batch <= 0) {
    std::fprintf(stderr, "l2l-bench-kernels: %s\n",
                 st.ok() ? "--batch must be positive" : st.ToString().c_str());
    return 2;
  }
  auto be = std::make_unique<kernels::CpuBackend>(threads);
  threads = be->num_threads();
  const int64_t C = spec.d_model, F = spec.d_ff, T = spec.seq_len, N = batch * T;
  std::printf("l2l-bench-kernels: %s, C=%ld F=%ld T=%ld heads=%ld, N=%ld tokens, %d threads\n",
              be->name().c_str(), long(C), long(F), long(T), long(spec.n_head), long(N), threads);

  // Conv1D y (N,OC) = x (N,IC) @ W (IC,OC): forward, dW += x^T dy, dx = dy W^T.
  std::vector<GemmCase> cases;
  for (auto [name, IC, OC] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"attn.c_attn", C, 3 * C}, {"attn.c_proj", C, C}, {"mlp.c_fc", C, F}, {"mlp.c_proj", F, C}}) {
    cases.push_back({name + " fwd", false, false, N, OC, IC, 0.0f});
    cases.push_back({name + " dW", true, false, IC, OC, N, 1.0f});
    cases.push_back({name + " dx", false, true, N, IC, OC, 0.0f});
  }

  const double peak = MeasureFmaLoopGflops() * threads;
  std::vector<double> ours;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const GemmCase& g : cases) {
    std::vector<float> A(size_t(g.M * g.K)), B(size_t(g.K * g.N)), Cm(size_t(g.M * g.N));
    for (auto* v : {&A, &B, &Cm})
      for (float& x : *v) x = u(rng);
    const double t = BestTime(
        [&] {
          be->Gemm(g.ta, g.tb, g.M, g.N, g.K, 1.0f, A.data(), g.ta ? g.M : g.K, B.data(),
                   g.tb ? g.K : g.N, g.beta, Cm.data(), g.N);
        },
        min_seconds);
    ours.push_back(g.flops() / t / 1e9);
  }

  nlohmann::json torch;
  std::string torch_note;
  if (!no_torch) {
    nlohmann::json jc = nlohmann::json::array();
    for (const GemmCase& g : cases) jc.push_back({g.ta, g.tb, g.M, g.N, g.K, g.beta});
    Result<std::string> out = RunCapture({"/usr/bin/python3", "-c", kTorchScript, jc.dump(),
                                          std::to_string(threads), std::to_string(min_seconds),
                                          torch_mm ? "1" : "0"});
    if (!out.ok()) {
      torch_note = out.status().ToString();
    } else {
      torch = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
      if (torch.is_discarded() || !torch.contains("mm")) {
        torch_note = "could not parse PyTorch's output: " + *out;
        torch = nullptr;
      } else {
        torch_note = "torch " + torch["version"].get<std::string>() + ", " +
                     std::to_string(torch["threads"].get<int>()) + " threads; torch-dnn = torch's oneDNN linear, torch.mm = BLAS_INFO=" +
                     torch["blas"].get<std::string>() + (torch_mm ? "" : " (not timed; --torch-mm)");
      }
    }
  } else {
    torch_note = "skipped (--no-torch)";
  }
  std::printf("FMA-loop rate (AVX2, 1 core measured x %d threads): %.1f GFLOP/s; load average %s",
              threads, peak, LoadAverage().c_str());
  std::printf("PyTorch peer: %s\n\n", torch_note.c_str());
  std::printf("%-18s %6s %6s %6s %5s | %9s %9s %7s %9s %7s | %6s  %s\n", "gemm", "M", "N", "K",
              "op", "l2l GF/s", "torch-dnn", "ratio", "torch.mm", "ratio", "%fma", "oneDNN impl");
  for (size_t i = 0; i < cases.size(); ++i) {
    const GemmCase& g = cases[i];
    std::string mm = "-", mm_ratio = "-", dnn = "-", dnn_ratio = "-";
    if (!torch.is_null()) {
      if (!torch["mm"][i].is_null()) {
        const double t = torch["mm"][i].get<double>();
        mm = std::to_string(t).substr(0, 7);
        mm_ratio = std::to_string(ours[i] / t).substr(0, 5) + "x";
      }
      if (!torch["mkldnn"][i].is_null()) {
        const double d = torch["mkldnn"][i].get<double>();
        dnn = std::to_string(d).substr(0, 7);
        dnn_ratio = std::to_string(ours[i] / d).substr(0, 5) + "x";
      }
    }
    std::printf("%-18s %6ld %6ld %6ld %c%c%3s | %9.1f %9s %7s %9s %7s | %5.1f%%  %s\n",
                g.name.c_str(), long(g.M), long(g.N), long(g.K), g.ta ? 'T' : 'N', g.tb ? 'T' : 'N',
                g.beta != 0.0f ? "+C" : "", ours[i], dnn.c_str(), dnn_ratio.c_str(), mm.c_str(),
                mm_ratio.c_str(), peak > 0 ? 100.0 * ours[i] / peak : 0.0,
                be->GemmImplName(g.ta, g.tb, g.M, g.N, g.K).c_str());
  }

  // Whole block, forward and (recomputing) backward.
  const std::vector<LayerLayout> layouts = BuildLayout(spec);
  const LayerLayout& L = layouts[1];
  auto ws = layers::LayerWorkspace::Create(be.get(), spec, batch, T);
  if (!ws.ok()) {
    std::fprintf(stderr, "l2l-bench-kernels: %s\n", ws.status().ToString().c_str());
    return 1;
  }
  std::vector<float> params(L.numel), grads(L.numel, 0.0f), x(size_t(N * C)), y(x.size()),
      dy(x.size()), dx(x.size());
  InitLayerParams(spec, L, 1, params.data());
  for (auto* v : {&x, &dy})
    for (float& f : *v) f = u(rng);
  const double lin = 2.0 * double(N) * double(4 * C * C + 2 * C * F);
  const double att = 4.0 * double(batch) * double(T) * double(T) * double(C);  // full T x T
  const double tf = BestTime([&] {
    layers::BlockForward(*be, spec, L, params.data(), x.data(), y.data(), batch, T, *ws);
  }, min_seconds);
  const double tb = BestTime([&] {
    layers::BlockBackward(*be, spec, L, params.data(), x.data(), dy.data(), dx.data(), grads.data(),
                          batch, T, *ws);
  }, min_seconds);
  std::printf("\nblock forward : %8.2f ms  %6.1f GFLOP/s  (%.0f tokens/s)\n", tf * 1e3,
              (lin + att) / tf / 1e9, double(N) / tf);
  std::printf("block backward: %8.2f ms  %6.1f GFLOP/s  (recompute + backward, %.0f tokens/s)\n",
              tb * 1e3, 3.0 * (lin + att) / tb / 1e9, double(N) / tb);
  // The causal attention alone (qkv as the block's forward left it), GFLOP/s counted on
  // the causal half of the T x T products: the forward's two, the backward's four
  // gradient products (its recomputed scores not counted).
  const int64_t NH = spec.n_head;
  const double taf = BestTime([&] {
    be->AttentionForward(ws->atty.f32(), ws->att.f32(), ws->qkv.f32(), batch, T, C, NH);
  }, min_seconds);
  const double tab = BestTime([&] {
    be->Zero(ws->g1.f32(), size_t(N * 3 * C) * sizeof(float));
    be->AttentionBackward(ws->g1.f32(), ws->att_scratch.f32(), ws->g0.f32(), ws->qkv.f32(), ws->att.f32(), batch,
                          T, C, NH);
  }, min_seconds);
  std::printf("attention fwd : %8.2f ms  %6.1f GFLOP/s  (%.1f%% of the block forward)\n", taf * 1e3,
              0.5 * att / taf / 1e9, 100.0 * taf / tf);
  std::printf("attention bwd : %8.2f ms  %6.1f GFLOP/s  (%.1f%% of the block backward)\n", tab * 1e3,
              att / tab / 1e9, 100.0 * tab / tb);

  // The fused elementwise backward ops against the composition they replace, at the
  // block's shapes (N rows of C; SwiGLU's gate|up rows of 2F): the residual-gradient
  // norm backwards (copy + accumulate vs one pass) and SwiGLU's (Zero + accumulate vs
  // one pass). Inputs are the workspace's (their values do not change the work).
  std::vector<float> gamma(size_t(C), 1.0f), dgamma(size_t(C), 0.0f), dbeta(size_t(C), 0.0f),
      gu(size_t(N * 2 * F)), dgu(gu.size()), dh(size_t(N * F)), stat_m(static_cast<size_t>(N)), stat_r(static_cast<size_t>(N)),
      normed(x.size());
  for (auto* v : {&gu, &dh})
    for (float& f : *v) f = u(rng);
  be->LayerNormForward(normed.data(), stat_m.data(), stat_r.data(), x.data(), gamma.data(), dbeta.data(), N, C);
  const size_t nc_bytes = size_t(N * C) * sizeof(float);
  struct Pair {
    const char* name;
    double unfused, fused;
  };
  const Pair pairs[] = {
      {"LayerNormBackwardResidual",
       BestTime([&] {
         be->CopyDeviceToDevice(dx.data(), dy.data(), nc_bytes);
         be->LayerNormBackward(dx.data(), dgamma.data(), dbeta.data(), normed.data(), x.data(), gamma.data(),
                               stat_m.data(), stat_r.data(), N, C);
       }, min_seconds),
       BestTime([&] {
         be->LayerNormBackwardResidual(dx.data(), dgamma.data(), dbeta.data(), dy.data(), normed.data(), x.data(),
                                       gamma.data(), stat_m.data(), stat_r.data(), N, C);
       }, min_seconds)},
      {"RMSNormBackwardResidual",
       BestTime([&] {
         be->CopyDeviceToDevice(dx.data(), dy.data(), nc_bytes);
         be->RMSNormBackward(dx.data(), dgamma.data(), normed.data(), x.data(), gamma.data(), stat_r.data(), N, C);
       }, min_seconds),
       BestTime([&] {
         be->RMSNormBackwardResidual(dx.data(), dgamma.data(), dy.data(), normed.data(), x.data(), gamma.data(),
                                     stat_r.data(), N, C);
       }, min_seconds)},
      {"SwiGLUBackwardInto",
       BestTime([&] {
         be->Zero(dgu.data(), dgu.size() * sizeof(float));
         be->SwiGLUBackward(dgu.data(), dh.data(), gu.data(), N, F);
       }, min_seconds),
       BestTime([&] { be->SwiGLUBackwardInto(dgu.data(), dh.data(), gu.data(), N, F); }, min_seconds)},
  };
  std::printf("\n%-26s %12s %12s %8s\n", "fused op (vs composition)", "unfused ms", "fused ms", "speedup");
  for (const Pair& p : pairs) {
    std::printf("%-26s %12.3f %12.3f %7.2fx\n", p.name, p.unfused * 1e3, p.fused * 1e3, p.unfused / p.fused);
  }
  return 0;
}

}  // namespace
}  // namespace l2l

int main(int argc, char** argv) { return l2l::Run(argc, argv); }

// l2l-bench-moe: a mixture-of-experts block's step (forward, and the recomputing backward)
// against a dense Llama block with the same ACTIVE parameters per token, on the CPU
// backend: the MoE block has E experts of width F and routes each token to k of them; the
// dense block's MLP has width k*F (so each token meets k*3*C*F MLP weights in both, plus
// the router's E*C in the MoE). The difference is the price of routing: the router
// product, the host-side softmax/top-k, the gathers and scatter-adds, E smaller GEMMs
// instead of one large one, and (backward) the recomputed expert forwards.
//
//   l2l-bench-moe [--d_model 512] [--d_ff 512] [--experts 8] [--top_k 2] [--heads 8]
//                 [--seq 256] [--batch 4] [--threads 0] [--min-time 2]
//
// Prints one line per block kind: forward ms, backward ms, step ms and tokens/s, and the
// MoE/dense ratio. Weights from InitLayerParams (router N(0, 0.02): close to uniform
// routing, so the experts' loads are balanced).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "kernels/layers/moe.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace l2l;

template <typename F>
double BestTime(F&& f, double min_seconds) {
  f();
  double best = 1e30, total = 0.0;
  for (int rep = 0; rep < 50 && (rep < 2 || total < min_seconds); ++rep) {
    const auto t0 = Clock::now();
    f();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

struct Timing {
  double forward = 0, backward = 0;
};

Timing TimeBlock(kernels::Backend& be, const ModelSpec& spec, int64_t batch, int64_t T, double min_seconds) {
  const LayerLayout L = BuildLayout(spec)[1];
  auto ws = layers::LayerWorkspace::Create(&be, spec, batch, T);
  if (!ws.ok()) {
    std::fprintf(stderr, "l2l-bench-moe: %s\n", ws.status().ToString().c_str());
    std::exit(1);
  }
  const size_t n = static_cast<size_t>(batch * T * spec.d_model);
  std::vector<float> params(L.numel), grads(L.numel, 0.0f), x(n), y(n), dy(n), dx(n);
  InitLayerParams(spec, L, 1, params.data());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto* v : {&x, &dy})
    for (float& f : *v) f = u(rng);
  layers::MoeStats stats;
  layers::SequenceInputs seq;
  if (spec.moe()) {
    stats.Reset(spec);
    seq.moe = &stats;
  }
  Timing t;
  t.forward = BestTime([&] {
    if (spec.moe()) stats.Reset(spec);
    layers::BlockForward(be, spec, L, params.data(), x.data(), y.data(), batch, T, *ws, seq);
  }, min_seconds);
  t.backward = BestTime([&] {
    layers::BlockBackward(be, spec, L, params.data(), x.data(), dy.data(), dx.data(), grads.data(), batch, T, *ws,
                          seq);
  }, min_seconds);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MoE block vs a dense block with the same active parameters (CPU backend)"};
  int64_t C = 512, F = 512, E = 8, k = 2, heads = 8, T = 256, batch = 4;
  int threads = 0;
  double min_seconds = 2.0;
  app.add_option("--d_model", C, "C");
  app.add_option("--d_ff", F, "F: each expert's width (the dense block's is top_k * F)");
  app.add_option("--experts", E, "E");
  app.add_option("--top_k", k, "experts per token");
  app.add_option("--heads", heads, "attention heads (key/value heads: the same)");
  app.add_option("--seq", T, "tokens per sequence");
  app.add_option("--batch", batch, "sequences per micro-batch");
  app.add_option("--threads", threads, "CPU threads (0: all cores)");
  app.add_option("--min-time", min_seconds, "seconds of repeats per measurement");
  CLI11_PARSE(app, argc, argv);

  ModelSpec moe;
  moe.family = ModelFamily::kLlama;
  moe.vocab_size = 256;
  moe.seq_len = T;
  moe.d_model = C;
  moe.n_layer = 1;
  moe.n_head = heads;
  moe.d_ff = F;
  moe.tied_embeddings = false;
  moe.num_experts = E;
  moe.experts_per_token = k;
  ModelSpec dense = moe;
  dense.num_experts = 0;
  dense.experts_per_token = 0;
  dense.d_ff = k * F;
  for (const ModelSpec* s : {&moe, &dense}) {
    if (Status st = s->Validate(); !st.ok()) {
      std::fprintf(stderr, "l2l-bench-moe: %s\n", st.ToString().c_str());
      return 2;
    }
  }
  auto be = kernels::CreateCpuBackend(threads);
  std::printf("l2l-bench-moe: %s; C=%ld heads=%ld T=%ld batch=%ld (N=%ld tokens)\n", be->name().c_str(), long(C),
              long(heads), long(T), long(batch), long(batch * T));
  std::printf("MoE: E=%ld experts of F=%ld, top-%ld; dense: F=%ld (the same %ld active MLP weights per token)\n",
              long(E), long(F), long(k), long(k * F), long(3 * C * k * F));
  const Timing d = TimeBlock(*be, dense, batch, T, min_seconds);
  const Timing m = TimeBlock(*be, moe, batch, T, min_seconds);
  const double N = double(batch * T);
  for (const auto& [name, t] : {std::pair<const char*, Timing>{"dense", d}, {"moe", m}}) {
    std::printf("%-6s forward %8.2f ms  backward %8.2f ms  step %8.2f ms  %9.0f tokens/s\n", name, t.forward * 1e3,
                t.backward * 1e3, (t.forward + t.backward) * 1e3, N / (t.forward + t.backward));
  }
  std::printf("moe / dense: forward %.2fx, backward %.2fx, step %.2fx\n", m.forward / d.forward,
              m.backward / d.backward, (m.forward + m.backward) / (d.forward + d.backward));
  return 0;
}

// Helpers for the GPU tests (label gpu): the CPU reference backend and the CUDA backend
// side by side, "twin" buffers holding the same bytes on both, and the one comparison
// rule |gpu - cpu| <= atol + rtol * |cpu| (ggml test-backend-ops, llm.c validate_result).
//
// No GPU is a FAILURE here, never a skip: this binary is only run by `ctest -L gpu` on a
// GPU host (CI runs `ctest -LE gpu`), and a GPU host without a usable GPU is broken.
// Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/layers/layers.h"
#include "kernels/layers/lora.h"
#include "tests/testing/bf16_reference.h"

namespace l2l::gpu_test {

using kernels::Backend;
using kernels::DeviceBuffer;

struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<Backend> gpu;
  std::string gpu_error;  // why gpu is null
};

// A CUDA backend on device 0 in bf16 GEMM mode (CudaGemmPrecision::kBf16), of this case's own.
// reuse: CudaBackendOptions::reuse_bf16_operands (false: every operand not in a noted layer
// copy is cast).
inline std::unique_ptr<Backend> CudaBf16Backend(bool reuse = true, bool hold = true) {
  kernels::CudaBackendOptions opt;
  opt.gemm = kernels::CudaGemmPrecision::kBf16;
  opt.reuse_bf16_operands = reuse;
  opt.hold_bf16_copies = hold;
  auto made = kernels::CreateCudaBackend(0, opt);
  REQUIRE(made.ok());
  return std::move(made).value();
}

// `run` (a relay of `steps` steps returning its losses) on two bf16-mode backends, operand
// reuse on and off (kernels/cuda/bf16_operands.h): a reused copy holds the bits a cast
// would, so the losses must be equal bit for bit, and every operand element is either cast
// or read from a copy in both. Returns each side's operand counts over the run.
struct ReuseCounts {
  Backend::Bf16OperandStats on, off;
};
inline ReuseCounts RunWithReuseOnAndOff(int steps, const std::function<std::vector<float>(Backend*)>& run) {
  ReuseCounts counts;
  std::vector<float> losses[2];
  for (const bool reuse : {true, false}) {
    const std::unique_ptr<Backend> be = CudaBf16Backend(reuse);
    const Backend::Bf16OperandStats before = be->bf16_operand_stats();
    losses[reuse ? 0 : 1] = run(be.get());
    const Backend::Bf16OperandStats after = be->bf16_operand_stats();
    (reuse ? counts.on : counts.off) = {after.cast_elements - before.cast_elements,
                                        after.reused_elements - before.reused_elements};
  }
  REQUIRE(losses[0].size() == static_cast<size_t>(steps));
  CHECK(losses[0] == losses[1]);
  CHECK(counts.on.cast_elements + counts.on.reused_elements == counts.off.cast_elements + counts.off.reused_elements);
  return counts;
}

// The process-wide pair (created once: backend creation costs ~0.5 s on a GPU).
inline Backends& Both() {
  static Backends* b = [] {
    auto* p = new Backends;
    p->cpu = kernels::CreateCpuBackend(0);
    auto gpu = kernels::CreateCudaBackend(0);
    if (gpu.ok()) {
      p->gpu = std::move(gpu).value();
    } else {
      p->gpu_error = gpu.status().ToString();
    }
    return p;
  }();
  INFO("GPU tests need a CUDA GPU (run them with `ctest -L gpu` on a GPU host): "
       << b->gpu_error);
  REQUIRE(b->gpu != nullptr);
  return *b;
}

inline std::vector<float> RandomVec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> RandomTokens(std::mt19937& rng, size_t n, int32_t V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// The same bytes on the CPU and the GPU backend.
struct Twin {
  DeviceBuffer cpu, gpu;
  size_t bytes = 0;

  template <typename T>
  static Twin Of(Backends& b, const std::vector<T>& host) {
    Twin t;
    t.bytes = host.size() * sizeof(T);
    auto c = DeviceBuffer::Create(b.cpu.get(), t.bytes);
    auto g = DeviceBuffer::Create(b.gpu.get(), t.bytes);
    REQUIRE(c.ok());
    REQUIRE(g.ok());
    t.cpu = std::move(c).value();
    t.gpu = std::move(g).value();
    b.cpu->CopyToDevice(t.cpu.data(), host.data(), t.bytes);
    b.gpu->CopyToDevice(t.gpu.data(), host.data(), t.bytes);
    return t;
  }
  float* c() const { return cpu.f32(); }
  float* g() const { return gpu.f32(); }
  int32_t* ci() const { return cpu.i32(); }
  int32_t* gi() const { return gpu.i32(); }

  template <typename T = float>
  std::vector<T> FromCpu(Backends& b) const {
    std::vector<T> v(bytes / sizeof(T));
    b.cpu->CopyToHost(v.data(), cpu.data(), bytes);
    return v;
  }
  template <typename T = float>
  std::vector<T> FromGpu(Backends& b) const {
    std::vector<T> v(bytes / sizeof(T));
    b.gpu->CopyToHost(v.data(), gpu.data(), bytes);
    return v;
  }
};

// Every element must satisfy |got - ref| <= atol + rtol * |ref| (NaN fails); one
// assertion reports the count and the worst element.
template <typename G, typename R>
void ExpectClose(const std::vector<G>& got, const std::vector<R>& ref, double atol, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == ref.size());
  REQUIRE(!got.empty());
  size_t bad = 0, worst = 0;
  double worst_excess = -1e300;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), r = double(ref[i]);
    const double excess = std::abs(g - r) - (atol + rtol * std::abs(r));
    if (!(excess <= 0.0)) ++bad;
    if (!(excess <= worst_excess)) {
      worst_excess = excess;
      worst = i;
    }
  }
  std::ostringstream os;
  os << what << ": " << bad << " of " << got.size() << " elements off; worst [" << worst
     << "] gpu " << double(got[worst]) << " cpu " << double(ref[worst]) << " (atol " << atol
     << ", rtol " << rtol << ")";
  INFO(os.str());
  CHECK(bad == 0);
}

// Compares the GPU copy of `t` against the CPU copy.
inline void ExpectTwinClose(Backends& b, const Twin& t, double atol, double rtol,
                            const std::string& what) {
  ExpectClose(t.FromGpu(b), t.FromCpu(b), atol, rtol, what);
}

// A host vector copied into `be`'s memory (DevOf<int32_t> for masks; Dev for floats).
template <typename T>
struct DevOf {
  DeviceBuffer buf;
  size_t n = 0;
  static DevOf Of(Backend& be, const std::vector<T>& host) {
    DevOf d;
    d.n = host.size();
    auto b = DeviceBuffer::Create(&be, d.n * sizeof(T));
    REQUIRE(b.ok());
    d.buf = std::move(b).value();
    be.CopyToDevice(d.buf.data(), host.data(), d.n * sizeof(T));
    return d;
  }
  T* p() const { return static_cast<T*>(buf.data()); }
  std::vector<T> Host(Backend& be) const {
    std::vector<T> v(n);
    be.CopyToHost(v.data(), buf.data(), n * sizeof(T));
    return v;
  }
};
using Dev = DevOf<float>;

// The bf16 references (RoundBf16, RoundedBf16, CpuAttentionProbs, Bf16AttentionBounds,
// ExpectWithin) live in tests/testing/bf16_reference.h, shared with the CPU bf16 tests.
using testing::AttentionBounds;
using testing::Bf16AttentionBounds;
using testing::CpuAttentionProbs;
using testing::ExpectWithin;
using testing::RoundBf16;
using testing::CheckBf16Gemm;
using testing::RoundedBf16;

// One layer workspace on each backend.
struct Workspaces {
  std::unique_ptr<layers::LayerWorkspace> cpu, gpu;
};
inline Workspaces MakeWorkspaces(Backends& b, const ModelSpec& spec, int64_t B, int64_t T) {
  auto c = layers::LayerWorkspace::Create(b.cpu.get(), spec, B, T);
  auto g = layers::LayerWorkspace::Create(b.gpu.get(), spec, B, T);
  REQUIRE(c.ok());
  REQUIRE(g.ok());
  return {std::make_unique<layers::LayerWorkspace>(std::move(c).value()),
          std::make_unique<layers::LayerWorkspace>(std::move(g).value())};
}

// A small Gemma 3 (V 53, T 64, 3 blocks: blocks 0 and 1 slide over a window of 7, block 2
// is global; q/k norms, local RoPE theta 100, query_pre_attn_scalar 10, tied
// embeddings) of the given widths.
struct Gemma3Widths {
  int64_t d_model, n_head, n_kv_heads, head_size, d_ff;
};
inline ModelSpec Gemma3Spec(const Gemma3Widths& w) {
  ModelSpec s;
  s.family = ModelFamily::kGemma3;
  s.vocab_size = 53;
  s.seq_len = 64;
  s.d_model = w.d_model;
  s.n_layer = 3;
  s.n_head = w.n_head;
  s.n_kv_heads = w.n_kv_heads;
  s.head_size = w.head_size;
  s.qk_norm = true;
  s.d_ff = w.d_ff;
  s.sliding_window = 7;
  s.sliding_window_pattern = 3;
  s.rope_theta = 10000.0;
  s.rope_local_theta = 100.0;
  s.query_pre_attn_scalar = 10.0;
  s.tied_embeddings = true;
  return s;
}

// A layer's parameters as InitLayerParams makes them (seed 42).
inline std::vector<float> InitParams(const ModelSpec& spec, const LayerLayout& layout) {
  std::vector<float> p(layout.numel);
  InitLayerParams(spec, layout, 42, p.data());
  return p;
}

// BlockForward, then the recomputing BlockBackward, on both backends from the same
// parameters and the same random inputs (drawn from `rng` in this order: in, out, dout,
// din, dparams): out, din and the accumulated dparams within atol 1e-4, rtol 1e-3.
// `lora_dropout`: the LoRA adapter dropout of both calls (kernels/layers/lora.h).
inline void ExpectBlockMatches(Backends& b, const ModelSpec& spec, const LayerLayout& block,
                               const std::vector<float>& param_values, int64_t B, int64_t T,
                               std::mt19937& rng, const layers::LoraDropout& lora_dropout = {}) {
  const int64_t C = spec.d_model;
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  // A LoRA block (kernels/layers/lora.h) needs its adapter scratch; nothing otherwise.
  REQUIRE(layers::ReserveLoraScratch(b.cpu.get(), {block}, ws.cpu.get(), lora_dropout.p).ok());
  REQUIRE(layers::ReserveLoraScratch(b.gpu.get(), {block}, ws.gpu.get(), lora_dropout.p).ok());
  layers::SequenceInputs seq;
  seq.lora_dropout = lora_dropout;
  Twin params = Twin::Of(b, param_values);
  Twin in = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin out = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::BlockForward(*b.cpu, spec, block, params.c(), in.c(), out.c(), B, T, *ws.cpu, seq);
  layers::BlockForward(*b.gpu, spec, block, params.g(), in.g(), out.g(), B, T, *ws.gpu, seq);
  ExpectTwinClose(b, out, 1e-4, 1e-3, "block out");

  Twin dout = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dparams = Twin::Of(b, RandomVec(rng, block.numel, -0.01f, 0.01f));  // accumulates
  layers::BlockBackward(*b.cpu, spec, block, params.c(), in.c(), dout.c(), din.c(), dparams.c(), B,
                        T, *ws.cpu, seq);
  layers::BlockBackward(*b.gpu, spec, block, params.g(), in.g(), dout.g(), din.g(), dparams.g(), B,
                        T, *ws.gpu, seq);
  ExpectTwinClose(b, din, 1e-4, 1e-3, "block din");
  ExpectTwinClose(b, dparams, 1e-4, 1e-3, "block dparams");
}

// EmbeddingForward, then HeadForwardBackward (loss scale 0.5) and EmbeddingBackward, on
// both backends from InitParams weights and random tokens, targets and din (drawn from
// `rng` in this order: tokens, targets, hidden, din). `tied_table`: the embedding tensor
// a tied head reads and accumulates into (nullptr: an untied head). The embedding output
// is compared within emb_atol/emb_rtol, the loss within 1e-5 relative, the gradients
// within atol 1e-6, rtol 1e-3.
inline void ExpectEmbeddingAndHeadMatch(Backends& b, const ModelSpec& spec, int64_t B, int64_t T,
                                        std::mt19937& rng, double emb_atol, double emb_rtol,
                                        const char* tied_table) {
  const auto layouts = BuildLayout(spec);
  const LayerLayout& emb = layouts.front();
  const LayerLayout& head = layouts.back();
  const int64_t C = spec.d_model;
  Workspaces ws = MakeWorkspaces(b, spec, B, T);
  Twin emb_params = Twin::Of(b, InitParams(spec, emb));
  Twin head_params = Twin::Of(b, InitParams(spec, head));
  const int32_t V = static_cast<int32_t>(spec.vocab_size);
  Twin tokens = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin targets = Twin::Of(b, RandomTokens(rng, B * T, V));
  Twin hidden = Twin::Of(b, RandomVec(rng, B * T * C));
  layers::EmbeddingForward(*b.cpu, spec, emb, emb_params.c(), tokens.ci(), hidden.c(), B, T);
  layers::EmbeddingForward(*b.gpu, spec, emb, emb_params.g(), tokens.gi(), hidden.g(), B, T);
  ExpectTwinClose(b, hidden, emb_atol, emb_rtol, "embedding out");

  const ParamInfo* table = tied_table != nullptr ? emb.Find(tied_table) : nullptr;
  if (tied_table != nullptr) REQUIRE(table != nullptr);
  const size_t off = table != nullptr ? table->offset : 0;
  Twin din = Twin::Of(b, RandomVec(rng, B * T * C));
  Twin dhead = Twin::Of(b, std::vector<float>(head.numel, 0.0f));
  Twin demb = Twin::Of(b, std::vector<float>(emb.numel, 0.0f));
  const float lc = layers::HeadForwardBackward(
      *b.cpu, spec, head, head_params.c(), table ? emb_params.c() + off : nullptr, hidden.c(), targets.ci(),
      0.5f, din.c(), dhead.c(), table ? demb.c() + off : nullptr, B, T, *ws.cpu);
  const float lg = layers::HeadForwardBackward(
      *b.gpu, spec, head, head_params.g(), table ? emb_params.g() + off : nullptr, hidden.g(), targets.gi(),
      0.5f, din.g(), dhead.g(), table ? demb.g() + off : nullptr, B, T, *ws.gpu);
  CHECK(std::abs(lg - lc) <= 1e-5 + 1e-5 * std::abs(lc));
  ExpectTwinClose(b, din, 1e-6, 1e-3, "head din");
  ExpectTwinClose(b, dhead, 1e-6, 1e-3, "head dparams");
  layers::EmbeddingBackward(*b.cpu, spec, emb, tokens.ci(), din.c(), demb.c(), B, T);
  layers::EmbeddingBackward(*b.gpu, spec, emb, tokens.gi(), din.g(), demb.g(), B, T);
  ExpectTwinClose(b, demb, 1e-6, 1e-3,
                  table ? "embedding dparams (tied table: head + embedding)" : "embedding dparams");
}

// Per-step losses of a GPU run against the CPU's: within 1e-4 + rtol * |cpu|, and the
// run trains (the last loss well below the first; the tests' data is learnable).
inline void ExpectLossesTrack(const std::vector<float>& gpu, const std::vector<float>& cpu, double rtol) {
  REQUIRE(gpu.size() == cpu.size());
  for (size_t s = 0; s < cpu.size(); ++s) {
    INFO("step " << s << ": gpu loss " << gpu[s] << ", cpu loss " << cpu[s]);
    CHECK(std::abs(gpu[s] - cpu[s]) <= 1e-4 + rtol * std::abs(cpu[s]));
  }
  CHECK(gpu.back() < 0.9f * gpu.front());
}

}  // namespace l2l::gpu_test

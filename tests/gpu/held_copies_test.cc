// Held bf16 copies in every family's block (Backend::HoldBf16Copy, kernels/layers/
// registry.h's HeldBf16Copies): a block call holds the copies its producers write of the
// activations its GEMMs read again later in the call (the weight-gradient GEMMs after the
// rest of the backward), on the promise that nothing else writes those regions during
// the call. A broken promise makes a GEMM read stale bits; this test is what catches it.
// Label gpu (emu on the emulator): fails, never skips, without a device.
//
// Oracle: the same block forward and recomputing backward on a second bf16-mode backend
// with operand reuse off, which casts every GEMM operand from its fp32 values at the GEMM.
// A held copy holds the bits a cast would give, so out, din and the parameter gradients
// must be equal bit for bit; the operand counts (Backend::bf16_operand_stats) of the
// backward, against a third backend that ignores holds (CudaBackendOptions::
// hold_bf16_copies), show exactly the held copies read instead of cast.
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/lora.h"
#include "kernels/layers/layers.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/testing/jobs.h"

namespace l2l::gpu_test {
namespace {

struct BlockRun {
  std::vector<float> out, din, dparams;
  Backend::Bf16OperandStats backward;  // the backward's operand counts
};

// Forward, then the recomputing backward, of `block` on a bf16-mode CUDA backend (operand
// reuse and holds on or off), from the same inputs (drawn from `seed`).
BlockRun RunBlock(bool reuse, bool hold, const ModelSpec& spec, const LayerLayout& block,
                  const std::vector<float>& params, int64_t B, int64_t T, uint32_t seed, bool keep = false) {
  const std::unique_ptr<Backend> be = CudaBf16Backend(reuse, hold);
  const int64_t C = spec.d_model;
  auto ws = layers::LayerWorkspace::Create(be.get(), spec, B, T);
  REQUIRE(ws.ok());
  REQUIRE(layers::ReserveLoraScratch(be.get(), {block}, &ws.value(), 0.0).ok());
  std::mt19937 rng(seed);
  const Dev p = Dev::Of(*be, params);
  const Dev in = Dev::Of(*be, RandomVec(rng, B * T * C));
  const Dev out = Dev::Of(*be, std::vector<float>(B * T * C));
  const Dev dout = Dev::Of(*be, RandomVec(rng, B * T * C));
  const Dev din = Dev::Of(*be, std::vector<float>(B * T * C));
  const Dev dparams = Dev::Of(*be, RandomVec(rng, block.numel, -0.01f, 0.01f));
  // keep: the forward's intermediates kept for the backward (SavedActivations: no recompute).
  std::optional<layers::SavedActivations> saved;
  if (keep) {
    auto made = layers::SavedActivations::Create(be.get(), spec, *ws);
    REQUIRE(made.ok());
    saved.emplace(std::move(made).value());
  }
  layers::BlockForward(*be, spec, block, p.p(), in.p(), out.p(), B, T, *ws, {}, keep ? &*saved : nullptr);
  const Backend::Bf16OperandStats before = be->bf16_operand_stats();
  layers::BlockBackward(*be, spec, block, p.p(), in.p(), dout.p(), din.p(), dparams.p(), B, T, *ws, {},
                        keep ? &*saved : nullptr);
  if (keep) CHECK(!saved->filled());  // the backward took them
  const Backend::Bf16OperandStats after = be->bf16_operand_stats();
  return {out.Host(*be), din.Host(*be), dparams.Host(*be),
          {after.cast_elements - before.cast_elements, after.reused_elements - before.reused_elements}};
}

// Runs `block` with reuse and holds on, reuse on without holds, and reuse off: the same
// bits all three ways, and the backward with holds reads exactly `held_reads` more operand
// elements from copies than without them (at least, with `at_least`: LoRA's adapters).
void ExpectHeldExact(const ModelSpec& spec, const LayerLayout& block, int64_t B, int64_t T, int64_t held_reads,
                     bool at_least = false, bool keep = false) {
  std::mt19937 rng(11);
  std::vector<float> params(block.numel);
  for (float& v : params) v = std::uniform_real_distribution<float>(-0.15f, 0.15f)(rng);
  const BlockRun held = RunBlock(true, true, spec, block, params, B, T, 23, keep);
  const BlockRun unheld = RunBlock(true, false, spec, block, params, B, T, 23, keep);
  const BlockRun off = RunBlock(false, true, spec, block, params, B, T, 23, keep);
  for (const BlockRun* r : {&held, &unheld}) {
    CHECK(r->out == off.out);
    CHECK(r->din == off.din);
    CHECK(r->dparams == off.dparams);
    CHECK(r->backward.cast_elements + r->backward.reused_elements == off.backward.cast_elements);
  }
  CHECK(off.backward.reused_elements == 0);
  const int64_t gained = held.backward.reused_elements - unheld.backward.reused_elements;
  INFO("backward operand elements read from copies: " << held.backward.reused_elements << " held, "
                                                      << unheld.backward.reused_elements << " without holds, of "
                                                      << off.backward.cast_elements);
  if (at_least) {
    CHECK(gained >= held_reads);
  } else {
    CHECK(gained == held_reads);
  }
}

// Head size 64 everywhere: the flash attention, which writes its output's copy.
constexpr int64_t kB = 2, kT = 24;
constexpr int64_t kN = kB * kT;

// In each count below, an activation whose producer runs right before its weight-gradient
// GEMM (GPT-2's and Llama's MLP activation: the recompute ends with it) is read fresh with
// or without a hold, so it is not among the held reads.

TEST_CASE("held bf16 copies: a GPT-2 block with reuse on and off is bit for bit the same", "[gpu]") {
  // Head size 64 (flash attention) and 32 (the GEMM attention, whose output no producer
  // writes: its hold never fills).
  const int64_t n_head = GENERATE(2, 4);
  CAPTURE(n_head);
  const ModelSpec spec = testing::GptModel({96, 32, 128, 2, n_head, 256});
  const auto layouts = BuildLayout(spec);
  // The weight-gradient GEMMs of c_fc, attn.c_proj and c_attn read ln2, the attention
  // output and ln1 (3 N C; 2 N C with the GEMM attention).
  ExpectHeldExact(spec, layouts[1], kB, kT, kN * (n_head == 2 ? 3 : 2) * spec.d_model);
}

TEST_CASE("held bf16 copies: a backward from kept intermediates (no recompute) holds nothing and is the same",
          "[gpu]") {
  // SavedActivations: the forward's regions are exchanged out and back, and no producer
  // runs in the backward, so no hold fills (and none may be read stale).
  const ModelSpec spec = testing::GptModel({96, 32, 128, 2, 2, 256});
  REQUIRE(layers::SavedActivations::Supported(spec));
  const auto layouts = BuildLayout(spec);
  ExpectHeldExact(spec, layouts[1], kB, kT, 0, /*at_least=*/false, /*keep=*/true);
}

TEST_CASE("held bf16 copies: Llama blocks (dense, q/k norms, experts) with reuse on and off are the same",
          "[gpu][llama]") {
  const std::string form = GENERATE("dense", "qk_norm", "moe");
  CAPTURE(form);
  ModelSpec spec = testing::LlamaModel({96, 32, 128, 2, 2, 1, 96});
  if (form == "qk_norm") spec.qk_norm = true;
  if (form == "moe") {
    spec.num_experts = 3;
    spec.experts_per_token = 2;
  }
  REQUIRE(spec.Validate().ok());
  REQUIRE(spec.head_dim() == 64);
  const int64_t C = spec.d_model, A = spec.n_head * spec.head_dim();
  const int64_t W = (spec.n_head + 2 * spec.kv_heads()) * spec.head_dim();
  const auto layouts = BuildLayout(spec);
  // dW_qkv reads ln1 (N C), dW_o the attention output (N A), and with the dense MLP
  // dW_gate_up ln2 (N C); with experts the router's logits, recomputed by the backward,
  // and its dW read ln2 (2 N C). With q/k norms, dqkv (RoPE's copy, kept fresh through the
  // norms' Copy2D) for dW_qkv (N W; dx's GEMM reads the cast of the first without holds).
  const int64_t held = (form == "moe" ? 3 * C + A : 2 * C + A) + (form == "qk_norm" ? W : 0);
  ExpectHeldExact(spec, layouts[1], kB, kT, kN * held);
}

TEST_CASE("held bf16 copies: Gemma 3 sliding and global blocks with reuse on and off are the same",
          "[gpu][gemma3]") {
  const ModelSpec spec = Gemma3Spec({.d_model = 96, .n_head = 2, .n_kv_heads = 1, .head_size = 64, .d_ff = 80});
  REQUIRE(spec.Validate().ok());
  const int64_t block = GENERATE(0, 2);  // block 0 slides, block 2 is global
  CAPTURE(block);
  const int64_t C = spec.d_model, F = spec.d_ff, A = spec.n_head * spec.head_dim();
  const auto layouts = BuildLayout(spec);
  const int64_t W = (spec.n_head + 2 * spec.kv_heads()) * spec.head_dim();
  // ln1, the attention output, ln2 and the GeGLU output (its down GEMM and post-norm run
  // after it in the recompute): 2 N C + N A + N F; and dqkv through the q/k norms (N W).
  ExpectHeldExact(spec, layouts[1 + block], kB, kT, kN * (2 * C + A + F + W));
}

TEST_CASE("held bf16 copies: a BERT block with reuse on and off is bit for bit the same", "[gpu][bert]") {
  const ModelSpec spec = testing::BertModel({96, 32, 128, 2, 2, 192}, 0);
  REQUIRE(spec.Validate().ok());
  const auto layouts = BuildLayout(spec);
  // The attention output and LayerNorm 1's output (2 N C) and the erf GELU output (N F).
  ExpectHeldExact(spec, layouts[1], kB, kT, kN * (2 * spec.d_model + spec.d_ff));
}

TEST_CASE("held bf16 copies: LoRA blocks (GPT-2 and Llama) with reuse on and off are the same", "[gpu][lora]") {
  const std::string family = GENERATE("gpt2", "llama");
  CAPTURE(family);
  const ModelSpec spec = family == "gpt2" ? testing::GptModel({96, 32, 128, 2, 2, 256})
                                          : testing::LlamaModel({96, 32, 128, 2, 2, 1, 96});
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 4;
  lora.alpha = 8;
  REQUIRE(ValidateLora(spec, lora).ok());
  const std::vector<LayerLayout> lo = BuildLoraLayout(spec, lora);
  // The frozen base has no weight-gradient GEMMs; the adapters read their layers' inputs
  // (held) again after other ops, at least ln1 once (N C).
  ExpectHeldExact(spec, lo[1], kB, kT, kN * spec.d_model, /*at_least=*/true);
}

}  // namespace
}  // namespace l2l::gpu_test

// LoRA (low-rank adaptation, Hu et al. 2021; Hugging Face PEFT's LoraModel): the job's
// `lora:` section and what it does to a model's layer layouts.
//
// With LoRA a targeted linear y = W x (+ b) becomes y = W x (+ b) + s * B (A (dropout(x)))
// with s = alpha / r, A (r, in) and B (out, r) (dropout: LoraDropoutStream below). W and
// every other base tensor are FROZEN (no gradient, no optimizer state); A and B train,
// and so do the tensors named in modules_to_save (the embedding table, an untied
// lm_head), in full.
//
// Layout: BuildLoraLayout keeps the base layout of every layer (same names, same offsets)
// and appends, per targeted linear of a block, "<module>.lora_A.weight" (r, in) then
// "<module>.lora_B.weight" (out, r) (module = the base weight's name without ".weight",
// e.g. "layers.3.self_attn.q_proj"). ParamInfo::trainable marks what trains; a layer's
// TRAINABLE VECTOR is its trainable tensors packed in layout order (PackTrainable): the
// gradient and the optimizer state (masters, m, v) of a LoRA job are sized by it, while
// the weights a layer runs with are the whole flat buffer.
//
// Targets are named as Hugging Face names the modules (PEFT's target_modules): Llama
// q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, GPT-2 c_attn c_proj c_fc
// (Conv1D; "c_attn" is the fused q|k|v projection, "c_proj" both the attention's and
// the MLP's output projection, as PEFT's suffix match takes it); "all-linear" is every
// linear of a block (never the lm_head, as PEFT). The family registry
// (common/models/*.cc, FamilyInfo::lora_targets) lists them; BERT has none yet.
//
// Thread-safety: pure functions of values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/model_spec.h"
#include "common/status.h"

namespace l2l {

// How the frozen base is held: fp32, bf16 (rounded once; computed in fp32), or block
// quantized: q4 = NF4, q8 = Q8_0 for the blocks' linears (common/lora_frozen.h).
enum class LoraBaseDType { kF32, kBF16, kQ4, kQ8 };
const char* ToString(LoraBaseDType d);                        // "fp32" | "bf16" | "q4" | "q8"
Result<LoraBaseDType> ParseLoraBaseDType(std::string_view text);  // also accepts "f32"

// The job's `lora:` section (common/config.h JobConfig::lora). Absent: enabled = false
// and nothing about the job changes.
struct LoraConfig {
  bool enabled = false;        // a `lora:` section was given
  int64_t r = 8;               // rank, > 0
  double alpha = 16.0;         // scale numerator, > 0; s = alpha / r
  double dropout = 0.0;        // on the adapter's input, in [0, 1)
  // Hugging Face module names, or the one entry "all-linear".
  std::vector<std::string> target = {"all-linear"};
  LoraBaseDType base_dtype = LoraBaseDType::kF32;
  uint64_t init_seed = 0;      // A's initialisation (B starts at 0)
  // Tensors trained in full beside the adapters, by Hugging Face module name:
  // the embedding ("embed_tokens" / GPT-2 "wte", "wpe") and an untied "lm_head".
  std::vector<std::string> modules_to_save;

  float scale() const { return static_cast<float>(alpha / static_cast<double>(r)); }
  bool operator==(const LoraConfig&) const = default;
};

// A linear of a block that LoRA can target (the family registry's table).
struct LoraTarget {
  std::string module;   // Hugging Face short name: "q_proj", "c_attn"
  std::string weight;   // the block tensor's name after "<blocks>.N.": "self_attn.q_proj.weight"
  int64_t in = 0;       // input features (A's columns)
  int64_t out = 0;      // output features (B's rows)
};

// The family's targetable linears (empty: the family has no LoRA support).
std::vector<LoraTarget> LoraTargets(const ModelSpec& spec);

// Adapter dropout (PEFT's lora_dropout, training only): the adapter sees dropout(x), the
// base W x the undropped x; inverted dropout, a kept element is scaled by 1 / (1 - p).
// The mask is never stored: it is counter-based, a pure function of its key, so the
// backward (and every backend, and an independent implementation such as the PEFT
// oracle's, tests/oracle/peft_oracle.py) regenerates it. For the adapter of block
// weight `weight` (LoraTarget::weight, e.g. "self_attn.q_proj.weight") of block `block`
// (0-based), in optimizer step `step` (0-based), for micro-batch `micro_batch` (its index
// among the step's micro-batches of all workers: data_rank * train.micro_batches + the
// worker's local index, the order the reference trainer receives them in), with the
// job's train.seed as `seed` (the run's training randomness, like the data order; not
// lora.init_seed, which only says where the adapters start), the mask stream is
//   k = SplitMix64(seed ^ kLoraDropoutTag)
//   k = SplitMix64(k ^ step);  k = SplitMix64(k ^ block);  k = SplitMix64(k ^ micro_batch)
//   stream = SplitMix64(k ^ FNV-1a-64(weight))       (integers as uint64, arithmetic mod 2^64)
// and element (n, c) of the adapter's (N, in) input, N = B*T rows in (b, t) order, is
// kept when common/rng.h DropoutKeep(stream, n * in + c, DropoutThreshold(p)).
inline constexpr uint64_t kLoraDropoutTag = 0x4C6F524144726F70ull;  // "LoRADrop"
uint64_t LoraDropoutStream(uint64_t seed, int64_t step, int64_t block, int64_t micro_batch,
                           std::string_view weight);

// Checks `lora` against the model: r > 0, alpha > 0, dropout in [0, 1), every target a
// module of the family (the message lists the family's), modules_to_save names a
// module that can train in full. Messages start "lora.<key>=<value>". OK when !lora.enabled.
Status ValidateLora(const ModelSpec& spec, const LoraConfig& lora);

// The targets of `lora` resolved against the family (all-linear expanded), in the
// family's block order. REQUIRES: ValidateLora ok.
std::vector<LoraTarget> ResolvedTargets(const ModelSpec& spec, const LoraConfig& lora);

// BuildLayout(spec) with the adapters appended and ParamInfo::trainable set (see the file
// comment); BuildLayout(spec) itself when !lora.enabled. Adapter tensors have decay =
// true (2-D weights, as torch.optim.AdamW decays every tensor PEFT hands it).
// REQUIRES: ValidateLora ok.
std::vector<LayerLayout> BuildLoraLayout(const ModelSpec& spec, const LoraConfig& lora);

// The LoRA job's layout of every layer: BuildLoraLayout (BuildLayout without LoRA).
// Weights for the layer: base tensors first, as BuildLayout(spec)[l], so
// base_numel(layout) floats of a base buffer are a prefix of the LoRA buffer.
size_t BaseNumel(const LayerLayout& layout);

// Where a layer's trainable vector lies in its flat buffer: the trainable tensors are
// contiguous in every LoRA layout (a block's adapters follow its base; an embedding or
// head trains all of itself, a prefix or a suffix; ValidateLora refuses modules_to_save
// that would split them). Without LoRA: {0, numel}. numel 0: nothing of the layer trains.
struct TrainableSpan {
  size_t offset = 0;
  size_t numel = 0;
};
TrainableSpan TrainableRange(const LayerLayout& layout);

// Floats of the layer's trainable vector (== numel without LoRA).
size_t TrainableNumel(const LayerLayout& layout);
// The layout of the layer's trainable vector: its trainable tensors, offsets from the
// span's start (what the daemon keeps masters, moments and gradients for; kind, index,
// block and the LoRA fields as the layer's). The layout itself when everything trains.
LayerLayout TrainableLayout(const LayerLayout& layout);
// packed (TrainableNumel) = the trainable tensors of full (layout.numel), in layout order.
void PackTrainable(const LayerLayout& layout, const float* full, float* packed);
// The inverse: writes the trainable tensors of full from packed; frozen ones untouched.
void UnpackTrainable(const LayerLayout& layout, const float* packed, float* full);

// Initialises the adapters of a LoRA layer in place (base tensors untouched): A as
// PEFT's kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)), drawn from
// SplitMix64 keyed by (init_seed, layer index, tensor index) (not torch's generator:
// PEFT's exact values are not reproduced, the oracle loads ours); B = 0.
void InitLoraAdapters(const LoraConfig& lora, const LayerLayout& layout, float* full);

// The values a frozen base holds (bf16-rounded, block-quantized): common/lora_frozen.h
// RoundToHeld.

// One trained adapter as PEFT names and shapes it (for exporters).
struct LoraAdapterTensors {
  std::string module;   // Hugging Face module path: "model.layers.3.self_attn.q_proj",
                        // "transformer.h.0.attn.c_attn"
  int64_t r = 0, in = 0, out = 0;
  std::vector<float> A;  // (r, in) row-major
  std::vector<float> B;  // (out, r) row-major
};
// The adapters of every layer, read from the layers' flat buffers (BuildLoraLayout order).
std::vector<LoraAdapterTensors> ExtractLoraAdapters(const ModelSpec& spec, const LoraConfig& lora,
                                                    const std::vector<LayerLayout>& layouts,
                                                    const std::vector<std::vector<float>>& layers);

}  // namespace l2l

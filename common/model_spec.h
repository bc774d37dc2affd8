// ModelSpec: the shape of a transformer of one FAMILY (GPT-2, Llama, BERT), and
// the parameter layout of each of its layers. Pure metadata (no compute): the EPS uses it
// to size its page store and name tensors on export, the worker and the reference trainer
// use it to find views inside a layer's flat fp32 parameter buffer.
//
// A model is a list of layers, indexed 0..NumLayers()-1, each of a LayerKind:
//   0              kEmbedding   token (and, for GPT-2, position) embeddings
//   1..n_layer     kBlock       transformer block i-1
//   n_layer+1      kHead        final norm; lm_head (V, C) only when embeddings are untied
// With tied embeddings the head reads the embedding matrix from layer 0: one tensor, two
// readers, the gradients summed into layer 0's gradient.
//
// What a family's layers hold, their Hugging Face names, their initialisation and FLOP
// counts live in the family registry (common/models/registry.h, one file per family under
// common/models/); the functions below dispatch to it. Nothing else switches on the
// family.
//
// Thread-safety: immutable values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace l2l {

// The role of a layer in the relay; a family gives each kind its parameters and kernels.
enum class LayerKind { kEmbedding, kBlock, kHead };
const char* LayerKindName(LayerKind kind);

// A model family: one entry of the registry (common/models/registry.h).
enum class ModelFamily {
  kGpt2,   // GPT2LMHeadModel: learned positions, LayerNorm, GELU MLP, biases everywhere
  kLlama,  // LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM: RoPE, RMSNorm,
           // grouped-query attention, SwiGLU MLP, no biases but optional q/k/v biases
  kBert,   // BertForMaskedLM / BertForSequenceClassification: bidirectional post-LN
           // encoder, learned positions + token types, erf GELU, padding mask
  kGemma3, // Gemma3ForCausalLM: scaled embeddings, (1+w) RMSNorms around both branches,
           // q/k norms, GELU-tanh gated MLP, interleaved sliding-window / global layers
};
const char* ToString(ModelFamily family);  // "gpt2" | "llama" | "bert" | "gemma3"
// "gpt2" | "llama" | "bert" | "gemma3"; anything else is INVALID_ARGUMENT listing the known families.
Result<ModelFamily> ParseModelFamily(std::string_view text);

// Rotary-embedding frequency scaling, as Hugging Face's config.json `rope_scaling`
// (transformers/modeling_rope_utils.py).
enum class RopeScalingType {
  kNone,    // plain RoPE
  kLinear,  // every inverse frequency divided by factor
  kLlama3,  // Llama 3.1: long wavelengths / factor, short kept, a smooth band between
};
const char* ToString(RopeScalingType type);  // "none" | "linear" | "llama3"
Result<RopeScalingType> ParseRopeScalingType(std::string_view text);

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                             // linear and llama3
  double low_freq_factor = 1.0;                    // llama3
  double high_freq_factor = 4.0;                   // llama3
  int64_t original_max_position_embeddings = 8192; // llama3
  bool operator==(const RopeScaling&) const = default;
};

struct ModelSpec {
  int64_t vocab_size = 256;  // V: token ids are in [0, V)
  int64_t seq_len = 64;      // T: maximum context length (GPT-2: rows of wpe)
  int64_t d_model = 64;      // C
  int64_t n_layer = 2;       // transformer blocks
  int64_t n_head = 4;        // attention (query) heads; must divide d_model
  int64_t d_ff = 256;        // F: MLP hidden width (GPT-2 uses 4*C; Llama's intermediate_size)
  bool tied_embeddings = true;  // LM head reads the embedding matrix instead of its own
  // After the GPT-2 shape fields so that ModelSpec{V, T, C, L, NH, F, tied} stays GPT-2.
  ModelFamily family = ModelFamily::kGpt2;

  // Llama family only (GPT-2 requires the defaults).
  int64_t n_kv_heads = 0;       // key/value heads (grouped-query attention); 0 = n_head
  double rope_theta = 10000.0;  // RoPE base
  RopeScaling rope_scaling = {};
  double rms_norm_eps = 1e-6;   // RMSNorm epsilon
  bool qkv_bias = false;        // q/k/v projections have biases (Qwen2)

  // Mixture of experts (Llama family; 0 experts = the dense SwiGLU MLP, every other MoE
  // field at its default). Each block's MLP is a router (E, C) and E SwiGLU experts of
  // width d_ff; a token runs through the experts_per_token experts of largest router
  // probability (softmax over all E logits in fp32), weighted by those probabilities
  // renormalised to sum 1 when norm_topk_prob (Mixtral always). With output_router_logits
  // the loss adds router_aux_loss_coef times Hugging Face's load_balancing_loss_func over
  // all blocks' router logits (kernels/layers/moe.h).
  int64_t num_experts = 0;            // E (config.json num_local_experts)
  int64_t experts_per_token = 0;      // k (num_experts_per_tok), 1 <= k <= E when E > 0
  bool norm_topk_prob = true;         // renormalise the k weights (Mixtral: always)
  double router_aux_loss_coef = 0.001;  // the aux loss's weight (HF's default)
  bool output_router_logits = false;  // add the aux loss (HF: only then is it computed)
  // Llama and Gemma 3 (GPT-2 and BERT require the defaults; 0 / false keep a Llama spec
  // exactly what it was before these fields existed).
  int64_t head_size = 0;        // attention head size; 0 = d_model / n_head (Qwen3, Gemma 3)
  bool qk_norm = false;         // RMSNorm over each q and k head before RoPE (Qwen3; Gemma 3: true)
  // Sliding-window attention: in a sliding block, query i sees keys j with
  // i - sliding_window < j <= i (Hugging Face's sliding_window). 0 = none.
  int64_t sliding_window = 0;
  // Which blocks slide (0-based block i): i >= max_window_layers (Qwen2's
  // max_window_layers; Mistral 0) and, when sliding_window_pattern > 0, (i + 1) %
  // sliding_window_pattern != 0 (Gemma 3: every pattern-th block is global).
  int64_t max_window_layers = 0;
  int64_t sliding_window_pattern = 0;

  // Gemma 3 only (the others require the defaults).
  double rope_local_theta = 10000.0;  // RoPE base of the sliding (local) blocks
  double query_pre_attn_scalar = 256.0;  // attention scores scaled by its -1/2 (Gemma3TextConfig's default)

  // BERT family only (the others require the defaults).
  int64_t type_vocab_size = 2;  // rows of the token-type (segment) embedding
  double layer_norm_eps = 1e-12;  // every LayerNorm's epsilon
  // The head: 0 = masked-LM head (decoder tied to the word embeddings; needs
  // tied_embeddings), > 0 = sequence classification into num_labels classes (pooler on
  // the first token, then a linear classifier; the label of sequence b is its target at
  // position 0, every other target kIgnoreTarget).
  int64_t num_labels = 0;

  // Checks every field; the message names the offending field and value.
  Status Validate() const;
  int64_t NumLayers() const { return n_layer + 2; }
  // The kind of layer `index` (0..NumLayers()-1), and all of them in model order.
  LayerKind KindOf(int64_t index) const;
  std::vector<LayerKind> LayerKinds() const;
  int64_t head_dim() const { return head_size > 0 ? head_size : d_model / n_head; }
  // Whether block `block` (0-based) attends through the sliding window, and its window
  // (0: full causal attention).
  bool SlidingBlock(int64_t block) const {
    return sliding_window > 0 && block >= max_window_layers &&
           (sliding_window_pattern <= 0 || (block + 1) % sliding_window_pattern != 0);
  }
  int64_t WindowOf(int64_t block) const { return SlidingBlock(block) ? sliding_window : 0; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_head; }
  bool moe() const { return num_experts > 0; }
  // Total trainable parameters (a tied embedding counted once).
  int64_t NumParams() const;
  // Training FLOPs per token of a forward + backward pass over sequences of `T` tokens
  // (matrix products only, 2 FLOPs a multiply-add, causal attention counted in full).
  double TrainFlopsPerToken(int64_t T) const;
  bool operator==(const ModelSpec&) const = default;
};


struct ParamInfo {
  std::string name;             // our name: the Hugging Face name without the base model's
                                // prefix, e.g. "h.3.attn.c_attn.weight" (GPT-2),
                                // "layers.3.self_attn.q_proj.weight" (Llama)
  std::vector<int64_t> shape;   // row-major
  size_t offset = 0;            // in floats, inside the layer's flat buffer
  size_t numel = 0;
  bool decay = false;           // AdamW weight decay applies (2-D weights only)
  // Trains (gradient + optimizer state). False only for the frozen base of a LoRA job
  // (common/lora.h); every tensor of BuildLayout trains.
  bool trainable = true;
};

struct LayerLayout {
  LayerKind kind = LayerKind::kBlock;
  int64_t index = 0;        // position in the model, 0..NumLayers()-1
  int64_t block = -1;       // block number for kBlock, else -1
  std::vector<ParamInfo> params;
  size_t numel = 0;         // floats in the flat buffer (sum of params' numel)
  // LoRA (common/lora.h BuildLoraLayout): the adapters' rank and scale alpha / r; 0 = no
  // adapters in this layer.
  int64_t lora_r = 0;
  float lora_scale = 0.0f;

  // The view named `suffix` (e.g. "ln_1.weight" or "wte.weight"); nullptr if absent.
  // Block tensors also answer to the name after their "<blocks>.N." prefix
  // ("attn.c_proj.weight"; a bare "c_proj.weight" is ambiguous and matches nothing).
  const ParamInfo* Find(const std::string& suffix) const;
};

// The [begin, end) element range of each expert of a mixture-of-experts block (the
// tensors named "...experts.<e>.*", contiguous per expert), indexed by expert; empty for a
// layer without experts. Optimizers use it to skip an expert that got no token in a step
// (torch.optim.AdamW skips a parameter whose .grad is None).
struct ExpertRange {
  size_t begin = 0, end = 0;
};
std::vector<ExpertRange> ExpertRanges(const ModelSpec& spec, const LayerLayout& layout);

// A Llama-family mixture-of-experts block's tensor names (after "layers.N."): Mixtral's
// block_sparse_moe.{gate, experts.e.{w1,w3,w2}}, or Qwen3-MoE's (qk_norm)
// mlp.{gate, experts.e.{gate_proj,up_proj,down_proj}}. Each expert's gate, up, down.
struct MoeNames {
  const char *prefix, *gate, *up, *down;
};
inline MoeNames MoeTensorNames(const ModelSpec& spec) {
  return spec.qk_norm ? MoeNames{"mlp.", "gate_proj", "up_proj", "down_proj"}
                      : MoeNames{"block_sparse_moe.", "w1", "w3", "w2"};
}

// One layout per layer, in model order (the family's). REQUIRES: spec.Validate().ok().
std::vector<LayerLayout> BuildLayout(const ModelSpec& spec);

// The embedding matrix (V, C) inside layer 0's layout: the tensor a tied head reads and
// whose gradient it adds to ("wte.weight", "embed_tokens.weight").
const ParamInfo& EmbeddingTable(const ModelSpec& spec, const LayerLayout& embedding);

// The tensor's name in a Hugging Face checkpoint of the family's architecture
// ("h.0.ln_1.weight" for GPT-2 as the hub stores it, "model.layers.0.mlp.up_proj.weight").
std::string HfTensorName(const ModelSpec& spec, const ParamInfo& param);

// Deterministic initialisation of one layer's flat buffer (out has layout.numel floats),
// as the family's Hugging Face class initialises (GPT-2: N(0, 0.02) weights, residual
// projections scaled by 1/sqrt(2*n_layer); Llama: N(0, 0.02) weights; both: norm weights 1,
// biases 0). Depends only on (seed, layer index), so any process can initialise any layer
// on its own and get the same bytes.
void InitLayerParams(const ModelSpec& spec, const LayerLayout& layout, uint64_t seed, float* out);

}  // namespace l2l

// ModelSpec: the shape of a GPT-style decoder, and the parameter layout of each of its
// layers. Pure metadata (no compute): the EPS uses it to size its page store and name
// tensors on export, the worker and the reference trainer use it to find views inside a
// layer's flat fp32 parameter buffer.
//
// A model is a list of layers, indexed 0..NumLayers()-1:
//   0              Embedding   wte (V, C), wpe (T, C)
//   1..n_layer     Block i-1   ln_1, attn.c_attn (C, 3C), attn.c_proj (C, C), ln_2,
//                              mlp.c_fc (C, F), mlp.c_proj (F, C)  (Hugging Face Conv1D
//                              layout: y = x @ W + b, W stored (in, out))
//   n_layer+1      Head        ln_f; lm_head (V, C) only when embeddings are untied.
// With tied embeddings the head reads wte from layer 0: one tensor, two readers, the
// gradients summed into layer 0's gradient.
//
// Thread-safety: immutable values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l {

struct ModelSpec {
  int64_t vocab_size = 256;  // V: token ids are in [0, V)
  int64_t seq_len = 64;      // T: maximum context length (rows of wpe)
  int64_t d_model = 64;      // C
  int64_t n_layer = 2;       // transformer blocks
  int64_t n_head = 4;        // attention heads; must divide d_model
  int64_t d_ff = 256;        // F: MLP hidden width (GPT-2 uses 4*C)
  bool tied_embeddings = true;  // LM head reads wte (GPT-2) instead of its own matrix

  // Checks every field; the message names the offending field and value.
  Status Validate() const;
  int64_t NumLayers() const { return n_layer + 2; }
  int64_t head_dim() const { return d_model / n_head; }
  // Total trainable parameters (a tied wte counted once).
  int64_t NumParams() const;
  bool operator==(const ModelSpec&) const = default;
};

enum class LayerKind { kEmbedding, kBlock, kHead };
const char* LayerKindName(LayerKind kind);

struct ParamInfo {
  std::string name;             // Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;   // row-major
  size_t offset = 0;            // in floats, inside the layer's flat buffer
  size_t numel = 0;
  bool decay = false;           // AdamW weight decay applies (2-D weights only, as GPT-2)
};

struct LayerLayout {
  LayerKind kind = LayerKind::kBlock;
  int64_t index = 0;        // position in the model, 0..NumLayers()-1
  int64_t block = -1;       // block number for kBlock, else -1
  std::vector<ParamInfo> params;
  size_t numel = 0;         // floats in the flat buffer (sum of params' numel)

  // The view named `suffix` (e.g. "ln_1.weight" or "wte.weight"); nullptr if absent.
  const ParamInfo* Find(const std::string& suffix) const;
};

// One layout per layer, in model order. REQUIRES: spec.Validate().ok().
std::vector<LayerLayout> BuildLayout(const ModelSpec& spec);

// Deterministic GPT-2 initialisation of one layer's flat buffer (out has layout.numel
// floats): weights ~ N(0, 0.02), residual projections (c_proj) scaled by 1/sqrt(2*n_layer),
// biases 0, LayerNorm weights 1. Depends only on (seed, layer index), so any process can
// initialise any layer on its own and get the same bytes.
void InitLayerParams(const ModelSpec& spec, const LayerLayout& layout, uint64_t seed, float* out);

}  // namespace l2l

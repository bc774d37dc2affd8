// Job builders for tests: a small GPT-2-family JobConfig from a model shape and the few
// training knobs a test sets, instead of a dozen field assignments in every test file.
//
//   JobConfig job = testing::GptJob(testing::kTinyGpt, {.micro_batch_size = 2, .seed = 91});
//
// A knob left unset keeps JobConfig's default, so a test states only what it relies on.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "common/config.h"
#include "common/model_spec.h"

namespace l2l::testing {

// The shape of a GPT-2-family test model (ModelSpec's other fields keep their defaults).
struct GptShape {
  int64_t vocab_size, seq_len, d_model, n_layer, n_head, d_ff;
  bool tied_embeddings = true;
};
// V=96, T=16, C=32, 3 blocks of 4 heads, F=128, tied embeddings: a few KiB per layer.
inline constexpr GptShape kTinyGpt{96, 16, 32, 3, 4, 128};

// The shape of a Llama-family test model: grouped-query attention with n_kv_heads
// key/value heads (RoPE, RMSNorm, SwiGLU keep ModelSpec's defaults unless set after).
struct LlamaShape {
  int64_t vocab_size, seq_len, d_model, n_layer, n_head, n_kv_heads, d_ff;
  bool tied_embeddings = false;
};

// The shape of a BERT-family test model; the defaults of the last two are ModelSpec's.
struct BertShape {
  int64_t vocab_size, seq_len, d_model, n_layer, n_head, d_ff;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
};

// Training and optimizer knobs; each one set overrides JobConfig's default.
struct TrainKnobs {
  // (Each with an initializer, so designated initializers may leave any out.)
  std::optional<int64_t> steps = {}, micro_batch_size = {}, micro_batches = {}, seq_len = {};
  std::optional<uint64_t> seed = {};
  std::optional<ClipMode> clip = {};
  std::optional<float> lr = {};
  std::optional<int64_t> warmup_steps = {}, total_steps = {};
  std::optional<float> eps = {}, weight_decay = {}, grad_clip = {};
};

ModelSpec GptModel(const GptShape& shape);
ModelSpec LlamaModel(const LlamaShape& shape);
// num_labels 0 = the masked-LM head (tied decoder), > 0 = classification (untied).
ModelSpec BertModel(const BertShape& shape, int64_t num_labels);
JobConfig GptJob(const GptShape& shape, const TrainKnobs& knobs = {});

}  // namespace l2l::testing

// ModelConfig: a typed, family-neutral description of a pretrained decoder as its file
// states it, filled from a Hugging Face config.json or from GGUF metadata, and written
// back as config.json. It records what the file says; deciding what a family accepts
// (defaults, refusals such as sliding windows) is the model-family registry's job.
//
// An absent std::optional means the file does not state the value (or states null);
// callers apply the family's Hugging Face default (e.g. tie_word_embeddings defaults to
// true in GPT-2 and false in Llama / Qwen2 / Mistral).
//
// config.json: unknown keys are ignored (kept in raw_json for export); a known key of the
// wrong JSON type is an error naming the key and the file. GPT-2's names (n_embd, n_layer,
// n_head, n_positions, n_inner) fill the standard fields, and gpt2_keys records that.
//
// GGUF: from "<arch>.*" keys (arch = general.architecture): embedding_length, block_count,
// attention.head_count, attention.head_count_kv, feed_forward_length, context_length,
// rope.freq_base, rope.dimension_count, rope.scaling.{type,factor,original_context_length}
// (or the older rope.scale_linear), attention.layer_norm_rms_epsilon,
// attention.layer_norm_epsilon, attention.key_length (head_dim), attention.sliding_window;
// vocab_size = length of tokenizer.ggml.tokens (else <arch>.vocab_size); bos/eos from
// tokenizer.ggml.{bos,eos}_token_id; tie_word_embeddings = no "output.weight" tensor;
// attention_bias = a "blk.0.attn_q.bias" tensor. llama.cpp's converter stores Llama-3 rope
// scaling as a "rope_freqs.weight" tensor, not as metadata: rope_scaling stays absent then.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/formats/gguf.h"
#include "common/formats/gguf_writer.h"
#include "common/status.h"

namespace l2l::formats {

struct RopeScaling {
  std::string type;  // HF "rope_type" (or legacy "type"): "linear", "llama3", "dynamic", "yarn", ...
  std::optional<double> factor;
  std::optional<double> low_freq_factor;   // llama3
  std::optional<double> high_freq_factor;  // llama3
  std::optional<int64_t> original_max_position_embeddings;  // llama3, yarn; GGUF original_context_length
  nlohmann::json json;  // the object as config.json states it (null when read from GGUF)
};

struct ModelConfig {
  std::string source;        // the file it was read from (config.json or the .gguf)
  std::string architecture;  // HF architectures[0], e.g. "LlamaForCausalLM"; "" from GGUF
  std::string model_type;    // HF model_type ("llama", "qwen2", "gpt2"); GGUF general.architecture
  std::optional<int64_t> vocab_size;
  std::optional<int64_t> hidden_size;
  std::optional<int64_t> intermediate_size;
  std::optional<int64_t> num_hidden_layers;
  std::optional<int64_t> num_attention_heads;
  std::optional<int64_t> num_key_value_heads;
  std::optional<int64_t> head_dim;
  std::optional<int64_t> max_position_embeddings;
  std::optional<int64_t> rope_dimension_count;  // GGUF rope.dimension_count (rotary dims)
  std::optional<double> rope_theta;
  std::optional<RopeScaling> rope_scaling;
  std::optional<double> rms_norm_eps;
  std::optional<double> layer_norm_epsilon;
  std::optional<bool> tie_word_embeddings;
  std::optional<bool> attention_bias;
  std::optional<int64_t> sliding_window;
  std::optional<bool> use_sliding_window;
  std::string torch_dtype;  // "" when absent
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config.json allows one id or a list
  bool gpt2_keys = false;              // the file used GPT-2's key names
  nlohmann::json raw_json;             // config.json as read (null from GGUF)
};

// `path` only names the source in errors and in ModelConfig::source.
Result<ModelConfig> ParseHfConfig(const std::string& json_text, const std::string& path);
Result<ModelConfig> ReadHfConfig(const std::string& config_json_path);
Result<ModelConfig> ConfigFromGguf(const GgufReader& gguf);

// config.json text: raw_json (so keys this struct does not model survive), then every
// field that is set, under GPT-2's names when gpt2_keys, then `extra` merged on top.
nlohmann::json HfConfigJson(const ModelConfig& c, const nlohmann::json& extra = nlohmann::json::object());
// Writes HfConfigJson(c, extra), indented, atomically.
Status WriteHfConfig(const std::string& path, const ModelConfig& c,
                     const nlohmann::json& extra = nlohmann::json::object());

// The inverse of ConfigFromGguf, for GGUF export: general.architecture = model_type and
// the "<arch>.*" keys above for every field that is set (plus <arch>.vocab_size, and
// rope.dimension_count = head_dim or hidden_size / num_attention_heads when not stated),
// tokenizer.ggml.{bos,eos}_token_id when set, rope scaling of type linear / yarn as
// rope.scaling.*. Llama-3 rope scaling has no GGUF metadata (llama.cpp stores a
// rope_freqs.weight tensor instead): InvalidArgument, as are a missing model_type and
// more than one eos id. Tokenizer arrays and general.name are the caller's (transformers'
// GGUF loader requires general.name).
Status AddConfigToGguf(const ModelConfig& c, GgufWriter* w);

}  // namespace l2l::formats

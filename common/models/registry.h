// The model-family registry: everything l2l knows about a family's metadata, in one table
// entry per family (one file per family beside this one: gpt2.cc, llama.cc, bert.cc, gemma3.cc). ModelSpec's
// functions (common/model_spec.h) dispatch here; the family's kernels are registered the
// same way in kernels/layers/registry.h.
//
// Adding a family: a new ModelFamily value, a new <family>.cc here defining its
// FamilyInfo, one line in registry.cc's table, and kernels/layers/<family>.cc.
//
// Thread-safety: the entries are immutable statics.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/lora.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l::models {

// A tensor-name pair: llama.cpp's GGUF name stem and Hugging Face's (without ".weight").
struct NamePair {
  const char* gguf;  // "attn_q", "token_embd"
  const char* hf;    // "self_attn.q_proj", "model.embed_tokens"
};

// A GGUF general.architecture a family imports (as llama.cpp's llama-arch.cpp keeps them
// per architecture).
struct GgufArch {
  const char* name;             // general.architecture: "llama", "qwen2"
  const char* hf_architecture;  // the Hugging Face class its tensors import as
  const char* hf_model_type;    // that class's model_type
  bool permuted_qk;             // llama.cpp's converter permuted attn_q / attn_k rows
};

struct FamilyInfo {
  ModelFamily family;
  const char* name;                         // ToString(family): "gpt2", "llama"
  std::vector<std::string> hf_architectures;  // config.json "architectures" it covers
  // Prefix of the base model's tensors in a Hugging Face state_dict ("transformer.",
  // "model."); lm_head.weight has none.
  const char* hf_base_prefix;
  // Prefix as the family's hub checkpoints store them: "" for GPT-2 (the hub's gpt2 files
  // hold "h.0.ln_1.weight"), "model." for Llama.
  const char* hf_file_prefix;
  const char* embedding_table;              // our name of the (V, C) token embedding
  // Family-specific checks, after ModelSpec::Validate's common ones.
  Status (*validate)(const ModelSpec&);
  int64_t (*num_params)(const ModelSpec&);
  double (*train_flops_per_token)(const ModelSpec&, int64_t T);
  std::vector<LayerLayout> (*build_layout)(const ModelSpec&);
  void (*init_layer)(const ModelSpec&, const LayerLayout&, uint64_t seed, float* out);
  // The spec of a Hugging Face config.json of one of hf_architectures (`origin` names the
  // file in errors); refuses what the family cannot compute (e.g. Gemma 3 logit softcapping).
  Result<ModelSpec> (*from_hf_config)(const nlohmann::json& config, const std::string& origin);
  // The config.json transformers needs to build the model of `spec` (its architecture
  // chosen by the spec, e.g. Qwen2ForCausalLM for a Llama spec with q/k/v biases).
  nlohmann::json (*to_hf_config)(const ModelSpec& spec);
  // The tensor's name in a Hugging Face checkpoint when it is not simply hf_file_prefix +
  // our name (BERT: the heads' "cls."/"classifier." tensors carry no "bert."); nullptr:
  // hf_file_prefix + name (lm_head.weight unprefixed).
  std::string (*hf_tensor_name)(const ModelSpec& spec, const ParamInfo& param) = nullptr;
  // Architectures (also in hf_architectures) of a base model without a task head
  // (BertModel): importing one, the job's model.num_labels picks the head, and the head
  // tensors the file lacks are initialised with init_layer from the job's seed.
  std::vector<std::string> hf_headless_architectures = {};
  // Non-parameter buffers a Hugging Face checkpoint may hold (matched on the name's end,
  // e.g. BERT's "embeddings.position_ids"): skipped on import.
  std::vector<std::string> hf_ignored_suffixes = {};
  // Tensors (our names) a headless checkpoint may hold that the chosen head does not use
  // (BERT's pooler under a masked-LM head): skipped on import, as transformers does.
  std::vector<std::string> hf_unused_base_tensors = {};
  // The family's Hugging Face linear weights are stored (in, out) (GPT-2's Conv1D) rather
  // than torch.nn.Linear's (out, in): a LoRA delta B A (out, in) is added transposed, and
  // PEFT adapters of it say fan_in_fan_out: true.
  bool hf_weights_in_out = false;
  // An encoder (bidirectional attention, token types and a padding mask; masked-LM or
  // classification tasks, no next-token task): BERT. Decoders are causal LMs.
  bool encoder = false;
  // GGUF: the architectures imported as this family (none: GGUF files of it are refused),
  // the tensor names (whole-model tensors, and block tensors "blk.N.<gguf>" <->
  // "<hf_block_prefix>N.<hf>"), and the architecture an export writes for a spec (nullptr:
  // no GGUF export).
  std::vector<GgufArch> gguf_architectures = {};
  std::vector<NamePair> gguf_global_names = {};
  std::vector<NamePair> gguf_block_names = {};
  const char* hf_block_prefix = "";
  const char* (*gguf_export_architecture)(const ModelSpec& spec) = nullptr;
  // GGUF files store every norm weight (our names ending in "norm.weight") plus this:
  // llama.cpp's converter adds Gemma's 1 of x * (1 + w) into the file. Import subtracts
  // it, export adds it. 0: stored as is.
  float gguf_norm_shift = 0.0f;
  // Optional: what llama.cpp fixes for the family's GGUF architecture instead of storing
  // it, added to the config.json an import derives from GGUF metadata (`config` holds
  // hidden_size, num_attention_heads, num_hidden_layers, head_dim when the file states
  // them). Gemma 3: the global-block pattern, the local RoPE base, the query scale.
  void (*gguf_hf_config_defaults)(nlohmann::json* config) = nullptr;
  // Optional: OK when a GGUF of the family can state `spec`, else UNIMPLEMENTED naming
  // what it cannot (a Llama-family sliding window; Gemma 3 settings llama.cpp fixes).
  Status (*gguf_export_check)(const ModelSpec& spec) = nullptr;
  // LoRA (common/lora.h): the block linears an adapter can target, by Hugging Face module
  // name, in block order; nullptr: the family has no LoRA support.
  std::vector<LoraTarget> (*lora_targets)(const ModelSpec& spec) = nullptr;
};

// The entry of `family`; every ModelFamily value has one.
const FamilyInfo& Family(ModelFamily family);
// The spec of a Hugging Face config.json: the family is the one whose hf_architectures
// holds config["architectures"][0]; an unknown architecture is an error naming it and the
// known ones.
Result<ModelSpec> SpecFromHfConfig(const nlohmann::json& config, const std::string& origin);
// The family and GGUF architecture row of a GGUF general.architecture; nullptr (and
// *family untouched) when no family imports it.
const GgufArch* FindGgufArchitecture(const std::string& name, const FamilyInfo** family);
// "llama, qwen2, ...": every GGUF architecture some family imports (for messages).
std::string KnownGgufArchitectures();
// Whether `name` is one of the family's non-parameter buffers (hf_ignored_suffixes).
bool IsIgnoredHfTensor(const FamilyInfo& family, const std::string& name);
// Whether `spec`'s family is an encoder (FamilyInfo::encoder).
bool IsEncoder(const ModelSpec& spec);
// Every registered family, in ModelFamily order.
const std::vector<const FamilyInfo*>& AllFamilies();

// The families' entries, defined in their own files.
const FamilyInfo& Gpt2Family();
const FamilyInfo& LlamaFamily();
const FamilyInfo& BertFamily();
const FamilyInfo& Gemma3Family();

}  // namespace l2l::models

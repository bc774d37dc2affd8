// ModelReader: one interface over a Hugging Face model directory and a GGUF file, for
// importers that stream a pretrained model tensor by tensor into fp32.
//
//   Open(path): a directory -> Hugging Face: config.json plus model.safetensors or a
//               sharded model.safetensors.index.json ({"weight_map": {tensor: shard}});
//               a file -> GGUF (version 3).
//   config()   ModelConfig (common/formats/model_config.h)
//   tensors()  (name, row-major shape, dtype as the file names it: "BF16", "Q4_1", ...)
//   ReadF32    one tensor converted to fp32 (F32/F16/BF16 safetensors; F32/F16/BF16/
//              Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q2_K..Q6_K/Q8_K GGUF), nothing else resident.
//
// Open validates everything it can before returning, so an importer can fail before
// writing any state: config.json types, the index (every shard present and holding the
// tensors the index assigns it, no shard tensor missing from the index, shard names
// without '/'), every safetensors header and GGUF header (lengths, offsets, sizes).
// Tensors of dtypes l2l does not convert (I64 buffers such as BERT's position_ids, GGUF
// IQ* types) are listed with to_f32 = false; CheckShape() rejects them, so an importer that
// calls CheckShape on every tensor it needs before writing anything fails early, naming
// the tensor, its dtype and the file. Errors name the file (the shard for a tensor) and
// the tensor or key.
//
// GGUF names: by default tensors keep their GGUF names (token_embd.weight, blk.N.attn_q.weight)
// and values are as stored. With ModelOpenOptions::gguf_hf_names, when a registered family
// imports the file's general.architecture (common/models/registry.h), tensors its name
// tables map are listed under their Hugging Face names, and where the architecture row
// says llama.cpp's converter permuted attn_q / attn_k rows ("llama": Llama, SmolLM; not
// Qwen2) they are unpermuted on read, using
// num_attention_heads / num_key_value_heads from the metadata. Names it does not map
// (e.g. rope_freqs.weight) are listed unchanged.
//
// Ownership: a reader owns its mappings. Thread-safety: immutable after Open(); ReadF32
// may be called from several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/formats/gguf.h"
#include "common/formats/model_config.h"
#include "common/models/registry.h"
#include "common/status.h"

namespace l2l::formats {

enum class ModelFormat { kHfDir, kGguf };
const char* ModelFormatName(ModelFormat f);  // "hf" | "gguf"

struct ModelTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // row-major
  std::string dtype;           // as the file names it: "F32", "BF16", "Q4_1", "I64", "Q6_K", ...
  bool to_f32 = true;          // ReadF32 converts it (else it fails naming the dtype)
  int64_t numel() const;
};

struct ModelOpenOptions {
  bool gguf_hf_names = false;  // see the header comment
};

class ModelReader {
 public:
  static Result<std::unique_ptr<ModelReader>> Open(const std::string& path, const ModelOpenOptions& options = {});
  virtual ~ModelReader() = default;

  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  // HF: index order (sorted by name) or file order; GGUF: file order.
  const std::vector<ModelTensorInfo>& tensors() const { return tensors_; }
  const ModelTensorInfo* Find(const std::string& name) const;
  // The file holding `name` (a shard for sharded HF dirs); "" for an unknown name.
  virtual std::string FileOf(const std::string& name) const = 0;
  // OK when `name` exists with exactly `shape` and converts to fp32; otherwise NotFound /
  // InvalidArgument / Unimplemented naming the file, the tensor, the expected and the found
  // shape or the dtype.
  Status CheckShape(const std::string& name, const std::vector<int64_t>& shape) const;
  // Converts `name` into out[0..n), row-major; n must equal its numel.
  virtual Status ReadF32(const std::string& name, float* out, size_t n) const = 0;
  Result<std::vector<float>> ReadF32(const std::string& name) const;
  // The GGUF reader (tokenizer.ggml.* and other metadata); nullptr for HF directories.
  virtual const GgufReader* gguf() const { return nullptr; }

 protected:
  ModelReader(ModelFormat f, std::string path) : format_(f), path_(std::move(path)) {}
  void AddTensor(ModelTensorInfo t);

  ModelFormat format_;
  std::string path_;
  ModelConfig config_;
  std::vector<ModelTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

// llama.cpp tensor names <-> Hugging Face names through a family's registry tables
// (common/models/registry.h FamilyInfo::gguf_global_names / gguf_block_names /
// hf_block_prefix): whole-model tensors by stem, block tensors "blk.N.<gguf>" <->
// "<hf_block_prefix>N.<hf>", each with its .weight / .bias suffix. nullopt for other names
// (rope_freqs.weight, ...).
std::optional<std::string> GgufToHfName(const models::FamilyInfo& family, const std::string& gguf_name);
std::optional<std::string> HfToGgufName(const models::FamilyInfo& family, const std::string& hf_name);
// The Llama family's (llama, mistral and qwen2 GGUF files): token_embd -> model.embed_tokens,
// blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...
std::optional<std::string> LlamaGgufToHfName(const std::string& gguf_name);
std::optional<std::string> LlamaHfToGgufName(const std::string& hf_name);

}  // namespace l2l::formats
